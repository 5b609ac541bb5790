"""ncu's raw-page CSV read into per-case counters, and the command line counters mode runs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from operatorx.measure.ncu import (
    METRICS,
    NVTX_INCLUDE,
    NcuCsvError,
    counters_replay_range,
    ncu_command,
    parse_ncu_csv,
    parse_ncu_version,
)

_FIXED = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
          "Grid Size", "Device", "CC"]
# ncu prints the metric columns sorted by name
_METRIC_COLUMNS = ["dram__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__time_duration.sum",
                   "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                   "sm__warps_active.avg.pct_of_peak_sustained_active"]


def _line(cells: list[str]) -> str:
    return ",".join(f'"{c}"' for c in cells)


def _kernel(kid: int, name: str, nvtx: str, dram: str, ns: str, sm: str, occ: str) -> list[str]:
    return [str(kid), "4242", "python3.11", "127.0.0.1", name, "1", "7", "(384, 1, 1)", "(132, 1, 1)", "0", "9.0",
            nvtx, dram, ns, sm, occ]


def _sample(nvtx_column: str = "thread_domain:push_pop_ranges", duration_unit: str = "nsecond") -> str:
    """Two kernels in case 0, one in case 12 (nested range, a metric n/a), two outside any
    ox.counters range; no kernel for case 1. Thousands separators and ncu's own messages included."""
    header = [*_FIXED, nvtx_column, *_METRIC_COLUMNS]
    units = [""] * (len(_FIXED) + 1) + ["%", duration_unit, "%", "%"]
    rows = [
        _kernel(0, "nvjet_tst_128x64_64x4_1x2_h_bz_coopA_NTN", "<default domain>:ox.counters/0", "20", "1,500",
                "80", "50"),
        _kernel(1, "void splitKreduce_kernel<32, 16>(float const*, int)", "<default domain>:ox.counters/0", "60",
                "500", "40", "10"),
        _kernel(2, "vectorized_elementwise_kernel", "<default domain>:warmup", "5", "9,999", "1", "1"),
        _kernel(3, "fused_moe_kernel", "<default domain>:ox.run/ox.counters/12", "12.5", "12,345.5", "n/a",
                "33.25"),
        _kernel(4, "memset_kernel", "", "1", "1,000,000", "1", "1"),
    ]
    return "\n".join(["==PROF== Connected to process 4242 (/usr/bin/python3.11)",
                      '==PROF== Profiling "nvjet_tst_128x64" - 0: 0%....50%....100% - 9 passes',
                      _line(header), _line(units), *(_line(r) for r in rows),
                      "==PROF== Disconnected from process 4242", ""])


@pytest.mark.parametrize("column", ["thread_domain:push_pop_ranges", "NVTX", "NVTX Push/Pop_Range", "Stack"])
def test_sample_is_read_per_case(column):
    """'Stack' is no NVTX-looking header: the range is then found in any text column."""
    got = parse_ncu_csv(_sample(column))
    assert sorted(got) == [0, 12]                       # case 1 had no kernel; outside kernels ignored
    case0 = got[0]
    assert case0["kernel_count"] == 2 and case0["duration_us"] == pytest.approx(2.0)
    assert case0["sm_throughput_pct"] == pytest.approx((80 * 1.5 + 40 * 0.5) / 2.0)
    assert case0["dram_throughput_pct"] == pytest.approx((20 * 1.5 + 60 * 0.5) / 2.0)
    assert case0["achieved_occupancy_pct"] == pytest.approx((50 * 1.5 + 10 * 0.5) / 2.0)
    assert [k["name"] for k in case0["kernels"]] == ["nvjet_tst_128x64_64x4_1x2_h_bz_coopA_NTN",
                                                     "void splitKreduce_kernel<32, 16>(float const*, int)"]
    assert case0["kernels"][1] == {"name": "void splitKreduce_kernel<32, 16>(float const*, int)",
                                   "duration_us": pytest.approx(0.5), "sm_throughput_pct": 40.0,
                                   "dram_throughput_pct": 60.0, "achieved_occupancy_pct": 10.0}
    case12 = got[12]
    assert case12["duration_us"] == pytest.approx(12.3455)  # "12,345.5" ns
    assert case12["sm_throughput_pct"] is None              # n/a for its only kernel
    assert case12["dram_throughput_pct"] == 12.5 and case12["achieved_occupancy_pct"] == 33.25


# ncu 2025.3.1 on an H200 (no NVTX filter, so kernels outside the ranges are listed too); its
# 279 columns cut to these, kernel names shortened; the NVTX cell is ncu's, byte for byte.
_REAL_2025_3 = """==WARNING== Note: Running with unmodified GPU clocks. If not controlled otherwise, profiling results \
may be inconsistent.
==PROF== Connected to process 1793 (/usr/bin/python3.12)
==PROF== Disconnected from process 1793
"ID","Process ID","Process Name","Host Name",\
"thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg",\
"Id:Domain:Start/Stop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg","Kernel Name","CC","gpu__time_duration.sum",\
"sm__throughput.avg.pct_of_peak_sustained_elapsed"
"","","","","","","","","ns","%"
"0","1793","python3.12","127.0.0.1","","","void at::<unnamed>::distribution_elementwise_grid_stride_ker","9.0",\
"6,112","49.51"
"1","1793","python3.12","127.0.0.1","","","nvjet_sm90_tst_128x64_64x8_1x2_h_bz_NNT","9.0","7,296","30.53"
"3","1793","python3.12","127.0.0.1","1793  ""<default domain>:ox.counters/0:none:none:none:none:none:none"" ","",\
"nvjet_sm90_tst_128x64_64x8_1x2_h_bz_NNT","9.0","7,232","30.82"
"4","1793","python3.12","127.0.0.1","1793  ""<default domain>:ox.counters/1:none:none:none:none:none:none"" ","",\
"nvjet_sm90_tst_128x64_64x8_1x2_h_bz_NNT","9.0","7,392","30.15"
"5","1793","python3.12","127.0.0.1","1793  ""<default domain>:ox.counters/1:none:none:none:none:none:none"" ","",\
"void at::vectorized_elementwise_kernel<8, at::CUDAFunctor_ad","9.0","3,968","6.01"
"""


def test_real_ncu_2025_3_output():
    got = parse_ncu_csv(_REAL_2025_3)
    assert sorted(got) == [0, 1]
    assert got[0]["kernel_count"] == 1 and got[0]["duration_us"] == pytest.approx(7.232)
    assert got[1]["kernel_count"] == 2 and got[1]["duration_us"] == pytest.approx(11.36)
    assert got[1]["sm_throughput_pct"] == pytest.approx((30.15 * 7.392 + 6.01 * 3.968) / 11.36)
    assert got[1]["dram_throughput_pct"] is None                 # a metric ncu did not print: no value


def test_duration_unit_row_is_honoured():
    got = parse_ncu_csv(_sample(duration_unit="usecond"))
    assert got[0]["duration_us"] == pytest.approx(2000.0)
    with pytest.raises(NcuCsvError, match="unknown unit 'furlong'"):
        parse_ncu_csv(_sample(duration_unit="furlong"))


def test_without_units_row_durations_are_ns():
    text = "\n".join(line for line in _sample().splitlines() if not line.startswith('"","'))
    assert parse_ncu_csv(text)[0]["duration_us"] == pytest.approx(2.0)


def test_no_report_is_no_counters():
    assert parse_ncu_csv("") == {}
    assert parse_ncu_csv("==PROF== Connected to process 1 (python)\n==WARNING== No kernels were profiled.\n") == {}


def test_ncu_errors_are_reported():
    text = "==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n"
    with pytest.raises(NcuCsvError, match="ERR_NVGPUCTRPERM"):
        parse_ncu_csv(text)


@pytest.mark.parametrize("text, match", [
    ("this is not what ncu writes\n", "no CSV header"),
    (_line(["ID", "Kernel Name", "NVTX"]) + "\n", "gpu__time_duration.sum"),
    (_sample().replace('"1,500"', '"1.500.000"'), "not a number"),
    (_sample().replace('"fused_moe_kernel",', ""), "fields"),
])
def test_unreadable_csv_raises(text, match):
    with pytest.raises(NcuCsvError, match=match):
        parse_ncu_csv(text)


def test_replay_range_names_are_what_the_parser_and_filter_look_for():
    assert counters_replay_range(3) == "ox.counters/3"
    for bad in (-1, True, "3"):
        with pytest.raises(ValueError):
            counters_replay_range(bad)  # type: ignore[arg-type]
    # the regex part of ncu's filter (before the push/pop '/' marker) finds the range name
    pattern = NVTX_INCLUDE.removeprefix("regex:").removesuffix("/")
    assert re.search(pattern, counters_replay_range(41)) and not re.search(pattern, "warmup/ox.counters/1")
    text = _sample().replace("ox.counters/12", counters_replay_range(41))
    assert sorted(parse_ncu_csv(text)) == [0, 41]


def test_ncu_command():
    child = ["/usr/bin/python3", "-m", "operatorx", "run", "-t", "gemm", "--counters-child", "--run-id", "R"]
    cmd = ncu_command(child, "/tmp/x/ncu.csv", ncu="/opt/ncu")
    assert cmd[0] == "/opt/ncu" and cmd[-len(child):] == child
    opts = cmd[1:-len(child)]
    pairs = {opts[i]: opts[i + 1] for i in range(len(opts) - 1) if opts[i].startswith("--")
             and not opts[i + 1].startswith("--")}
    assert pairs["--clock-control"] == "none" and pairs["--target-processes"] == "all"
    assert pairs["--page"] == "raw" and pairs["--log-file"] == "/tmp/x/ncu.csv"
    assert pairs["--nvtx-include"] == NVTX_INCLUDE and "--nvtx" in opts and "--csv" in opts
    assert pairs["--metrics"].split(",") == list(METRICS)
    with pytest.raises(ValueError):
        ncu_command([], "x.csv")


def test_version_line():
    out = "NVIDIA (R) Nsight Compute Command Line Profiler\nCopyright (c) 2018-2024\nVersion 2024.1.1.0 (build 1)\n"
    assert parse_ncu_version(out) == "2024.1.1.0"
    assert parse_ncu_version("nothing here") is None


_REPLAY_SCRIPT = """
import sys
import torch

a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
(a @ a).sum()                      # outside every range: ncu must not profile it
torch.cuda.synchronize()
for name, fn in zip(sys.argv[1:], [lambda: a @ a, lambda: (a @ a) + a]):
    torch.cuda.nvtx.range_push(name)
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
"""


@pytest.mark.gpu
def test_real_ncu_attributes_kernels_to_replay_ranges(tmp_path):
    """The real thing: ncu's filter takes the replay ranges, and its CSV is read per case."""
    ncu = shutil.which("ncu")
    if ncu is None:
        pytest.skip("no ncu on PATH")
    script, csv_path = tmp_path / "replay.py", tmp_path / "ncu.csv"
    script.write_text(_REPLAY_SCRIPT)
    child = [sys.executable, str(script), counters_replay_range(0), counters_replay_range(1)]
    done = subprocess.run(ncu_command(child, csv_path, ncu=ncu), capture_output=True, text=True, timeout=300)
    text = csv_path.read_text() if csv_path.exists() else ""
    try:
        got = parse_ncu_csv(text)
    except NcuCsvError as err:
        if "==ERROR==" in text:
            pytest.skip(f"ncu cannot profile on this machine: {err}")
        raise
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(got) == [0, 1], text[-3000:]
    assert got[0]["kernel_count"] >= 1 and got[1]["kernel_count"] >= 2, text[-3000:]
    for case in got.values():
        assert case["duration_us"] > 0
        for field in ("sm_throughput_pct", "dram_throughput_pct", "achieved_occupancy_pct"):
            assert case[field] is not None and 0 <= case[field] <= 100.5, (field, text[-3000:])
