"""The shards (or hosts) of one sweep read as one: a run group's document.

`operatorx run --shard I/N --run-group NAME` stores each shard as its own run; a report wants the
sweep. The group's document holds every row of its runs, one per (case key, backend, side): a
final row wins over `missing` (a shard that was re-run), and among final rows the newest run's.
"""

from __future__ import annotations

import json
from typing import Any

from operatorx.result import SCHEMA_VERSION
from operatorx.store.db import Store
from operatorx.store.errors import RunNotFound

__all__ = ["group_document", "merge_rows", "GROUP_PREFIX"]

#: `results show group:NAME` names a run group where a run id is expected.
GROUP_PREFIX = "group:"


def _key(row: dict[str, Any]) -> tuple[str, str, str]:
    """A document row's identity: the same as `Row.key()` (case type and args, backend, side)."""
    op = row["op"]
    case = json.dumps({"type": op["type"], "args": op["args"]}, sort_keys=True, separators=(",", ":"))
    return case, op["backend"], row.get("side") or ""


def merge_rows(docs: list[tuple[str, list[dict[str, Any]]]]) -> list[tuple[str, dict[str, Any]]]:
    """One row per (case key, backend, side) of the runs' rows, each with the id of the run it came
    from: `docs` is (run id, its document's rows), oldest run first; a final row wins over `missing`,
    and among final rows the newest run's. In case order."""
    rows: dict[tuple[str, str, str], tuple[str, dict[str, Any]]] = {}
    for run_id, run_rows in docs:
        for row in run_rows:
            key = _key(row)
            if row["status"] != "missing" or key not in rows:
                rows[key] = (run_id, row)
    return sorted(rows.values(), key=lambda x: (x[1].get("case_index", 0), x[1]["op"]["backend"],
                                                x[1].get("side") or ""))


def group_document(store: Store, name: str) -> dict[str, Any]:
    runs = [r for r in store.list_runs() if r.get("run_group") == name]
    if not runs:
        raise RunNotFound(f"no run group {name!r} in {store.url}")
    runs.sort(key=lambda r: r["started_at"])            # oldest first: newer runs overwrite
    docs = [store.document(r["id"]) for r in runs]
    merged = merge_rows([(r["id"], doc["rows"]) for r, doc in zip(runs, docs, strict=True)])
    first = docs[0]["run"]
    states = sorted({r["state"] for r in runs})
    merged_run = {**first, "id": f"{GROUP_PREFIX}{name}", "run_group": name, "shard": None,
                  "runs": [{"id": r["id"], "shard": r.get("shard"), "state": r["state"], "gpu": r.get("gpu"),
                            "started_at": r["started_at"]} for r in runs],
                  "state": states[0] if len(states) == 1 else "mixed: " + ", ".join(states),
                  "started_at": runs[0]["started_at"],
                  "finished_at": max((r["finished_at"] or "") for r in runs) or None}
    return {"schema_version": SCHEMA_VERSION, "run": merged_run, "rows": [row for _, row in merged]}
