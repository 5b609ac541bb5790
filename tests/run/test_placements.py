"""--placements N: each case prepared N times behind pads of other sizes, the row's number the median
over the placements; fewer copies (with the reason) when the device has no room; the row stored whole."""

from __future__ import annotations

import json
import statistics

import pytest

from operatorx.backends import Check, Prepared, Unsupported
from operatorx.measure import TimingSettings
from operatorx.run import RunConfig, run_testlist
from operatorx.run.placements import add_placements, pad_bytes
from operatorx.spec import Case
from operatorx.store import Store
from tests.conftest import gemm

FAST = TimingSettings(warmup_calls=1, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=4, max_samples=8,
                      max_time_s=0)


def test_pads_are_distinct_offsets():
    assert [pad_bytes(p) >> 20 for p in range(5)] == [0, 2, 6, 14, 30]


class _Backend:
    name, op_type = "fake", "gemm"

    def __init__(self, room: int):
        self.room, self.prepared = room, 0

    def supports(self, case, device):
        return None

    def prepare(self, case, device):
        if self.prepared >= self.room:
            raise Unsupported("needs 9.0 GiB on cpu; 1.0 GiB free")
        self.prepared += 1
        return Prepared(fn=lambda: None, check=lambda: Check(0.0, 1.0, 1, "none"))


def test_fewer_placements_when_there_is_no_room_and_the_row_says_why():
    case = Case.model_validate(gemm(m=2, n=64, k=64))
    backend = _Backend(room=2)
    first = backend.prepare(case, "cpu")
    held = [first]
    out = add_placements(backend, case, "cpu", first, 4, held)   # type: ignore[arg-type]
    assert len(out.prepared) == 2 and len(held) == 2 and out.prepared[0] is first
    assert out.pad_bytes == [0, 2 << 20]
    assert out.fewer_why == "placement 3 of 4 not prepared: needs 9.0 GiB on cpu; 1.0 GiB free"


def test_a_cpu_run_with_three_placements(tmp_path, write_testlist):
    path = write_testlist([gemm(m=4, n=64, k=64), gemm(m=8, n=32, k=64)])
    config = RunConfig(testlist=str(path), device="cpu", db=str(tmp_path / "ox.db"), results_dir=tmp_path / "res",
                       timing=FAST, executor="inline", placements=3)
    outcome = run_testlist(config)
    for row in outcome.rows:
        assert row.status == "ok", row.message
        p = row.placement
        assert p is not None and p.count == p.requested == 3 and p.rounds == 2 and p.fewer_why is None
        assert p.pad_bytes == [0, 2 << 20, 6 << 20]
        assert row.measured.latency_us == pytest.approx(statistics.median(p.per_placement_us))
        assert p.spread_pct == pytest.approx((max(p.per_placement_us) - min(p.per_placement_us))
                                             / row.measured.latency_us * 100)
        # each placement twice, min_samples split over its rounds: at least 2 + 2 samples each
        assert len(row.measured.samples_us) >= 12
        attempts = row.conditions.telemetry.attempts
        assert [(a["placement"], a["round"]) for a in attempts] == [(0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (0, 1)]
    doc = json.loads(outcome.document_path.read_text())
    assert doc["rows"][0]["metrics"]["placement"]["count"] == 3
    stored = Store(str(tmp_path / "ox.db")).document(outcome.run_id)
    assert stored["rows"][0]["metrics"]["placement"]["per_placement_us"] == \
        outcome.rows[0].placement.per_placement_us
    assert json.loads(outcome.document_path.read_text())["run"]["job"]["config"]["placements"] == 3


def test_placements_are_bounded():
    with pytest.raises(ValueError, match="--placements must be 1..8, got 9"):
        RunConfig(testlist="x", placements=9)


@pytest.mark.gpu
def test_a_cuda_case_at_three_placements(tmp_path, write_testlist):
    """On the GPU: three copies (the kernel spans of each timed), the median over them, busy per copy."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    path = write_testlist([gemm(m=256, n=4096, k=4096)])
    config = RunConfig(testlist=str(path), device="cuda", db=str(tmp_path / "ox.db"), results_dir=tmp_path / "res",
                       executor="inline", placements=3)
    (row,) = run_testlist(config).rows
    assert row.status == "ok", row.message
    p = row.placement
    assert p is not None and p.count == 3 and p.per_placement_busy_us is not None
    assert row.measured.latency_us == pytest.approx(statistics.median(p.per_placement_us))
    assert row.measured.busy_us == pytest.approx(statistics.median(p.per_placement_busy_us))
    assert row.measured.method == "cupti_kernels" and row.check.ok
