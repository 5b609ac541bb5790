"""The torch GEMM backend: F.linear for bf16/fp16/fp32, F.scaled_mm for fp8 (cuBLASLt / hipBLASLt).

One code path for every device torch supports; what a device or library cannot really run
is refused with the reason, never emulated and never run in another dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import torch
import torch.nn.functional as F

from operatorx.backends.base import Check, Prepared, Unsupported
from operatorx.backends.check import CHECK_ROWS, REL_ERROR_BOUND, rel_error
from operatorx.backends.ranked import RankComm, RankPrepared
from operatorx.backends.refusal import library_refusal
from operatorx.backends.torch.gemm_layers import float_layers, fp8_layers
from operatorx.backends.torch.memory import require_memory
from operatorx.backends.torch.quant import FP8_MAX, dequantize, quantize, torch_dtype
from operatorx.backends.torch.scaled_mm import recipe_for, scale_a_layout, scale_b_layout
from operatorx.spec import Case, GemmArgs
from operatorx.spec.dtypes import FLOAT_DTYPES

__all__ = ["TorchGemm", "float_inputs"]

_TF32_BOUND = 5e-3

def _reference(a_rows: torch.Tensor, weight_fp32_chunks: Callable[[int, int], torch.Tensor], n: int) -> torch.Tensor:
    """fp32 a_rows @ W.T, W produced in N-chunks so the fp32 weight never exists whole."""
    # ~256 MiB of fp32 weight at a time, in whole 128-row blocks so block scales line up
    chunk = max(128, (1 << 28) // max(1, a_rows.shape[1] * 4) // 128 * 128)
    parts = [a_rows @ weight_fp32_chunks(n0, min(n, n0 + chunk)).T for n0 in range(0, n, chunk)]
    return torch.cat(parts, dim=1)


def float_inputs(args: GemmArgs, device: str, gen: torch.Generator) -> dict[str, Any]:
    """A float GEMM's inputs from the case's generator: {"a" [M,K], "b" [N,K], "bias" [N] or None}.

    `py:` code gets the same tensors through `backends.py_file.gemm_inputs`, so its output can
    be compared with this backend's.
    """
    dt = torch_dtype(args.a.dtype)
    return {
        "a": torch.randn(args.m, args.k, generator=gen, device=device, dtype=dt),
        "b": torch.randn(args.n, args.k, generator=gen, device=device, dtype=dt) / args.k ** 0.5,
        "bias": torch.randn(args.n, generator=gen, device=device, dtype=dt) if args.bias else None,
    }


class TorchGemm:
    name = "torch"
    op_type = "gemm"

    def supports(self, case: Case, device: str) -> Optional[str]:
        args = case.args
        assert isinstance(args, GemmArgs)
        a, b = args.a, args.b
        if isinstance(args.bias, str) and args.bias != args.out:
            return f"bias in {args.bias}: torch adds the bias in the output dtype ({args.out})"
        if args.activation is not None:
            return ("torch has no GEMM with a fused activation epilogue; F.linear then an activation "
                    "would time two ops")
        if a.dtype in FLOAT_DTYPES and b.dtype in FLOAT_DTYPES:
            if a.dtype != b.dtype:
                return f"F.linear takes one dtype; a={a.dtype} b={b.dtype}"
            if a.arrives_as(activation=True) != a.dtype:
                return f"an activation cast {a.arrives_as(activation=True)}→{a.dtype} is not part of a torch GEMM"
            if args.out != a.dtype:
                return f"F.linear returns {a.dtype}; out={args.out} would need a separate cast"
            return None
        for op in (a, b):
            if op.dtype == "e2m1":
                return "fp4 (e2m1): the torch backend has no fp4 GEMM (needs sm100 block-scaled MMA)"
            if op.dtype in ("int4", "int8"):
                return f"{op.dtype}: torch has no scaled integer GEMM in its public API"
        if a.dtype in FLOAT_DTYPES or b.dtype in FLOAT_DTYPES:
            return (f"weight-only or mixed quantization (a={a.dtype}, b={b.dtype}) has no torch GEMM; "
                    "a framework backend runs it")
        if device == "cpu":
            return "fp8 on CPU: torch has no native fp8 matrix kernel on this device"
        if getattr(torch.version, "hip", None):
            return "fp8 through torch on ROCm (fnuz formats) is not wired in this backend yet"
        for name, op in (("a", a), ("b", b)):
            if op.scale2 is not None:
                return f"{name}.scale2: torch's fp8 recipes take one scale per operand"
            if op.scale is not None and op.scale.dtype not in ("fp32", "ue8m0"):
                return f"{name}.scale.dtype={op.scale.dtype}: torch's fp8 recipes take fp32 scales"
        if a.scale and b.scale and (a.scale.group == [1, 32] or b.scale.group == [1, 32]):
            major = torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 0
            if major < 10:
                return f"MX formats (1x32 ue8m0 scales) need sm100 block-scaled MMA; this device is sm{major}x"
        recipe, why = recipe_for(args)
        if recipe is None:
            return why
        static_a = a.scale is not None and a.scale.static and a.quantized_in_op(activation=True)
        if static_a and recipe.name != "tensorwise":
            return "a static activation scale is only defined per tensor"
        if args.bias and recipe.name != "tensorwise":
            return f"torch scaled_mm takes a bias with tensorwise scaling only, not {recipe.name}"
        return None

    def supports_ranks(self, case: Case, device: str, world: int) -> Optional[str]:
        """The single-device refusals, then the multi-rank ones (backends/torch/tp.py)."""
        from operatorx.backends.torch.tp import gemm_rank_refusal

        return self.supports(case, device) or gemm_rank_refusal(case, device, world)

    def prepare_ranks(self, case: Case, device: str, comm: RankComm) -> RankPrepared:
        """This rank's share of a tp GEMM, its collective inside the call (backends/torch/tp.py)."""
        from operatorx.backends.torch.tp import prepare_gemm_ranks

        return prepare_gemm_ranks(case, device, comm)

    def prepare(self, case: Case, device: str) -> Prepared:
        args = case.args
        assert isinstance(args, GemmArgs)
        require_memory(self._device_bytes(args), device)
        gen = torch.Generator(device=device).manual_seed(case.seed())
        if args.a.dtype in FLOAT_DTYPES:
            return self._prepare_float(args, device, gen)
        return self._prepare_fp8(args, device, gen)

    @staticmethod
    def _device_bytes(args: GemmArgs) -> int:
        """Bytes the prepared case holds: inputs as they arrive, stored weight, output, check rows."""
        m, n, k = args.m, args.n, args.k
        arrive = torch_dtype(args.a.arrives_as(activation=True)).itemsize
        out = torch_dtype(args.out).itemsize
        total = m * k * arrive + args.b.bytes(n, k, weight=True) + m * n * out
        if args.a.dtype not in FLOAT_DTYPES:
            total += args.a.bytes(m, k, weight=False) + n * k * 2  # quantized a; bf16 weight before quantizing
        total += min(m, CHECK_ROWS) * (n + k) * 4 + (1 << 28)     # fp32 reference rows and one weight chunk
        return total

    # --- bf16 / fp16 / fp32 -----------------------------------------------------------------
    def _prepare_float(self, args: GemmArgs, device: str, gen: torch.Generator) -> Prepared:
        dt = torch_dtype(args.a.dtype)
        state: dict[str, Any] = float_inputs(args, device, gen)

        def fn() -> torch.Tensor:
            return F.linear(state["a"], state["b"], state["bias"])

        def check() -> Check:
            rows = min(args.m, CHECK_ROWS)
            out = fn()[:rows]
            ref = _reference(state["a"][:rows].float(), lambda n0, n1: state["b"][n0:n1].float(), args.n)
            if state["bias"] is not None:
                ref += state["bias"].float()
            tf32 = dt == torch.float32 and device == "cuda" and torch.backends.cuda.matmul.allow_tf32
            bound = _TF32_BOUND if tf32 else REL_ERROR_BOUND[args.out]
            return Check(rel_error(out, ref), bound, rows, "fp32 matmul of the same inputs")

        meta = {"call": "torch.nn.functional.linear", "dtype": args.a.dtype,
                "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32) if device == "cuda" else None}
        return Prepared(fn=fn, check=check, metadata=meta, release=state.clear,
                        layers=float_layers(fn, state, device))

    # --- fp8 ----------------------------------------------------------------------------------
    def _prepare_fp8(self, args: GemmArgs, device: str, gen: torch.Generator) -> Prepared:
        recipe, _ = recipe_for(args)
        assert recipe is not None
        a_op, b_op = args.a, args.b
        assert a_op.scale is not None and b_op.scale is not None
        a_dt, out_dt = torch_dtype(a_op.dtype), torch_dtype(args.out)
        arrive = torch_dtype(a_op.arrives_as(activation=True))
        a_in = torch.randn(args.m, args.k, generator=gen, device=device, dtype=torch.bfloat16)
        w = torch.randn(args.n, args.k, generator=gen, device=device, dtype=torch.bfloat16) / args.k ** 0.5
        bq, sb = quantize(w, b_op.dtype, b_op.scale, weight=True)
        del w
        state: dict[str, Any] = {"bq_t": bq.t(), "sb": scale_b_layout(recipe, sb), "bq": bq, "sb_raw": sb,
                                 "bias": torch.randn(args.n, generator=gen, device=device, dtype=out_dt)
                                 if args.bias else None}
        scaling_a, scaling_b = recipe.scaling_types()
        a_scale = a_op.scale
        dynamic = a_op.quantized_in_op(activation=True) and not a_scale.static
        static_quant = a_op.quantized_in_op(activation=True) and a_scale.static

        def matmul(aq: torch.Tensor, sa: torch.Tensor) -> torch.Tensor:
            return F.scaled_mm(aq, state["bq_t"], scale_a_layout(recipe, sa), scaling_a, state["sb"], scaling_b,
                               bias=state["bias"], output_dtype=out_dt)

        if dynamic:
            state["a"] = a_in.to(arrive)

            def quant_a() -> tuple[torch.Tensor, torch.Tensor]:
                return quantize(state["a"], a_op.dtype, a_scale, weight=False)
        elif static_quant:  # calibrated per-tensor scale: a scaled cast inside the op
            state["a"] = a_in.to(arrive)
            _, state["sa"] = quantize(a_in, a_op.dtype, a_scale, weight=False)
            fp8_max = FP8_MAX[a_op.dtype]

            def quant_a() -> tuple[torch.Tensor, torch.Tensor]:
                q = (state["a"].float() / state["sa"]).clamp_(-fp8_max, fp8_max).to(a_dt)
                return q, state["sa"]
        else:  # arrives already quantized
            state["aq"], state["sa"] = quantize(a_in, a_op.dtype, a_scale, weight=False)

            def quant_a() -> tuple[torch.Tensor, torch.Tensor]:
                return state["aq"], state["sa"]
        del a_in

        def fn() -> torch.Tensor:
            return matmul(*quant_a())

        try:
            fn()
            torch.cuda.synchronize()
        except (RuntimeError, NotImplementedError, ValueError) as err:
            reason = library_refusal(err)
            state.clear()
            if reason is None:
                raise
            raise Unsupported(f"torch scaled_mm ({recipe.name}) refused: {reason}") from err

        b_block = b_op.scale.block(args.n, args.k, weight=True)

        def check() -> Check:
            rows = min(args.m, CHECK_ROWS)
            aq, sa = quant_a()
            out = matmul(aq, sa)[:rows]
            a_block = a_scale.block(args.m, args.k, weight=False)
            a_ref = dequantize(aq, sa, a_block)[:rows]
            bq_, sb_ = state["bq"], state["sb_raw"]
            bn = b_block[0]

            def w_chunk(n0: int, n1: int) -> torch.Tensor:
                # chunks start on a row-block boundary, so scale row n0 // bn belongs to row n0
                return dequantize(bq_[n0:n1], sb_[n0 // bn: -(-n1 // bn)], b_block)

            ref = _reference(a_ref, w_chunk, args.n)
            if state["bias"] is not None:
                ref += state["bias"].float()
            return Check(rel_error(out, ref), REL_ERROR_BOUND[args.out], rows,
                         "fp32 matmul of the dequantized fp8 operands")

        meta = {"call": "torch.nn.functional.scaled_mm", "recipe": recipe.name,
                "scaling": [recipe.a, recipe.b], "activation_quant":
                "dynamic, timed" if dynamic else "static scale, timed cast" if static_quant else "pre-quantized",
                "ue8m0_as_pow2_fp32": a_scale.dtype == "ue8m0" or b_op.scale.dtype == "ue8m0"}
        layers = fp8_layers(fn, quant_a, state, lambda sa: scale_a_layout(recipe, sa), (scaling_a, scaling_b),
                            out_dt, device)
        return Prepared(fn=fn, check=check, metadata=meta, release=state.clear, layers=layers)
