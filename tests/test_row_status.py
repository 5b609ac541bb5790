"""A row's status agrees with its content (Row's rules), and stored documents from before the rules still load."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from operatorx.result import Measured, Row, status_problem
from operatorx.spec import Case
from operatorx.store.ingest import prepare_document

GEMM = Case.model_validate({"type": "gemm", "args": {"m": 4, "n": 8, "k": 16, "a": {"dtype": "bf16"},
                                                     "b": {"dtype": "bf16"}, "out": "bf16"}})
MEASURED = Measured(latency_us=12.5, samples_us=[12.0, 12.5, 13.0])


def _row(status: str, **fields: Any) -> Row:
    return Row(case=GEMM, backend="torch", status=status, testlist="t", case_index=0, **fields)  # type: ignore[arg-type]


def _refused(status: str, match: str, **fields: Any) -> None:
    with pytest.raises(ValidationError, match=match) as err:
        _row(status, **fields)
    assert "row of case 'gemm 4x8x16' (torch)" in str(err.value)     # names the case and the backend


# --- ok ⇔ a measurement ------------------------------------------------------------------------------

def test_an_ok_row_has_a_measurement() -> None:
    assert _row("ok", measured=MEASURED).latency_us == 12.5
    assert _row("ok", ab={"status": "ok", "host": {"verdict": "same"}}).ab is not None    # an A/B row's result
    _refused("ok", "status ok needs a measurement")
    _refused("ok", "status ok needs a measurement", message="fine")


def test_an_ok_row_has_no_error_kind() -> None:
    _refused("ok", "only an error row has a kind", measured=MEASURED, error_kind="exception")


def test_only_ok_and_error_rows_carry_a_measurement() -> None:
    """An error row may keep what was measured before it failed (a leak, a failed release); an
    unsupported or planned row never has a number."""
    leaked = _row("error", measured=MEASURED, error_kind="leak", message="leaked 2.0 GiB")
    assert leaked.latency_us == 12.5 and leaked.error_kind == "leak"
    _refused("unsupported", "status unsupported with a measurement", measured=MEASURED, message="no kernel")
    _refused("missing", "status missing with a measurement", measured=MEASURED)


# --- error ⇔ a kind and a message --------------------------------------------------------------------

def test_an_error_row_has_a_kind_and_a_message() -> None:
    row = _row("error", error_kind="timeout", message="timeout: the case ran past 60 s")
    assert row.error_kind == "timeout"
    _refused("error", "status error needs an error_kind", message="RuntimeError: boom")
    _refused("error", "status error needs a message", error_kind="exception")
    _refused("error", "status error needs a message", error_kind="exception", message="")


def test_an_error_kind_is_only_on_an_error_row() -> None:
    _refused("unsupported", "only an error row has a kind", message="no kernel", error_kind="check")
    _refused("missing", "only an error row has a kind", error_kind="crashed")


# --- unsupported ⇔ a reason --------------------------------------------------------------------------

def test_an_unsupported_row_has_its_reason() -> None:
    assert _row("unsupported", message="CPU device: fp8 has no kernel").message == "CPU device: fp8 has no kernel"
    _refused("unsupported", "status unsupported needs its reason")


def test_a_planned_row_is_valid() -> None:
    assert Row.missing(GEMM, "torch", "t", 3).status == "missing"


def test_the_rules_alone_say_what_is_wrong() -> None:
    assert status_problem("ok", measured=True, ab=False, error_kind=None, message=None) is None
    assert status_problem("error", measured=False, ab=False, error_kind="oom", message="OOM") is None
    assert status_problem("unsupported", measured=False, ab=True, error_kind=None, message="a: fp8") is None
    assert status_problem("missing", measured=False, ab=False, error_kind=None, message=None) is None
    assert status_problem("ok", measured=False, ab=False, error_kind=None, message=None)
    assert status_problem("error", measured=False, ab=False, error_kind=None, message="x")


def test_changing_a_rows_status_is_checked_too() -> None:
    """run/worker.py turns a row into an error (a leak) by building it again: the rules hold there."""
    from operatorx.run.worker import with_changes

    row = _row("ok", measured=MEASURED)
    assert with_changes(row, status="error", error_kind="leak", message="leak").status == "error"
    with pytest.raises(ValidationError, match="status error needs an error_kind"):
        with_changes(row, status="error", message="leak")


# --- stored documents from before the rules ----------------------------------------------------------

def _old_documents() -> list[dict[str, Any]]:
    """Rows as an earlier version could store them: an error row before `error_kind` existed, an ok
    row whose measurement was not kept, an unsupported row with no reason."""
    base = _row("ok", measured=MEASURED).to_json()
    no_kind = {**base, "status": "error", "message": "RuntimeError: boom", "metrics": {}}
    del no_kind["error_kind"]
    no_number = {**base, "metrics": {"scheme": "bf16"}}
    no_reason = {**base, "status": "unsupported", "metrics": {}}
    return [no_kind, no_number, no_reason]


def test_old_documents_that_break_a_rule_still_load_as_they_were_written() -> None:
    for doc in _old_documents():
        row = Row.from_json(json.loads(json.dumps(doc)))
        again = row.to_json()
        assert row.status == doc["status"] and again["metrics"] == doc["metrics"]
        assert Row.from_json(again) == row
    with pytest.raises(ValidationError):          # the same content as a new row is refused
        Row.model_validate({"case": GEMM, "backend": "torch", "status": "error", "testlist": "t", "case_index": 0,
                            "message": "RuntimeError: boom"})


def test_an_old_document_is_ingested_with_its_rows_as_written() -> None:
    docs = _old_documents()
    doc = {"schema_version": "1", "rows": docs,
           "run": {"id": "old-run-1", "started_at": "2026-01-01T00:00:00", "finished_at": None,
                   "state": "finished", "testlist": "t", "backend": "torch"}}
    prepared = prepare_document(json.loads(json.dumps(doc)), "old.json")
    assert [r["status"] for r in prepared.rows] == ["error", "ok", "unsupported"]
    assert [r["metrics"] for r in prepared.rows] == [d["metrics"] for d in docs]
    assert prepared.rows[0]["error_kind"] is None


# --- rows the run builds ----------------------------------------------------------------------------

VARIANTS = '''
import torch.nn.functional as F
from operatorx.backends.py_file import gemm_inputs

def variant(case, device, scale=1.0):
    x = gemm_inputs(case, device)
    return lambda: F.linear(x["a"], x["b"]) * scale
'''


def test_an_ab_error_row_has_its_kind(tmp_path) -> None:
    """An A/B case whose side fails its check ends as an error row with a kind from the start (the
    rule the worker applies to an error row without one), not as a row the rules refuse."""
    from operatorx.run.config import RunConfig
    from operatorx.run.job import ABJob, JobSpec, build_job

    path = tmp_path / "variants.py"
    path.write_text(VARIANTS)
    case = Case.model_validate({"type": "gemm", "sources": ["t/ab"], "args": {
        "m": 1, "n": 16, "k": 16, "a": {"dtype": "fp32"}, "b": {"dtype": "fp32"}, "out": "fp32"}})
    spec = JobSpec(config=RunConfig(testlist="t", backend="ab", device="cpu"), run_id="ab-row", testlist="t",
                   ab=ABJob(a=f"py:{path}:variant", b=f"py:{path}:variant[scale=1.5]",
                            settings={"host": {"batches": 3, "batch_calls": 5}}))
    row = build_job(spec).run(case, 0)
    assert row.status == "error" and row.error_kind == "exception"
    assert row.message is not None and "b: wrong result" in row.message and row.ab is not None
