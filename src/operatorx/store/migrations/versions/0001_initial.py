"""The first versioned schema: runs with typed provenance, shared cases, rows keyed by
(run, case, backend, side).

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_Json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "ox_runs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False, server_default="run"),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("started_at", sa.String(40), nullable=False),
        sa.Column("finished_at", sa.String(40)),
        sa.Column("testlist", sa.Text, nullable=False),
        sa.Column("backend", sa.Text, nullable=False),
        sa.Column("device", sa.String(16), nullable=False),
        sa.Column("run_group", sa.Text),
        sa.Column("shard", sa.Text),
        sa.Column("host", sa.Text),
        sa.Column("gpu_name", sa.Text),
        sa.Column("gpu_uuid", sa.Text),
        sa.Column("gpu_pci_bus_id", sa.Text),
        sa.Column("driver", sa.Text),
        sa.Column("cuda", sa.Text),
        sa.Column("torch_version", sa.Text),
        sa.Column("vllm_version", sa.Text),
        sa.Column("triton_version", sa.Text),
        sa.Column("operatorx_version", sa.Text),
        sa.Column("git_commit", sa.Text),
        sa.Column("settings", _Json),
        sa.Column("info", sa.JSON, nullable=False),
    )
    op.create_index("ox_runs_started_at", "ox_runs", ["started_at"])
    op.create_index("ox_runs_run_group", "ox_runs", ["run_group"])
    op.create_table(
        "ox_cases",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("key_sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("case_key", sa.Text, nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("label", sa.Text),
        sa.Column("args", _Json, nullable=False),
        sa.Column("sources", _Json, nullable=False),
    )
    op.create_table(
        "ox_rows",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("ox_runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("case_id", sa.Integer, sa.ForeignKey("ox_cases.id"), nullable=False),
        sa.Column("backend", sa.Text, nullable=False),
        sa.Column("side", sa.Text, nullable=False, server_default=""),
        sa.Column("case_index", sa.Integer, nullable=False),
        sa.Column("testlist", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error_kind", sa.String(16)),
        sa.Column("message", sa.Text),
        sa.Column("op_type", sa.String(16), nullable=False),
        sa.Column("label", sa.Text),
        sa.Column("scheme", sa.Text),
        sa.Column("model", sa.Text),
        sa.Column("role", sa.Text),
        sa.Column("m", sa.Integer),
        sa.Column("n", sa.Integer),
        sa.Column("k", sa.Integer),
        sa.Column("tokens", sa.Integer),
        sa.Column("latency_us", sa.Float),
        sa.Column("busy_us", sa.Float),
        sa.Column("tflops", sa.Float),
        sa.Column("gbps", sa.Float),
        sa.Column("pct_peak", sa.Float),
        sa.Column("samples_us", _Json),
        sa.Column("sources", _Json),
        sa.Column("record", sa.JSON, nullable=False),
        sa.UniqueConstraint("run_id", "case_id", "backend", "side", name="ox_rows_identity"),
    )
    op.create_index("ox_rows_run_status", "ox_rows", ["run_id", "status"])
    op.create_index("ox_rows_run_index", "ox_rows", ["run_id", "case_index"])
    op.create_index("ox_rows_case", "ox_rows", ["case_id"])


def downgrade() -> None:
    op.drop_table("ox_rows")
    op.drop_table("ox_cases")
    op.drop_table("ox_runs")
