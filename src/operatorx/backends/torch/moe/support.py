"""Can the torch backend really run this MoE case here? Small predicates, each with its reason.

The experts' scheme decides the grouped kernel: all-bf16 → grouped_mm; e4m3 per-token ×
per-channel on sm90 → scaled_grouped_mm with row-wise scales. Everything else has no torch
grouped kernel on the device and is refused with the reason, never emulated or run in
another dtype.
"""

from __future__ import annotations

import functools
from typing import Literal, Optional, Union, cast

import torch

from operatorx.backends.torch.moe.activation import activation_refusal
from operatorx.backends.torch.moe.experts import grouped_mm_fn, scaled_grouped_mm_fn
from operatorx.spec.dtypes import FLOAT_DTYPES
from operatorx.spec.moe import GroupedTopK, MoeArgs
from operatorx.spec.operand import Operand

__all__ = ["Scheme", "experts_scheme", "shared_scheme", "refusal"]

Scheme = Literal["bf16", "fp8_rowwise"]


def _cuda_major() -> int:
    return torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 0


@functools.cache
def _cpu_grouped_mm() -> Optional[str]:
    """None when this torch's grouped_mm has a CPU kernel; else why not."""
    fn, name = grouped_mm_fn()
    if fn is None:
        return f"torch {torch.__version__} has no grouped_mm"
    try:
        a = torch.zeros(4, 8, dtype=torch.bfloat16)
        b = torch.zeros(2, 8, 8, dtype=torch.bfloat16).transpose(1, 2)
        fn(a, b, offs=torch.tensor([2, 4], dtype=torch.int32))
    except (RuntimeError, NotImplementedError) as err:
        return f"{name} has no CPU kernel in torch {torch.__version__}: {str(err).splitlines()[0][:200]}"
    return None


def _rowwise_fp8(a: Operand, w1: Operand, w2: Operand, a2: Optional[Operand]) -> Optional[str]:
    """None when the operands are e4m3 per-token (dynamic) × per-channel (static) with fp32 scales."""
    for name, op, want, static in (("a1", a, (1, -1), False), ("w1", w1, (1, -1), True),
                                   ("w2", w2, (1, -1), True), ("a2", a2, (1, -1), False)):
        if op is None:
            continue
        assert op.scale is not None
        if op.dtype != "e4m3":
            return f"{name} is {op.dtype}: torch's scaled grouped GEMM takes e4m3 on both operands"
        if op.scale2 is not None or op.scale.dtype != "fp32":
            return f"{name} scales ({op.scheme_name()}): torch's row-wise fp8 recipes take one fp32 scale"
        got = op.scale.oriented(weight=name.startswith("w"))
        if got != want or op.scale.static != static:
            kinds = f"a {a.scale.kind if a.scale else '-'} × w {w1.scale.kind if w1.scale else '-'}"
            if got in ((1, 32), (1, 16)) or (op.scale.group == [1, 32]):
                return (f"MX/NV block formats ({kinds}) need sm100 block-scaled MMA; torch has no such grouped "
                        f"GEMM on sm{_cuda_major()}x")
            return (f"fp8 {kinds}: torch's scaled grouped GEMM on sm90 takes per-token (dynamic) × per-channel "
                    "scales only; block-scaled fp8 grouped GEMM (DeepSeek 1x128 × 128x128) has no torch kernel "
                    "here (vLLM/DeepGEMM run it)")
    return None


def _scheme(a: Operand, w1: Operand, w2: Operand, a2: Optional[Operand], device: str, what: str
            ) -> Union[Scheme, str]:
    ops = [("a1", a), ("w1", w1), ("w2", w2)] + ([("a2", a2)] if a2 is not None else [])
    dtypes = {op.dtype for _, op in ops}
    if dtypes <= set(FLOAT_DTYPES):
        if dtypes != {"bf16"}:
            return f"{what}: torch's grouped GEMM takes bf16 only; operands are {sorted(dtypes)}"
        if a.arrives_as(activation=True) != "bf16":
            return f"{what}: an activation cast {a.arrives_as(activation=True)}→bf16 is not part of the layer"
        return "bf16"
    if "e2m1" in dtypes:
        return (f"{what}: fp4 (e2m1) weights ({w1.scheme_name()}): torch has no fp4 grouped GEMM "
                f"(needs sm100 block-scaled MMA); never emulated")
    if dtypes & {"int4", "int8"}:
        return f"{what}: torch has no integer grouped GEMM ({w1.scheme_name()})"
    if a.dtype in FLOAT_DTYPES or w1.dtype in FLOAT_DTYPES:
        return (f"{what}: mixed/weight-only quantization (a={a.scheme_name()}, w={w1.scheme_name()}) has no "
                "torch grouped GEMM; a framework backend runs it")
    if device == "cpu":
        return f"{what}: fp8 on CPU: torch has no fp8 grouped GEMM on this device"
    if getattr(torch.version, "hip", None):
        return f"{what}: fp8 grouped GEMM through torch on ROCm is not wired in this backend"
    why = _rowwise_fp8(a, w1, w2, a2)
    if why is not None:
        return f"{what}: {why}"
    return "fp8_rowwise"


def experts_scheme(args: MoeArgs, device: str) -> Union[Scheme, str]:
    e = args.experts
    return _scheme(e.a1, e.w1, e.w2, e.a2, device, "experts")


def shared_scheme(args: MoeArgs, device: str) -> Union[Scheme, str, None]:
    s = args.shared
    if s is None:
        return None
    return _scheme(s.a1, s.w1, s.w2, None, device, "shared experts")


def _alignment(args: MoeArgs, scheme: Scheme) -> Optional[str]:
    """torch's grouped kernels read 16-byte aligned rows: K and N in whole 16-byte units."""
    unit = 8 if scheme == "bf16" else 16
    rows1 = 2 * args.experts.inter if args.activation.is_gated else args.experts.inter
    for name, n in (("width", args.width), ("inter", args.experts.inter), ("w1 rows", rows1)):
        if n % unit:
            return f"{name}={n} is not a multiple of {unit}: torch's grouped GEMM needs 16-byte aligned strides"
    return None


def refusal(args: MoeArgs, device: str) -> Optional[str]:
    """None when the case can really run on `device`; else the reason."""
    why = activation_refusal(args.activation)
    if why:
        return why
    scheme = experts_scheme(args, device)
    if scheme not in ("bf16", "fp8_rowwise"):
        return scheme
    shared = shared_scheme(args, device)
    if shared is not None and shared not in ("bf16", "fp8_rowwise"):
        return shared
    r = args.router
    if isinstance(r.select, GroupedTopK) and args.experts.zero:
        return "grouped_topk over zero experts is not defined (which group would a zero expert be in?)"
    if r.gate.dtype == "bf16" and r.gate.logits == "fp32" and device != "cuda":
        return "a bf16 gate with fp32 logits needs torch.mm(out_dtype=fp32), which has no kernel on this device"
    if device == "cpu":
        return _cpu_grouped_mm()
    if device == "cuda":
        major = _cuda_major()
        if scheme == "fp8_rowwise":
            if major != 9:
                return (f"e4m3 row-wise scaled grouped GEMM is wired for sm90 here; this device is sm{major}x "
                        "(sm100 runs MXFP8 grouped GEMMs, not wired)")
            if scaled_grouped_mm_fn()[0] is None:
                return f"torch {torch.__version__} has no scaled_grouped_mm"
        elif major < 8:
            return f"torch's bf16 grouped_mm needs sm80 or newer; this device is sm{major}x"
        return _alignment(args, cast(Scheme, scheme))     # any other value was returned as a refusal above
    return f"device {device!r}: the torch MoE backend runs on cuda and cpu"
