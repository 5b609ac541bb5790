"""Shared helpers for catalog tests: shapes by role from generated cases."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def shapes_by_role(cases) -> dict[str, tuple[int, int]]:
    """role -> (n, k) for gemm cases (each role must map to one shape)."""
    out: dict[str, tuple[int, int]] = {}
    for case in cases:
        if case.type != "gemm":
            continue
        for source in case.sources:
            role = source.rsplit("/", 1)[-1]
            shape = (case.args.n, case.args.k)
            assert out.setdefault(role, shape) == shape, f"{role}: two shapes {out[role]} and {shape}"
    return out


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES
