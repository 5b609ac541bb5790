"""Nsight Compute (`ncu`) for counters mode: the metrics asked for, its command line, its CSV.

Hardware counters cannot be read from inside the timed process without perturbing it, so a
counters run is a child process under `ncu`: after timing a case the child calls the op once more
inside the NVTX range `counters_replay_range(case_index)`, and ncu profiles only kernels launched
inside such ranges. This module is the contract between the two sides (range names, metric names,
how the CSV is read) and is pure: no torch, no subprocess, so it is tested anywhere.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

__all__ = ["METRICS", "DURATION_METRIC", "RANGE_PREFIX", "NVTX_INCLUDE", "CLOCK_CONTROL", "CACHE_CONTROL",
           "PERTURBED_REASON", "NcuCsvError", "counters_replay_range", "ncu_command", "parse_ncu_csv",
           "parse_ncu_version"]

METRICS: dict[str, str] = {
    "gpu__time_duration.sum": "duration_us",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
}
"""ncu metric → the name it is stored under. Duration is summed over a case's kernels; every other
metric is a percentage, averaged over the case's kernels weighted by their duration."""

DURATION_METRIC = "gpu__time_duration.sum"
RANGE_PREFIX = "ox.counters/"
NVTX_INCLUDE = r"regex:^ox\.counters/"
"""ncu's filter for the replay ranges (in ncu's NVTX syntax a trailing '/' means a push/pop range)."""
CLOCK_CONTROL = "none"
"""Clocks as the timed run had them (ncu's default would lock them to base)."""
CACHE_CONTROL = "all"
"""ncu flushes caches before each replay pass (its default, passed explicitly so the record holds)."""
PERTURBED_REASON = "timed while running under ncu (--counters)"
"""What the child puts in `metrics["perturbed"]` of every row: its latencies are not clean."""

_RANGE = re.compile(re.escape(RANGE_PREFIX) + r"(\d+)")
_NVTX_HEADER = re.compile(r"nvtx|push_pop|push/pop|thread_domain|range", re.IGNORECASE)
"""ncu 2025.3 names its NVTX columns "thread Domain:Push/Pop_Range:PL_Type:..." and
"Id:Domain:Start/Stop_Range:..."; other versions differ, hence the liberal match."""
_TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6,
          "second": 1e6}
_MISSING = {"", "n/a", "na", "nan", "-"}


class NcuCsvError(ValueError):
    """ncu's output could not be read as the CSV (`--csv --page raw`) counters mode asked for."""


def counters_replay_range(case_index: int) -> str:
    """The NVTX push/pop range the child wraps the counted call of case `case_index` in."""
    if isinstance(case_index, bool) or not isinstance(case_index, int) or case_index < 0:
        raise ValueError(f"case_index must be an int >= 0, got {case_index!r}")
    return f"{RANGE_PREFIX}{case_index}"


def ncu_command(child_argv: Sequence[str], csv_path: Path | str, ncu: str = "ncu") -> list[str]:
    """The command line: `ncu <options> <child_argv...>`, the report going to `csv_path`."""
    if not child_argv:
        raise ValueError("ncu_command needs the child's command line")
    return [ncu, "--clock-control", CLOCK_CONTROL, "--cache-control", CACHE_CONTROL,
            "--target-processes", "all", "--nvtx", "--nvtx-include", NVTX_INCLUDE,
            "--metrics", ",".join(METRICS), "--csv", "--page", "raw", "--print-units", "base",
            "--log-file", str(csv_path), *child_argv]


def parse_ncu_version(text: str) -> Optional[str]:
    """'2024.1.1.0' from `ncu --version` output, or None."""
    match = re.search(r"\bVersion\s+(\S+)", text)
    return match.group(1) if match else None


def parse_ncu_csv(text: str) -> dict[int, dict[str, Any]]:
    """case_index → {"duration_us", "sm_throughput_pct", "dram_throughput_pct",
    "achieved_occupancy_pct", "kernel_count", "kernels": [...]} from ncu's raw-page CSV.

    Lines before the header (ncu's `==PROF==` messages) are skipped, as is a units row after it.
    A kernel belongs to the case whose `ox.counters/<index>` range its NVTX column(s) name; kernels
    outside every such range are ignored. A case with no kernel has no entry. No report at all
    (ncu profiled nothing) is an empty dict; anything else unreadable raises NcuCsvError.
    """
    lines = text.splitlines()
    start = _header_line(lines)
    if start is None:
        _no_report(lines)
        return {}
    records = list(csv.reader(io.StringIO("\n".join(ln for ln in lines[start:] if not ln.startswith("==")))))
    header = [h.strip() for h in records[0]]
    columns = _columns(header)
    body = [r for r in records[1:] if any(cell.strip() for cell in r)]
    units: dict[str, str] = {}
    if body and not body[0][columns["ID"]].strip().isdigit():
        units = {name: body[0][i].strip() for name, i in columns.items() if i < len(body[0])}
        body = body[1:]
    scale = _duration_scale(units.get(DURATION_METRIC, "nsecond"))
    kernels: dict[int, list[dict[str, Any]]] = {}
    for number, record in enumerate(body, start=1):
        if len(record) != len(header):
            raise NcuCsvError(f"data row {number} has {len(record)} fields, the header {len(header)}")
        index = _case_index(record, header, columns)
        if index is not None:
            kernels.setdefault(index, []).append(_kernel(record, columns, scale, number))
    return {index: _aggregate(ks) for index, ks in kernels.items()}


def _header_line(lines: list[str]) -> Optional[int]:
    for i, line in enumerate(lines):
        if line.startswith('"ID"') or line.startswith("ID,"):
            return i
    return None


def _no_report(lines: list[str]) -> None:
    """No header: fine when ncu only printed its own messages (it profiled no kernel)."""
    errors = [ln for ln in lines if ln.startswith("==ERROR==")]
    if errors:
        raise NcuCsvError("ncu reported errors: " + " | ".join(errors[:5]))
    other = [ln for ln in lines if ln.strip() and not ln.startswith("==")]
    if other:
        raise NcuCsvError(f"no CSV header (a line starting with \"ID\"); first line: {other[0][:200]!r}")


def _columns(header: list[str]) -> dict[str, int]:
    """Positions of "ID", "Kernel Name" and the metrics; the duration metric is required."""
    columns = {name: header.index(name) for name in ("ID", "Kernel Name", *METRICS) if name in header}
    for required in ("ID", "Kernel Name", DURATION_METRIC):
        if required not in columns:
            raise NcuCsvError(f"no column {required!r} in the header ({', '.join(header[:20])})")
    return columns


def _duration_scale(unit: str) -> float:
    scale = _TO_US.get(unit.lower() or "nsecond")
    if scale is None:
        raise NcuCsvError(f"unknown unit {unit!r} for {DURATION_METRIC}")
    return scale


def _case_index(record: list[str], header: list[str], columns: dict[str, int]) -> Optional[int]:
    """The innermost `ox.counters/<index>` in the row's NVTX column(s); without such columns, in
    any text column."""
    nvtx = [i for i, name in enumerate(header) if _NVTX_HEADER.search(name)]
    metric_columns = {columns[m] for m in METRICS if m in columns}
    cells = nvtx or [i for i in range(len(header)) if i not in metric_columns]
    found = [m for i in cells for m in _RANGE.findall(record[i])]
    return int(found[-1]) if found else None


def _number(text: str, where: str) -> Optional[float]:
    """'1,234.5' → 1234.5; 'n/a' or empty → None; anything else unreadable raises."""
    cleaned = text.strip().replace(",", "").replace("\u202f", "").replace(" ", "")
    if cleaned.lower() in _MISSING:
        return None
    try:
        return float(cleaned)
    except ValueError:
        raise NcuCsvError(f"{where}: {text!r} is not a number") from None


def _kernel(record: list[str], columns: dict[str, int], duration_scale: float, number: int) -> dict[str, Any]:
    out: dict[str, Any] = {"name": record[columns["Kernel Name"]].strip()}
    for metric, field in METRICS.items():
        value = _number(record[columns[metric]], f"data row {number}, {metric}") if metric in columns else None
        out[field] = value * duration_scale if value is not None and metric == DURATION_METRIC else value
    if out["duration_us"] is None:
        raise NcuCsvError(f"data row {number}: no {DURATION_METRIC} for kernel {out['name']!r}")
    return out


def _weighted(kernels: list[dict[str, Any]], field: str) -> Optional[float]:
    """Mean of `field` over the kernels that have it, weighted by duration (plain mean if all 0)."""
    pairs = [(k["duration_us"], k[field]) for k in kernels if k[field] is not None]
    if not pairs:
        return None
    weight = sum(w for w, _ in pairs)
    if weight <= 0:
        return sum(v for _, v in pairs) / len(pairs)
    return sum(w * v for w, v in pairs) / weight


def _aggregate(kernels: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"duration_us": sum(k["duration_us"] for k in kernels)}
    for field in METRICS.values():
        if field != "duration_us":
            out[field] = _weighted(kernels, field)
    out["kernel_count"] = len(kernels)
    out["kernels"] = kernels
    return out
