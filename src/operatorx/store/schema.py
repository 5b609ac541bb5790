"""The tables, as SQLAlchemy Core metadata. Alembic migrations (store/migrations/) create and change them;
`SCHEMA_HEAD` names the revision this code reads and writes.

- `runs`: one per run, with the provenance people filter on as typed columns (host, GPU, driver, versions,
  git commit, run group, shard) and the run's full `info` as JSON.
- `cases`: one per distinct case (type + args), shared by every run that timed it.
- `rows`: one per (run, case, backend, side) — a UNIQUE key, so writing a row twice replaces it. Typed
  columns for what people filter and plot, the raw samples, and the full row document as JSON. Its
  size columns (m, n, k, tokens) and case_index are 64-bit (BIGINT on PostgreSQL; SQLite's INTEGER
  already is): they hold every size a case may give (spec/base.py, at most 2^63 - 1).

`info` and `record` are plain JSON (PostgreSQL `json`: kept as written, key order included, so a
document read back is the document stored); the JSON columns meant for queries are JSONB there.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB

__all__ = ["SCHEMA_HEAD", "metadata", "runs", "cases", "rows", "RUN_STATES", "ROW_STATUSES"]

SCHEMA_HEAD = "0002"
RUN_STATES = ("running", "finished", "interrupted", "failed")
ROW_STATUSES = ("ok", "unsupported", "error", "missing")

_Json = JSON().with_variant(JSONB(), "postgresql")
#: A 64-bit integer: BIGINT on PostgreSQL; INTEGER on SQLite, which stores 64 bits in it already.
_Int64 = BigInteger().with_variant(Integer(), "sqlite")

metadata = MetaData()

runs = Table(
    "ox_runs", metadata,
    Column("id", String(64), primary_key=True),
    Column("kind", String(16), nullable=False, server_default="run"),     # run, ab
    Column("state", String(16), nullable=False),
    Column("started_at", String(40), nullable=False),
    Column("finished_at", String(40)),
    Column("testlist", Text, nullable=False),
    Column("backend", Text, nullable=False),
    Column("device", String(16), nullable=False),                         # cuda, cpu
    Column("run_group", Text),
    Column("shard", Text),
    Column("host", Text),
    Column("gpu_name", Text),
    Column("gpu_uuid", Text),
    Column("gpu_pci_bus_id", Text),
    Column("driver", Text),
    Column("cuda", Text),
    Column("torch_version", Text),
    Column("vllm_version", Text),
    Column("triton_version", Text),
    Column("operatorx_version", Text),
    Column("git_commit", Text),
    Column("settings", _Json),
    Column("info", JSON, nullable=False),
    Index("ox_runs_started_at", "started_at"),
    Index("ox_runs_run_group", "run_group"),
)

cases = Table(
    "ox_cases", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key_sha256", String(64), nullable=False, unique=True),
    Column("case_key", Text, nullable=False),
    Column("type", String(16), nullable=False),
    Column("label", Text),
    Column("args", _Json, nullable=False),
    Column("sources", _Json, nullable=False),           # as first stored; each row keeps its own too
)

rows = Table(
    "ox_rows", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(64), ForeignKey("ox_runs.id", ondelete="CASCADE"), nullable=False),
    Column("case_id", Integer, ForeignKey("ox_cases.id"), nullable=False),
    Column("backend", Text, nullable=False),
    Column("side", Text, nullable=False, server_default=""),
    Column("case_index", _Int64, nullable=False),
    Column("testlist", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("error_kind", String(16)),
    Column("message", Text),
    Column("op_type", String(16), nullable=False),
    Column("label", Text),
    Column("scheme", Text),
    Column("model", Text),
    Column("role", Text),
    Column("m", _Int64),
    Column("n", _Int64),
    Column("k", _Int64),
    Column("tokens", _Int64),
    Column("latency_us", Float),
    Column("busy_us", Float),
    Column("tflops", Float),
    Column("gbps", Float),
    Column("pct_peak", Float),
    Column("samples_us", _Json),
    Column("sources", _Json),
    Column("record", JSON, nullable=False),
    UniqueConstraint("run_id", "case_id", "backend", "side", name="ox_rows_identity"),
    Index("ox_rows_run_status", "run_id", "status"),
    Index("ox_rows_run_index", "run_id", "case_index"),
    Index("ox_rows_case", "case_id"),
)
