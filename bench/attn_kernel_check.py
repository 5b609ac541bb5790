"""Issue 31: the attention kernel's time inside OperatorX's vllm gqa module, beside the same kernel called
directly (vLLM's FlashAttention 3) and FlashInfer's paged attention, for 6 decode and 2 prefill shapes.

    PYTHONPATH=/tmp/site:src python3 bench/attn_kernel_check.py --out $OUT/attn_kernel_check.json
    python bench/attn_kernel_check.py --dry          # CPU: writes the testlist, prints the plan

The shapes: Llama-3.1-8B attention (hidden 4096, 32q/8kv x 128, rope_theta 5e5) and Qwen3-30B-A3B's
(hidden 2048, 32q/4kv x 128, q/k norm, rope_theta 1e6), each at decode 16 x ctx 1024, 16 x ctx 8192,
64 x ctx 8192 and one prefill of 2048 new tokens (ctx 0). MLA is left out: OperatorX has no vLLM MLA
module yet. They are written as gqa cases to bench/lists/attn_kernel_check.json.

Per shape, three measurements of the attention kernel:
1. module: `operatorx run --backend vllm` over the testlist (in-process `run_testlist`, a worker per GPU as
   the CLI), and the row's kernel breakdown (`metrics.profile.kernels`, from the timed CUPTI records): the
   kernels report/kernel_class.py calls `attention` (FlashAttention 3's FlashAttnFwdSm90 and its
   FlashAttnFwdCombine), summed per call (each kernel's launches per call x its median launch).
2. FA3 direct: `vllm.vllm_flash_attn.flash_attn_varlen_func` on a paged bf16 cache laid out as the row's
   (block 16, K and V packed in one (blocks, kv_heads, 16, 2·head_dim) tensor, vLLM's NHD stride order),
   the same batch index (OperatorX's plan_layout / batch_index), and the arguments FlashAttentionImpl.forward
   passes: causal, window (-1, -1), scheduler_metadata from get_scheduler_metadata (the builder's
   aot_schedule), num_splits = the row's `max_num_splits` (32 under vLLM's full decode graphs, else 0 =
   FA3's heuristic). Timed three ways: flashinfer.testing.bench_gpu_time (FlashInfer's harness: CUDA
   events per call); CUDA events over a CUDA graph of `--graph-calls` [flush, call] pairs less a graph
   of the flushes alone; and OperatorX's own kernel breakdown of the direct call (Kineto records, the row's
   flush), so the module and the direct call are compared with one instrument too.
3. FlashInfer: BatchDecodeWithPagedKVCacheWrapper (tensor cores, as vLLM's FlashInfer backend) or
   BatchPrefillWithPagedKVCacheWrapper (causal), NHD, page 16, on a (blocks, 2, 16, kv_heads, head_dim)
   copy of the same K/V (so its output is checked against FA3's), timed with bench_gpu_time. A FlashInfer
   part that cannot run (no JIT cache, no nvcc) reads `unsupported: <reason>`.

The L2 rule: OperatorX times each call from cold_clean L2 by default (measure/settings.py l2_state;
measure/l2.py: zero a buffer of 2x L2, then discard.global.L2 over it). The graph and breakdown paths
here produce the row's state with the same flush; bench_gpu_time's cold_l2_cache=True zeroes 2x L2 before
each call and leaves the lines dirty (OperatorX's cold_dirty): its write-backs are part of its number, and
`--l2 cold_dirty` makes the rows match it. The output says which state each number started in.
Prints one table; writes JSON with every kernel name each measurement saw.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from operatorx.backends.torch.attention.layout import PAGE_TOKENS, plan_layout
from operatorx.backends.vllm.attention.batch import BatchIndex, batch_index
from operatorx.report.kernel_class import classify
from operatorx.spec import Case
from operatorx.spec.attention import GqaArgs
from operatorx.spec.testlist import dump_testlist

DEFAULT_TESTLIST = Path(__file__).resolve().parent / "lists" / "attn_kernel_check.json"
L2_STATES = ("cold_clean", "cold_dirty", "warm")
#: vLLM's default KV-cache layout (v1/attention/backends/utils.py get_kv_cache_layout): NHD, i.e. the
#: logical (blocks, kv_heads, block, 2·head_dim) cache stored as (blocks, block, kv_heads, 2·head_dim).
NHD_ORDER = (0, 2, 1, 3)
#: vLLM 0.26 AttentionConfig.flash_attn_max_num_splits_for_cuda_graph (config/attention.py).
GRAPH_MAX_SPLITS = 32
#: FlashInfer float workspace (vLLM's default VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE is 394 MiB).
FLASHINFER_WORKSPACE_BYTES = 512 << 20
#: GPU spin queued ahead of a profiled batch, per call: ~100 µs at ~2 GHz, so the host stays ahead.
SPIN_CYCLES_PER_CALL = 200_000
#: ||FlashInfer - FA3|| / ||FA3|| above this: the two did not compute the same attention.
AGREEMENT_BOUND = 2e-2


# --- the shapes ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttentionModule:
    """One checkpoint's attention sizes, as its config gives them."""

    source: str
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    qk_norm: bool
    note: Optional[str] = None
    """What the case format cannot hold (kept in the case's metadata)."""


@dataclass(frozen=True)
class BatchShape:
    count: int
    q: int
    ctx: int

    @property
    def phase(self) -> str:
        return "decode" if self.q == 1 else "prefill"


MODULES = (
    AttentionModule("meta-llama/Llama-3.1-8B-Instruct/self_attn", 4096, 32, 8, 128, 500000.0, False,
                    "llama3 rope_scaling factor 8 (the gqa case format has no rope_scaling; RoPE frequencies "
                    "differ, the attention kernel's work does not)"),
    AttentionModule("Qwen/Qwen3-30B-A3B/self_attn", 2048, 32, 4, 128, 1000000.0, True),
)
BATCHES = (BatchShape(16, 1, 1024), BatchShape(16, 1, 8192), BatchShape(64, 1, 8192), BatchShape(1, 2048, 0))


def make_case(m: AttentionModule, b: BatchShape) -> Case:
    """The gqa case of one module at one batch shape (bf16 projections and cache, contiguous pages)."""
    args = {"hidden": m.hidden, "batch": {"groups": [{"count": b.count, "q": b.q, "ctx": b.ctx}],
                                          "pages": "contiguous", "seed": 0},
            "q_heads": m.q_heads, "kv_heads": m.kv_heads, "head_dim": m.head_dim, "rope_dim": m.head_dim,
            "rope_theta": m.rope_theta, "qk_norm": m.qk_norm, "gate": False, "kv_cache_dtype": "auto"}
    data: dict[str, Any] = {"type": "gqa", "args": args, "sources": [m.source]}
    if m.note is not None:
        data["metadata"] = {"rope_scaling_not_in_case": m.note}
    return Case.model_validate(data)


def shape_cases() -> list[Case]:
    """6 decode and 2 prefill cases: each module at each batch shape."""
    return [make_case(m, b) for m in MODULES for b in BATCHES]


def gqa(case: Case) -> GqaArgs:
    assert isinstance(case.args, GqaArgs)
    return case.args


def phase_of(case: Case) -> str:
    return "decode" if all(g.q == 1 for g in gqa(case).batch.groups) else "prefill"


def keep(case: Case, only: Optional[str]) -> bool:
    """The run's `--filter` rule (label, scheme or sources contain the text), so indices agree with its rows."""
    return only is None or only in case.label() or only in case.scheme() or any(only in s for s in case.sources)


# --- the plan (CPU) --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShapePlan:
    index: int
    label: str
    source: str
    phase: str
    tokens: int
    requests: int
    seq_len_max: int
    blocks: int
    kv_cache_mib: float
    num_splits_if_no_row: int


def default_num_splits(tokens: int) -> int:
    """vLLM's rule (FlashAttentionMetadataBuilder.build): under full CUDA graphs, a batch of at most the
    largest capture size gets the graph's split bound; else 0 (FA3's own heuristic)."""
    from operatorx.backends.vllm.quant_map import MAX_CAPTURE_SIZE

    return GRAPH_MAX_SPLITS if tokens <= MAX_CAPTURE_SIZE else 0


def batch_of(case: Case) -> BatchIndex:
    args = gqa(case)
    return batch_index(plan_layout(args.batch, args.window), None)   # FlashAttention's builder: no reorder


def plan_of(index: int, case: Case) -> ShapePlan:
    args, ix = gqa(case), batch_of(case)
    cache_bytes = ix.num_blocks * PAGE_TOKENS * 2 * args.kv_heads * args.head_dim * 2
    return ShapePlan(index, case.label(), case.sources[0], phase_of(case), ix.num_tokens, len(ix.order),
                     ix.max_seq_len, ix.num_blocks, cache_bytes / 2**20, default_num_splits(ix.num_tokens))


def print_plan(plans: Sequence[ShapePlan], testlist: Path, l2: str) -> None:
    print(f"testlist: {testlist} ({len(plans)} cases)")
    print("| # | case | phase | T | requests | max seq | blocks | K/V cache MiB | num_splits (no row) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in plans:
        print(f"| {p.index} | {p.label} ({p.source}) | {p.phase} | {p.tokens} | {p.requests} | {p.seq_len_max} | "
              f"{p.blocks} | {p.kv_cache_mib:.0f} | {p.num_splits_if_no_row} |")
    print(f"\nmodule: run_testlist(backend=vllm, l2_state={l2}); the row's attention-class kernels")
    print("FA3 direct: vllm.vllm_flash_attn.flash_attn_varlen_func, fa_version and num_splits from the row, "
          "scheduler_metadata from get_scheduler_metadata; bench_gpu_time + CUDA-graph events + kernel breakdown")
    print("FlashInfer: BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True) / "
          "BatchPrefillWithPagedKVCacheWrapper(causal), NHD, page 16; bench_gpu_time + kernel breakdown")
    print(l2_statement(l2))


def l2_statement(state: str) -> str:
    graph = {"cold_clean": "zero 2x L2 + discard.global.L2 (OperatorX's cold_clean flush)",
             "cold_dirty": "zero 2x L2 (OperatorX's cold_dirty flush)", "warm": "no flush"}[state]
    bench = ("cold_l2_cache=True: zero_() of 2x L2 before each call, lines left dirty (= cold_dirty)"
             if state != "warm" else "cold_l2_cache=False (warm)")
    return (f"L2: module rows {state}; direct breakdown and CUDA-graph timings: {graph}; "
            f"bench_gpu_time: {bench}")


# --- measured values -------------------------------------------------------------------------------

@dataclass
class KernelTime:
    name: str
    kernel_class: str
    count_per_call: float
    device_us_per_call: float
    """Mean over the calls (the breakdown's own number)."""
    device_us_median: Optional[float]
    """Median launch."""


@dataclass
class AttentionTime:
    """The attention-class kernels of one call."""

    median_us: Optional[float]
    """Σ launches per call x median launch."""
    mean_us: float
    names: list[str]


def kernel_times(rows: Iterable[tuple[str, float, float, Optional[float]]]) -> list[KernelTime]:
    """(name, launches per call, µs per call, median launch µs) -> classified kernels."""
    return [KernelTime(name, classify(name), count, per_call, median) for name, count, per_call, median in rows]


def attention_time(kernels: Sequence[KernelTime]) -> Optional[AttentionTime]:
    att = [k for k in kernels if k.kernel_class == "attention"]
    if not att:
        return None
    medians = [k.count_per_call * k.device_us_median for k in att if k.device_us_median is not None]
    median = sum(medians) if len(medians) == len(att) else None
    return AttentionTime(median, sum(k.device_us_per_call for k in att), [k.name for k in att])


def headline(t: Optional[AttentionTime]) -> Optional[float]:
    if t is None:
        return None
    return t.median_us if t.median_us is not None else t.mean_us


@dataclass
class ModuleSide:
    status: str
    message: Optional[str] = None
    attention: Optional[AttentionTime] = None
    latency_us: Optional[float] = None
    """The whole module's call (projections, norms, RoPE, cache write, attention, o_proj)."""
    l2_state: Optional[str] = None
    flush_bytes: Optional[int] = None
    attention_backend: Optional[str] = None
    flash_attn_version: Optional[int] = None
    cuda_graph: Optional[bool] = None
    max_num_splits: Optional[int] = None
    aot_schedule: Optional[bool] = None
    kv_cache_stride: Optional[list[int]] = None
    kernels: list[KernelTime] = field(default_factory=list)


@dataclass
class Timed:
    method: str
    us: Optional[float] = None
    samples: int = 0
    error: Optional[str] = None


@dataclass
class Reference:
    """One direct measurement of a shape's attention (FA3 called alone, or FlashInfer)."""

    name: str
    status: str = "ok"
    message: Optional[str] = None
    settings: str = ""
    l2_state: str = ""
    bench: Optional[Timed] = None
    graph: Optional[Timed] = None
    breakdown: Optional[AttentionTime] = None
    breakdown_error: Optional[str] = None
    kernels: list[KernelTime] = field(default_factory=list)
    rel_error_vs_fa3: Optional[float] = None


@dataclass
class ShapeResult:
    index: int
    label: str
    source: str
    phase: str
    module: ModuleSide
    fa3: Reference
    flashinfer: Reference
    module_over_fa3_bench: Optional[float] = None
    module_over_fa3_breakdown: Optional[float] = None
    module_over_flashinfer: Optional[float] = None
    verdict: list[str] = field(default_factory=list)


def _error(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300] if text else ''}"


def short(names: Iterable[str], chars: int = 100) -> list[str]:
    """Kernel names cut for the terminal (FA3's template names run to thousands of characters; the JSON
    keeps them whole)."""
    return [n if len(n) <= chars else n[:chars] + "…" for n in names]


def same_kernel(name: str) -> str:
    """A kernel name without the spacing and `void ` that CUPTI's demangling (the row, torch._C._demangle) and
    Kineto's (the direct breakdown) may write differently."""
    return "".join(name.removeprefix("void ").split())


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b is not None and b > 0 else None


# --- 1. the module's row ---------------------------------------------------------------------------

def module_side(row: Any) -> ModuleSide:
    """The row's attention kernels and what the backend chose (its `backend_meta`)."""
    if row.status != "ok":
        return ModuleSide(status=row.status, message=row.message)
    meta: dict[str, Any] = row.extra
    backend = meta.get("attention_backend") or {}
    profile = row.ran.profile if row.ran is not None else None
    kernels = kernel_times((k.name or "", k.count_per_call or 0.0, k.device_us_per_call or 0.0, k.device_us_median)
                           for k in (profile.kernels if profile is not None else []))
    measured = row.measured
    timing = measured.timing if measured is not None else None
    return ModuleSide(
        status="ok", message=row.ran.profile_error if row.ran is not None else "no kernel breakdown",
        attention=attention_time(kernels), latency_us=measured.latency_us if measured is not None else None,
        l2_state=measured.l2_state if measured is not None else None,
        flush_bytes=timing.flush_bytes if timing is not None else None,
        attention_backend=backend.get("name"), flash_attn_version=backend.get("flash_attn_version"),
        cuda_graph=meta.get("cuda_graph"), max_num_splits=meta.get("max_num_splits"),
        aot_schedule=meta.get("aot_schedule"), kv_cache_stride=(meta.get("kv_cache") or {}).get("stride"),
        kernels=kernels)


def module_rows(testlist: Path, only: Optional[str], l2: str, executor: str) -> dict[int, ModuleSide]:
    """Each case's row through the vllm backend, as `operatorx run -t FILE --backend vllm --l2 L2` times it."""
    import operatorx.backends.vllm  # noqa: F401  (the backend table's vllm entry)
    from operatorx.measure.settings import TimingSettings
    from operatorx.run import RunConfig, run_testlist

    work = Path(tempfile.mkdtemp(prefix="attn-kernel-check-"))
    config = RunConfig(testlist=str(testlist), backend="vllm", device="cuda", filter=only, db=str(work / "rows.db"),
                       results_dir=work / "results", timing=TimingSettings(l2_state=l2),  # type: ignore[arg-type]
                       executor=executor)  # type: ignore[arg-type]
    outcome = run_testlist(config)
    print(f"module rows: {outcome.document_path} ({outcome.state})", flush=True)
    return {row.case_index: module_side(row) for row in outcome.rows}


# --- 2./3. the direct calls ------------------------------------------------------------------------

@dataclass
class PagedBatch:
    """One case's attention inputs on the GPU: q, the paged cache as vLLM's FlashAttention holds it, the index."""

    q: torch.Tensor
    """[T, q_heads, head_dim] bf16, normal values."""
    kv: torch.Tensor
    """Logical (blocks, kv_heads, 16, 2·head_dim): K the first head_dim of each token's row, V the rest."""
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    """(blocks, 16, kv_heads, head_dim) views, as FlashAttentionImpl.forward splits the cache."""
    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    pages: list[int]
    """Blocks each request uses (its block-table row's first entries)."""
    max_seqlen_q: int
    max_seqlen_k: int
    q_heads: int
    kv_heads: int
    head_dim: int

    @property
    def requests(self) -> int:
        return len(self.pages)


def physical_order(stride: Optional[Sequence[int]]) -> tuple[int, ...]:
    """The dimension order of the cache in memory, from the logical view's strides (largest first)."""
    if stride is None or len(stride) != 4:
        return NHD_ORDER
    return tuple(sorted(range(4), key=lambda i: -stride[i]))


def paged_batch(case: Case, stride: Optional[Sequence[int]]) -> PagedBatch:
    args, ix = gqa(case), batch_of(case)
    d = args.head_dim
    shape = (ix.num_blocks, args.kv_heads, PAGE_TOKENS, 2 * d)
    order = physical_order(stride)
    gen = torch.Generator(device="cuda").manual_seed(case.seed())
    stored = torch.randn([shape[i] for i in order], generator=gen, device="cuda", dtype=torch.bfloat16)
    kv = stored.permute(*[order.index(i) for i in range(4)])
    key_cache, value_cache = kv.transpose(1, 2).split(d, dim=-1)
    q = torch.randn(ix.num_tokens, args.q_heads, d, generator=gen, device="cuda", dtype=torch.bfloat16)
    seq = ix.seq_lens.tolist()
    return PagedBatch(q, kv, key_cache, value_cache, ix.query_start_loc.cuda(), ix.seq_lens.cuda(),
                      ix.block_table.cuda(), [-(-s // PAGE_TOKENS) for s in seq], ix.max_query_len, ix.max_seq_len,
                      args.q_heads, args.kv_heads, d)


@dataclass
class Prepared:
    call: Callable[[], Any]
    out: torch.Tensor
    settings: str


def fa3_direct(b: PagedBatch, num_splits: int, aot_schedule: bool, fa_version: int) -> Prepared:
    """flash_attn_varlen_func with FlashAttentionImpl.forward's arguments (non-cascade, no DCP)."""
    from vllm.vllm_flash_attn import flash_attn_varlen_func, get_scheduler_metadata

    scheduler_metadata = None
    if aot_schedule:          # FlashAttentionMetadataBuilder.build's schedule(): once, outside the timed call
        scheduler_metadata = get_scheduler_metadata(
            batch_size=b.requests, max_seqlen_q=b.max_seqlen_q, max_seqlen_k=b.max_seqlen_k, num_heads_q=b.q_heads,
            num_heads_kv=b.kv_heads, headdim=b.head_dim, cache_seqlens=b.seq_lens, qkv_dtype=torch.bfloat16,
            cu_seqlens_q=b.cu_seqlens_q, page_size=PAGE_TOKENS, causal=True, window_size=(-1, -1),
            num_splits=num_splits)
    out = torch.empty_like(b.q)
    descale = torch.ones((), dtype=torch.float32, device="cuda").expand(b.requests, b.kv_heads)
    scale = b.head_dim ** -0.5

    def call() -> Any:
        return flash_attn_varlen_func(
            q=b.q, k=b.key_cache, v=b.value_cache, out=out, cu_seqlens_q=b.cu_seqlens_q, max_seqlen_q=b.max_seqlen_q,
            seqused_k=b.seq_lens, max_seqlen_k=b.max_seqlen_k, softmax_scale=scale, causal=True, alibi_slopes=None,
            window_size=[-1, -1], block_table=b.block_table, softcap=0, scheduler_metadata=scheduler_metadata,
            fa_version=fa_version, q_descale=descale, k_descale=descale, v_descale=descale, num_splits=num_splits)

    settings = (f"fa_version={fa_version} num_splits={num_splits} scheduler_metadata="
                f"{'get_scheduler_metadata' if aot_schedule else 'None'} causal window=(-1,-1) block=16 "
                f"cache stride {list(b.kv.stride())}")
    return Prepared(call, out, settings)


def flashinfer_direct(b: PagedBatch, phase: str) -> Prepared:
    """FlashInfer's paged wrapper over a (blocks, 2, 16, kv_heads, head_dim) NHD copy of the same K/V."""
    import flashinfer

    kv5 = torch.empty(b.kv.shape[0], 2, PAGE_TOKENS, b.kv_heads, b.head_dim, dtype=torch.bfloat16, device="cuda")
    kv5[:, 0].copy_(b.key_cache)
    kv5[:, 1].copy_(b.value_cache)
    pages = torch.tensor(b.pages, dtype=torch.int32)
    indptr = torch.zeros(b.requests + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(pages, 0)
    indices = torch.cat([b.block_table[i, :n] for i, n in enumerate(b.pages)]).to(torch.int32)
    last_page_len = ((b.seq_lens - 1) % PAGE_TOKENS + 1).to(torch.int32)
    workspace = torch.zeros(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    scale = b.head_dim ** -0.5
    if phase == "decode":
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)
        wrapper.plan(indptr.cuda(), indices, last_page_len, b.q_heads, b.kv_heads, b.head_dim, PAGE_TOKENS,
                     pos_encoding_mode="NONE", q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=scale)
        what = "BatchDecodeWithPagedKVCacheWrapper(NHD, use_tensor_cores=True)"
    else:
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        wrapper.plan(b.cu_seqlens_q, indptr.cuda(), indices, last_page_len, b.q_heads, b.kv_heads, b.head_dim,
                     PAGE_TOKENS, causal=True, sm_scale=scale, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
        what = "BatchPrefillWithPagedKVCacheWrapper(NHD, causal)"
    out = torch.empty_like(b.q)

    def call() -> Any:
        return wrapper.run(b.q, kv5, out=out)

    return Prepared(call, out, f"{what} page 16, cache (blocks, 2, 16, kv_heads, head_dim)")


# --- timers ----------------------------------------------------------------------------------------

class Flushes:
    """The row's L2 state before each call: OperatorX's L2Flusher for the breakdown, and the same
    kernels (zero, discard) inline for a CUDA graph, which cannot replay a graph inside its capture."""

    def __init__(self, state: str, flush_bytes: Optional[int]):
        from operatorx.measure.l2 import L2Flusher

        l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
        self.state = state
        self.flusher = L2Flusher(state, l2_bytes, flush_bytes)  # type: ignore[arg-type]
        self.flush_bytes = self.flusher.flush_bytes
        self._buffer = (torch.empty(self.flush_bytes, dtype=torch.uint8, device="cuda")
                        if state != "warm" else None)

    @property
    def cold(self) -> bool:
        return self.state != "warm"

    def for_profile(self) -> Optional[Callable[[], None]]:
        return self.flusher.flush if self.cold else None

    def inline(self) -> None:
        from operatorx.measure.l2 import discard_l2

        if self._buffer is None:
            return
        self._buffer.zero_()
        if self.state == "cold_clean":
            discard_l2(self._buffer)


def breakdown(call: Callable[[], Any], flushes: Flushes, calls: int) -> list[KernelTime]:
    """OperatorX's kernel breakdown of `calls` [flush, call] pairs, with Kineto's records (this process)."""
    from operatorx.measure.activity import KinetoSession
    from operatorx.measure.kernels import kernel_breakdown

    batch = KinetoSession().batch(call, calls, flushes.for_profile(), calls * SPIN_CYCLES_PER_CALL)
    table = kernel_breakdown(batch, launch_shapes=False)
    if table is None:
        raise RuntimeError("the profiler saw no device work in the calls")
    return kernel_times((k["name"], k["count_per_call"], k["device_us_per_call"], k["device_us_median"])
                        for k in table["kernels"])


def _replay_ms(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def graph_events(call: Callable[[], Any], flushes: Flushes, n: int, replays: int) -> Timed:
    """CUDA events around a graph of n [flush, call] pairs, less a graph of the n flushes, per call."""
    from operatorx.backends.vllm.graphs import capture

    def pairs() -> None:
        for _ in range(n):
            flushes.inline()
            call()

    def flushes_only() -> None:
        for _ in range(n):
            flushes.inline()

    with_calls = capture(pairs, warmup=1)
    total_ms = _replay_ms(with_calls.graph, replays)
    flush_ms = _replay_ms(capture(flushes_only, warmup=1).graph, replays) if flushes.cold else 0.0
    return Timed(method=f"CUDA events over a graph of {n} [flush, call] pairs minus {n} flushes, median of "
                        f"{replays} replays", us=(total_ms - flush_ms) / n * 1e3, samples=replays)


def bench_gpu_time_us(call: Callable[[], Any], cold: bool, cupti: bool) -> Timed:
    """flashinfer.testing.bench_gpu_time (testing/utils.py): per-call times in ms; their median."""
    from flashinfer.testing import bench_gpu_time

    timer = "CUDA events"
    if cupti:                  # bench_gpu_time falls back to events, with a warning only, without cupti-python
        try:
            from cupti import cupti as _cupti  # noqa: F401

            timer = "CUPTI kernel span"
        except ImportError:
            timer = "CUDA events (cupti-python missing: enable_cupti fell back)"
    times = bench_gpu_time(fn=call, dry_run_time_ms=25, repeat_time_ms=100, cold_l2_cache=cold, enable_cupti=cupti)
    method = f"flashinfer.testing.bench_gpu_time({timer} per call, cold_l2_cache={cold})"
    return Timed(method=method, us=statistics.median(times) * 1e3, samples=len(times))


def measure(ref: Reference, prepared: Prepared, flushes: Flushes, opts: argparse.Namespace, graph: bool) -> None:
    """Fill `ref` with its timings; each timer's failure is kept beside the others' numbers."""
    ref.settings = prepared.settings
    ref.l2_state = flushes.state
    for _ in range(3):
        prepared.call()
    torch.cuda.synchronize()
    try:
        ref.kernels = breakdown(prepared.call, flushes, opts.calls)
        ref.breakdown = attention_time(ref.kernels)
    except Exception as err:  # noqa: BLE001 - the other timers still run
        ref.breakdown_error = _error(err)
    if graph:
        try:
            ref.graph = graph_events(prepared.call, flushes, opts.graph_calls, opts.replays)
        except Exception as err:  # noqa: BLE001
            ref.graph = Timed(method="CUDA-graph events", error=_error(err))
    try:
        ref.bench = bench_gpu_time_us(prepared.call, flushes.cold, opts.fi_cupti)
    except Exception as err:  # noqa: BLE001
        ref.bench = Timed(method="flashinfer.testing.bench_gpu_time", error=_error(err))


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


# --- one shape -------------------------------------------------------------------------------------

def references(case: Case, module: ModuleSide, flushes: Flushes, opts: argparse.Namespace) -> tuple[Reference,
                                                                                                   Reference]:
    """FA3 called directly, then FlashInfer, on one batch; the tensors are freed after."""
    fa3 = Reference("vllm.vllm_flash_attn.flash_attn_varlen_func (FA3, direct)")
    peer = Reference("flashinfer paged attention")
    try:
        batch = paged_batch(case, module.kv_cache_stride)
    except Exception as err:  # noqa: BLE001 - an out-of-memory cache: this shape's references only
        fa3.status, fa3.message = "error", f"inputs: {_error(err)}"
        peer.status, peer.message = fa3.status, fa3.message
        return fa3, peer
    fa3_out: Optional[torch.Tensor] = None
    try:
        splits = module.max_num_splits if module.max_num_splits is not None else default_num_splits(batch.q.shape[0])
        aot = module.aot_schedule if module.aot_schedule is not None else True
        prepared = fa3_direct(batch, splits, aot, module.flash_attn_version or 3)
        if module.max_num_splits is None:
            prepared.settings += " (num_splits by vLLM's rule: no row to read it from)"
        measure(fa3, prepared, flushes, opts, graph=True)
        prepared.call()
        fa3_out = prepared.out.clone()
    except Exception as err:  # noqa: BLE001
        fa3.status, fa3.message = "error", _error(err)
    if opts.no_flashinfer:
        peer.status, peer.message = "skipped", "--no-flashinfer"
    else:
        try:
            prepared = flashinfer_direct(batch, phase_of(case))
            prepared.call()
            torch.cuda.synchronize()
        except Exception as err:  # noqa: BLE001 - JIT without nvcc, no cubins, an unsupported shape
            peer.status, peer.message = "unsupported", _error(err)
        else:
            if fa3_out is not None:
                peer.rel_error_vs_fa3 = rel_error(prepared.out, fa3_out)
            measure(peer, prepared, flushes, opts, graph=False)
    del batch, fa3_out
    torch.cuda.empty_cache()
    return fa3, peer


def verdict(r: ShapeResult, tolerance: float) -> list[str]:
    """Within the tolerance of FA3 direct (bench_gpu_time), or the facts that explain the difference."""
    out: list[str] = []
    ratio = r.module_over_fa3_bench
    if ratio is None:
        return ["no comparison: " + (r.module.message or r.fa3.message or "a number is missing")]
    out.append(f"{'within' if abs(ratio - 1) <= tolerance else 'outside'} {tolerance:.0%} of FA3 direct "
               f"(bench_gpu_time): ratio {ratio:.3f}")
    same = r.module_over_fa3_breakdown
    if same is not None:
        out.append(f"same instrument (kernel breakdown, {r.fa3.l2_state}): ratio {same:.3f}")
    module_names = {same_kernel(n) for n in r.module.attention.names} if r.module.attention else set()
    direct_names = {same_kernel(n) for n in r.fa3.breakdown.names} if r.fa3.breakdown else set()
    if direct_names and module_names != direct_names:
        out.append(f"attention kernels differ: module only {short(sorted(module_names - direct_names))}, "
                   f"direct only {short(sorted(direct_names - module_names))}")
    if r.module.attention_backend not in (None, "FLASH_ATTN"):
        out.append(f"the module ran {r.module.attention_backend}, not FLASH_ATTN")
    bench, brk = (r.fa3.bench.us if r.fa3.bench else None), headline(r.fa3.breakdown)
    if bench is not None and brk is not None and r.fa3.l2_state != "warm":
        out.append(f"bench_gpu_time - breakdown = {bench - brk:+.1f} µs: bench's events time one eager call (its "
                   "launch gaps) after a dirty flush (write-backs)" + ("" if r.fa3.l2_state == "cold_dirty" else
                                                                         "; the breakdown's flush is clean"))
    if r.flashinfer.rel_error_vs_fa3 is not None and r.flashinfer.rel_error_vs_fa3 > AGREEMENT_BOUND:
        out.append(f"FlashInfer's output differs from FA3's (rel {r.flashinfer.rel_error_vs_fa3:.2e}): not the "
                   "same attention")
    return out


def shape_result(index: int, case: Case, module: ModuleSide, fa3: Reference, peer: Reference,
                 tolerance: float) -> ShapeResult:
    mod = headline(module.attention)
    r = ShapeResult(index, case.label(), case.sources[0], phase_of(case), module, fa3, peer,
                    module_over_fa3_bench=_ratio(mod, fa3.bench.us if fa3.bench else None),
                    module_over_fa3_breakdown=_ratio(mod, headline(fa3.breakdown)),
                    module_over_flashinfer=_ratio(mod, peer.bench.us if peer.bench else None))
    r.verdict = verdict(r, tolerance)
    return r


# --- output ----------------------------------------------------------------------------------------

def _us(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.1f}"


def _x(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}"


def _timed(t: Optional[Timed]) -> str:
    if t is None:
        return "-"
    return _us(t.us) if t.error is None else "err"


def print_table(results: Sequence[ShapeResult]) -> None:
    print("\n| shape | OperatorX module attn µs | FA3 direct µs bench_gpu_time | FA3 graph events | FA3 breakdown | "
          "FlashInfer µs bench_gpu_time | FlashInfer breakdown | module/direct | module/direct (breakdown) | "
          "module/flashinfer |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        peer = _timed(r.flashinfer.bench) if r.flashinfer.status == "ok" else r.flashinfer.status
        mod = _us(headline(r.module.attention)) if r.module.status == "ok" else r.module.status
        print(f"| {r.label} | {mod} | {_timed(r.fa3.bench)} | {_timed(r.fa3.graph)} | {_us(headline(r.fa3.breakdown))} "
              f"| {peer} | {_us(headline(r.flashinfer.breakdown))} | {_x(r.module_over_fa3_bench)} | "
              f"{_x(r.module_over_fa3_breakdown)} | {_x(r.module_over_flashinfer)} |")
    for r in results:
        print(f"\n[{r.index}] {r.label} ({r.source})")
        m = r.module
        print(f"  module: {m.status} {m.message or ''} backend={m.attention_backend} fa{m.flash_attn_version} "
              f"graph={m.cuda_graph} max_num_splits={m.max_num_splits} aot_schedule={m.aot_schedule} "
              f"l2={m.l2_state} module latency {_us(m.latency_us)} µs")
        print(f"    attention kernels: {short(m.attention.names) if m.attention else '-'}")
        for ref in (r.fa3, r.flashinfer):
            print(f"  {ref.name}: {ref.status} {ref.message or ''} {ref.settings}")
            seen = short(ref.breakdown.names) if ref.breakdown else ref.breakdown_error or "-"
            print(f"    attention kernels: {seen}")
            for t in (ref.bench, ref.graph):
                if t is not None:
                    print(f"    {t.method}: {_us(t.us)} µs {t.error or ''}")
            if ref.rel_error_vs_fa3 is not None:
                print(f"    output vs FA3: rel {ref.rel_error_vs_fa3:.2e}")
        for line in r.verdict:
            print(f"  => {line}")


def environment() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, Any] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
                           "l2_bytes": torch.cuda.get_device_properties(0).L2_cache_size,
                           "nvcc": shutil.which("nvcc")}
    for pkg in ("vllm", "flashinfer-python", "flashinfer-jit-cache", "flashinfer-cubin", "cupti-python"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


# --- main ------------------------------------------------------------------------------------------

def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--dry", action="store_true", help="write the testlist and print the plan (CPU, no vLLM)")
    p.add_argument("--testlist", type=Path, default=DEFAULT_TESTLIST, help="where the 8 cases are written")
    p.add_argument("--out", type=Path, default=None, help="JSON report (default $OUT/attn_kernel_check.json)")
    p.add_argument("--only", default=None, help="keep cases whose label or source contains this text")
    p.add_argument("--l2", choices=L2_STATES, default="cold_clean", help="the rows' L2 state (OperatorX default)")
    p.add_argument("--executor", choices=("local", "inline"), default="local", help="where the rows are timed")
    p.add_argument("--calls", type=int, default=50, help="calls in each direct kernel breakdown")
    p.add_argument("--graph-calls", type=int, default=20, help="[flush, call] pairs in the CUDA graph")
    p.add_argument("--replays", type=int, default=10, help="timed replays of each graph")
    p.add_argument("--tolerance", type=float, default=0.10, help="module/direct within this fraction of 1")
    p.add_argument("--fi-cupti", action="store_true",
                   help="bench_gpu_time with enable_cupti (cupti-python >= 13; its cupti.finalize() may upset the "
                        "Kineto breakdowns of the shapes after it)")
    p.add_argument("--no-module", action="store_true", help="skip the OperatorX rows (direct calls only)")
    p.add_argument("--no-flashinfer", action="store_true", help="skip FlashInfer (e.g. while its JIT is slow)")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    opts = parse(argv)
    cases = shape_cases()
    opts.testlist.parent.mkdir(parents=True, exist_ok=True)
    dump_testlist(cases, opts.testlist)
    chosen = [(i, c) for i, c in enumerate(cases) if keep(c, opts.only)]
    if opts.dry:
        print_plan([plan_of(i, c) for i, c in chosen], opts.testlist, opts.l2)
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: run with --dry on a CPU machine", file=sys.stderr)
        return 2
    # the rows first: their workers own the GPU before this process makes its CUDA context
    modules = {} if opts.no_module else module_rows(opts.testlist, opts.only, opts.l2, opts.executor)
    from operatorx.measure.activity import use_kineto

    use_kineto("attn_kernel_check: the direct breakdowns record with torch.profiler")  # pauses an inline CUPTI
    ok = [m for m in modules.values() if m.status == "ok" and m.l2_state in L2_STATES]
    state = ok[0].l2_state if ok else opts.l2
    assert state is not None
    flush_bytes = next((m.flush_bytes for m in ok if m.flush_bytes), None)
    try:
        flushes = Flushes(state, flush_bytes)
        l2_note = l2_statement(state)
    except RuntimeError as err:      # cold_clean's discard kernel needs Triton: said, never silent
        flushes = Flushes("cold_dirty", flush_bytes)
        l2_note = f"{l2_statement('cold_dirty')} (the rows' {state} flush failed here: {_error(err)})"
    print(l2_note, flush=True)
    results = []
    for i, case in chosen:
        module = modules.get(i) or ModuleSide(status="missing", message="--no-module" if opts.no_module else "no row")
        fa3, peer = references(case, module, flushes, opts)
        results.append(shape_result(i, case, module, fa3, peer, opts.tolerance))
        print(f"[{i}] {case.label()}: module {_us(headline(module.attention))} µs, FA3 bench "
              f"{_timed(fa3.bench)} µs, FlashInfer {_timed(peer.bench) if peer.status == 'ok' else peer.status}",
              flush=True)
    print_table(results)
    out = opts.out or (Path(os.environ["OUT"]) / "attn_kernel_check.json" if os.environ.get("OUT") else None)
    if out is not None:
        doc = {"environment": environment(), "l2": l2_note, "flush_bytes": flushes.flush_bytes,
               "testlist": str(opts.testlist), "shapes": [asdict(r) for r in results]}
        out.write_text(json.dumps(doc, indent=1, default=str))
        print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
