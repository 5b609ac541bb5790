"""A/B: a planted host cost must be found at its size; identical sides must not differ."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from operatorx.measure.host_time import HostTimeSettings
from operatorx.run.ab import ABSettings, run_ab_case
from operatorx.run.ab_spec import parse_side
from operatorx.run.ab_stats import paired_difference
from operatorx.spec import Case

PLANTED_US = 5.0
VARIANTS = textwrap.dedent('''
    import time
    import torch.nn.functional as F
    from operatorx.backends.py_file import gemm_inputs

    _operands = {}       # one set for every side: operands of their own spread identical sides wider (§35)

    def variant(case, device, spin_us=0.0, scale=1.0):
        x = _operands.setdefault(device, gemm_inputs(case, device))    # (gemm_inputs hands the check its copy)
        a, b = x["a"], x["b"]
        spin_ns, now = int(spin_us * 1000), time.perf_counter_ns

        def call():
            if spin_ns:                      # the planted host cost: a busy-wait on the host clock
                end = now() + spin_ns
                while now() < end:
                    pass
            out = F.linear(a, b)
            return out * scale if scale != 1.0 else out
        return call

    def unchecked(case, device, scale=1.0):
        import torch
        gen = torch.Generator().manual_seed(0)           # its own inputs: no reference, no check
        a, b = torch.randn(1, 64, generator=gen), torch.randn(64, 64, generator=gen)
        return lambda: F.linear(a, b) * scale
''')
# fp32, tiny: F.linear costs a few µs on any CPU, so the planted 5 µs dominates nothing but itself
CASE = Case.model_validate({"type": "gemm", "sources": ["test/ab"], "args": {
    "m": 1, "n": 64, "k": 64, "a": {"dtype": "fp32"}, "b": {"dtype": "fp32"}, "out": "fp32"}})
# enough paired batches that a 2-core CI machine's preemptions stay outliers
SETTINGS = ABSettings(host=HostTimeSettings(batches=41, batch_calls=200))


def _at_its_size(found_us: float) -> bool:
    """The planted cost is the 5 µs wait plus the wait loop's own cost: its clock reads (0.1-0.5 µs
    each on a VM) and the last one's overshoot, so it reads up to ~16% more on a slow CI machine
    (seen: 5.79 µs), and noise can read it a little less."""
    return -0.15 * PLANTED_US < found_us - PLANTED_US < 0.3 * PLANTED_US


@pytest.fixture
def variants(tmp_path: Path) -> str:
    p = tmp_path / "variants.py"
    p.write_text(VARIANTS)
    return f"py:{p}:variant"


def test_a_planted_host_cost_is_found_at_its_size(variants: str) -> None:
    r = run_ab_case(CASE, parse_side(variants), parse_side(f"{variants}[spin_us={PLANTED_US}]"), "cpu", SETTINGS)
    assert r.status == "ok", r.message
    h = r.host
    assert h is not None and h["verdict"] == "slower"
    assert _at_its_size(h["diff_us"]), h
    assert h["ci_low_us"] > 0 and h["pairs"] == 41 - h["rounds_dropped"] >= 35   # contended rounds are dropped
    assert r.outputs == {"result": "bitwise"}            # the wait changes time, not the result
    assert r.device is None                              # CPU: no separate device clock, and it says so


def test_the_planted_cost_is_found_when_it_sits_on_side_a(variants: str) -> None:
    r = run_ab_case(CASE, parse_side(f"{variants}[spin_us={PLANTED_US}]"), parse_side(variants), "cpu", SETTINGS)
    assert r.host is not None and r.host["verdict"] == "faster"
    assert _at_its_size(-r.host["diff_us"]), r.host


def test_identical_sides_do_not_differ(variants: str) -> None:
    """Both sides call the same code on the same operands: with operands of their own, identical sides'
    differences spread wider under other load (up to 6.1% against 4.6%), and two A/Bs read `slower` by just
    past the 5% band (docs/benchmarks.md §35). Judged at 99%: a bias of the method (one side always timed
    first, say) still shows in 41 pairs, and a chance miss of zero is rarer than at 95%."""
    settings = ABSettings(host=SETTINGS.host, same_within_rel=0.05, confidence=0.99)
    r = run_ab_case(CASE, parse_side(variants), parse_side(f"{variants}[spin_us=0]"), "cpu", settings)
    assert r.host is not None and abs(r.host["diff_us"]) < 0.5
    assert r.host["verdict"] in ("same", "inconclusive"), r.host


def test_different_outputs_are_reported(variants: str) -> None:
    unchecked = variants.replace(":variant", ":unchecked")
    r = run_ab_case(CASE, parse_side(unchecked), parse_side(f"{unchecked}[scale=1.5]"), "cpu",
                    ABSettings(host=HostTimeSettings(batches=3, batch_calls=5)))
    assert r.status == "ok" and r.sides["a"]["check"]["checked"] is False
    assert r.outputs is not None and r.outputs["result"] == "different" and r.outputs["rel_error"] > 0.4


def test_a_side_that_fails_its_check_is_not_timed(variants: str) -> None:
    r = run_ab_case(CASE, parse_side(variants), parse_side(f"{variants}[scale=1.5]"), "cpu", SETTINGS)
    assert r.status == "error" and "b: wrong result" in (r.message or "") and r.host is None


def test_torch_against_user_code_on_the_same_inputs_is_bitwise(variants: str) -> None:
    r = run_ab_case(CASE, parse_side("torch"), parse_side(variants), "cpu",
                    ABSettings(host=HostTimeSettings(batches=3, batch_calls=5)))
    assert r.status == "ok" and r.outputs == {"result": "bitwise"}


def test_set_default_device_on_one_side_is_warned_and_costs_host_time() -> None:
    r = run_ab_case(CASE, parse_side("torch"), parse_side("torch[default_device=cpu]"), "cpu", SETTINGS)
    assert r.host is not None
    assert "b" in r.host["warnings"] and "a" not in r.host["warnings"]
    assert r.host["verdict"] == "slower"                 # the mode intercepts every torch call
    import torch

    assert torch.get_default_device() == torch.device("cpu") and not r.host["warnings"].get("a")


def test_unknown_settings_and_backends_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown setting"):
        parse_side("torch[turbo=1]")
    with pytest.raises(ValueError, match="no backend"):
        parse_side("nosuch")


def test_unsupported_side_makes_an_unsupported_result(variants: str) -> None:
    fp8 = Case.model_validate({"type": "gemm", "sources": ["t/x"], "args": {
        "m": 1, "n": 128, "k": 128, "out": "bf16",
        "a": {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": False, "group": [1, 128]}},
        "b": {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": True, "group": [128, 128]}}}})
    r = run_ab_case(fp8, parse_side("torch"), parse_side(variants), "cpu", SETTINGS)
    assert r.status == "unsupported" and "a: fp8 on CPU" in (r.message or "")


def test_too_few_pairs_never_give_a_verdict() -> None:
    for n in (1, 2, 3, 5):
        d = paired_difference([10.0] * n, [13.0 + i for i in range(n)])
        assert d.verdict == "inconclusive", (n, d)
    assert paired_difference([10.0] * 6, [13.0 + i for i in range(6)]).verdict == "slower"


def test_a_resolved_difference_that_may_exceed_the_band_is_inconclusive() -> None:
    rng = np.random.default_rng(1)
    a = 100 + rng.normal(0, 0.01, 31)
    # differences whose median (0.9 µs) is inside the 1% band (1 µs) but whose interval reaches past it
    d = paired_difference(a, a + np.linspace(0.1, 1.7, 31), same_within_rel=0.01)
    assert 0 < d.ci_low_us and d.diff_us < 1.0 < d.ci_high_us, d
    assert d.verdict == "inconclusive"
    tight = paired_difference(a, a + 0.5 + rng.normal(0, 0.05, 31), same_within_rel=0.01)
    assert tight.verdict == "same", tight


def test_paired_difference_finds_a_shift_and_not_noise() -> None:
    rng = np.random.default_rng(0)
    a = 10 + rng.normal(0, 0.3, 31)
    shifted = paired_difference(a, a + 2 + rng.normal(0, 0.3, 31))
    assert shifted.verdict == "slower" and shifted.ci_low_us < 2 < shifted.ci_high_us
    same = paired_difference(a, a + rng.normal(0, 0.01, 31), same_within_rel=0.01)
    assert same.verdict == "same" and same.ci_low_us < 0 < same.ci_high_us
    noisy = paired_difference(a, a + rng.normal(0, 3, 31))
    assert noisy.verdict == "inconclusive"


def test_cli_ab_runs_stores_a_run_and_writes_json(tmp_path: Path, variants: str) -> None:
    from typer.testing import CliRunner

    from operatorx.cli import app
    from operatorx.store import Store

    tl = tmp_path / "tl.json"
    tl.write_text(json.dumps([CASE.to_json()]))
    out, db = tmp_path / "ab.json", str(tmp_path / "ox.db")
    res = CliRunner().invoke(app, ["ab", "--a", variants, "--b", f"{variants}[spin_us=3]", "-t", str(tl),
                                   "--device", "cpu", "--batches", "9", "--batch-calls", "50", "--json", str(out),
                                   "--db", db, "--results-dir", str(tmp_path / "res")])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["results"][0]["host"]["verdict"] == "slower" and "spin_us=3" in res.output
    stored = Store(db).document("latest")
    assert stored["run"]["kind"] == "ab" and stored["run"]["b"].endswith("[spin_us=3]")
    assert stored["rows"][0]["metrics"]["ab"]["host"]["verdict"] == "slower"
    assert (tmp_path / "res" / f"{stored['run']['id']}.json").exists()
    shown = CliRunner().invoke(app, ["results", "show", "latest", "--db", db])
    assert shown.exit_code == 0 and "slower" in shown.output and "host B−A" in shown.output
    md = CliRunner().invoke(app, ["results", "show", "latest", "--db", db, "--markdown"])
    assert md.exit_code == 0 and "| slower |" in md.output
    csv = CliRunner().invoke(app, ["results", "export", "latest", "--format", "csv", "--db", db])
    assert csv.exit_code == 0 and csv.output.startswith("case_index,")


@pytest.mark.gpu
def test_cuda_ab_gives_host_and_device_differences() -> None:
    case = Case.model_validate({"type": "gemm", "sources": ["t/x"], "args": {
        "m": 1, "n": 7168, "k": 2048, "a": {"dtype": "bf16"}, "b": {"dtype": "bf16"}, "out": "bf16"}})
    r = run_ab_case(case, parse_side("torch"), parse_side("torch[default_device=cuda]"), "cuda",
                    ABSettings(host=HostTimeSettings(batches=15, batch_calls=200)))
    assert r.status == "ok", r.message
    assert r.host is not None and r.device is not None
    assert r.outputs is not None and r.outputs["result"] in ("bitwise", "within_tolerance")
    # the default-device mode costs host time: slower, or held back only by a condition the row names
    host = r.host
    assert host["verdict"] == "slower" or (host.get("numbers_verdict") == "slower" and host.get("verdict_why")), \
        {k: host.get(k) for k in ("verdict", "numbers_verdict", "verdict_why", "diff_us", "ci_low_us", "ci_high_us",
                                  "a_us", "conditions")}
    assert len(r.device["round_median_us"]["a"]) == 15 and r.device["a_us"] > 0
    # the rows say which timer ran (kernels mode by default), not a fixed label
    assert r.device["method"].startswith("cupti_kernels") and r.device["l2_state"] == "cold_clean"
