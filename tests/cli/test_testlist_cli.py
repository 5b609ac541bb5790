"""`operatorx testlist ...`: validate/show/list/upgrade/generate/from-config on good and bad input."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from operatorx.cli import app
from operatorx.spec import load_testlist
from tests.conftest import gemm, moe
from tests.spec.test_upstream import GLM, OLD_GEMM, OLD_MOE

runner = CliRunner()


def test_validate_says_1_case_singular(write_testlist):
    r = runner.invoke(app, ["testlist", "validate", str(write_testlist([gemm()]))])
    assert r.exit_code == 0 and ": 1 case\n" in r.output


def test_a_markup_key_prints_as_text_with_a_warning(write_testlist):
    path = write_testlist([{**gemm(), "[/red]": 1}], "inj[v2].json")
    r = runner.invoke(app, ["testlist", "validate", str(path)])
    assert r.exit_code == 0, r.output
    assert "[/red]: not a case field" in r.output and "inj[v2].json" in r.output
    assert "Traceback" not in r.output


def test_an_error_line_with_markup_prints_as_text(write_testlist):
    bad = gemm()
    bad["args"]["[/red]"] = 1
    r = runner.invoke(app, ["testlist", "validate", str(write_testlist([bad], "x[b].json"))])
    assert r.exit_code == 1 and "args.[/red]: Extra inputs" in r.output and "x[b].json" in r.output


def test_show_lists_recipes(write_testlist):
    path = write_testlist([{**moe(), "sources": GLM, "name": ["mlp"], "recipes": ["glm5-[fp8]-serving"]}])
    r = runner.invoke(app, ["testlist", "show", str(path)])
    assert r.exit_code == 0 and "glm5-[fp8]-serving" in r.output and "1 case" in r.output


def test_list_is_aligned():
    r = runner.invoke(app, ["testlist", "list"])
    assert r.exit_code == 0
    lines = [line for line in r.output.splitlines() if line.strip()]
    starts = {line.index("/") for line in lines[1:]}
    assert len(starts) == 1 and "\t" not in r.output


def test_upgrade_writes_a_file_that_validates(write_testlist, tmp_path):
    old = write_testlist([OLD_MOE, OLD_GEMM], "old.json")
    new = tmp_path / "new.json"
    r = runner.invoke(app, ["testlist", "upgrade", str(old), "-o", str(new)])
    assert r.exit_code == 0, r.output
    assert "wrote 2 cases" in r.output and "softmax top-k" in r.output
    assert [c.type for c in load_testlist(new)] == ["moe", "gemm"]
    assert runner.invoke(app, ["testlist", "validate", str(new)]).exit_code == 0


def test_upgrade_errors_are_lines_exit_2_and_nothing_written(write_testlist, tmp_path):
    bad = json.loads(json.dumps(OLD_MOE))
    bad["args"]["dtype_weight"] = "int3"
    new = tmp_path / "new.json"
    r = runner.invoke(app, ["testlist", "upgrade", str(write_testlist([bad])), "-o", str(new)])
    assert r.exit_code == 2 and "args.dtype_weight" in r.output and "nothing written" in r.output
    assert not new.exists()
    r = runner.invoke(app, ["testlist", "upgrade", str(write_testlist([OLD_GEMM])), "-o", "/missing/dir/x.json"])
    assert r.exit_code == 2 and "does not exist" in r.output and len(r.output.strip().splitlines()) == 1


def test_validate_and_run_on_an_old_file_say_to_upgrade(write_testlist, tmp_path):
    path = write_testlist([OLD_MOE])
    r = runner.invoke(app, ["testlist", "validate", str(path)])
    assert r.exit_code == 1 and "operatorx testlist upgrade" in r.output
    r = runner.invoke(app, ["run", "-t", str(path), "--device", "cpu", "--db", str(tmp_path / "x.db"),
                            "--results-dir", str(tmp_path / "r")])
    assert r.exit_code == 2 and "operatorx testlist upgrade" in r.output


def test_generate_to_a_missing_directory_is_one_line_exit_2():
    r = runner.invoke(app, ["testlist", "generate", "-o", "/missing/dir/x.json", "--models", "llama"])
    assert r.exit_code == 2 and r.output.strip().count("\n") == 0 and "does not exist" in r.output


def test_generate_to_a_directory_is_one_line_exit_2(tmp_path):
    r = runner.invoke(app, ["testlist", "generate", "-o", str(tmp_path), "--models", "llama"])
    assert r.exit_code == 2 and "is a directory" in r.output


def test_models_takes_a_family_prefix(tmp_path):
    out = tmp_path / "l.json"
    r = runner.invoke(app, ["testlist", "generate", "-o", str(out), "--models", "llama", "--tp", "8", "--m", "1"])
    assert r.exit_code == 0, r.output
    sources = {s for c in load_testlist(out) for s in c.sources}
    assert sources and all(s.startswith("meta-llama/") for s in sources)


def test_unknown_model_lists_families_and_ids(tmp_path):
    r = runner.invoke(app, ["testlist", "generate", "-o", str(tmp_path / "x.json"), "--models", "nosuch"])
    assert r.exit_code == 2
    assert "llama-3" in r.output and "qwen3-moe" in r.output and "meta-llama/Llama-3.1-8B-Instruct" in r.output


def test_from_config_without_kv_heads_is_multi_head_attention(tmp_path):
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
              "intermediate_size": 2816, "num_attention_heads": 16, "num_hidden_layers": 2, "vocab_size": 32000,
              "head_dim": 64}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = tmp_path / "mha.json"
    r = runner.invoke(app, ["testlist", "from-config", str(path), "--scheme", "bf16", "--tp", "1", "-o", str(out),
                            "--m", "1"])
    assert r.exit_code == 0, r.output
    qkv = [c for c in load_testlist(out) if any("qkv_proj" in s for s in c.sources)]
    assert qkv and qkv[0].args.n == 3 * 16 * 64          # q + k + v, 16 heads each


def test_an_upstream_style_case_runs_through_worker_processes(write_testlist, tmp_path):
    path = write_testlist([{**gemm(m=2, n=64, k=64), "sources": ["org/A", "org/B"], "name": ["q_proj"],
                            "recipes": ["serve-[x]"], "owner": "perf"}])
    db = tmp_path / "x.db"
    r = runner.invoke(app, ["run", "-t", str(path), "--device", "cpu", "--db", str(db), "--results-dir",
                            str(tmp_path / "r"), "--min-samples", "3", "--max-time", "0.1"])
    assert r.exit_code == 0, r.output
    from operatorx.store import Store

    (row,) = Store(str(db)).document("latest")["rows"]
    assert row["status"] == "ok" and row["op"]["sources"] == ["org/A/q_proj", "org/B/q_proj"]
