"""The typed row: exact document round trip, identity, computed rates, and docs/metrics.md from the model."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from operatorx.backends import Check, Prepared, register_backend
from operatorx.report.metrics_doc import DOC_PATH, metrics_markdown
from operatorx.result import (
    CheckResult,
    Measured,
    Peak,
    Rates,
    Row,
    Summary,
    TimingInfo,
    Warmup,
    compute_rates,
    json_safe,
)
from operatorx.result_parts import bound_by
from operatorx.spec import Case

GEMM = Case.model_validate({"type": "gemm", "args": {"m": 1000, "n": 1000, "k": 500, "a": {"dtype": "bf16"},
                                                     "b": {"dtype": "bf16"}, "out": "bf16"},
                            "sources": ["org/model/mlp.down_proj"]})
H200_LIKE = Peak(compute_class="bf16", tflops=1000.0, memory_gbps=5000.0, source="test")


def ok_row(**over) -> Row:
    samples = [10.0, 10.2, 9.9, 10.1, 10.0, 10.05, 9.95]
    fields = dict(
        case=GEMM, backend="torch", status="ok", testlist="t", case_index=4, scheme="bf16",
        measured=Measured(latency_us=10.0, busy_us=8.0, method="cupti_kernels", clock="device", l2_state="cold_clean",
                          l2_verified=True, noise=0.004, summary_us=Summary(median=10.0, n=7, median_noise=0.004),
                          samples_us=samples, warmup=Warmup(calls=5, seconds=0.01), stop_reason="noise_target",
                          timing=TimingInfo.model_validate({"mode": "kernels", "batches": 2, "flush_launch": "graph"})),
        rates=compute_rates(GEMM.flops(), GEMM.min_bytes(), 10.0, H200_LIKE),
        check=CheckResult(rel_error=0.001, bound=0.01, rows_checked=8, reference="fp32 matmul", ok=True),
        extra={"dtype": "torch.bfloat16"},
    )
    fields.update(over)
    return Row(**fields)


# --- the document round trip --------------------------------------------------------------------

def test_to_json_from_json_is_an_exact_round_trip():
    row = ok_row(side="B")
    doc = row.to_json()
    back = Row.from_json(json.loads(json.dumps(doc, allow_nan=False)))
    assert back == row
    assert back.to_json() == doc
    assert back.case.sources == row.case.sources


def test_the_document_keeps_todays_keys_and_adds_side_and_error_kind():
    doc = ok_row().to_json()
    assert set(doc) == {"op", "label", "status", "testlist", "case_index", "side", "error_kind", "metrics"}
    assert doc["op"] == {"type": "gemm", "args": GEMM.args_dict(), "backend": "torch",
                         "sources": ["org/model/mlp.down_proj"]}
    m = doc["metrics"]
    assert m["latency_us"] == 10.0 and m["busy_us"] == 8.0 and m["backend_meta"] == {"dtype": "torch.bfloat16"}
    assert m["timing"]["flush_launch"] == "graph"            # open parts keep what the timer added
    assert m["summary_us"] == {"median": 10.0, "n": 7, "median_noise": 0.004}   # only what was given


def test_a_document_from_elsewhere_round_trips_unknown_keys_and_nulls():
    doc = ok_row().to_json()
    doc["metrics"]["from_the_future"] = {"x": 1}
    doc["metrics"]["l2_verified"] = None
    doc["metrics"]["counters"] = {"duration_us": 9.1, "tool": "ncu"}
    doc["message"] = "kept"
    row = Row.from_json(doc)
    assert row.other == {"from_the_future": {"x": 1}}
    assert row.ran is not None and row.ran.counters == {"duration_us": 9.1, "tool": "ncu"}
    assert row.to_json() == doc


def test_an_older_document_without_side_or_error_kind_reads():
    doc = ok_row().to_json()
    del doc["side"], doc["error_kind"]
    row = Row.from_json(doc)
    assert row.side == "" and row.error_kind is None


def test_the_metrics_constructor_of_older_callers_is_typed():
    row = Row(case=GEMM, backend="x", status="ok", testlist="t", case_index=0,
              metrics={"latency_us": 5.0, "tflops": 1.5, "ab": {"status": "ok"}, "backend_meta": {"k": (1, 2)}})
    assert row.measured is not None and row.measured.latency_us == 5.0
    assert row.rates is not None and row.rates.tflops == 1.5 and row.ab == {"status": "ok"}
    assert row.metrics == {"latency_us": 5.0, "tflops": 1.5, "ab": {"status": "ok"}, "backend_meta": {"k": [1, 2]}}


def test_wrong_types_and_non_finite_numbers_are_refused():
    with pytest.raises(ValidationError):
        Row.from_json({**ok_row().to_json(), "metrics": {"latency_us": "fast"}})
    with pytest.raises(ValidationError):
        Measured(latency_us=float("nan"), samples_us=[])
    with pytest.raises(ValidationError):
        ok_row(status="done")
    with pytest.raises(ValidationError):
        ok_row(status="error", error_kind="sad")


def test_json_safe_turns_what_json_refuses_into_data():
    assert json_safe({(1, 2): float("inf"), "d": object, "l": (1.5, float("nan"))}) == \
        {"(1, 2)": None, "d": str(object), "l": [1.5, None]}
    assert Summary.model_validate(json_safe({"median": 1.0, "median_noise": float("inf")})).median_noise is None


# --- identity -----------------------------------------------------------------------------------

def test_key_is_case_backend_side():
    assert ok_row().key() == (GEMM.key(), "torch", "")
    assert ok_row(side="A").key() != ok_row(side="B").key()


def test_missing_is_a_planned_unfinished_case():
    row = Row.missing(GEMM, "torch", "t", 7, side="A")
    assert (row.status, row.case_index, row.side, row.latency_us, row.metrics) == ("missing", 7, "A", None, {})
    assert Row.from_json(row.to_json()) == row and row.key() == (GEMM.key(), "torch", "A")


# --- computed values ----------------------------------------------------------------------------

def test_one_tflop_at_one_ms_is_one_thousand_tflops_per_second():
    r = compute_rates(10**12, 10**9, 1000.0, None)
    assert r.tflops == pytest.approx(1000.0, rel=1e-12)         # 1e12 FLOP / 1e-3 s = 1e15 FLOP/s
    assert r.gbps == pytest.approx(1000.0, rel=1e-12)           # 1e9 B / 1e-3 s = 1e12 B/s
    assert r.pct_peak is None and r.peak is None


def test_rates_are_exactly_work_over_time_and_pct_peak_takes_the_binding_bound():
    row = ok_row()
    rates = row.rates
    assert isinstance(rates, Rates)
    flops, nbytes = GEMM.flops(), GEMM.min_bytes()
    assert flops == 2 * 1000 * 1000 * 500
    assert rates.tflops == pytest.approx(flops / 10e-6 / 1e12, rel=1e-12)
    assert rates.gbps == pytest.approx(nbytes / 10e-6 / 1e9, rel=1e-12)
    compute, memory = rates.tflops / 1000.0, rates.gbps / 5000.0
    assert rates.pct_peak == pytest.approx(100 * max(compute, memory), rel=1e-12)
    memory_bound = compute_rates(10**6, 10**9, 1000.0, H200_LIKE)        # 1000 GB/s of 5000: 20%
    assert memory_bound.pct_peak == pytest.approx(20.0, rel=1e-12)
    no_compute_peak = compute_rates(10**12, 10**3, 1000.0, Peak(tflops=None, memory_gbps=5000.0, source="t"))
    assert no_compute_peak.pct_peak == pytest.approx(100 * 1e-3 / 5000, rel=1e-9)


def test_an_attention_row_names_the_part_that_bounds_it_at_the_peaks():
    # 1e9 FLOPs at 1000 TFLOP/s: 1 µs; 1e8 bytes at 5000 GB/s: 20 µs: the cache read bounds the call
    parts = {"projection_flops": 10**9, "attention_flops": 10**8, "projection_bytes": 10**7, "cache_bytes": 10**8,
             "state_bytes": 0}
    r = compute_rates(11 * 10**8, 11 * 10**7, 50.0, H200_LIKE, cost_parts=parts)
    assert r.bound_by == "cache_bytes" and r.cost_parts == parts
    prefill = compute_rates(10**11, 10**6, 50.0, H200_LIKE, cost_parts={**parts, "attention_flops": 10**11})
    assert prefill.bound_by == "attention_flops"           # 100 µs of compute against 20 µs of cache
    assert compute_rates(1, 1, 1.0, None, cost_parts=parts).bound_by is None      # no peaks: no verdict
    row = ok_row(rates=r)
    assert row.rates_at("busy").bound_by == "cache_bytes"                 # recomputed at busy time, kept
    assert Row.from_json(row.to_json()).rates == r
    # every attention type splits its count so, and the parts add up to flops() and min_bytes()
    gqa = Case.model_validate({"type": "gqa", "args": {
        "hidden": 4096, "q_heads": 32, "kv_heads": 8, "head_dim": 128, "rope_dim": 128, "rope_theta": 5e5,
        "batch": {"groups": [{"count": 16, "q": 1, "ctx": 8192}]}}, "sources": ["x"]})
    split = gqa.args.cost_parts()
    assert split["projection_flops"] + split["attention_flops"] == gqa.flops()
    assert split["projection_bytes"] + split["cache_bytes"] + split["state_bytes"] == gqa.min_bytes()
    assert bound_by(split, 989.0, 4800.0) == "cache_bytes"     # a 16x8k decode reads 2 GiB of K/V
    assert GEMM.args.cost_parts() is None


def test_a_collective_carries_algbw_and_busbw_as_nccl_tests_defines_them():
    # 8 ranks all_reduce 1 GB in 10 ms: algbw = 1e9 B / 1e-2 s = 100 GB/s, busbw = 100 × 2·7/8 = 175 GB/s
    r = compute_rates(7 * 5 * 10**8, 28 * 10**9, 10_000.0, None, collective_bytes=10**9, bus_factor=2 * 7 / 8)
    assert r.algbw_gbps == pytest.approx(100.0, rel=1e-12) and r.busbw_gbps == pytest.approx(175.0, rel=1e-12)
    assert r.gbps == pytest.approx(2800.0, rel=1e-12) and r.collective_bytes == 10**9
    assert "busbw_gbps" in r.dump() and "busbw_gbps" not in compute_rates(1, 1, 1.0, None).dump()
    row = ok_row(rates=r)                                                # busy 8 µs: the rates at busy time
    assert row.rates_at("busy").busbw_gbps == pytest.approx(10**9 / 8e-6 / 1e9 * 2 * 7 / 8, rel=1e-12)
    assert Row.from_json(row.to_json()).rates == r                       # the stored document keeps them


def test_a_planted_thousandfold_error_fails_the_rate_tests(monkeypatch):
    import sys

    real = compute_rates

    def planted(flops, min_bytes, time_us, peak):
        r = real(flops, min_bytes, time_us, peak)
        return r.model_copy(update={"tflops": r.tflops * 1000, "gbps": r.gbps * 1000})

    monkeypatch.setattr(sys.modules[__name__], "compute_rates", planted)
    for test in (test_one_tflop_at_one_ms_is_one_thousand_tflops_per_second,
                 test_rates_are_exactly_work_over_time_and_pct_peak_takes_the_binding_bound):
        with pytest.raises(AssertionError):
            test()


# --- the row run/case.py builds -----------------------------------------------------------------

class _FixedTimer:
    """Every call takes exactly 1000 µs of span and 800 µs of busy time."""

    method = "fixed_for_test"
    flusher = None

    def measure(self, fn, pause_s=0.0, give_up=None):
        from operatorx.measure import Measurement
        from operatorx.measure.record import TimerRecord
        from operatorx.measure.stats import summarize

        fn()
        samples = [1000.0] * 12
        return Measurement(method=self.method, clock="device", samples_us=samples, summary=summarize(samples),
                           warmup_calls=1, warmup_s=0.0, stop_reason="noise_target",
                           details=TimerRecord(busy_us_median=800.0, busy_samples_us=[800.0] * 12, l2_state="warm",
                                               spin=False))


def _runner(backend: str = "torch"):
    from operatorx.measure import Telemetry, TimingSettings
    from operatorx.platform import DeviceInfo, Peaks
    from operatorx.run.case import CaseRunner
    from operatorx.run.config import RunConfig

    config = RunConfig(testlist="t", backend=backend, device="cpu", timing=TimingSettings(throttle_retries=0))
    peaks = Peaks({"bf16": 1000.0}, 5000.0, "test peaks")
    return CaseRunner(config=config, device=DeviceInfo(kind="cpu", name="test cpu"), timer=_FixedTimer(),
                      telemetry=Telemetry(None), peaks=peaks, testlist="t")


def test_the_case_runner_builds_exact_rates_and_busy_from_the_timer():
    case = Case.model_validate({"type": "gemm", "args": {"m": 8, "n": 64, "k": 32, "a": {"dtype": "bf16"},
                                                         "b": {"dtype": "bf16"}, "out": "bf16"}})
    row = _runner().run(case, 3)
    assert row.status == "ok" and row.error_kind is None, row.message
    assert row.latency_us == 1000.0 and row.busy_us == 800.0 and row.gaps_us == 200.0
    assert row.measured is not None and row.measured.busy_samples_us == [800.0] * 12
    assert row.measured.timing is not None and "busy_samples_us" not in row.metrics["timing"]
    flops, nbytes = 2 * 8 * 64 * 32, case.min_bytes()
    m = row.metrics
    assert m["flops"] == flops and m["min_bytes"] == nbytes
    assert m["tflops"] == flops / 1e-3 / 1e12                  # FLOP per second, in TFLOP/s: exactly
    assert m["gbps"] == nbytes / 1e-3 / 1e9
    assert m["pct_peak"] == pytest.approx(100 * max(m["tflops"] / 1000.0, m["gbps"] / 5000.0), rel=1e-12)
    assert m["peak"] == {"compute_class": "bf16", "tflops": 1000.0, "memory_gbps": 5000.0, "source": "test peaks"}
    assert m["worker"] == {"kind": "cpu", "name": "test cpu", "uuid": None, "pci_bus_id": None, "index": None}
    assert m["scheme"] == "bf16" and m["check"]["ok"] is True and m["case_seconds"]["total"] > 0
    assert Row.from_json(json.loads(json.dumps(row.to_json(), allow_nan=False))) == row
    assert "launch_gap_us" not in m["timing"]                  # no level read: none written


def test_every_row_carries_its_workers_launch_gap_level():
    from dataclasses import replace

    case = Case.model_validate({"type": "gemm", "args": {"m": 8, "n": 64, "k": 32, "a": {"dtype": "bf16"},
                                                         "b": {"dtype": "bf16"}, "out": "bf16"}})
    row = replace(_runner(), launch_gap_us=1.104).run(case, 0)
    assert row.metrics["timing"]["launch_gap_us"] == 1.104
    assert Row.from_json(json.loads(json.dumps(row.to_json()))).measured.timing.launch_gap_us == 1.104


class _Faulting:
    name, op_type = "rows_fault_for_test", "gemm"

    def supports(self, case, device):
        return None

    def prepare(self, case, device):
        return Prepared(fn=self._boom, check=lambda: Check(0.0, 0.01, 1, "planted"))

    @staticmethod
    def _boom():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


register_backend("rows_fault_for_test", "gemm", _Faulting)


def test_a_case_that_raises_is_an_error_row_with_its_kind():
    row = _runner("rows_fault_for_test").run(GEMM, 0)
    assert row.status == "error" and row.error_kind == "cuda_fault" and row.traceback
    assert "illegal memory access" in (row.message or "")


def test_busy_gaps_and_the_headline():
    row = ok_row()
    assert row.busy_us == 8.0 and row.gaps_us == pytest.approx(2.0) and row.busy_differs()
    assert row.headline_us("span") == 10.0 and row.headline_us("busy") == 8.0
    busy = row.rates_at("busy")
    assert busy is not None and row.rates is not None
    assert busy.tflops == pytest.approx(row.rates.tflops * 10 / 8, rel=1e-12)
    close = ok_row(measured=Measured(latency_us=10.0, busy_us=9.8, samples_us=[10.0]))
    assert not close.busy_differs()                               # 2% < 3%
    no_busy = ok_row(measured=Measured(latency_us=10.0, samples_us=[10.0]))
    assert no_busy.headline_us("busy") == 10.0 and no_busy.gaps_us is None


# --- docs/metrics.md ----------------------------------------------------------------------------

def test_docs_metrics_md_is_generated_from_the_row_model():
    committed = DOC_PATH.read_text(encoding="utf-8")
    assert committed == metrics_markdown(), "docs/metrics.md is stale: run `python -m operatorx.result --write`"


def test_docs_metrics_md_names_every_key_of_a_full_row_with_a_unit_column():
    text = metrics_markdown()
    for key in ok_row().metrics:
        assert f"`{key}`" in text
    assert "| `latency_us` | number | µs |" in text and "| `tflops` | number | TFLOP/s |" in text


def test_the_sweeps_own_keys_are_typed_and_round_trip():
    doc = Row(case=GEMM, backend="torch", status="error", testlist="t", case_index=2, message="crashed: the worker",
              error_kind="crashed", metrics={"scheme": "bf16", "worker_stderr_tail": "Segmentation fault",
                                             "failures": ["crashed: exit -11"],
                                             "memory": {"before": {"host_rss_bytes": 1}, "after": {"host_rss_bytes": 2},
                                                        "host_growth_bytes": 1, "device_growth_bytes": 0}}).to_json()
    row = Row.from_json(doc)
    assert row.other == {} and row.failures == ["crashed: exit -11"] and row.worker_stderr_tail == "Segmentation fault"
    assert row.memory is not None and row.memory.host_growth_bytes == 1
    assert row.to_json() == doc


@pytest.mark.gpu
def test_a_cuda_row_carries_busy_time_exact_rates_and_its_worker():
    """The CUDA branch of run/case.py: busy time from the kernel timer, rates from the span, a kernel
    profile, the worker device, and a strict-JSON round trip."""
    from operatorx.measure import Telemetry, TimingSettings
    from operatorx.measure.device_timer import device_timer
    from operatorx.platform import describe_device, peaks_for
    from operatorx.report.table import rows_table
    from operatorx.run.case import CaseRunner
    from operatorx.run.config import RunConfig

    device = describe_device("cuda")
    telemetry = Telemetry.for_torch_device(0)
    timing = TimingSettings(warmup_calls=2, warmup_floor_s=0, first_warmup_floor_s=0, max_time_s=0.3)
    runner = CaseRunner(config=RunConfig(testlist="t", device="cuda", timing=timing), device=device,
                        timer=device_timer(timing, device.l2_bytes, telemetry.max_sm_clock_hz()),
                        telemetry=telemetry, peaks=peaks_for(device.name), testlist="t")
    case = Case.model_validate({"type": "gemm", "args": {"m": 16, "n": 2048, "k": 2048, "a": {"dtype": "bf16"},
                                                         "b": {"dtype": "bf16"}, "out": "bf16"}})
    row = runner.run(case, 0)
    assert row.status == "ok", row.message
    m = row.measured
    assert m is not None and m.method == "cupti_kernels" and m.busy_us is not None
    assert 0 < m.busy_us <= m.latency_us * 1.001 and row.gaps_us is not None and row.gaps_us >= 0
    assert m.busy_samples_us is not None and len(m.busy_samples_us) == len(m.samples_us)
    assert all(b <= s * 1.001 for b, s in zip(m.busy_samples_us, m.samples_us, strict=True))   # busy <= span
    assert row.rates is not None and row.rates.tflops == case.flops() / m.latency_us / 1e6
    assert row.ran is not None and row.ran.profile is not None and row.ran.profile.kernels
    assert row.worker is not None and row.worker.name == device.name and row.extra
    assert Row.from_json(json.loads(json.dumps(row.to_json(), allow_nan=False))) == row
    rows_table([row], headline="busy")                  # the busy headline renders a real row
