"""L2 states: the verdict rule (CPU) and, on a GPU, that the states are what they claim."""

from __future__ import annotations

import pytest

from operatorx.measure.l2 import L2Flusher
from operatorx.measure.l2_check import verdicts


def test_verdicts_follow_the_h200_ordering():
    ok = verdicts({"warm": 7.6, "cold_clean": 9.3, "cold_dirty": 11.0})
    assert ok == {"warm": True, "cold_clean": True, "cold_dirty": True}


def test_a_flush_that_leaves_lines_dirty_is_not_clean():
    ok = verdicts({"warm": 7.6, "cold_clean": 10.9, "cold_dirty": 11.0})   # the discard did nothing
    assert not ok["cold_clean"] and not ok["cold_dirty"]


def test_a_flush_that_does_not_evict_is_not_cold():
    ok = verdicts({"warm": 7.6, "cold_clean": 7.7, "cold_dirty": 9.0})
    assert not ok["cold_clean"] and not ok["warm"]


def test_flusher_refuses_unknown_states_and_needs_an_l2_size():
    with pytest.raises(ValueError, match="l2 state"):
        L2Flusher("lukewarm", 1 << 20)                      # type: ignore[arg-type]
    with pytest.raises(ValueError, match="L2 size"):
        L2Flusher("cold_clean", None)
    warm = L2Flusher("warm", None)
    warm.flush()                                             # nothing to do, no GPU needed
    assert warm.to_json() == {"l2_state": "warm", "flush_bytes": 0, "flush_launch": "eager"}


@pytest.mark.gpu
def test_on_this_gpu_every_state_is_verified():
    import torch

    from operatorx.measure.l2_check import check_l2_states

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    result = check_l2_states(l2, "cold_clean", None)
    assert result["states_verified"] == {"warm": True, "cold_clean": True, "cold_dirty": True}, result


def test_a_state_that_could_not_be_probed_is_unverified_and_the_rest_still_judged():
    ok = verdicts({"warm": 7.6, "cold_clean": None, "cold_dirty": 11.0})   # no discard kernel here
    assert ok == {"warm": True, "cold_clean": None, "cold_dirty": True}
    assert verdicts({"warm": None, "cold_clean": None, "cold_dirty": 11.0}) == {
        "warm": None, "cold_clean": None, "cold_dirty": None}


def test_the_probe_records_a_state_it_cannot_produce_and_judges_the_rest(monkeypatch):
    import torch

    from operatorx.measure import l2_check

    monkeypatch.setattr(torch, "randn", lambda *a, **k: torch.zeros(4))        # no CUDA buffer needed here
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    times = {"warm": 7.6, "cold_dirty": 11.0}

    def probe(state, l2_bytes, read, clock):
        if state == "cold_clean":
            raise RuntimeError("l2 state cold_clean needs Triton's discard.global.L2 kernel")
        return times[state]

    monkeypatch.setattr(l2_check, "_probe", probe)
    result = l2_check.check_l2_states(64 << 20, "cold_dirty", None)
    assert result["verified"] is True and result["states_verified"]["cold_clean"] is None
    assert "discard" in result["probe_errors"]["cold_clean"] and "dirty_over_clean" not in result
    assert l2_check.check_l2_states(64 << 20, "cold_clean", None)["verified"] is False
