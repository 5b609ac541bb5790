"""DeepSeek-V4 attention's caches as vLLM 0.26 lays them out, written and read in plain torch (no vLLM import).

The rules, each as vLLM 0.26 has it:
- fp8_ds_mla token (584 bytes; models/deepseek_v4/common/ops/cache_utils.py quantize_and_insert_k_cache and
  its reader dequantize_and_gather_k_cache): dims 0..447 ("nope") in 7 blocks of 64, each block quantized as
  e4m3 with scale 2^e, e = ceil(log2(max(amax, 1e-4) / 448)), stored as the byte clamp(e + 127, 0, 255)
  (UE8M0); dims 448..511 ("rope") kept bf16. A block of bs tokens is [bs · 576 data][bs · 8 scales][pad]:
  token t's data at t · 576 (448 e4m3 bytes, then 64 bf16 little-endian), its 8 scale bytes at bs · 576 + t · 8
  (7 real, the 8th written 0). Read back: e4m3 · 2^(byte - 127), the rope as stored.
- pages (v1/kv_cache_interface.py): a spec's page is storage_block_size · bytes per row, padded up to a multiple
  of 576 (alignment 576 with the fp8_ds_mla cache); the runner views it as [num_blocks, storage_block_size,
  row] with that padded page as the block stride (v1/worker/gpu/attn_utils.py _reshape_attention_kv_cache).
- the caches of one layer (compress_ratio r; coff = 2 at r 4, else 1), each its own kv-cache group:
  SWA `p.swa_cache` (block 64, the window); main `p` (r 4 / 128: block 256 positions, 256 / r entries stored
  per block, all entries); compressor state `p.compressor.state_cache` (fp32 [kv | score + ape], 2 · coff ·
  head_dim wide, block 4 at r 4 / 8 at r 128, window coff · r); r 4 only: indexer keys `p.indexer.k_cache`
  (block 256 -> 64 entries, 132 bytes: dsa_layout's [bs · 128 e4m3][bs · 4 fp32 scales]) and indexer state
  `p.indexer.compressor.state_cache` (fp32, 2 · 2 · 128 wide, block 4, window 8).
- blocks (v1/core/single_type_kv_cache_manager.py): block 0 is the null block; a request holds
  ceil((ctx + q) / block) blocks of each cache; a sliding-window cache (SWA, the states) maps its first
  max(0, ctx - window + 1) // block blocks to the null block (SlidingWindowManager.remove_skipped_blocks at
  num_computed = ctx), the rest are the request's own. A compressed entry e (written at position p with
  (p + 1) % r == 0, e = p // r) sits at block e // stored, offset e % stored (compressor_utils.py).
Why here: the fill, the timed call and the reference's read-back follow one layout that CPU tests pin.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

import torch

from operatorx.backends.torch.attention.dsv4_reference import CachedRows, Dsv4Cached
from operatorx.backends.torch.attention.layout import Layout, Request, pages_for
from operatorx.backends.vllm.attention.batch import RESERVED_BLOCKS, vllm_slots
from operatorx.backends.vllm.attention.dsa_layout import E4M3_MAX, index_cache_width, quantize_keys, read_index_keys
from operatorx.spec.attention import Dsv4AttnArgs

__all__ = ["AMAX_FLOOR", "CACHE_KINDS", "NOPE_DIM", "PAGE_ALIGN", "QUANT_BLOCK", "ROPE_DIM", "SCALE_BYTES",
           "TOKEN_BYTES", "TOKEN_DATA_BYTES", "CachePlan", "CacheSpec", "Dsv4CachePlans", "allocate_cache",
           "dsv4_cache_specs", "pack_fp8_ds_mla", "plan_caches", "read_cached", "read_fp8_ds_mla", "split_state",
           "unpack_fp8_ds_mla", "write_fp8_ds_mla", "write_index_keys", "write_rows"]

#: The fp8_ds_mla token: 448 e4m3 nope dims, 64 bf16 rope dims (576 data bytes), 8 UE8M0 scale bytes.
NOPE_DIM, ROPE_DIM = 448, 64
TOKEN_DATA_BYTES = NOPE_DIM + 2 * ROPE_DIM
SCALE_BYTES = 8
TOKEN_BYTES = TOKEN_DATA_BYTES + SCALE_BYTES
#: Dims per UE8M0 scale.
QUANT_BLOCK = 64
#: The smallest block amax the writer scales by (tl.maximum(block_max, 1e-4)).
AMAX_FLOOR = 1e-4
#: What every DeepSeek-V4 page is padded to a multiple of (the specs' alignment with the fp8_ds_mla cache).
PAGE_ALIGN = 576
#: The caches of a layer in vLLM's construction order, by kind, with their layer-name suffix.
CACHE_KINDS = {"swa": "swa_cache", "main": "", "state": "compressor.state_cache", "index_keys": "indexer.k_cache",
               "index_state": "indexer.compressor.state_cache"}
#: The block size of the main and indexer caches (cache_config.block_size: the FlashMLA-V4 and V4-indexer
#: kernel block), the SWA cache's fixed block.
_COMPRESSED_BLOCK, _SWA_BLOCK = 256, 64


# --- the 584-byte token --------------------------------------------------------------------------------

def pack_fp8_ds_mla(rows: torch.Tensor) -> torch.Tensor:
    """bf16 rows [n, 512] -> uint8 [n, 584]: each token's 576 data bytes then its 8 scale bytes, the values
    quantize_and_insert_k_cache writes (module docstring); rows in another dtype are rounded to bf16 first."""
    if rows.dim() != 2 or rows.shape[1] != NOPE_DIM + ROPE_DIM:
        raise ValueError(f"fp8_ds_mla rows are [n, {NOPE_DIM + ROPE_DIM}], got {tuple(rows.shape)}")
    n = rows.shape[0]
    x = rows.to(torch.bfloat16)
    nope = x[:, :NOPE_DIM].float().view(n, NOPE_DIM // QUANT_BLOCK, QUANT_BLOCK)
    amax = nope.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    exponent = torch.ceil(torch.log2(amax / E4M3_MAX))
    values = (nope / torch.exp2(exponent)[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    out = torch.zeros(n, TOKEN_BYTES, dtype=torch.uint8, device=rows.device)
    out[:, :NOPE_DIM] = values.view(torch.uint8).view(n, NOPE_DIM)
    out[:, NOPE_DIM:TOKEN_DATA_BYTES] = x[:, NOPE_DIM:].contiguous().view(torch.uint8)
    out[:, TOKEN_DATA_BYTES:TOKEN_DATA_BYTES + NOPE_DIM // QUANT_BLOCK] = (exponent + 127).clamp(0, 255).to(torch.uint8)
    return out


def unpack_fp8_ds_mla(tokens: torch.Tensor) -> torch.Tensor:
    """uint8 [n, 584] (pack_fp8_ds_mla's layout) -> fp32 [n, 512]: e4m3 · 2^(scale byte - 127), then the bf16 rope."""
    if tokens.dim() != 2 or tokens.shape[1] != TOKEN_BYTES or tokens.dtype != torch.uint8:
        raise ValueError(f"fp8_ds_mla tokens are uint8 [n, {TOKEN_BYTES}], got {tokens.dtype} {tuple(tokens.shape)}")
    n = tokens.shape[0]
    values = tokens[:, :NOPE_DIM].contiguous().view(torch.float8_e4m3fn).float()
    scales = torch.exp2(tokens[:, TOKEN_DATA_BYTES:TOKEN_DATA_BYTES + NOPE_DIM // QUANT_BLOCK].float() - 127)
    nope = (values.view(n, NOPE_DIM // QUANT_BLOCK, QUANT_BLOCK) * scales[..., None]).view(n, NOPE_DIM)
    rope = tokens[:, NOPE_DIM:TOKEN_DATA_BYTES].contiguous().view(torch.bfloat16).float()
    return torch.cat((nope, rope), dim=1)


def _regions(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(data [blocks, bs, 576], scales [blocks, bs, 8]) views of a uint8 fp8_ds_mla cache [blocks, bs, 584]
    (its block stride may be the padded page): the block's bytes split as the writer lays them."""
    blocks, size, width = cache.shape
    if width != TOKEN_BYTES or cache.dtype != torch.uint8:
        raise ValueError(f"an fp8_ds_mla cache is uint8 [blocks, bs, {TOKEN_BYTES}], got {cache.dtype} "
                         f"{tuple(cache.shape)}")
    flat = cache.view(blocks, size * width)                  # raises rather than copy: writes must land in place
    return (flat[:, :size * TOKEN_DATA_BYTES].view(blocks, size, TOKEN_DATA_BYTES),
            flat[:, size * TOKEN_DATA_BYTES:].view(blocks, size, SCALE_BYTES))


def write_fp8_ds_mla(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """quantize_and_insert_k_cache in torch: rows [n, 512] packed into the cache [blocks, bs, 584] at `slots`
    (block · bs + offset; -1 skipped, as the kernel skips it)."""
    data, scales = _regions(cache)
    size = cache.shape[1]
    keep = slots >= 0
    packed = pack_fp8_ds_mla(rows[keep.to(rows.device)]).to(cache.device)
    kept = slots[keep].to(cache.device)
    data[kept // size, kept % size] = packed[:, :TOKEN_DATA_BYTES]
    scales[kept // size, kept % size] = packed[:, TOKEN_DATA_BYTES:]


def read_fp8_ds_mla(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """uint8 [n, 584]: the tokens at `slots` of an fp8_ds_mla cache, in pack_fp8_ds_mla's layout."""
    data, scales = _regions(cache)
    size = cache.shape[1]
    s = slots.to(cache.device)
    return torch.cat((data[s // size, s % size], scales[s // size, s % size]), dim=1)


def write_index_keys(cache: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor) -> None:
    """keys [n, index_dim] into an indexer key cache [blocks, bs, index_dim + 4] at `slots`, quantized as
    dsa_layout.quantize_keys does and laid out as its pack_index_block ([bs · dim values][bs · 4 scales])."""
    blocks, size, width = cache.shape
    dim = keys.shape[1]
    if width != index_cache_width(dim):
        raise ValueError(f"indexer cache width {width}: expected {index_cache_width(dim)} for index_dim {dim}")
    values, scale = quantize_keys(keys)
    flat = cache.view(blocks, size * width)
    vals = flat[:, :size * dim].view(blocks, size, dim)
    scl = flat[:, size * dim:].view(blocks, size, 4)
    s = slots.to(cache.device)
    vals[s // size, s % size] = values.view(torch.uint8).to(cache.device)
    scl[s // size, s % size] = scale.float().contiguous().view(torch.uint8).view(-1, 4).to(cache.device)


def split_state(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv, score + ape) halves of compressor state rows [..., 2 · coff · head] (save_partial_states' packing)."""
    half = rows.shape[-1] // 2
    return rows[..., :half], rows[..., half:]


# --- the caches of one layer -------------------------------------------------------------------------------

@dataclass(frozen=True)
class CacheSpec:
    """One of a layer's caches as its vLLM KV-cache spec gives it (module docstring)."""

    kind: str
    """A key of CACHE_KINDS."""
    block_tokens: int
    """Positions per block (the spec's block_size): what the block table counts in."""
    stored: int
    """Rows stored per block (storage_block_size = block_tokens / ratio)."""
    ratio: int
    """Positions per stored row: 1, or the compress ratio for the main and indexer-key caches."""
    window: Optional[int]
    """The sliding window in positions (SWA, the states), None for a full cache."""
    width: int
    """Elements of `dtype` per stored row."""
    dtype: torch.dtype

    @property
    def name(self) -> str:
        return CACHE_KINDS[self.kind]

    def layer_name(self, prefix: str) -> str:
        """The name vLLM registers the cache layer under (the attention layer itself for the main cache)."""
        return f"{prefix}.{self.name}" if self.name else prefix

    @property
    def real_page_bytes(self) -> int:
        return self.stored * self.width * torch.empty((), dtype=self.dtype).element_size()

    @property
    def page_bytes(self) -> int:
        """The page padded up to a multiple of PAGE_ALIGN: the block stride in bytes."""
        return -(-self.real_page_bytes // PAGE_ALIGN) * PAGE_ALIGN

    @property
    def page_stride(self) -> int:
        """The block stride in elements of `dtype` (what the runner's as_strided view uses)."""
        return self.page_bytes // torch.empty((), dtype=self.dtype).element_size()

    def shape(self, num_blocks: int) -> tuple[int, int, int]:
        return (num_blocks, self.stored, self.width)

    def strides(self) -> tuple[int, int, int]:
        return (self.page_stride, self.width, 1)


def dsv4_cache_specs(args: Dsv4AttnArgs) -> tuple[CacheSpec, ...]:
    """The layer's 1 (ratio 0), 3 (ratio 128) or 5 (ratio 4) caches, in CACHE_KINDS order."""
    r = args.compress_ratio
    specs = [CacheSpec("swa", _SWA_BLOCK, _SWA_BLOCK, 1, args.window, TOKEN_BYTES, torch.uint8)]
    if r > 1:
        coff = 2 if r == 4 else 1
        state_block = 4 if r == 4 else 8
        specs += [CacheSpec("main", _COMPRESSED_BLOCK, _COMPRESSED_BLOCK // r, r, None, TOKEN_BYTES, torch.uint8),
                  CacheSpec("state", state_block, state_block, 1, coff * r, 2 * coff * args.head_dim, torch.float32)]
    if r == 4 and args.indexer is not None:
        assert args.index_dim is not None
        specs += [CacheSpec("index_keys", _COMPRESSED_BLOCK, _COMPRESSED_BLOCK // r, r, None,
                            index_cache_width(args.index_dim), torch.uint8),
                  CacheSpec("index_state", 4, 4, 1, 2 * r, 2 * 2 * args.index_dim, torch.float32)]
    return tuple(specs)


def allocate_cache(spec: CacheSpec, num_blocks: int, device: str) -> torch.Tensor:
    """A zeroed cache [num_blocks, stored, width] of `spec`, viewed over padded pages as vLLM's runner does."""
    raw = torch.zeros(num_blocks * spec.page_bytes, dtype=torch.uint8, device=device)
    return torch.as_strided(raw.view(spec.dtype), spec.shape(num_blocks), spec.strides())


@dataclass(frozen=True)
class CachePlan:
    """Which blocks each request holds of one cache, and which of its stored rows the fill writes.

    `requests` are the layout's requests (same order) in the cache's stored units: `ctx` its stored rows
    before this step (ctx positions, or ctx // ratio entries), `q` the rows this step writes, `key_start` the
    first row the fill writes (the window's last window - 1 positions, else 0), `pages` its blocks in order
    (-1: the null block), `page_tokens` = stored rows per block; so batch.vllm_slots / block_offsets and
    dsa_layout.read_index_keys read it as they read a layout.
    """

    spec: CacheSpec
    requests: tuple[Request, ...]
    pool_blocks: int
    """Blocks the requests hold (the null block aside)."""

    @property
    def num_blocks(self) -> int:
        """Blocks of the cache: the requests' and the reserved null block."""
        return self.pool_blocks + RESERVED_BLOCKS

    def block_table(self, order: tuple[int, ...]) -> torch.Tensor:
        """int32 [n, widest request's blocks] in batch `order` (layout indices): vLLM's block ids, null-padded."""
        rows = [self.requests[i] for i in order]
        table = torch.zeros(len(rows), max(len(r.pages) for r in rows), dtype=torch.int32)
        for k, r in enumerate(rows):
            table[k, :len(r.pages)] = torch.tensor(r.pages, dtype=torch.int32) + RESERVED_BLOCKS
        return table

    def fill_slots(self, i: int) -> torch.Tensor:
        """int64 slots of request i's filled rows key_start .. ctx - 1."""
        r = self.requests[i]
        return vllm_slots(r, r.key_start, r.ctx)


def _block_ids(counts: list[int], pages: str, seed: int) -> list[list[int]]:
    """Each request's `counts[i]` pool blocks: consecutive, or a seeded permutation of the pool (plan_layout's
    rule for `shuffled`)."""
    total = sum(counts)
    order = (torch.randperm(total, generator=torch.Generator().manual_seed(seed)).tolist() if pages == "shuffled"
             else list(range(total)))
    out, at = [], 0
    for n in counts:
        out.append(order[at:at + n])
        at += n
    return out


def _plan(spec: CacheSpec, layout: Layout, seed: int) -> CachePlan:
    held, skipped, rows = [], [], []
    for r in layout.requests:
        blocks = pages_for(r.ctx + r.q, spec.block_tokens)
        null = 0 if spec.window is None else min(max(0, r.ctx - spec.window + 1) // spec.block_tokens, blocks)
        skipped.append(null)
        held.append(blocks - null)
    ids = _block_ids(held, layout.pages, seed)
    for r, null, own in zip(layout.requests, skipped, ids, strict=True):
        ctx, new = r.ctx // spec.ratio, (r.ctx + r.q) // spec.ratio - r.ctx // spec.ratio
        start = 0 if spec.window is None else max(0, r.ctx - (spec.window - 1))
        rows.append(Request(r.group, ctx, new, r.row0, (-1,) * null + tuple(own), start, spec.stored))
    return CachePlan(spec, tuple(rows), sum(held))


@dataclass(frozen=True)
class Dsv4CachePlans:
    """Every cache of the layer planned over one layout (plan_caches)."""

    layout: Layout
    plans: dict[str, CachePlan]
    """By kind, in CACHE_KINDS order."""

    def index(self, r: Request) -> int:
        """The layout index of a layout request (by its first row)."""
        for i, own in enumerate(self.layout.requests):
            if own.row0 == r.row0:
                return i
        raise KeyError(f"no request at row {r.row0} in the layout")

    def slot_mapping(self, kind: str, order: tuple[int, ...]) -> torch.Tensor:
        """int64 [T] in batch `order`: where this step's tokens write the cache. Ratio-1 caches: each new
        position's slot (the runner's slot_mapping); compressed caches: the entry slot at boundary positions
        ((p + 1) % ratio == 0), -1 elsewhere (get_compressed_slot_mapping, what the builders hand the kernels)."""
        plan = self.plans[kind]
        out = []
        for i in order:
            r, own = self.layout.requests[i], plan.requests[i]
            pos = torch.arange(r.ctx, r.ctx + r.q, dtype=torch.int64)
            if plan.spec.ratio == 1:
                out.append(vllm_slots(own, r.ctx, r.ctx + r.q))
                continue
            entry = pos // plan.spec.ratio
            table = torch.tensor(own.pages, dtype=torch.int64) + RESERVED_BLOCKS
            slots = table[entry // own.page_tokens] * own.page_tokens + entry % own.page_tokens
            out.append(torch.where((pos + 1) % plan.spec.ratio == 0, slots, torch.full_like(slots, -1)))
        return torch.cat(out)


def plan_caches(args: Dsv4AttnArgs, layout: Layout) -> Dsv4CachePlans:
    """The blocks of each of the layer's caches (dsv4_cache_specs) for the layout's requests; shuffled pages
    permute each cache's pool with its own seed (batch.seed + 2 + the cache's index)."""
    plans = {spec.kind: _plan(spec, layout, args.batch.seed + 2 + k) for k, spec in enumerate(dsv4_cache_specs(args))}
    return Dsv4CachePlans(layout, plans)


def write_rows(cache: torch.Tensor, plan: CachePlan, i: int, rows: torch.Tensor) -> None:
    """Request i's filled rows (key_start .. ctx - 1: `rows` [ctx - key_start, ...]) into the cache, in the
    cache's format: fp8_ds_mla (SWA, main), quantized index keys, or the fp32 state rows as given."""
    slots = plan.fill_slots(i)
    if rows.shape[0] != slots.numel():
        raise ValueError(f"{plan.spec.kind}: request {i} fills {slots.numel()} rows, got {rows.shape[0]}")
    kind = plan.spec.kind
    if kind in ("swa", "main"):
        write_fp8_ds_mla(cache, slots, rows)
    elif kind == "index_keys":
        write_index_keys(cache, slots, rows)
    else:
        s = slots.to(cache.device)
        cache[s // plan.spec.stored, s % plan.spec.stored] = rows.to(device=cache.device, dtype=cache.dtype)


def _reader(cache: torch.Tensor, plan: CachePlan, plans: Dsv4CachePlans, index_dim: Optional[int]) -> CachedRows:
    """request -> fp32 rows key_start .. ctx - 1 of this cache (all ctx rows for a full cache)."""
    def read(r: Request) -> torch.Tensor:
        own = plan.requests[plans.index(r)]
        kind = plan.spec.kind
        if kind == "index_keys":
            assert index_dim is not None
            return read_index_keys(cache, own, index_dim)
        slots = vllm_slots(own, own.key_start, own.ctx).to(cache.device)
        if kind in ("swa", "main"):
            return unpack_fp8_ds_mla(read_fp8_ds_mla(cache, slots))
        return cache[slots // plan.spec.stored, slots % plan.spec.stored].float()
    return read


def read_cached(args: Dsv4AttnArgs, plans: Dsv4CachePlans, caches: Mapping[str, torch.Tensor]) -> Dsv4Cached:
    """What the filled caches (by kind, vLLM's views) hold for each request's ctx, dequantized to fp32, as R's
    reference reads it: window rows ctx - n .. ctx - 1 (n = min(ctx, window - 1)), every compressed entry and
    index key, the state rows of the last coff · ratio - 1 positions."""
    def get(kind: str) -> Optional[CachedRows]:
        return _reader(caches[kind], plans.plans[kind], plans, args.index_dim) if kind in plans.plans else None

    return Dsv4Cached(window=_reader(caches["swa"], plans.plans["swa"], plans, None), compressed=get("main"),
                      state=get("state"), index_keys=get("index_keys"), index_state=get("index_state"))
