"""vLLM's own decode step time on this GPU, to hold OperatorX's step estimate against (issue 33).

    # on the H200, after the vllm and engine kits are installed (bench/engine-kit.txt):
    PYTHONPATH=/tmp/site:src python3 bench/step_check.py --model llama-3.1-8b --batch 1 16 64 \
        --ctx 1024 --out $OUT/step-llama.json
    # anywhere (no vLLM, no torch): write and print the config.json and the OperatorX commands
    python bench/step_check.py --dry --model llama-3.1-8b

The model is a catalog checkpoint (src/operatorx/catalog/checkpoints/*.json: its file name, id or
name after the org); its published config becomes a config.json in a temp dir, served by vLLM's
in-process engine with dummy weights and no tokenizer (prompts are token ids).

Rule: a decode step is (wall(max_tokens=N2) - wall(max_tokens=N1)) / (N2 - N1) for B prompts of
the same length, median over repetitions. Why: both runs pay the same prefill (prefix caching is off
and N1 outlasts the chunked prefill, so the staggered start and end are the same in both), so the
difference is N2 - N1 steps with every request decoding. `--ctx` is the mean context of those steps:
prompts are ctx - (N1 + N2) / 2 tokens long. vLLM's per-request timestamps (RequestOutput.metrics,
with log stats on) give a second number: each request's mean inter-token time, median over requests
(its first tokens share steps with other requests' prefill chunks, so it reads high at large B x ctx).

The matching OperatorX scenario has ISL = prompt + N1 and OSL = N2 - N1, so that its decode context
ISL + OSL/2 (docs/serving.md) is `--ctx`; the script prints those commands after the measurement.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import site
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CATALOG_DIR = Path(__file__).resolve().parents[1] / "src" / "operatorx" / "catalog" / "checkpoints"

#: vLLM's architecture class for each model_type the catalog's dense and MoE decoders use.
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
}


@dataclass(frozen=True)
class Plan:
    """What one measurement point runs: B prompts of `prompt_tokens`, decoded N1 and N2 tokens."""

    batch: int
    ctx_tokens: int
    prompt_tokens: int
    n1_tokens: int
    n2_tokens: int

    @property
    def isl_tokens(self) -> int:
        return self.prompt_tokens + self.n1_tokens

    @property
    def osl_tokens(self) -> int:
        return self.n2_tokens - self.n1_tokens


@dataclass
class Point:
    """One (batch, ctx) result: step times in ms, one per repetition, and their medians."""

    batch: int
    ctx_tokens: int
    prompt_tokens: int
    n1_tokens: int
    n2_tokens: int
    step_ms: list[float] = field(default_factory=list)
    step_ms_median: float | None = None
    #: vLLM's per-request mean inter-token time of the N2 run (metrics timestamps), median over requests.
    itl_ms: list[float] = field(default_factory=list)
    itl_ms_median: float | None = None
    wall_n1_s: list[float] = field(default_factory=list)
    wall_n2_s: list[float] = field(default_factory=list)
    operatorx_commands: list[str] = field(default_factory=list)


@dataclass
class Report:
    model: str
    num_hidden_layers: int
    vllm_version: str
    gpu: str
    engine: dict[str, Any]
    points: list[Point]


def checkpoint_data(name: str) -> dict[str, Any]:
    """The catalog data file of `name`: its file name (llama-3.1-8b), id, or name after the org."""
    low = name.lower()
    for path in sorted(CATALOG_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        if low in (path.stem.lower(), data["id"].lower(), data["id"].split("/")[-1].lower()):
            return data
    raise SystemExit(f"unknown model '{name}': give a file name of {CATALOG_DIR} or a checkpoint id")


def hf_config(data: dict[str, Any], max_positions: int, layers: int | None) -> dict[str, Any]:
    """The published config with the architecture vLLM needs, bf16, and room for `max_positions`.

    The catalog keeps only confirmed keys; transformers' defaults fill the rest (rms_norm_eps,
    tie_word_embeddings...), which change values, not the step's shapes.
    """
    cfg = dict(data["config"])
    model_type = cfg.get("model_type")
    if model_type not in ARCHITECTURES:
        raise SystemExit(f"{data['id']}: model_type {model_type!r} has no vLLM architecture here; "
                         f"known: {', '.join(ARCHITECTURES)}")
    cfg["architectures"] = [ARCHITECTURES[model_type]]
    cfg["torch_dtype"] = "bfloat16"
    cfg["max_position_embeddings"] = max(int(cfg.get("max_position_embeddings", 0)), max_positions)
    if layers is not None:
        cfg["num_hidden_layers"] = layers
    return cfg


def plans(batches: list[int], ctxs: list[int], n1: int, n2: int) -> list[Plan]:
    out = []
    for ctx in ctxs:
        prompt = ctx - (n1 + n2) // 2
        if prompt < 1:
            raise SystemExit(f"--ctx {ctx} is shorter than the decoded tokens' mean (N1+N2)/2 = {(n1 + n2) // 2}")
        out += [Plan(b, ctx, prompt, n1, n2) for b in batches]
    return out


def operatorx_commands(model_id: str, plan: Plan, tag: str) -> list[str]:
    """The OperatorX estimate of the same step: a serving scenario whose decode ctx ISL + OSL/2 is ctx."""
    scen = f"scenario-{tag}-b{plan.batch}-c{plan.ctx_tokens}.json"
    return [
        f"python3 -m operatorx testlist serving --model {model_id} --isl {plan.isl_tokens} "
        f"--osl {plan.osl_tokens} --conc {plan.batch} -o {scen}",
        f"python3 -m operatorx run -t {scen} --backend vllm",
        f"python3 -m operatorx estimate latest --scenario {scen}",
    ]


def use_pth_files() -> None:
    """Read the .pth files of PYTHONPATH folders (cutlass DSL finds its package through one).

    Why: Python reads .pth files in site folders only, and the kits install into /tmp/site.
    """
    for folder in filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        if glob.glob(os.path.join(folder, "*.pth")):
            site.addsitedir(folder)


def build_engine(config_dir: str, args: argparse.Namespace, max_model_len: int) -> Any:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    use_pth_files()
    from vllm import LLM

    return LLM(model=config_dir, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
               max_model_len=max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
               enforce_eager=args.enforce_eager, max_num_seqs=max(args.batch),
               max_num_batched_tokens=args.max_num_batched_tokens, enable_prefix_caching=False,
               disable_log_stats=not args.request_stats, seed=0)


def timed_generate(llm: Any, plan: Plan, max_tokens: int, vocab: int, rng: random.Random) -> tuple[float, list[float]]:
    """Wall seconds of one generate of B fresh random prompts, and each request's mean ITL in ms."""
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": [rng.randrange(vocab) for _ in range(plan.prompt_tokens)]}
               for _ in range(plan.batch)]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, detokenize=False)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    itl = []
    for o in outs:
        m = o.metrics
        n = getattr(m, "num_generation_tokens", 0) if m is not None else 0
        if n > 1 and m.last_token_ts > m.first_token_ts:
            itl.append((m.last_token_ts - m.first_token_ts) / (n - 1) * 1e3)
    return wall, itl


def measure(llm: Any, plan: Plan, reps: int, vocab: int, rng: random.Random, point: Point) -> None:
    for _ in range(reps):
        w1, _ = timed_generate(llm, plan, plan.n1_tokens, vocab, rng)
        w2, itl = timed_generate(llm, plan, plan.n2_tokens, vocab, rng)
        point.wall_n1_s.append(round(w1, 6))
        point.wall_n2_s.append(round(w2, 6))
        point.step_ms.append(round((w2 - w1) / plan.osl_tokens * 1e3, 4))
        if itl:
            point.itl_ms.append(round(statistics.median(itl), 4))
        print(f"  B={plan.batch} ctx={plan.ctx_tokens}: wall N1={w1:.3f}s N2={w2:.3f}s "
              f"step={point.step_ms[-1]:.3f} ms itl={point.itl_ms[-1] if itl else '-'} ms", flush=True)
    point.step_ms_median = round(statistics.median(point.step_ms), 4)
    point.itl_ms_median = round(statistics.median(point.itl_ms), 4) if point.itl_ms else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True,
                   help="catalog checkpoint: file name (llama-3.1-8b), id or name after the org")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64], help="concurrent requests B")
    p.add_argument("--ctx", type=int, nargs="+", default=[1024], help="mean context of the timed decode steps")
    p.add_argument("--n1", type=int, default=64, help="max_tokens of the short run (it must outlast the prefill)")
    p.add_argument("--n2", type=int, default=192, help="max_tokens of the long run")
    p.add_argument("--reps", type=int, default=3, help="repetitions per point (median)")
    p.add_argument("--layers", type=int, help="num_hidden_layers override (a quick check of the engine)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--max-num-batched-tokens", type=int, help="vLLM's prefill chunk (default: vLLM's own)")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (default: as vLLM picks)")
    p.add_argument("--no-request-stats", dest="request_stats", action="store_false",
                   help="leave vLLM's log stats off (no per-request timestamps)")
    p.add_argument("--config-dir", help="where config.json goes (default: a new temp dir)")
    p.add_argument("--out", help="JSON report path")
    p.add_argument("--dry", action="store_true", help="write and print config.json and the OperatorX commands only")
    args = p.parse_args(argv)
    if args.n2 <= args.n1 or args.n1 < 1 or (args.n2 - args.n1) % 2:
        p.error("need 1 <= --n1 < --n2 with N2 - N1 even (so that ISL + OSL/2 is --ctx exactly)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data = checkpoint_data(args.model)
    todo = plans(args.batch, args.ctx, args.n1, args.n2)
    max_model_len = max(pl.prompt_tokens for pl in todo) + args.n2 + 16
    cfg = hf_config(data, max_model_len, args.layers)
    config_dir = args.config_dir or tempfile.mkdtemp(prefix="step-check-")
    Path(config_dir).mkdir(parents=True, exist_ok=True)
    (Path(config_dir) / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tag = data["id"].split("/")[-1].lower()
    points = [Point(pl.batch, pl.ctx_tokens, pl.prompt_tokens, pl.n1_tokens, pl.n2_tokens,
                    operatorx_commands=operatorx_commands(data["id"], pl, tag)) for pl in todo]
    print(f"== config.json for {data['id']} in {config_dir}")
    print(json.dumps(cfg, indent=2))
    if not args.dry:
        import torch
        import vllm

        llm = build_engine(config_dir, args, max_model_len)
        sched = llm.llm_engine.vllm_config.scheduler_config
        chunk = int(sched.max_num_batched_tokens)
        rng = random.Random(0)
        print("== warm-up", flush=True)
        timed_generate(llm, todo[0], args.n1, cfg["vocab_size"], rng)
        print("== vLLM decode step", flush=True)
        for pl, pt in zip(todo, points, strict=True):
            prefill_steps = -(-pl.batch * pl.prompt_tokens // chunk)
            if pl.n1_tokens <= prefill_steps:
                print(f"  warning: B={pl.batch} ctx={pl.ctx_tokens}: prefill takes ~{prefill_steps} steps of "
                      f"{chunk} tokens, not fewer than N1={pl.n1_tokens}: raise --n1", flush=True)
            measure(llm, pl, args.reps, cfg["vocab_size"], rng, pt)
        report = Report(model=data["id"], num_hidden_layers=cfg["num_hidden_layers"], vllm_version=vllm.__version__,
                        gpu=torch.cuda.get_device_name(), points=points,
                        engine={"max_model_len": max_model_len, "max_num_seqs": max(args.batch),
                                "max_num_batched_tokens": chunk, "enforce_eager": args.enforce_eager,
                                "gpu_memory_utilization": args.gpu_memory_utilization,
                                "cudagraph_mode": str(llm.llm_engine.vllm_config.compilation_config.cudagraph_mode),
                                "request_stats": args.request_stats})
        print("== result")
        for pt in points:
            print(f"  {data['id']} B={pt.batch} ctx={pt.ctx_tokens}: step {pt.step_ms_median} ms "
                  f"(reps {pt.step_ms}), vLLM ITL {pt.itl_ms_median} ms")
        if args.out:
            Path(args.out).write_text(json.dumps(asdict(report), indent=2) + "\n")
            print(f"wrote {args.out}")
    if args.layers is not None:
        print(f"(note: --layers {args.layers}; the OperatorX scenario below counts the checkpoint's own layers)")
    print("== OperatorX estimate of the same steps (on the same GPU; add the kits' PYTHONPATH there)")
    for pt in points:
        print(f"# B={pt.batch} ctx={pt.ctx_tokens} (ISL+OSL/2 = {pt.prompt_tokens + pt.n1_tokens} + "
              f"{(pt.n2_tokens - pt.n1_tokens) // 2})")
        print("\n".join(pt.operatorx_commands))
    return 0


if __name__ == "__main__":
    sys.exit(main())
