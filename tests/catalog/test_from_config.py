"""from_config on config.json fixtures of architectures not in the catalog, and its errors."""

from __future__ import annotations

import json

import pytest

from operatorx.catalog import CatalogError, from_config

from conftest import FIXTURES, shapes_by_role


def test_dense_gqa_fixture_tp2(fixtures):
    cases = from_config(fixtures / "dense_gqa_config.json", "fp8_channel", 2, ms=[1, 512])
    assert shapes_by_role(cases) == {
        "self_attn.qkv_proj": ((16 + 2 * 4) * 128, 5120),
        "self_attn.o_proj": (5120, 16 * 128),
        "mlp.gate_up_proj": (2 * 32768 // 2, 5120),
        "mlp.down_proj": (5120, 32768 // 2),
        "lm_head": (131072 // 2, 5120),
    }
    assert all(c.sources[0].startswith("example/dense-gqa-24b/") for c in cases)
    assert len(cases) == 5 * 2
    head = next(c for c in cases if c.sources[0].endswith("lm_head"))
    assert head.args.b.dtype == "bf16"  # lm_head stays bf16


def test_moe_with_shared_fixture_tp4(fixtures):
    cases = from_config(fixtures / "moe_shared_config.json", "bf16", 4, ms=[1])
    shapes = shapes_by_role(cases)
    assert shapes["mlp.gate"] == (64, 2048)
    assert shapes["mlp.shared_expert.gate_up_proj"] == (2 * 2048 // 4, 2048)
    assert shapes["self_attn.qkv_proj"] == ((4 + 2 * 1) * 128, 2048)
    assert "mlp.gate_up_proj" not in shapes  # all layers MoE
    moe = [c for c in cases if c.type == "moe"]
    assert [c.args.tokens for c in moe] == [1, 8, 64, 512, 2048]
    assert moe[0].args.experts.inter == 1024 // 4


def _write(tmp_path, **changes):
    config = json.loads((FIXTURES / "dense_gqa_config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_missing_field_names_it(tmp_path):
    with pytest.raises(CatalogError, match="vocab_size"):
        from_config(_write(tmp_path, vocab_size=None), "bf16", 1)


def test_moe_without_norm_topk_prob_is_an_error(tmp_path, fixtures):
    """Renormalization changes the combine weights: an unknown model type without it is not guessed."""
    config = json.loads((fixtures / "moe_shared_config.json").read_text())
    del config["norm_topk_prob"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(CatalogError, match="norm_topk_prob"):
        from_config(path, "bf16", 1)


def test_glm4_moe_config_runs_its_router_gate_in_fp32(tmp_path, fixtures):
    """The implementation table (vLLM Glm4MoE: fp32 nn.Linear) decides the router gate, not --scheme."""
    config = json.loads((fixtures / "moe_shared_config.json").read_text())
    config.update(model_type="glm4_moe", n_routed_experts=config.pop("num_experts"), scoring_func="sigmoid",
                  n_group=1, topk_group=1)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    cases = from_config(path, "fp8_block", 1, ms=[1])
    gate = next(c for c in cases if c.sources[0].endswith("/mlp.gate")).args
    assert (gate.a.dtype, gate.b.dtype, gate.out) == ("fp32", "fp32", "fp32")
    moe = next(c for c in cases if c.type == "moe").args
    assert (moe.router.gate.dtype, moe.router.gate.logits, moe.router.bias) == ("fp32", "fp32", True)
    assert moe.router.select.kind == "grouped_topk"  # Glm4MoE: use_grouped_topk=True, one group


def test_unknown_architecture(tmp_path):
    with pytest.raises(CatalogError, match="unknown architecture.*intermediate_size"):
        from_config(_write(tmp_path, intermediate_size=None), "bf16", 1)


def test_unknown_scheme(fixtures):
    with pytest.raises(CatalogError, match="unknown scheme 'fp7'"):
        from_config(fixtures / "dense_gqa_config.json", "fp7", 1)


def test_tp_not_dividing_heads(tmp_path):
    with pytest.raises(CatalogError, match="tp=8 does not divide num_attention_heads=12"):
        from_config(_write(tmp_path, num_attention_heads=12, num_key_value_heads=4), "bf16", 8)


def test_moe_without_scoring_func_is_an_error(tmp_path, fixtures):
    config = json.loads((fixtures / "moe_shared_config.json").read_text())
    del config["scoring_func"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(CatalogError, match="scoring_func"):
        from_config(path, "bf16", 1)


def test_a_config_that_is_not_an_object_is_refused(tmp_path):
    from operatorx.catalog.errors import CatalogError
    from operatorx.catalog.generate import from_config

    path = tmp_path / "config.json"
    path.write_text("[1, 2]")
    with pytest.raises(CatalogError, match="a config.json is a JSON object, got list"):
        from_config(path, "bf16", 1)
