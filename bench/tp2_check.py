"""Issue 34: a tp=2 bf16 GEMM's multi-rank row against an independent sum, its shard on one GPU plus its
collective measured alone, for 5 shapes from decode to prefill and two roles.

    PYTHONPATH=/tmp/site:src python3 bench/tp2_check.py --device cuda --out $OUT/tp2_check.json
    PYTHONPATH=/tmp/site:src python3 bench/tp2_check.py --device cuda --backend vllm --out $OUT/tp2_check_vllm.json
    python bench/tp2_check.py --dry               # CPU, no CUDA: writes the testlists, prints the plan
    python bench/tp2_check.py --device cpu        # CPU: the whole path on small shapes (gloo, host clock)

The cases: Llama-3.1-70B-Instruct's `mlp.down_proj` (row-parallel: K 28672 split, [M, 8192] partial sums
all-reduced) and `mlp.gate_up_proj` (column-parallel: N 57344 split, [M, 28672] slices all-gathered into
[M, 57344]), bf16, tp=2, at M = 1, 16, 128, 1024, 4096. A case's split comes from the role its source
names (spec/shard.py split_of_role; the catalog knows the checkpoint, so the shard is its own shape).

Per case, three measurements (in this order; this process never makes a CUDA context, so the workers
and the collective's two processes own the GPUs):
(a) the multi-rank row: `run_testlist` on 2 workers (`gpus=(0, 1)`; CPU: `workers=2`, gloo), as
    `operatorx run` times it: the row's latency_us is the median of the slowest rank's per-iteration
    kernel span, `metrics.ranks` has skew_us, each rank's latency, busy and collective (NCCL kernel) time.
    With the torch backend the same run also times OperatorX's own `collective` case of each output size
    (a column beside the independent one, not part of the verdict);
(b) the shard: the same testlist with `rank_local=True` on one worker, once per GPU of `--shard-gpus`:
    the GEMM one rank runs, collectives left out;
(c) the collective alone, measured without OperatorX: two processes spawned here (torch.multiprocessing),
    one GPU each (CUDA_VISIBLE_DEVICES as the sweep's workers get it, `--visible all` to see both),
    NCCL with NCCL_NVLS_ENABLE=0 on 127.0.0.1 at a free port, bf16 buffers of the case's sizes:
    row: all_reduce of [M, N] in place (as backends/torch/tp.py); column: all_gather_into_tensor of
    [M, N/2] into [2M, N/2], and the reorder of that buffer into [M, N] that the column call also runs
    (a view at M = 1, a copy kernel above). Timed with CUDA events, each sample behind a one-element
    device all_reduce (the barrier), batches of samples queued behind a GPU spin so no host launch gap
    is inside a sample. Three ways: `single` (one call between an event pair), `loop` (`--reps` calls
    back to back, the pair around them, divided), `graph` (`--reps` calls captured in a CUDA graph,
    one replay between the pair, divided). Per sample the slower rank's time is kept; median over
    `--samples` (>= 100). `--coll-timing` picks the one the verdict uses (default loop).
(d) Prints, per case: the row's latency, skew and per-rank collective time; the shard's latency (the
    slower GPU's); the collective and the reorder; their sum; multi / sum and whether it is within
    `--tolerance` (10%), and beside it multi / (shard + collective), the reorder left out (the issue's
    sum: the two differ only for the column role above M = 1). JSON to --out: settings, versions, every
    row, every collective sample, the NCCL transports each rank's log names.

On the CPU the same three parts run (host clock, gloo); the numbers only show that the path works.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

WORLD = 2
CHECKPOINT = "meta-llama/Llama-3.1-70B-Instruct"
#: role -> (source, whole layer N, K): Llama-3.1-70B's MLP, hidden 8192, intermediate 28672
ROLES: dict[str, tuple[str, int, int]] = {
    "row": (f"{CHECKPOINT}/mlp.down_proj", 8192, 28672),
    "column": (f"{CHECKPOINT}/mlp.gate_up_proj", 57344, 8192),
}
CPU_ROLES: dict[str, tuple[str, int, int]] = {
    "row": ("org/model/mlp.down_proj", 256, 512),
    "column": ("org/model/mlp.gate_up_proj", 512, 256),
}
MS = (1, 16, 128, 1024, 4096)
CPU_MS = (1, 8, 32)
COLL_MODES = ("single", "loop", "graph")
BF16 = {"dtype": "bf16"}


@dataclass(frozen=True)
class Plan:
    """One case of the check: the whole layer, its split, what rank r runs and what it exchanges."""

    index: int
    label: str
    source: str
    split: str
    """`row` (K split, all_reduce of [M, N]) or `column` (N split, all_gather into [M, N])."""
    m: int
    n: int
    k: int
    shard_n: int
    shard_k: int
    rule: str
    collective: str
    """`all_reduce` or `all_gather`."""
    out_elements: int
    """M·N: the all_reduce's buffer, the all_gather's gathered output (NCCL-tests' size)."""

    @property
    def out_mib(self) -> float:
        return self.out_elements * 2 / (1 << 20)


@dataclass(frozen=True)
class CollSpec:
    """What one child times for one case: the collective of the case's output size in bf16."""

    index: int
    kind: str
    m: int
    n: int
    world: int


@dataclass(frozen=True)
class CollSettings:
    device: str
    samples: int
    reps: int
    batch: int
    spin_ms: float
    warmup: int
    modes: tuple[str, ...]
    visible: str
    gpus: tuple[str, ...]
    nccl_debug: bool


@dataclass
class CollResult:
    """One case's independent collective times, µs per call (the slower rank's per sample, then the median)."""

    index: int
    kind: str
    bytes_out: int
    median_us: dict[str, Optional[float]] = field(default_factory=dict)
    """mode -> median over samples of the slower rank's time; None when the mode failed."""
    per_rank_median_us: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    reorder_us: Optional[float] = None
    """Column only: the [2M, N/2] -> [M, N] reorder (0 where it is a view: M = 1), the slower rank's median."""
    samples_us: dict[str, list[list[float]]] = field(default_factory=dict)
    """mode -> per rank, every sample."""


# --- the cases ---------------------------------------------------------------------------------------

def case_dicts(device: str, ms: Sequence[int], splits: Sequence[str]) -> list[dict[str, Any]]:
    roles = CPU_ROLES if device == "cpu" else ROLES
    out = []
    for split in splits:
        source, n, k = roles[split]
        for m in ms:
            out.append({"type": "gemm", "args": {"m": m, "n": n, "k": k, "a": BF16, "b": BF16, "out": "bf16",
                                                 "parallel": {"tp": WORLD}}, "sources": [source]})
    return out


def collective_dicts(plans: Sequence[Plan]) -> list[dict[str, Any]]:
    """OperatorX's own `collective` case of each plan's output size (NCCL-tests' size: elements = M·N)."""
    return [{"type": "collective", "args": {"kind": p.collective, "elements": p.out_elements, "dtype": "bf16",
                                            "parallel": {"tp": WORLD}}, "sources": []} for p in plans]


def plan_cases(raw: Sequence[dict[str, Any]]) -> list[Plan]:
    """Each case validated and cut as the run cuts it (spec/shard.py with the catalog's shapes)."""
    from operatorx.catalog.gemm_split import CATALOG_SHAPES
    from operatorx.spec import Case, GemmArgs
    from operatorx.spec.shard import split_of_role

    plans = []
    for i, d in enumerate(raw):
        case = Case.model_validate(d)
        args = case.args
        assert isinstance(args, GemmArgs)
        shard, rule = args.rank_shard(case.sources, CATALOG_SHAPES)
        split = split_of_role(case.sources[0].rpartition("/")[2])
        if split not in ("row", "column"):
            raise SystemExit(f"{case.label()}: split {split!r}, the check needs row or column")
        plans.append(Plan(index=i, label=case.label(), source=case.sources[0], split=split, m=args.m, n=args.n,
                          k=args.k, shard_n=shard.n, shard_k=shard.k, rule=rule,
                          collective="all_reduce" if split == "row" else "all_gather",
                          out_elements=args.m * args.n))
    return plans


def refusals(raw: Sequence[dict[str, Any]], device: str) -> list[str]:
    """What the torch and vllm backends would refuse of these cases before running them (dry check)."""
    from operatorx.backends.torch.tp import gemm_rank_refusal as torch_refusal
    from operatorx.spec import Case

    said = []
    for d in raw:
        case = Case.model_validate(d)
        why = torch_refusal(case, device, WORLD)
        if why:
            said.append(f"torch refuses {case.label()}: {why}")
        try:
            from operatorx.backends.vllm.ranks import gemm_rank_refusal as vllm_refusal
        except Exception as err:  # noqa: BLE001
            said.append(f"vllm's refusals not importable here: {err}")
            continue
        why = vllm_refusal(case, WORLD)
        if why:
            said.append(f"vllm refuses {case.label()}: {why}")
    return said


def print_plan(plans: Sequence[Plan], work: Path, opts: argparse.Namespace, device: str) -> None:
    cpu = device == "cpu"
    extra = "" if opts.backend != "torch" or opts.no_ox_collective else " (+ OperatorX's own collective cases)"
    print(f"testlists in {work}: tp2_gemm.json (the {len(plans)} GEMMs), tp2_ranks.json{extra}")
    print(f"(a) run_testlist backend={opts.backend} " + ("workers=2 (gloo)" if cpu else "gpus=0,1 (2 workers)")
          + ": multi-rank rows")
    print(f"(b) run_testlist backend={opts.backend} rank_local=True, one worker"
          + ("" if cpu else f" on each of GPU(s) {opts.shard_gpus}"))
    print(f"(c) torch.multiprocessing x2, {'gloo, host clock' if cpu else 'NCCL (NCCL_NVLS_ENABLE=0), CUDA events'}, "
          f"bf16, modes {','.join(opts.coll_modes)}, {opts.samples} samples, {opts.reps} calls per loop/graph "
          f"sample; verdict on {opts.coll_timing}")
    print(f"{'#':>2} {'case':26} {'split':6} {'shard (n x k)':>14} {'collective':10} {'out MiB':>8}  rule")
    for p in plans:
        print(f"{p.index:2d} {p.label:26} {p.split:6} {p.shard_n:>6} x {p.shard_k:<6} {p.collective:10} "
              f"{p.out_mib:8.3f}  {p.rule}")


# --- (a), (b): OperatorX's rows ------------------------------------------------------------------------

def run_rows(testlist: Path, work: Path, name: str, backend: str, device: str, gpus: tuple[int, ...],
             rank_local: bool, l2: str) -> dict[int, Any]:
    """case index -> Row, as `operatorx run -t FILE --backend B --gpus G [--rank-local]` times them."""
    from operatorx.measure import TimingSettings
    from operatorx.run import RunConfig, run_testlist

    if device == "cpu":
        timing = TimingSettings(warmup_calls=2, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=5,
                                max_samples=64, max_time_s=0.3)
        config = RunConfig(testlist=str(testlist), backend=backend, device="cpu", workers=len(gpus),
                           db=str(work / f"{name}.db"), results_dir=work / f"res_{name}", timing=timing,
                           rank_local=rank_local)
    else:
        config = RunConfig(testlist=str(testlist), backend=backend, device="cuda", gpus=gpus,
                           db=str(work / f"{name}.db"), results_dir=work / f"res_{name}",
                           timing=TimingSettings(l2_state=l2),  # type: ignore[arg-type]
                           rank_local=rank_local)
    outcome = run_testlist(config)
    print(f"{name}: {outcome.document_path} ({outcome.state})", flush=True)
    return {row.case_index: row for row in outcome.rows}


# --- (c): the collective alone, without OperatorX ------------------------------------------------------

def _cuda_samples(torch: Any, call: Any, barrier: Any, samples: int, per_sample: int, batch: int,
                  spin_cycles: int) -> list[float]:
    """µs per call: each sample is `barrier(); e0; call() (per_sample calls' worth); e1`, a batch of samples
    queued behind a GPU spin so the host is ahead of the GPU for the whole batch."""
    out: list[float] = []
    while len(out) < samples:
        n = min(batch, samples - len(out))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        torch.cuda._sleep(spin_cycles)
        for e0, e1 in events:
            barrier()
            e0.record()
            call()
            e1.record()
        torch.cuda.synchronize()
        out += [e0.elapsed_time(e1) * 1000.0 / per_sample for e0, e1 in events]
    return out


def _host_samples(call: Any, barrier: Any, samples: int, per_sample: int) -> list[float]:
    import time

    out = []
    for _ in range(samples):
        barrier()
        t0 = time.perf_counter()
        call()
        out.append((time.perf_counter() - t0) * 1e6 / per_sample)
    return out


def _time_spec(torch: Any, dist: Any, gather: Any, ctl: Any, spec: CollSpec, settings: CollSettings, device: Any,
               barrier: Any, spin_cycles: int) -> dict[str, Any]:
    """One spec on this rank: the column's reorder (local), warmup, then each mode's samples. A CUDA graph
    that one rank cannot capture is skipped on every rank (agreed over the gloo group `ctl`)."""
    cuda, world, m, n = settings.device == "cuda", spec.world, spec.m, spec.n
    done: dict[str, Any] = {"index": spec.index, "samples_us": {}, "errors": {}}
    if spec.kind == "all_reduce":
        buf = torch.randn(m, n, device=device, dtype=torch.bfloat16)

        def one() -> None:
            dist.all_reduce(buf)
    else:
        part = n // world
        src = torch.randn(m, part, device=device, dtype=torch.bfloat16)
        dst = torch.empty(world * m, part, device=device, dtype=torch.bfloat16)

        def one() -> None:
            gather(dst, src)
        view = dst.view(world, m, part).permute(1, 0, 2)       # what the column call returns, reshaped
        if view.is_contiguous():
            done["reorder_samples_us"] = [0.0]
        else:
            def reorder() -> None:
                for _ in range(settings.reps):
                    view.reshape(m, n)
            done["reorder_samples_us"] = (
                _cuda_samples(torch, reorder, lambda: None, settings.samples, settings.reps, settings.batch,
                              spin_cycles) if cuda else
                _host_samples(reorder, lambda: None, settings.samples, settings.reps))
    for _ in range(settings.warmup):
        one()
    if cuda:
        torch.cuda.synchronize()
    dist.barrier(group=ctl)

    def loop() -> None:
        for _ in range(settings.reps):
            one()

    for mode in settings.modes:
        call, per = (one, 1) if mode == "single" else (loop, settings.reps)
        if mode == "graph":
            if not cuda:
                continue
            graph, why = torch.cuda.CUDAGraph(), ""
            try:                                   # capture records the calls; nothing is exchanged yet
                with torch.cuda.graph(graph):
                    loop()
                torch.cuda.synchronize()
            except Exception as err:  # noqa: BLE001
                why = f"capture: {type(err).__name__}: {err}"[:500]
            agreed = torch.tensor([0 if why else 1])
            dist.all_reduce(agreed, group=ctl)
            if int(agreed.item()) < world:
                done["errors"][mode] = why or "another rank could not capture the graph"
                continue
            call = graph.replay
        if cuda:
            done["samples_us"][mode] = _cuda_samples(torch, call, barrier, settings.samples, per, settings.batch,
                                                     spin_cycles)
        else:
            done["samples_us"][mode] = _host_samples(call, barrier, settings.samples, per)
        dist.barrier(group=ctl)
    return done


def _collective_rank(rank: int, port: int, specs: list[CollSpec], settings: CollSettings, out_dir: str) -> None:
    """One rank of the independent measurement (a spawned process): NCCL (or gloo) group, every spec timed."""
    cuda = settings.device == "cuda"
    if cuda and settings.visible == "one":
        os.environ["CUDA_VISIBLE_DEVICES"] = settings.gpus[rank]
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    if cuda and settings.nccl_debug:
        os.environ.setdefault("NCCL_DEBUG", "INFO")
        os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,P2P")
        os.environ["NCCL_DEBUG_FILE"] = str(Path(out_dir) / f"nccl.rank{rank}.log")
    import datetime

    import torch
    import torch.distributed as dist

    world = specs[0].world if specs else WORLD
    device = torch.device("cuda", 0 if settings.visible == "one" else rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    init = f"tcp://127.0.0.1:{port}"
    timeout = datetime.timedelta(seconds=300)
    if cuda:
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world, timeout=timeout,
                                device_id=device)
    else:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timeout)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    ctl = dist.new_group(backend="gloo") if cuda else None      # control messages never wait on the GPU
    info: dict[str, Any] = {"rank": rank, "torch": torch.__version__, "specs": []}
    spin_cycles = 0
    if cuda:
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
        nccl = torch.cuda.nccl.version()
        info["nccl"] = ".".join(str(v) for v in nccl) if isinstance(nccl, tuple) else str(nccl)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)
        e0.record()
        torch.cuda._sleep(10_000_000)
        e1.record()
        torch.cuda.synchronize()
        cycles_per_ms = 10_000_000 / max(e0.elapsed_time(e1), 1e-3)
        spin_cycles = int(settings.spin_ms * cycles_per_ms)
        info["spin_cycles"] = spin_cycles
    flag = torch.zeros(1, device=device)

    def barrier() -> None:
        if cuda:
            dist.all_reduce(flag)         # on the device, no host sync: the ranks' GPUs leave it together
        else:
            dist.barrier()

    for spec in specs:
        info["specs"].append(_time_spec(torch, dist, gather, ctl, spec, settings, device, barrier, spin_cycles))
    dist.barrier(group=ctl)
    dist.destroy_process_group()
    with open(Path(out_dir) / f"rank{rank}.json", "w", encoding="utf-8") as f:
        json.dump(info, f)


def measure_collectives(plans: Sequence[Plan], settings: CollSettings, work: Path) -> tuple[list[CollResult],
                                                                                              list[dict[str, Any]]]:
    """Spawn the two ranks, wait, combine: per sample the slower rank's time, then the median."""
    import torch.multiprocessing as mp

    from operatorx.run.ranks.gang import free_port

    out_dir = work / "collective"
    out_dir.mkdir(parents=True, exist_ok=True)
    specs = [CollSpec(index=p.index, kind=p.collective, m=p.m, n=p.n, world=WORLD) for p in plans]
    mp.spawn(_collective_rank, args=(free_port(), specs, settings, str(out_dir)), nprocs=WORLD, join=True)
    ranks = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(WORLD)]
    results = []
    for i, spec in enumerate(specs):
        per = [rk["specs"][i] for rk in ranks]
        res = CollResult(index=spec.index, kind=spec.kind, bytes_out=spec.m * spec.n * 2)
        for mode in settings.modes:
            errs = [p["errors"][mode] for p in per if mode in p["errors"]]
            if errs or any(mode not in p["samples_us"] for p in per):
                res.errors[mode] = errs[0] if errs else "not run on this device"
                res.median_us[mode] = None
                continue
            rows = [p["samples_us"][mode] for p in per]
            res.samples_us[mode] = rows
            res.median_us[mode] = statistics.median(max(xs) for xs in zip(*rows, strict=True))
            res.per_rank_median_us[mode] = [statistics.median(xs) for xs in rows]
        if spec.kind == "all_gather":
            res.reorder_us = max(statistics.median(p["reorder_samples_us"]) for p in per)
        results.append(res)
    for rk in ranks:
        rk.pop("specs")
    for r in range(WORLD):
        log = out_dir / f"nccl.rank{r}.log"
        if log.exists():
            lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines()
                     if " via " in ln or "NCCL version" in ln or "comm " in ln and "Init COMPLETE" in ln]
            ranks[r]["nccl_log"] = lines[:40]
    return results, ranks


# --- (d): the comparison ------------------------------------------------------------------------------

@dataclass
class Verdict:
    index: int
    label: str
    split: str
    multi_us: Optional[float]
    multi_status: str
    skew_us: Optional[float]
    per_rank_latency_us: list[float]
    per_rank_collective_us: list[Optional[float]]
    per_rank_busy_us: list[Optional[float]]
    per_rank_telemetry: list[bool]
    shard_us: dict[str, Optional[float]]
    shard_status: dict[str, str]
    collective_us: Optional[float]
    reorder_us: Optional[float]
    ox_collective_us: Optional[float]
    predicted_us: Optional[float]
    ratio: Optional[float]
    within: Optional[bool]
    ratio_without_reorder: Optional[float]
    notes: list[str] = field(default_factory=list)


def compare(plans: Sequence[Plan], multi: dict[int, Any], shards: dict[str, dict[int, Any]],
            colls: Sequence[CollResult], ox_colls: dict[int, Any], mode: str, tolerance: float) -> list[Verdict]:
    by_index = {c.index: c for c in colls}
    out = []
    for p in plans:
        row = multi.get(p.index)
        ranks = row.ranks if row is not None else None
        notes = []
        if row is not None and row.status != "ok":
            notes.append(f"multi-rank {row.status}: {row.message}")
        shard_us: dict[str, Optional[float]] = {}
        shard_status: dict[str, str] = {}
        for gpu, rows in shards.items():
            srow = rows.get(p.index)
            shard_status[gpu] = srow.status if srow is not None else "absent"
            shard_us[gpu] = srow.latency_us if srow is not None and srow.status == "ok" else None
            if srow is not None and srow.status != "ok":
                notes.append(f"shard on {gpu} {srow.status}: {srow.message}")
        coll = by_index.get(p.index)
        coll_us = coll.median_us.get(mode) if coll is not None else None
        if coll is not None and coll.errors:
            notes += [f"collective {m}: {e}" for m, e in coll.errors.items()]
        reorder = coll.reorder_us if coll is not None else None
        known = [v for v in shard_us.values() if v is not None]
        shard = max(known) if known and len(known) == len(shard_us) else None
        predicted = shard + coll_us + (reorder or 0.0) if shard is not None and coll_us is not None else None
        latency = row.latency_us if row is not None and row.status == "ok" else None
        ratio = latency / predicted if latency is not None and predicted else None
        bare = latency / (shard + coll_us) if latency is not None and shard is not None and coll_us else None
        if row is not None and row.extra:
            layer = (row.extra.get("rank_layer") or {}) if isinstance(row.extra, dict) else {}
            if layer.get("tp_all_reduce"):
                notes.append(f"vLLM's all-reduce: {layer['tp_all_reduce']}")
        ox = ox_colls.get(p.index)
        out.append(Verdict(
            index=p.index, label=p.label, split=p.split, multi_us=latency, multi_status=row.status if row else "absent",
            skew_us=ranks.skew_us if ranks else None,
            per_rank_latency_us=[ln.latency_us for ln in ranks.per_rank] if ranks else [],
            per_rank_collective_us=[ln.collective_us for ln in ranks.per_rank] if ranks else [],
            per_rank_busy_us=[ln.busy_us for ln in ranks.per_rank] if ranks else [],
            per_rank_telemetry=[ln.telemetry is not None for ln in ranks.per_rank] if ranks else [],
            shard_us=shard_us, shard_status=shard_status, collective_us=coll_us, reorder_us=reorder,
            ox_collective_us=ox.latency_us if ox is not None and ox.status == "ok" else None,
            predicted_us=predicted, ratio=ratio, within=abs(ratio - 1) <= tolerance if ratio is not None else None,
            ratio_without_reorder=bare, notes=notes))
    return out


def _f(v: Optional[float], digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def print_verdicts(verdicts: Sequence[Verdict], mode: str, tolerance: float) -> None:
    print(f"\n{'case':26} {'split':6} {'multi µs':>9} {'skew':>6} {'coll/rank (row)':>16} | {'shard µs':>9} "
          f"{'coll µs':>8} {'reorder':>7} {'sum µs':>9} {'ratio':>6} {'w/o reo':>7} {'ox coll':>8}  "
          f"within {tolerance:.0%} ({mode})")
    for v in verdicts:
        coll_rank = "/".join(_f(x, 1) for x in v.per_rank_collective_us) or "-"
        shard = max((x for x in v.shard_us.values() if x is not None), default=None)
        flag = "-" if v.within is None else ("yes" if v.within else "NO")
        print(f"{v.label:26} {v.split:6} {_f(v.multi_us):>9} {_f(v.skew_us):>6} {coll_rank:>16} | {_f(shard):>9} "
              f"{_f(v.collective_us):>8} {_f(v.reorder_us):>7} {_f(v.predicted_us):>9} {_f(v.ratio, 3):>6} "
              f"{_f(v.ratio_without_reorder, 3):>7} {_f(v.ox_collective_us):>8}  {flag}")
        for note in v.notes:
            print(f"    {note}")
    judged = [v for v in verdicts if v.within is not None]
    print(f"\n{sum(v.within is True for v in judged)}/{len(judged)} within {tolerance:.0%} "
          f"(of {len(verdicts)} cases; shard = the slower GPU's rank-local row)")


def versions(backend: str) -> dict[str, Any]:
    import torch

    from operatorx.run.metadata import git_sha

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "operatorx_git_sha": git_sha()}
    if backend == "vllm":
        try:
            from importlib.metadata import version

            out["vllm"] = version("vllm")
        except Exception as err:  # noqa: BLE001
            out["vllm"] = f"unknown: {err}"
    return out


# --- main ---------------------------------------------------------------------------------------------

def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--backend", choices=("torch", "vllm"), default="torch", help="for (a) and (b)")
    p.add_argument("--dry", action="store_true", help="write the testlists and print the plan (CPU, no CUDA)")
    p.add_argument("--out", type=Path, default=None, help="JSON report (default $OUT/tp2_check.json when $OUT is set)")
    p.add_argument("--work", type=Path, default=None, help="testlists, databases, documents (default: a temp dir)")
    p.add_argument("--m", type=int, nargs="+", default=None, help=f"M values (default {MS}; CPU {CPU_MS})")
    p.add_argument("--splits", nargs="+", choices=("row", "column"), default=["row", "column"])
    p.add_argument("--shard-gpus", default="0,1", help="GPUs the rank-local shard runs on, one run each")
    p.add_argument("--l2", default="cold_clean", choices=("cold_clean", "cold_dirty", "warm"), help="rows' L2 state")
    p.add_argument("--coll-modes", nargs="+", choices=COLL_MODES, default=list(COLL_MODES))
    p.add_argument("--coll-timing", choices=COLL_MODES, default="loop", help="the collective time the verdict uses")
    p.add_argument("--samples", type=int, default=200, help="collective samples per mode (>= 100)")
    p.add_argument("--reps", type=int, default=20, help="calls per loop / graph sample")
    p.add_argument("--batch", type=int, default=25, help="samples queued behind one GPU spin")
    p.add_argument("--spin-ms", type=float, default=20.0, help="GPU spin ahead of each batch")
    p.add_argument("--visible", choices=("one", "all"), default="one",
                   help="collective processes see one GPU each (as the sweep's workers) or both")
    p.add_argument("--no-nccl-debug", action="store_true", help="no NCCL_DEBUG log of the transports")
    p.add_argument("--no-ox-collective", action="store_true", help="skip OperatorX's own collective rows")
    p.add_argument("--skip", nargs="*", choices=("multi", "shard", "collective"), default=[],
                   help="parts to leave out (e.g. collective only, to repeat it)")
    p.add_argument("--tolerance", type=float, default=0.10)
    opts = p.parse_args(argv)
    if opts.samples < 100 and opts.device == "cuda":
        p.error("--samples: at least 100 (the issue's median over >= 100)")
    if opts.coll_timing not in opts.coll_modes:
        p.error(f"--coll-timing {opts.coll_timing} is not among --coll-modes")
    return opts


def main(argv: Optional[Sequence[str]] = None) -> int:
    opts = parse(argv)
    from operatorx.spec import Case
    from operatorx.spec.testlist import dump_testlist

    device = "cpu" if opts.dry else opts.device
    ms = tuple(opts.m) if opts.m else (CPU_MS if device == "cpu" and not opts.dry else MS)
    raw = case_dicts("cuda" if opts.dry else device, ms, opts.splits)
    plans = plan_cases(raw)
    work = opts.work or Path(tempfile.mkdtemp(prefix="tp2-check-"))
    work.mkdir(parents=True, exist_ok=True)
    gemm_list, ranks_list = work / "tp2_gemm.json", work / "tp2_ranks.json"
    ox_coll = opts.backend == "torch" and not opts.no_ox_collective
    dump_testlist([Case.model_validate(d) for d in raw], gemm_list)
    dump_testlist([Case.model_validate(d) for d in raw + (collective_dicts(plans) if ox_coll else [])], ranks_list)
    if opts.dry:
        print_plan(plans, work, opts, "cuda")
        for line in refusals(raw, "cuda"):
            print(line)
        return 0
    if device == "cuda":
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < WORLD:
            print("needs 2 CUDA GPUs of one host: run --dry (or --device cpu) on a CPU machine", file=sys.stderr)
            return 2
    out = opts.out or (Path(os.environ["OUT"]) / "tp2_check.json" if os.environ.get("OUT") else None)
    shard_gpus = tuple(int(g) for g in opts.shard_gpus.split(",")) if device == "cuda" else (0,)
    print_plan(plans, work, opts, device)
    # (a) and (b) first: their workers own the GPUs before the collective's processes start
    multi: dict[int, Any] = {}
    ox_rows: dict[int, Any] = {}
    if "multi" not in opts.skip:
        rows = run_rows(ranks_list, work, "ranks", opts.backend, device, (0, 1), False, opts.l2)
        multi = {i: r for i, r in rows.items() if i < len(plans)}
        ox_rows = {i - len(plans): r for i, r in rows.items() if i >= len(plans)}
    shards: dict[str, dict[int, Any]] = {}
    if "shard" not in opts.skip:
        for g in shard_gpus:
            name = f"gpu{g}" if device == "cuda" else "cpu"
            shards[name] = run_rows(gemm_list, work, f"shard_{name}", opts.backend, device, (g,), True, opts.l2)
    colls: list[CollResult] = []
    coll_ranks: list[dict[str, Any]] = []
    modes = tuple(m for m in opts.coll_modes if device == "cuda" or m != "graph")   # no CUDA graph on the CPU
    settings = CollSettings(device=device, samples=opts.samples, reps=opts.reps, batch=opts.batch,
                            spin_ms=opts.spin_ms, warmup=20, modes=modes, visible=opts.visible,
                            gpus=tuple(str(g) for g in range(WORLD)), nccl_debug=not opts.no_nccl_debug)
    coll_error: Optional[str] = None
    if "collective" not in opts.skip:
        os.environ["NCCL_NVLS_ENABLE"] = "0"
        try:
            colls, coll_ranks = measure_collectives(plans, settings, work)
        except Exception as err:  # noqa: BLE001  (the rows are kept and written; the failure is said)
            coll_error = f"{type(err).__name__}: {err}"[:2000]
            print(f"collective measurement failed: {coll_error}", file=sys.stderr)
    verdicts = compare(plans, multi, shards, colls, ox_rows, opts.coll_timing, opts.tolerance)
    print_verdicts(verdicts, opts.coll_timing, opts.tolerance)
    if out is not None:
        report = {"settings": {**vars(opts), "out": str(out), "work": str(work), "device": device,
                               "collective": asdict(settings)},
                  "versions": versions(opts.backend), "collective_ranks": coll_ranks, "collective_error": coll_error,
                  "plans": [asdict(p) for p in plans], "verdicts": [asdict(v) for v in verdicts],
                  "collectives": [asdict(c) for c in colls],
                  "rows": {"multi": {i: r.to_json() for i, r in multi.items()},
                           "shard": {g: {i: r.to_json() for i, r in rows.items()} for g, rows in shards.items()},
                           "ox_collective": {i: r.to_json() for i, r in ox_rows.items()}}}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
