"""The order a sweep hands its cases out in (run/plan.py)."""

from __future__ import annotations

from operatorx.run.plan import estimated_s, longest_first
from operatorx.spec import Case
from tests.conftest import gemm


def test_several_workers_take_the_longest_cases_first_and_equals_keep_their_order():
    small, big, mid = (Case.model_validate(gemm(m=m, n=4096, k=4096)) for m in (1, 8192, 512))
    tasks = [(0, small), (1, big), (2, mid), (3, small)]
    assert [i for i, _ in longest_first(tasks, lambda t: t[1])] == [1, 2, 0, 3]
    # a decode GEMM is memory-bound: its estimate is its bytes, not its flops
    assert estimated_s(small) == small.min_bytes() / 4000e9 and estimated_s(big) == big.flops() / 1000e12
