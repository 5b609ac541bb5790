"""Writes the hostile testlist corpus next to this file: `python tests/cli/hostile/make_corpus.py`.

Each file is one malformed or hostile input; its name says what it is. `expect` in MANIFEST.json
says what `testlist validate` must answer: `ok` (loads, perhaps with warnings) or `error`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BF16 = {"dtype": "bf16"}


def gemm(**args: Any) -> dict[str, Any]:
    return {"type": "gemm", "args": {"m": 2, "n": 64, "k": 64, "a": BF16, "b": BF16, "out": "bf16", **args},
            "sources": []}


def fp8(**over: Any) -> dict[str, Any]:
    c = gemm(a={"dtype": "e4m3", "scale": {"dtype": "fp32", "static": False, "group": [1, 32]}},
             b={"dtype": "e4m3", "scale": {"dtype": "fp32", "static": True, "group": [32, 32]}})
    c["args"].update(over)
    return c


def moe(**over: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "tokens": 4, "hidden": 64,
        "experts": {"num": 4, "top_k": 2, "inter": 32, "w1": BF16, "w2": BF16},
        "router": {"gate": {"dtype": "bf16"}, "scoring": "softmax", "select": {"kind": "topk"}},
        "activation": {"kind": "silu"}, "routing": {"distribution": "natural", "seed": 0}}
    args.update(over)
    return {"type": "moe", "args": args, "sources": []}


def put(case: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    case = copy.deepcopy(case)
    node = case
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[k]
    if value is DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return case


DELETE = object()
OLD_MOE = {"type": "moe_gemm", "name": "r1", "args": {
    "num_tokens": 8, "hidden": 7168, "intermediate": 2048, "num_experts": 256, "top_k": 8, "dtype_act": "fp8",
    "dtype_weight": "fp8", "expert_parallel_size": 8, "routed_tensor_parallel_size": 1,
    "shared_tensor_parallel_size": 1, "n_shared_experts": 1, "expert_distribution": "uniform"}}
OLD_GEMM = {"type": "gemm", "name": "skinny", "args": {"m": 16, "n": 4096, "k": 4096, "dtype_a": "fp8",
                                                        "dtype_b": "fp8", "dtype_out": "bf16"}}
MARKUP = "[/red] [bold]x[/bold] [/m] [link=http://evil]y[/link]"
ANSI = "\x1b[31mred\x1b[0m \x1b]8;;http://evil\x07link\x1b]8;;\x07 \x1b]0;pwned\x07 \x1b[2J"
HTML = "<script>alert(1)</script><img src=x onerror=alert(1)> | a\r\nb"
FORMULA = "=HYPERLINK(\"http://evil\",\"x\");+1;-1;@SUM(A1)"
BIDI = "org/\u202emodel\u202c/q_proj\u2066"


def j(data: Any) -> str:
    return json.dumps(data)


# name -> (text or bytes, expect): expect is what `testlist validate` answers, ok or error
CORPUS: dict[str, tuple[Any, str]] = {
    # --- not strict JSON ------------------------------------------------------------------------
    "deep_nesting_100k": ("[" * 100_000 + "]" * 100_000, "error"),
    "deep_nesting_in_case_2": (j([gemm(), gemm()])[:-1] + ", " + "[" * 40 + "]" * 40 + "]", "error"),
    "deep_objects": (j([gemm()])[:-1] + ", " + '{"a":' * 200 + "1" + "}" * 200 + "]", "error"),
    "int_5000_digits": (j([gemm()]).replace('"m": 2', '"m": ' + "9" * 5000), "error"),
    "float_300_digits": (j([moe()]).replace('"seed": 0', '"seed": 0.' + "1" * 300), "error"),
    "nan_router_scale": (j([put(moe(), "args.router.scale", "@X@")]).replace('"@X@"', "NaN"), "error"),
    "neg_infinity_activation_limit": (j([put(moe(), "args.activation.limit", "@X@")]).replace('"@X@"', "-Infinity"),
                                      "error"),
    "infinity_zipf_s": (j([put(moe(), "args.routing.distribution", {"kind": "zipf", "s": "@X@"})])
                        .replace('"@X@"', "Infinity"), "error"),
    "overflow_1e999": (j([put(moe(), "args.router.scale", "@X@")]).replace('"@X@"', "1e999"), "error"),
    "nan_as_size": (j([gemm()]).replace('"m": 2', '"m": NaN'), "error"),
    "duplicate_type_key": ('[{"type": "moe", "type": "gemm", "args": ' + j(gemm()["args"]) + "}]", "error"),
    "duplicate_args_key": (j([gemm()]).replace('"m": 2', '"m": 2, "m": 4096'), "error"),
    "duplicate_nested_scale_key": (j([fp8()]).replace('"static": true', '"static": true, "static": false'), "error"),
    "lone_surrogate_source": (j([gemm()]).replace('"sources": []', '"sources": ["org/m\\ud800/q"]'), "error"),
    "lone_surrogate_key": (j([gemm()]).replace('"sources": []', '"sources": [], "\\udc00": 1'), "error"),
    "truncated": (j([gemm()])[:40], "error"),
    "empty_file": ("", "error"),
    "whitespace_only": ("  \n\t ", "error"),
    "not_utf8": (b'[{"type": "gemm", "sources": ["caf\xe9"]}]', "error"),
    "utf8_bom": (b"\xef\xbb\xbf" + j([gemm()]).encode(), "error"),
    "utf16": (j([gemm()]).encode("utf-16"), "error"),
    "trailing_comma": (j([gemm()])[:-1] + ",]", "error"),
    "single_quotes": (j([gemm()]).replace('"', "'"), "error"),
    "comments": ("// a testlist\n" + j([gemm()]), "error"),
    "two_documents": (j([gemm()]) + j([gemm()]), "error"),
    "nul_bytes": (b"[\x00]", "error"),
    # --- not a testlist ---------------------------------------------------------------------------
    "top_level_object": (j(gemm()), "error"),
    "top_level_string": (j("gemm"), "error"),
    "top_level_number": ("42", "error"),
    "top_level_null": ("null", "error"),
    "empty_array": ("[]", "ok"),
    "array_of_nulls": (j([None, None]), "error"),
    "array_of_numbers": (j([1, 2.5, -3]), "error"),
    "array_of_strings": (j(["gemm", MARKUP]), "error"),
    "nested_case_array": (j([[gemm()]]), "error"),
    "thousand_bad_cases": (j([put(gemm(), "args.m", 0)] * 1000), "error"),
    # --- bad cases --------------------------------------------------------------------------------
    "missing_type": (j([put(gemm(), "type", DELETE)]), "error"),
    "missing_args": (j([put(gemm(), "args", DELETE)]), "error"),
    "type_conv": (j([put(gemm(), "type", "conv")]), "error"),
    "type_number": (j([put(gemm(), "type", 1)]), "error"),
    "type_markup": (j([put(gemm(), "type", MARKUP)]), "error"),
    "args_string": (j([put(gemm(), "args", "m=2")]), "error"),
    "args_list": (j([put(gemm(), "args", [2, 64, 64])]), "error"),
    "gemm_zero_m": (j([put(gemm(), "args.m", 0)]), "error"),
    "gemm_negative_k": (j([put(gemm(), "args.k", -64)]), "error"),
    "gemm_string_m": (j([put(gemm(), "args.m", "2")]), "error"),
    "gemm_float_m": (j([put(gemm(), "args.m", 2.0)]), "error"),
    "gemm_bool_m": (j([put(gemm(), "args.m", True)]), "error"),
    "gemm_null_m": (j([put(gemm(), "args.m", None)]), "error"),
    "gemm_unknown_dtype": (j([put(gemm(), "args.a.dtype", "bf17")]), "error"),
    "gemm_fp8_without_scale": (j([put(fp8(), "args.a.scale", DELETE)]), "error"),
    "gemm_bf16_with_scale": (j([put(gemm(), "args.a.scale", {"dtype": "fp32", "static": True, "group": [-1, -1]})]),
                             "error"),
    "scale_group_three": (j([put(fp8(), "args.a.scale.group", [1, 32, 1])]), "error"),
    "scale_group_zero": (j([put(fp8(), "args.b.scale.group", [0, 32])]), "error"),
    "scale_group_not_dividing": (j([put(fp8(), "args.a.scale.group", [1, 48])]), "error"),
    "scale_group_huge_negative": (j([put(fp8(), "args.a.scale.group", [1, -5])]), "error"),
    "scale_dtype_bad": (j([put(fp8(), "args.b.scale.dtype", "fp64")]), "error"),
    "scale_static_string": (j([put(fp8(), "args.b.scale.static", "yes")]), "error"),
    "symmetric_on_float_dtype": (j([put(fp8(), "args.a.symmetric", False)]), "error"),
    "scale2_without_scale": (j([put(gemm(), "args.a", {"dtype": "bf16", "scale2": {
        "dtype": "fp32", "static": True, "group": [-1, -1]}})]), "error"),
    "gemm_unknown_arg_key": (j([put(gemm(), "args.mm", 4)]), "error"),
    "gemm_markup_arg_key": (j([put(gemm(), "args.[/red]", 4)]), "error"),
    "gemm_ansi_arg_key": (j([put(gemm(), "args.\x1b[31mk", 4)]), "error"),
    "gemm_out_int8": (j([put(gemm(), "args.out", "int8")]), "error"),
    "gemm_bias_bad": (j([put(gemm(), "args.bias", "yes")]), "error"),
    "gemm_activation_bad": (j([put(gemm(), "args.activation", "swish")]), "error"),
    "parallel_tp_zero": (j([put(gemm(), "args.parallel", {"tp": 0})]), "error"),
    "parallel_unknown_key": (j([put(gemm(), "args.parallel", {"pp": 2})]), "error"),
    "moe_top_k_exceeds": (j([put(moe(), "args.experts.top_k", 5)]), "error"),
    "moe_zero_experts": (j([put(moe(), "args.experts.num", 0)]), "error"),
    "moe_groups_not_dividing": (j([put(moe(), "args.router.select", {"kind": "grouped_topk", "groups": 3,
                                                                    "topk_groups": 1})]), "error"),
    "moe_topk_groups_exceed": (j([put(moe(), "args.router.select", {"kind": "grouped_topk", "groups": 2,
                                                                   "topk_groups": 3})]), "error"),
    "moe_unknown_scoring": (j([put(moe(), "args.router.scoring", "relu")]), "error"),
    "moe_unknown_select": (j([put(moe(), "args.router.select", {"kind": "random"})]), "error"),
    "moe_unknown_distribution": (j([put(moe(), "args.routing.distribution", "uniform")]), "error"),
    "moe_zipf_negative_s": (j([put(moe(), "args.routing.distribution", {"kind": "zipf", "s": -1.0})]), "error"),
    "moe_zipf_string_s": (j([put(moe(), "args.routing.distribution", {"kind": "zipf", "s": "1.2"})]), "error"),
    "moe_unknown_activation": (j([put(moe(), "args.activation.kind", "relu2")]), "error"),
    "moe_negative_seed": (j([put(moe(), "args.routing.seed", -1)]), "error"),
    "moe_missing_router": (j([put(moe(), "args.router", DELETE)]), "error"),
    "moe_router_scale_string": (j([put(moe(), "args.router.scale", "2.5")]), "error"),
    "sources_string": (j([put(gemm(), "sources", "org/m/q_proj")]), "error"),
    "sources_empty_entry": (j([put(gemm(), "sources", ["org/m/q", "  "])]), "error"),
    "sources_numbers": (j([put(gemm(), "sources", [1, 2])]), "error"),
    "name_count_mismatch": (j([{**gemm(), "sources": ["a/b", "c/d", "e/f"], "name": ["x", "y"]}]), "error"),
    "name_number": (j([{**gemm(), "sources": ["a/b"], "name": 7}]), "error"),
    "recipes_string": (j([{**gemm(), "recipes": "serve-x"}]), "error"),
    "recipes_empty_entry": (j([{**gemm(), "recipes": [""]}]), "error"),
    "metadata_not_object": (j([{**gemm(), "metadata": [1]}]), "error"),
    "old_moe_gemm_format": (j([OLD_MOE]), "error"),
    "old_gemm_dtype_strings": (j([OLD_GEMM, gemm()]), "error"),
    "moe_forward_type": (j([{"type": "moe_forward", "args": {"num_tokens": 8}}]), "error"),
    # --- valid, with hostile strings that reach the output ------------------------------------------
    "markup_unknown_top_level_key": (j([{**gemm(), "[/red]": 1, "[bold]": "[/bold]"}]), "ok"),
    "ansi_unknown_top_level_key": (j([{**gemm(), ANSI: 1}]), "ok"),
    "nul_in_key": (j([{**gemm(), "a\u0000b": 1}]), "ok"),
    "markup_sources": (j([put(gemm(), "sources", [f"org/{MARKUP}/q_proj", "py:b.py:ok[x=1]"])]), "ok"),
    "ansi_osc_sources": (j([put(gemm(), "sources", [f"org/{ANSI}/o_proj"])]), "error"),
    "html_sources": (j([put(gemm(), "sources", [f"org/{HTML}/mlp"])]), "error"),
    "formula_sources": (j([put(gemm(), "sources", [FORMULA, "-2+3", "@cmd"])]), "ok"),
    "bidi_sources": (j([put(gemm(), "sources", [BIDI])]), "ok"),
    "long_source_100k": (j([put(gemm(), "sources", ["org/" + "x" * 100_000 + "/q"])]), "ok"),
    "markup_recipes": (j([{**gemm(), "recipes": [MARKUP, ANSI, HTML]}]), "error"),
    "one_role_many_sources": (j([{**moe(), "sources": ["org/A", "org/B[v2]"], "name": ["[/mlp]"]}]), "ok"),
    "huge_gemm_refused_on_cpu": (j([put(put(put(gemm(), "args.m", 2**40), "args.n", 2**40), "args.k", 2**40)]),
                                 "ok"),
    "fp8_gemm_unsupported_on_cpu": (j([fp8()]), "ok"),
    "gemm_bias_null_is_absent": (j([put(gemm(), "args.bias", None)]), "ok"),
    "inj[v2]": (j([{**gemm(), "[/x]": MARKUP}]), "ok"),
    "inj[bold]bad[-v2]": (j([put(gemm(), "args.m", "[/red]")]), "error"),
}


def main() -> None:
    manifest = {}
    for name, (content, expect) in CORPUS.items():
        path = HERE / f"{name}.json"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        manifest[f"{name}.json"] = expect
    (HERE / "MANIFEST.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(manifest)} files")


if __name__ == "__main__":
    main()
