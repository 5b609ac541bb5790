"""How a prepared case is checked against its fp32 reference: the error measure and the bounds.

One place, so every backend (and `py:` user code checked on the torch backend's inputs) judges
an output the same way.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHECK_ROWS", "REL_ERROR_BOUND", "FP8_LAYER_ERROR", "FP8_CHAINED_LAYERS", "fp8_projection_bound",
           "rel_error"]

#: Rows of the output compared with the reference: enough to cover every K block and every
#: column, few enough that the fp32 reference stays cheap for prefill shapes.
CHECK_ROWS = 256
#: ||out - ref|| / ||ref|| allowed, by output dtype: the output's rounding dominates.
REL_ERROR_BOUND = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 1e-4}


#: ||out - ref|| / ||ref|| one block-FP8 projection adds against a reference that quantizes the same
#: activations with the same groups: the module's inputs are bf16 where the reference's are fp32, so a
#: value near an e4m3 rounding boundary (3 mantissa bits: a step is 6-12% of the value) now and then
#: lands in the neighbouring step.
FP8_LAYER_ERROR = 3e-2
#: Block-FP8 projections one after another on the way from an attention module's input to its output:
#: gqa qkv_proj -> o_proj; mla q_a -> q_b -> (kv_b_proj over the latents) -> o_proj.
FP8_CHAINED_LAYERS = {"gqa": 2, "mla": 4}


def fp8_projection_bound(op_type: str) -> float:
    """The check's bound for an attention module whose projections are all block FP8: the chained layers'
    independent flips add in quadrature."""
    return float(FP8_LAYER_ERROR * FP8_CHAINED_LAYERS[op_type] ** 0.5)


def rel_error(out: Any, ref: Any) -> float:
    """||out - ref||_F / ||ref||_F in fp32 (NaN anywhere gives NaN, which no bound passes)."""
    return float((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))
