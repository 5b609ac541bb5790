"""Rows for the report tests, built through the typed model (the document form is `.to_json()`)."""

from __future__ import annotations

from typing import Any, Optional

from operatorx.result import Row
from operatorx.spec import Case

GEMM = Case.model_validate({"type": "gemm", "args": {"m": 1, "n": 2, "k": 3, "a": {"dtype": "bf16"},
                                                     "b": {"dtype": "bf16"}, "out": "bf16"}})


def make_row(status: str = "ok", message: Optional[str] = None, case: Case = GEMM, index: int = 0,
             side: str = "", error_kind: Optional[str] = None, **metrics: Any) -> Row:
    """A valid row of `status` (Row's status rules): an ok row has a measurement, an error row a kind
    (`exception` unless given) and a message, an unsupported row its reason."""
    if status == "ok":
        metrics = {"latency_us": 10.0, "samples_us": [10.0], "clock": "device", **metrics}
    if status == "error":
        error_kind = error_kind or "exception"
        message = message or "RuntimeError: planted"
    if status == "unsupported":
        message = message or "planted: no kernel for this case"
    return Row(case=case, backend="torch", status=status, testlist="t", case_index=index, message=message,
               side=side, error_kind=error_kind, metrics={"scheme": "bf16", **metrics})
