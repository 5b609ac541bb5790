"""`operatorx estimate RUN --scenario FILE`: a planted run in the store, read by id and by `latest`."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from operatorx.cli import app
from operatorx.result import Row
from operatorx.store import Store
from tests.report.rows import make_row
from tests.report.test_estimate import ATTN, HEAD, QKV, UP

runner = CliRunner()


def _plant(db: str, run_id: str, started: str, latency_us: float) -> None:
    planted = [make_row(case=QKV, index=0, latency_us=latency_us, samples_us=[latency_us]),
               make_row(case=UP, index=1, latency_us=4.0, samples_us=[4.0]),
               make_row("unsupported", message="no gqa kernel here", case=ATTN, index=2)]
    store = Store(db)
    store.begin_run(run_id, started, "s", "torch", "cuda", {},
                    [Row.missing(r.case, r.backend, "s", r.case_index) for r in planted])
    for r in planted:
        store.put_row(run_id, r)
    store.finish_run(run_id, started)
    store.close()


def _scenario(tmp_path: Path) -> str:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps([c.to_json() for c in (QKV, UP, ATTN, HEAD)]), encoding="utf-8")
    return str(path)


def test_estimate_latest_as_json(tmp_path):
    db = str(tmp_path / "ox.db")
    _plant(db, "old-run", "2026-12-01T00:00:00+00:00", 1.0)
    _plant(db, "new-run", "2026-12-02T00:00:00+00:00", 3.0)
    r = runner.invoke(app, ["estimate", "latest", "--scenario", _scenario(tmp_path), "--db", db, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["run"] == "new-run"
    step = doc["steps"][0]
    assert step["time_us"] == 4 * 3.0 + 4 * 4.0                     # the newest run's qkv latency
    assert [(u["status"], u["count"]) for u in step["unmeasured"]] == [("unsupported", 4), ("not in run", 1)]
    assert step["attention"] == [{"module": "self_attn", "used": "gemm roles",
                                  "why": "the attention case has no ok row"}]
    assert step["not_in_scenario"][0] == "each layer's input and post-attention RMSNorm and residual adds"


def test_estimate_table_by_id(tmp_path):
    db = str(tmp_path / "ox.db")
    _plant(db, "old-run", "2026-12-01T00:00:00+00:00", 1.0)
    r = runner.invoke(app, ["estimate", "old", "--scenario", _scenario(tmp_path), "--db", db])
    assert r.exit_code == 0, r.output
    assert "decode step: 20.00 µs; 2 of 4 ops measured, 61.5% of counts" in r.output
    assert "no gqa kernel here" in r.output and "not in run" in r.output
    assert "attention self_attn: gemm roles used" in r.output
    assert "not in the scenario (no op times them): each layer's input and post-attention RMSNorm" in r.output


def test_bad_scenario_file_is_one_line(tmp_path):
    db = str(tmp_path / "ox.db")
    _plant(db, "old-run", "2026-12-01T00:00:00+00:00", 1.0)
    bad = tmp_path / "bad.json"
    bad.write_text('[{"type": "gemm", "args": {"m": 1}}]', encoding="utf-8")
    r = runner.invoke(app, ["estimate", "latest", "--scenario", str(bad), "--db", db])
    assert r.exit_code == 2
    assert len(r.output.strip().splitlines()) == 1 and r.output.startswith("error: --scenario ")
    assert "bad.json" in r.output


def test_plain_testlist_is_not_a_scenario(tmp_path):
    db = str(tmp_path / "ox.db")
    _plant(db, "old-run", "2026-12-01T00:00:00+00:00", 1.0)
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps([{"type": "gemm", "args": {"m": 1, "n": 2, "k": 3, "a": {"dtype": "bf16"},
                                                             "b": {"dtype": "bf16"}, "out": "bf16"}}]))
    r = runner.invoke(app, ["estimate", "latest", "--scenario", str(plain), "--db", db])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert "case 0: no `count`" in r.output


def test_unknown_run_is_one_line(tmp_path):
    db = str(tmp_path / "ox.db")
    _plant(db, "old-run", "2026-12-01T00:00:00+00:00", 1.0)
    r = runner.invoke(app, ["estimate", "nope", "--scenario", _scenario(tmp_path), "--db", db])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "no run 'nope'" in r.output
