"""Datasheet peak rates (dense, no sparsity) per GPU, to put a measured rate in proportion.

These are the vendors' published numbers, not measurements; `source` says so in every row.
The measured ceilings of a card belong in docs/benchmarks.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["Peaks", "peaks_for", "compute_class"]


@dataclass(frozen=True)
class Peaks:
    tflops: dict[str, float]       # by compute class: bf16, fp16, fp8, fp32
    memory_gbps: float
    source: str


_DATASHEET = "vendor datasheet, dense"
# Longest match first: "H100 PCIe" before "H100".
_TABLE: list[tuple[str, Peaks]] = [
    ("H200", Peaks({"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "fp32": 66.9}, 4800.0, _DATASHEET)),
    ("H100 PCIe", Peaks({"bf16": 756.0, "fp16": 756.0, "fp8": 1513.0, "fp32": 51.0}, 2000.0, _DATASHEET)),
    ("H100", Peaks({"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "fp32": 66.9}, 3350.0, _DATASHEET)),
    ("H20", Peaks({"bf16": 148.0, "fp16": 148.0, "fp8": 296.0, "fp32": 44.0}, 4000.0, _DATASHEET)),
    ("B200", Peaks({"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "fp32": 75.0}, 8000.0, _DATASHEET)),
    ("A100", Peaks({"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}, 2039.0, _DATASHEET)),
    ("MI300X", Peaks({"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "fp32": 163.4}, 5300.0, _DATASHEET)),
]


def peaks_for(device_name: str) -> Optional[Peaks]:
    for key, peaks in _TABLE:
        if key.lower() in device_name.lower():
            return peaks
    return None


def compute_class(a_dtype: str, b_dtype: str) -> str:
    """The matrix-unit rate a GEMM of these operand dtypes runs at."""
    pair = {a_dtype, b_dtype}
    if pair <= {"e4m3", "e5m2"}:
        return "fp8"
    if "fp32" in pair:
        return "fp32"
    if "fp16" in pair:
        return "fp16"
    return "bf16"
