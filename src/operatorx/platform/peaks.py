"""Peak rates per GPU, to put a measured rate in proportion: the vendor's datasheet numbers (dense,
no sparsity) and, where a worker measured them, this card's own (platform/calibrate.py).

The datasheet understates or overstates what a card reaches under a given driver, clock and power
limit (docs/peaks.md), so `% peak` is taken
against the measured peaks where a row has them; the datasheet ones stay beside them in the row
(`Peak.tflops`, `Peak.memory_gbps`) and `source` says which were used. docs/peaks.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from operatorx.result_parts import Peak

__all__ = ["Peaks", "peaks_for", "compute_class", "DATASHEET"]


@dataclass(frozen=True)
class Peaks:
    tflops: dict[str, float]
    """Datasheet compute peaks by compute class: bf16, fp16, fp8, fp32 (TFLOP/s)."""
    memory_gbps: Optional[float]
    """Datasheet memory bandwidth (GB/s); None for a card only measured, not in the table."""
    source: str
    """Where the datasheet numbers come from."""
    measured_tflops: dict[str, float] = field(default_factory=dict)
    """This card's measured compute peaks by class (TFLOP/s): only the classes that were measured."""
    measured_memory_gbps: Optional[float] = None
    """This card's measured copy bandwidth (GB/s)."""
    measured_source: Optional[str] = None
    """How and when the measured peaks were taken (`measured <date> ...`)."""

    def with_measured(self, tflops: dict[str, float], memory_gbps: Optional[float], source: str) -> Peaks:
        """These datasheet peaks with a measurement beside them."""
        return replace(self, measured_tflops=dict(tflops), measured_memory_gbps=memory_gbps, measured_source=source)

    def part(self, compute_class: str) -> Peak:
        """The row's `Peak` for a case of `compute_class`: the datasheet peaks, the measured ones
        beside them (those classes that were measured), and `source` naming what `pct_peak` uses."""
        measured_tf = self.measured_tflops.get(compute_class)
        measured_bw = self.measured_memory_gbps
        kw: dict[str, object] = {}
        if measured_tf is not None:
            kw["measured_tflops"] = measured_tf
        if measured_bw is not None:
            kw["measured_memory_gbps"] = measured_bw
        return Peak(compute_class=compute_class, tflops=self.tflops.get(compute_class), memory_gbps=self.memory_gbps,
                    source=self._source(measured_tf is not None, measured_bw is not None), **kw)  # type: ignore[arg-type]

    def _source(self, compute_measured: bool, memory_measured: bool) -> str:
        what = self.measured_source or "measured"
        if compute_measured and memory_measured:
            return f"{what}; datasheet beside: {self.source}"
        if memory_measured:
            return f"memory {what}; compute: {self.source}"
        if compute_measured:
            return f"compute {what}; memory: {self.source}"
        return self.source


DATASHEET = "vendor datasheet, dense"
# Longest match first: "H100 PCIe" before "H100".
_TABLE: list[tuple[str, Peaks]] = [
    ("H200", Peaks({"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "fp32": 66.9}, 4800.0, DATASHEET)),
    ("H100 PCIe", Peaks({"bf16": 756.0, "fp16": 756.0, "fp8": 1513.0, "fp32": 51.0}, 2000.0, DATASHEET)),
    ("H100", Peaks({"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "fp32": 66.9}, 3350.0, DATASHEET)),
    ("H20", Peaks({"bf16": 148.0, "fp16": 148.0, "fp8": 296.0, "fp32": 44.0}, 4000.0, DATASHEET)),
    ("B200", Peaks({"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "fp32": 75.0}, 8000.0, DATASHEET)),
    ("A100", Peaks({"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}, 2039.0, DATASHEET)),
    ("MI300X", Peaks({"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "fp32": 163.4}, 5300.0, DATASHEET)),
]


def peaks_for(device_name: str) -> Optional[Peaks]:
    """The datasheet peaks of a GPU by its name; None for a device not in the table."""
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
