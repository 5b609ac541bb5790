"""The Model page (web/model.py) over runs planted in a real SQLite store from scenario files that
`operatorx testlist serving` wrote for a small catalog model (Qwen3-30B-A3B: attention, MoE, 48 layers):
its step totals, op-class shares and layer boxes equal what `operatorx estimate --json` prints for the
same run and file, for one run and for two (TP2 on an H200 against DP2·EP2 on a B200, two backends);
a run with no scenario cases and a bad run id; and the page in Chromium without a console error."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from operatorx.cli import app as cli
from operatorx.result import Row
from operatorx.spec import Case
from operatorx.spec.testlist import load_testlist, merge_cases
from operatorx.store import Store
from operatorx.web import Queries
from operatorx.web.app import create_app
from operatorx.web.model import layer_kind
from tests.conftest import gemm
from tests.web.conftest import page_data, serving, watched_page

MODEL = "Qwen/Qwen3-30B-A3B-Base"
TP2 = ["--isl", "1024", "--osl", "128", "--conc", "8", "--tp", "2"]
DP2_EP2 = ["--isl", "1024", "--osl", "128", "--conc", "8", "--dp", "2", "--ep", "2"]
TP2_URL = "model=Qwen3-30B-A3B-Base&isl=1024&osl=128&conc=8&tp=2"
runner = CliRunner()


def _write_scenario(tmp: Path, name: str, flags: list[str]) -> Path:
    out = tmp / f"{name}.json"
    r = runner.invoke(cli, ["testlist", "serving", "--model", MODEL, *flags, "-o", str(out)])
    assert r.exit_code == 0, r.output
    return out


def _latency(i: int, case: Case) -> float:
    """A planted latency per case: distinct, so a part summed into the wrong line changes a total."""
    return round(1.5 + 0.25 * i + (3.0 if case.type == "moe" else 0.0), 2)


def _plant(store: Store, rid: str, day: int, gpu: str, backend: str, scenario: Path,
           not_ok: Callable[[Case], Optional[tuple[str, str]]], drop: set[str]) -> None:
    """A run of the scenario file as a run stores it: cases merged by key (decode and prefill share
    some), each an ok row with `_latency` unless `not_ok` gives it a status and reason, or `drop` (by
    role) leaves it out of the run."""
    cases = [c for c in merge_cases(load_testlist(str(scenario)))
             if not {s.rsplit("/", 1)[1] for s in c.sources} & drop]
    info: dict[str, Any] = {"device": {"kind": "cuda", "name": gpu}}
    store.begin_run(rid, f"2026-12-{day:02d}T00:00:00+00:00", str(scenario.name), backend, "cuda", info,
                    [Row.missing(c, backend, scenario.name, i) for i, c in enumerate(cases)])
    for i, c in enumerate(cases):
        hit = not_ok(c)
        if hit:
            status, why = hit
            store.put_row(rid, Row(case=c, backend=backend, status=status, testlist=scenario.name, case_index=i,
                                   message=why, error_kind="exception" if status == "error" else None))
            continue
        v = _latency(i, c)
        store.put_row(rid, Row(case=c, backend=backend, status="ok", testlist=scenario.name, case_index=i,
                               metrics={"latency_us": v, "samples_us": [v] * 3, "scheme": "bf16"}))
    store.finish_run(rid, f"2026-12-{day:02d}T01:00:00+00:00")


class Planted:
    def __init__(self, db: str, tp2: Path, dp2: Path):
        self.db, self.tp2, self.dp2 = db, tp2, dp2


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Planted:
    tmp = tmp_path_factory.mktemp("model")
    tp2, dp2 = _write_scenario(tmp, "tp2", TP2), _write_scenario(tmp, "dp2ep2", DP2_EP2)
    db = str(tmp / "model.db")
    store = Store(db)
    # TP2 on an H200: the prefill attention unsupported (its GEMM roles time it), the logits' gather not run
    _plant(store, "h200-tp2", 1, "NVIDIA H200", "vllm", tp2,
           lambda c: ("unsupported", "no prefill gqa kernel here") if c.type == "gqa" and c.step == "prefill"
           else None, {"lm_head:all_gather"})
    _plant(store, "b200-dp2", 2, "NVIDIA B200", "torch", dp2, lambda c: None, set())
    # a run of a plain testlist: its rows cite no catalog checkpoint
    plain = Case.model_validate({**gemm(m=8), "sources": ["org/not-in-catalog/q_proj"]})
    store.begin_run("plain", "2026-12-03T00:00:00+00:00", "plain", "torch", "cuda", {"device": {"kind": "cuda"}},
                    [Row.missing(plain, "torch", "plain", 0)])
    store.put_row("plain", Row(case=plain, backend="torch", status="ok", testlist="plain", case_index=0,
                               metrics={"latency_us": 2.0, "samples_us": [2.0] * 3}))
    store.finish_run("plain", "2026-12-03T01:00:00+00:00")
    store.close()
    return Planted(db, tp2, dp2)


@pytest.fixture(scope="module")
def client(planted: Planted) -> TestClient:
    return TestClient(create_app(Queries.open(planted.db)))


def _cli_estimate(planted: Planted, run: str, scenario: Path) -> dict[str, Any]:
    r = runner.invoke(cli, ["estimate", run, "--scenario", str(scenario), "--db", planted.db, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)  # type: ignore[no-any-return]


def _check_side(side: dict[str, Any], want: dict[str, Any]) -> None:
    """The page's side of a run against `operatorx estimate --json` of the same run and file."""
    est = side["estimate"]
    assert [s["step"] for s in est["steps"]] == [s["step"] for s in want["steps"]] == ["decode", "prefill"]
    for got, exp in zip(est["steps"], want["steps"], strict=True):
        # the same sum, so the same floats: exactly equal, not close
        assert got["time_us"] == exp["time_us"] and got["time_us"] > 0
        assert [(c["name"], c["time_us"], c["share"]) for c in got["by_class"]] == [
            (c["name"], c["time_us"], c["share"]) for c in exp["by_class"]]
        assert [(c["name"], c["time_us"], c["share"]) for c in got["by_role"]] == [
            (c["name"], c["time_us"], c["share"]) for c in exp["by_role"]]
        assert [(u["label"], u["status"], u["count"]) for u in got["unmeasured"]] == [
            (u["label"], u["status"], u["count"]) for u in exp["unmeasured"]]
        assert got["tokens"] == exp["tokens"]
    # the boxes: every by-role part in exactly one box, in its layer kind's; per step the boxes sum to the step
    for i, exp in enumerate(want["steps"]):
        lines = {line["name"]: (box["kind"], line["cells"][i]) for box in side["boxes"] for line in box["lines"]}
        for part in exp["by_role"]:
            kind, cell = lines[part["name"]]
            assert kind == " + ".join(dict.fromkeys(layer_kind(r) for r in part["name"].split(" + ")))
            assert cell["time_us"] == pytest.approx(part["time_us"]) and cell["share"] == pytest.approx(part["share"])
        assert math.fsum(b["time_us"][i] for b in side["boxes"]) == pytest.approx(exp["time_us"])


def test_one_run_matches_estimate(planted, client):
    r = client.get(f"/model?run=h200-tp2&{TP2_URL}")
    assert r.status_code == 200, r.text
    data = page_data(r.text)
    side = data["runs"][0]
    want = _cli_estimate(planted, "h200-tp2", planted.tp2)
    _check_side(side, want)
    decode, prefill = side["estimate"]["steps"]
    # hand-computed from the planted rows: decode times the attention case (its qkv and o_proj GEMMs
    # inside it), prefill's attention is unsupported so its GEMM roles are timed instead; the logits'
    # gather is not in the run, in both steps
    assert [(a["module"], a["used"]) for a in decode["attention"]] == [("self_attn", "attention case")]
    assert [(a["module"], a["used"]) for a in prefill["attention"]] == [("self_attn", "gemm roles")]
    rows = {c.key(): _latency(i, c) for i, c in enumerate(
        c for c in merge_cases(load_testlist(str(planted.tp2))) if "lm_head:all_gather" not in c.sources[0])}
    expect = {s: 0.0 for s in ("decode", "prefill")}
    for c in load_testlist(str(planted.tp2)):
        role = c.sources[0].rsplit("/", 1)[1]
        if role == "lm_head:all_gather" or (c.step == "prefill" and role == "self_attn") or \
                (c.step == "decode" and role in ("self_attn.qkv_proj", "self_attn.o_proj")):
            continue
        expect[str(c.step)] += (c.count or 0) * rows[c.key()]
    assert decode["time_us"] == pytest.approx(expect["decode"])
    assert prefill["time_us"] == pytest.approx(expect["prefill"])
    # the page says which part is not measured and why, never a 0
    head = {line["name"]: line["cells"] for box in side["boxes"] for line in box["lines"]}
    assert head["lm_head:all_gather"][0] == {"time_us": None, "share": None, "inside": None,
                                             "not_measured": ["not measured (not in run), count 1"]}
    attn = head["self_attn"]
    assert attn[0]["time_us"] == pytest.approx(48 * rows[next(c.key() for c in load_testlist(str(planted.tp2))
                                                              if c.type == "gqa" and c.step == "decode")])
    assert attn[1]["time_us"] is None and attn[1]["not_measured"] == [
        "not measured (unsupported: no prefill gqa kernel here), count 48"]
    # decode times qkv_proj inside the attention case (no time of its own there); prefill times it
    assert head["self_attn.qkv_proj"][0] == {"time_us": None, "share": None, "not_measured": [], "inside": "self_attn"}
    assert head["self_attn.qkv_proj"][1]["time_us"] > 0 and head["self_attn.qkv_proj"][1]["inside"] is None
    boxes = {b["kind"]: b for b in side["boxes"]}
    assert list(boxes) == ["attention", "MoE", "LM head"]
    assert (boxes["attention"]["layers"], boxes["MoE"]["layers"], boxes["LM head"]["layers"]) == (48, 48, None)
    assert {line["name"] for line in boxes["MoE"]["lines"]} == {"mlp.experts", "mlp.gate"}
    assert side["held"] == side["ops"] - 1 and side["message"] is None
    assert data["steps"] == ["decode", "prefill"]


def test_two_runs_side_by_side_each_its_scenario(planted, client):
    url = ("/model?run=h200-tp2&run=b200-dp2&model=Qwen3-30B-A3B-Base&isl=1024&osl=128&conc=8"
           "&tp=2&tp=1&dp=1&dp=2&ep=1&ep=2")
    data = page_data(client.get(url).text)
    tp2, dp2 = data["runs"]
    assert (tp2["name"], dp2["name"]) == ("NVIDIA H200 · vllm", "NVIDIA B200 · torch")
    assert (tp2["facts"]["tp"], dp2["facts"]["dp"], dp2["facts"]["ep"]) == (2, 2, 2)
    _check_side(tp2, _cli_estimate(planted, "h200-tp2", planted.tp2))
    want = _cli_estimate(planted, "b200-dp2", planted.dp2)
    _check_side(dp2, want)
    # DP2·EP2: every op ok, tp 1 so no collective; tokens/s per GPU over the whole step
    decode = dp2["estimate"]["steps"][0]
    assert decode["unmeasured"] == [] and "collective" not in {c["name"] for c in decode["by_class"]}
    assert decode["tokens"]["tokens_per_s_per_gpu"] == pytest.approx(4 / 1 / (decode["time_us"] * 1e-6))
    assert set(data["classes"]) == {"gemm", "moe", "attention", "collective"}


def test_no_scenario_cases_and_bad_input(client):
    html = client.get("/model?run=plain").text
    assert "run plain holds no scenario cases: its rows cite no catalog checkpoint" in html
    off = page_data(client.get(f"/model?run=plain&{TP2_URL}").text)["runs"][0]
    assert off["estimate"] is None and off["held"] == 0
    assert off["message"].startswith("run plain holds none of the 14 ops of this scenario")
    form = client.get("/model?run=h200-tp2")                   # no facts: the form, the model offered
    assert form.status_code == 200 and f'<option value="{MODEL}">bf16</option>' in form.text
    assert client.get(f"/model?run=nope&{TP2_URL}").status_code == 404
    assert client.get("/model?run=h200-tp2&model=Qwen3-30B-A3B-Base&isl=1024&osl=128").status_code == 400
    bad = client.get("/model?run=h200-tp2&model=Qwen3-30B-A3B-Base&isl=1024&osl=128&conc=8&tp=2&tp=1&tp=4")
    assert bad.status_code == 400 and "tp: 3 values for 1 runs" in bad.text
    assert client.get("/model?run=h200-tp2&model=nope&isl=1&osl=1&conc=1").status_code == 400
    assert client.get("/model?" + "&".join(["run=h200-tp2"] * 5)).status_code == 400
    assert client.get("/model").status_code == 200             # the picker


def test_run_page_links_the_model_page(client):
    assert 'id="model-link" href="/model?run=h200-tp2"' in client.get("/run/h200-tp2").text
    assert 'id="model-link"' not in client.get("/run/plain").text
    assert 'href="/model"' in client.get("/").text             # the nav


def test_model_page_in_a_browser(browser, client, planted):
    with serving(planted.db) as url:
        want = [_cli_estimate(planted, "h200-tp2", planted.tp2), _cli_estimate(planted, "b200-dp2", planted.dp2)]
        with watched_page(browser, 1400, 900) as pg:
            pg.goto(f"{url}/run/h200-tp2")
            pg.click("#model-link")
            pg.fill("fieldset[data-slot='0'] input[name='isl']", "1024")
            pg.fill("fieldset[data-slot='0'] input[name='osl']", "128")
            pg.fill("fieldset[data-slot='0'] input[name='conc']", "8")
            pg.fill("fieldset[data-slot='0'] input[name='tp']", "2")
            pg.click("#add-run")
            pg.select_option("fieldset[data-slot='1'] select[name='run']", "b200-dp2")
            pg.fill("fieldset[data-slot='1'] input[name='tp']", "1")
            pg.fill("fieldset[data-slot='1'] input[name='dp']", "2")
            pg.fill("fieldset[data-slot='1'] input[name='ep']", "2")
            pg.fill("fieldset[data-slot='0'] input[name='dp']", "1")
            pg.fill("fieldset[data-slot='0'] input[name='ep']", "1")
            pg.click("#model-form button[type='submit']")
            pg.wait_for_selector("#plot-steps[data-drawn='1']")
            # four bars (two steps × two runs) on one axis, a segment per op class the step has (13 of
            # 4 classes × 4 bars: DP2·EP2 has no collective, and plotly keeps an empty point for those)
            segments = sum(len(s["by_class"]) for w in want for s in w["steps"])
            assert pg.get_attribute("#plot-steps", "data-points") == str(segments) == "13"
            assert pg.locator("#plot-steps .bars .point").count() == 4 * 4
            assert pg.locator("#plot-steps .xtick").count() == 4
            for i, w in enumerate(want):
                for s in w["steps"]:
                    shown = pg.get_attribute(f"#model-run-{i} .step-total[data-step='{s['step']}']", "data-time-us")
                    assert float(shown or "nan") == pytest.approx(s["time_us"])
            assert pg.locator("#model-run-0 .layer-box").count() == 3
            assert "no prefill gqa kernel here" in pg.inner_text("#model-run-0 .layer-box[data-kind='attention']")
