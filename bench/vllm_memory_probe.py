"""Which device tensors a released vLLM MoE case leaves alive (issue 14, item 4): after the first
bf16 DeepSeek-style case of tests/backends/vllm/test_gpu.py::test_moe_gives_its_memory_back_over_20_cases,
torch showed 49.5 MiB still allocated, freed only by the first block-FP8 DeepSeek-style case.

    python bench/vllm_memory_probe.py

Prints the memory left after each case and, when it grew, the live CUDA tensors the garbage
collector can see that were not alive before the case, with what refers to them.
"""

from __future__ import annotations

import gc

import torch

from operatorx.backends.vllm import VllmMoe
from tests.backends.vllm.cases import moe_case


def live_cuda() -> dict[int, tuple[torch.Tensor, int]]:
    """Real CUDA tensors the collector sees, with their storage bytes (fake and symbolic ones of
    torch.compile are left out: they hold no memory)."""
    from torch._subclasses.fake_tensor import FakeTensor

    out = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and not isinstance(obj, FakeTensor) and obj.is_cuda:
                out[id(obj)] = (obj, int(obj.untyped_storage().nbytes()))
        except Exception:  # noqa: BLE001
            pass
    return out


def describe(obj: object) -> str:
    name = type(obj).__name__
    if isinstance(obj, dict):
        return f"dict{list(obj)[:4]}"
    if isinstance(obj, (list, tuple)):
        return f"{name}[{len(obj)}]"
    return f"{name}:{getattr(obj, '__qualname__', getattr(obj, '__name__', ''))}"


def main() -> None:
    moe = VllmMoe()
    cases = [moe_case(s, st, tokens=t, hidden=1024, inter=512, num=32, top_k=8)
             for s in ("bf16", "fp8_block") for st in ("deepseek", "qwen") for t in (1, 64)]
    warm = moe_case("fp8_block", "qwen", tokens=4, hidden=1024, inter=512, num=32, top_k=8)
    for case in [warm, *cases]:
        before_ids = set(live_cuda())
        before = torch.cuda.memory_allocated()
        p = moe.prepare(case, "cuda")
        p.check()
        p.fn()
        p.release()
        torch.cuda.synchronize()
        left = torch.cuda.memory_allocated() - before
        print(f"{case.label()[:60]:60s} left {left / 2**20:8.2f} MiB", flush=True)
        if left > 4 * 2**20:
            new = {k: v for k, v in live_cuda().items() if k not in before_ids}
            for t, nbytes in sorted(new.values(), key=lambda tb: -tb[1])[:8]:
                refs = [describe(r) for r in gc.get_referrers(t)][:4]
                print(f"   {tuple(t.shape)} {t.dtype} {nbytes / 2**20:.2f} MiB refs {refs}")
                for r in gc.get_referrers(t)[:2]:
                    print(f"      <- {[describe(rr) for rr in gc.get_referrers(r)][:4]}")


if __name__ == "__main__":
    main()
