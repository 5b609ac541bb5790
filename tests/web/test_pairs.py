"""`report build`'s default comparisons (web/pairs.py), with runs planted in a real SQLite store: only
runs of the same testlist, backend and shard that differ in GPU or a version are paired, each run
against the newest earlier one comparable with it, and every pair says why. Also the run group page
(one sweep from its shards) and the Runs page's group and shard columns, on the server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
from starlette.testclient import TestClient

from operatorx.result import Row
from operatorx.store import Store
from operatorx.store.group import group_document
from operatorx.web import Queries
from operatorx.web.app import create_app
from operatorx.web.pairs import comparable_pairs, newest_pairs, previous_pairs
from operatorx.web.render import compare_file
from operatorx.web.site import build_site
from tests.store.conftest import case, done, planned
from tests.web.conftest import page_data


def _info(gpu: Optional[str] = "NVIDIA H200", torch: str = "2.13.0", git: str = "a" * 40,
          kind: Optional[str] = None) -> dict[str, Any]:
    device = {"kind": "cuda", "name": gpu} if gpu else {"kind": "cpu", "name": "cpu"}
    info: dict[str, Any] = {"device": device, "software": {"torch": torch, "operatorx": "0.9.0"}, "git_sha": git}
    if kind:
        info["kind"] = kind
    return info


def _run(store: Store, rid: str, day: int, info: dict[str, Any], *, testlist: str = "gemm_perf",
         backend: str = "torch", group: Optional[str] = None, shard: Optional[str] = None,
         cases: range = range(3), statuses: Optional[dict[int, str]] = None) -> None:
    statuses = statuses or {}
    store.begin_run(rid, f"2026-12-{day:02d}T00:00:00+00:00", testlist, backend, "cuda" if info["device"]["kind"] ==
                    "cuda" else "cpu", info, [r for r in planned(max(cases) + 1, backend=backend) if r.case_index
                                              in cases], run_group=group, shard=shard)
    for i in cases:
        status = statuses.get(i, "ok")
        if status == "ok":
            store.put_row(rid, done(i, latency_us=10.0 + day + i, backend=backend))
        elif status == "error":
            store.put_row(rid, Row(case=case(i), backend=backend, status="error", testlist=testlist, case_index=i,
                                   error_kind="exception", message="boom"))
    store.finish_run(rid, f"2026-12-{day:02d}T01:00:00+00:00")


@pytest.fixture
def planted(tmp_path: Path) -> str:
    """Five comparable torch runs of gemm_perf (GPU, torch or git differ from one to the next), a
    user-backend run and an A/B run of the same testlist, two identical re-runs of another testlist, and
    two run groups of two shards each (one group's shards on two GPUs)."""
    db = str(tmp_path / "planted.db")
    store = Store(db)
    _run(store, "t1", 1, _info(gpu="NVIDIA H100"))
    _run(store, "t2", 2, _info(gpu="NVIDIA H200"))
    _run(store, "user", 3, _info(gpu="NVIDIA H200"), backend="py:my_gemm.py:build")
    _run(store, "ab1", 4, _info(gpu="NVIDIA H100", kind="ab"), backend="ab")
    _run(store, "t3", 5, _info(gpu="NVIDIA H200", torch="2.14.0"))
    _run(store, "t4", 6, _info(gpu="NVIDIA H200", torch="2.14.0", git="c" * 40 + "-dirty"))
    _run(store, "t5", 7, _info(gpu="NVIDIA H100", torch="2.14.0", git="c" * 40 + "-dirty"))
    _run(store, "same1", 8, _info(), testlist="gemm")
    _run(store, "same2", 9, _info(), testlist="gemm")
    _run(store, "n-0", 10, _info(gpu="NVIDIA H200"), testlist="moe_small", group="nightly", shard="0/2",
         cases=range(0, 3), statuses={1: "error"})
    _run(store, "n-1", 10, _info(gpu="NVIDIA H100"), testlist="moe_small", group="nightly", shard="1/2",
         cases=range(3, 6), statuses={5: "missing"})
    _run(store, "w-0", 11, _info(gpu="NVIDIA B200"), testlist="moe_small", group="weekly", shard="0/2",
         cases=range(0, 3))
    store.close()
    return db


EXPECTED = [
    ("t1", "t2", "same testlist gemm_perf, backend torch; GPU NVIDIA H100 vs NVIDIA H200"),
    ("t2", "t3", "same testlist gemm_perf, backend torch; torch 2.13.0 vs 2.14.0"),
    ("t3", "t4", "same testlist gemm_perf, backend torch; git aaaaaaaaaaaa vs cccccccccccc-dirty"),
    ("t4", "t5", "same testlist gemm_perf, backend torch; GPU NVIDIA H200 vs NVIDIA H100"),
    ("n-0", "w-0", "same testlist moe_small, backend torch, shard 0/2; GPU NVIDIA H200 vs NVIDIA B200"),
]


def test_default_pairs_chain_the_comparable_runs_and_say_why(planted):
    runs = Queries.open(planted).runs()
    got = [(p.a, p.b, p.why) for p in comparable_pairs(runs)]
    assert got == EXPECTED
    paired = {x for p in got for x in p[:2]}
    assert not paired & {"user", "ab1", "same1", "same2"}      # no A/B run, user run alone, re-runs: no pair
    assert ("n-0", "n-1") not in {p[:2] for p in got}           # one sweep's shards hold different cases
    assert [(p.a, p.b) for p in newest_pairs(runs)] == [("t4", "t5"), ("n-0", "w-0")]
    previous = [(p.a, p.b, p.why) for p in previous_pairs(runs)]
    assert ("same1", "same2", "same testlist gemm, backend torch; the run before it") in previous
    assert ("t1", "t2") in [p[:2] for p in previous] and not {"user", "ab1"} & {x for p in previous for x in p[:2]}


def test_report_build_writes_the_default_pairs_and_names_why(planted, tmp_path):
    site = build_site(Queries.open(planted), tmp_path / "site", workers=1)
    assert [(p.a, p.b, p.why) for p in site.pairings] == EXPECTED and site.compares == len(EXPECTED)
    names = sorted(p.name for p in site.directory.glob("compare-*.html"))
    assert names == sorted(compare_file(a, b) for a, b, _ in EXPECTED)
    index = (site.directory / "index.html").read_text()
    for a, b, why in EXPECTED:
        assert f">{b} against {a}</a>: <span class=\"why\">{why}</span>" in index
    runs = {r["id"]: r for r in page_data(index)["runs"]}
    assert runs["t3"]["previous"] == "t2" and runs["t3"]["compare_why"] == EXPECTED[1][2]
    assert runs["user"]["previous"] is None and runs["ab1"]["previous"] is None and runs["t1"]["previous"] is None
    assert site.groups == 2 and (site.directory / "group-nightly.html").is_file()
    assert (site.directory / "group-weekly.html").is_file()
    cli = subprocess.run([sys.executable, "-m", "operatorx", "report", "build", "--db", planted, "-o",
                          str(tmp_path / "cli")], capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    assert "compare t2 against t1: same testlist gemm_perf, backend torch; GPU NVIDIA H100 vs NVIDIA H200" in cli.stdout
    assert f"({len(EXPECTED)} comparisons, 2 run groups)" in cli.stdout


def test_no_comparable_runs_no_comparisons(tmp_path):
    db = str(tmp_path / "ox.db")
    store = Store(db)
    _run(store, "x1", 1, _info())
    _run(store, "x2", 2, _info())                                         # a re-run: nothing differs
    _run(store, "x3", 3, _info(gpu="NVIDIA H100"), backend="py:mine.py:f")  # another backend
    _run(store, "x4", 4, _info(gpu="NVIDIA H100", kind="ab"), backend="ab")
    store.close()
    site = build_site(Queries.open(db), tmp_path / "site", workers=1)
    assert site.compares == 0 and site.pairings == () and not list(site.directory.glob("compare-*"))
    assert "<h2>Comparisons</h2>" not in (site.directory / "index.html").read_text()


def test_group_page_merges_the_shards_into_one_sweep(planted):
    client = TestClient(create_app(Queries.open(planted)))
    runs = {r["id"]: r for r in page_data(client.get("/").text)["runs"]}
    assert (runs["n-0"]["run_group"], runs["n-0"]["shard"], runs["n-0"]["group_href"]) == ("nightly", "0/2",
                                                                                         "/group/nightly")
    assert runs["t1"]["run_group"] is None and runs["t1"]["group_href"] is None
    r = client.get("/group/nightly")
    assert r.status_code == 200
    data = page_data(r.text)
    with Store(planted, read_only=True) as store:
        doc = group_document(store, "nightly")
    assert [x["index"] for x in data["rows"]] == [row["case_index"] for row in doc["rows"]] == list(range(6))
    assert [x["status"] for x in data["rows"]] == [row["status"] for row in doc["rows"]]
    assert [(x["run"], x["shard"]) for x in data["rows"]] == [("n-0", "0/2")] * 3 + [("n-1", "1/2")] * 3
    assert data["run"]["counts"] == {"ok": 4, "unsupported": 0, "error": 1, "missing": 1} and data["run"]["rows"] == 6
    assert [s["id"] for s in data["shards"]] == ["n-0", "n-1"]
    assert data["run"]["gpu"] == "NVIDIA H100, NVIDIA H200"
    assert client.get("/group/nope").status_code == 404
    assert client.get("/group/" + "x" * 300).status_code == 400
