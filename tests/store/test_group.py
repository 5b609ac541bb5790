"""A sweep's shards, stored as runs of one run group, read back as one document."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from operatorx.cli import app
from tests.conftest import gemm


def test_the_shards_of_a_group_merge_into_the_whole_list(tmp_path, write_testlist):
    cases = [gemm(m=m, n=64, k=64, a={"dtype": "fp32"}, b={"dtype": "fp32"}, out="fp32") for m in range(1, 9)]
    tl = write_testlist(cases)
    db = str(tmp_path / "ox.db")
    runner = CliRunner()
    common = ["run", "-t", str(tl), "--device", "cpu", "--db", db, "--results-dir", str(tmp_path / "res"),
              "--executor", "inline", "--min-samples", "3", "--warmup-calls", "1", "--max-time", "0",
              "--run-group", "nightly"]
    per_shard = []
    for i in range(2):                          # two runs may start in the same second: name them
        done = runner.invoke(app, [*common, "--shard", f"{i}/2", "--run-id", f"nightly-{i}"])
        assert done.exit_code == 0, done.output
        exported = runner.invoke(app, ["results", "export", f"nightly-{i}", "--db", db])
        per_shard.append({r["op"]["args"]["m"] for r in json.loads(exported.output)["rows"]})
    assert per_shard[0] and per_shard[1] and not (per_shard[0] & per_shard[1])
    merged = runner.invoke(app, ["results", "export", "group:nightly", "--db", db])
    assert merged.exit_code == 0, merged.output
    doc = json.loads(merged.output)
    assert sorted(r["op"]["args"]["m"] for r in doc["rows"]) == list(range(1, 9))
    assert {r["status"] for r in doc["rows"]} == {"ok"}
    assert len(doc["run"]["runs"]) == 2 and doc["run"]["state"] == "finished"
    shown = runner.invoke(app, ["results", "show", "group:nightly", "--db", db])
    assert shown.exit_code == 0 and "8x64x64" in shown.output
    missing = runner.invoke(app, ["results", "show", "group:nope", "--db", db])
    assert missing.exit_code == 1 and "no run group 'nope'" in missing.output


def test_export_to_a_path_it_cannot_write_is_one_line(tmp_path, write_testlist):
    db = str(tmp_path / "ox.db")
    runner = CliRunner()
    tl = write_testlist([gemm(m=2, n=64, k=64, a={"dtype": "fp32"}, b={"dtype": "fp32"}, out="fp32")])
    assert runner.invoke(app, ["run", "-t", str(tl), "--device", "cpu", "--db", db, "--executor", "inline",
                               "--results-dir", str(tmp_path / "res"), "--max-time", "0"]).exit_code == 0
    for target in (tmp_path / "missing" / "x.json", tmp_path):
        done = runner.invoke(app, ["results", "export", "latest", "--db", db, "-o", str(target)])
        assert done.exit_code == 2 and "cannot write there" in done.output and "Traceback" not in done.output
