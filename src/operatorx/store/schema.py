"""Tables: one `runs` row per run, one `rows` row per case. JSON columns keep the full record;
the scalar columns (status, latency_us, tflops, gbps) are there to query and sort on."""

from __future__ import annotations

from typing import Any, Optional

from sqlalchemy import JSON, Float, ForeignKey, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = ["Base", "RunRecord", "RowRecord"]


class Base(DeclarativeBase):
    pass


class RunRecord(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    started_at: Mapped[str] = mapped_column(String(40))
    finished_at: Mapped[Optional[str]] = mapped_column(String(40), nullable=True)
    state: Mapped[str] = mapped_column(String(16))             # running, finished, interrupted
    testlist: Mapped[str] = mapped_column(Text)
    backend: Mapped[str] = mapped_column(String(128))
    device: Mapped[str] = mapped_column(String(16))
    info: Mapped[dict[str, Any]] = mapped_column(JSON)


class RowRecord(Base):
    __tablename__ = "rows"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    case_index: Mapped[int] = mapped_column(Integer)
    case_key: Mapped[str] = mapped_column(Text)
    op_type: Mapped[str] = mapped_column(String(16))
    backend: Mapped[str] = mapped_column(String(128))
    testlist: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), index=True)
    message: Mapped[Optional[str]] = mapped_column(Text, nullable=True)
    latency_us: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    tflops: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    gbps: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    record: Mapped[dict[str, Any]] = mapped_column(JSON)       # the row as the result document has it
