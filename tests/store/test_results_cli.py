"""`operatorx results list` over the store: the plain table, --limit, --json."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from operatorx.cli import app
from operatorx.store import Store
from tests.store.conftest import done, planned

runner = CliRunner()


def _fill(db: str, n: int) -> None:
    store = Store(db)
    for i in range(n):
        store.begin_run(f"run-{i}", f"2026-11-30T00:00:{i:02d}", "t\x1b[31mred", "torch", "cpu",
                        {"device": {"name": "NVIDIA H200"}}, planned(3), run_group="g" if i else None,
                        shard="1/2" if i else None)
        store.put_row(f"run-{i}", done(0))
        store.put_row(f"run-{i}", done(1, status="error"))


def test_list_shows_counts_by_status_newest_first(db_url):
    _fill(db_url, 3)
    r = runner.invoke(app, ["results", "list", "--db", db_url])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].split() == ["run", "started", "state", "testlist", "backend", "device", "gpu", "group", "rows",
                                "ok", "unsup", "error", "missing"]
    assert [ln.split()[0] for ln in lines[2:]] == ["run-2", "run-1", "run-0"]
    assert lines[2].split()[-5:] == ["3", "1", "0", "1", "1"] and "g 1/2" in lines[2]
    assert "\x1b" not in r.output and " tred " in r.output         # escape sequences never reach the terminal
    assert len({len(ln) for ln in lines[:2]}) == 1                     # header and rule line up


def test_list_limit_and_json(db_url):
    _fill(db_url, 4)
    r = runner.invoke(app, ["results", "list", "--db", db_url, "--limit", "2"])
    assert r.exit_code == 0 and [ln.split()[0] for ln in r.output.splitlines()[2:4]] == ["run-3", "run-2"]
    assert "2 older runs not shown" in r.output
    got = json.loads(runner.invoke(app, ["results", "list", "--db", db_url, "--json", "--limit", "3"]).output)
    assert [x["id"] for x in got] == ["run-3", "run-2", "run-1"]
    assert got[0]["counts"] == {"ok": 1, "unsupported": 0, "error": 1, "missing": 1}
    assert Store(db_url).list_runs(limit=1)[0]["counts"]["missing"] == 1 and Store(db_url).run_count() == 4
