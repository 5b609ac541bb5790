"""The results database: SQLite by default, any SQLAlchemy URL (PostgreSQL) when given one.

Each row is committed when its case ends, so a crash loses at most the case in flight.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session

from operatorx.result import SCHEMA_VERSION, Row
from operatorx.store.schema import Base, RowRecord, RunRecord

__all__ = ["Store", "RunNotFound", "database_url"]


class RunNotFound(LookupError):
    pass


def database_url(db: str) -> str:
    """A path becomes a SQLite URL; anything with '://' is used as a SQLAlchemy URL."""
    return db if "://" in db else f"sqlite:///{Path(db).expanduser()}"


class Store:
    def __init__(self, db: str):
        self.url = database_url(db)
        self.engine = create_engine(self.url)
        Base.metadata.create_all(self.engine)

    def begin_run(self, run_id: str, started_at: str, testlist: str, backend: str, device: str,
                  info: dict[str, Any]) -> None:
        with Session(self.engine) as s, s.begin():
            s.add(RunRecord(id=run_id, started_at=started_at, state="running", testlist=testlist,
                            backend=backend, device=device, info=info))

    def add_row(self, run_id: str, row: Row) -> None:
        m = row.metrics
        with Session(self.engine) as s, s.begin():
            s.add(RowRecord(run_id=run_id, case_index=row.case_index, case_key=row.case.key(),
                            op_type=row.case.type, backend=row.backend, testlist=row.testlist,
                            status=row.status, message=row.message, latency_us=m.get("latency_us"),
                            tflops=m.get("tflops"), gbps=m.get("gbps"), record=row.to_json()))

    def patch_metrics(self, run_id: str, patches: Mapping[int, Mapping[str, Any]]) -> int:
        """Merge `patches[case_index]` into the metrics of that case's row(s) of the run, all in one
        transaction (keys given replace keys stored; others stay). Returns the rows changed."""
        if not patches:
            return 0
        with Session(self.engine) as s, s.begin():
            rows = s.scalars(select(RowRecord).where(RowRecord.run_id == run_id,
                                                     RowRecord.case_index.in_(list(patches)))).all()
            for r in rows:
                record = dict(r.record)      # a new object: the JSON column only sees reassignment
                record["metrics"] = {**(record.get("metrics") or {}), **patches[r.case_index]}
                r.record = record
            return len(rows)

    def finish_run(self, run_id: str, finished_at: str, state: str = "finished") -> None:
        with Session(self.engine) as s, s.begin():
            run = s.get(RunRecord, run_id)
            if run is None:
                raise RunNotFound(run_id)
            run.finished_at, run.state = finished_at, state

    def list_runs(self) -> list[dict[str, Any]]:
        with Session(self.engine) as s:
            counts = dict(s.execute(select(RowRecord.run_id, func.count()).group_by(RowRecord.run_id)).all())
            runs = s.scalars(select(RunRecord).order_by(RunRecord.started_at.desc())).all()
            return [{"id": r.id, "started_at": r.started_at, "finished_at": r.finished_at, "state": r.state,
                     "testlist": r.testlist, "backend": r.backend, "device": r.device,
                     "gpu": (r.info.get("device") or {}).get("name"), "rows": counts.get(r.id, 0)} for r in runs]

    def resolve_run(self, run: str) -> str:
        """A full id, a unique id prefix, or `latest`."""
        with Session(self.engine) as s:
            if run == "latest":
                rid = s.scalars(select(RunRecord.id).order_by(RunRecord.started_at.desc()).limit(1)).first()
            else:
                ids = s.scalars(select(RunRecord.id).where(RunRecord.id.startswith(run, autoescape=True))).all()
                rid = ids[0] if len(ids) == 1 else (run if run in ids else None)
            if rid is None:
                raise RunNotFound(f"no run {run!r} in {self.url}")
            return rid

    def document(self, run: str) -> dict[str, Any]:
        """The run's result document: {"schema_version", "run", "rows"}."""
        rid = self.resolve_run(run)
        with Session(self.engine) as s:
            r = s.get(RunRecord, rid)
            assert r is not None
            rows = s.scalars(select(RowRecord).where(RowRecord.run_id == rid).order_by(RowRecord.id)).all()
            run_doc = {"id": r.id, "started_at": r.started_at, "finished_at": r.finished_at, "state": r.state,
                       "testlist": r.testlist, "backend": r.backend, **r.info}
            return {"schema_version": SCHEMA_VERSION, "run": run_doc, "rows": [x.record for x in rows]}

    def row_count(self, run_id: Optional[str] = None) -> int:
        with Session(self.engine) as s:
            q = select(func.count()).select_from(RowRecord)
            if run_id is not None:
                q = q.where(RowRecord.run_id == run_id)
            return int(s.execute(q).scalar_one())
