"""A ``BlockMask`` made ready for the kernels: validated, re-blocked, transposed; cached.

The kernels walk lists of ``(Q, KV)`` blocks whose sizes are multiples of 16 (a block is walked
tile by tile) and trust every entry. ``normalize`` takes a BlockMask's ``kv`` lists (partial and
full) and ``BLOCK_SIZE`` and returns ``Blocks``:

* validation, on the host, before any launch: ``kv_num_blocks`` in ``[0, kv blocks]``, listed
  indices in range, no block listed twice (partial and full lists together), shapes that
  broadcast over the call's batch and heads. torch's kernels trust these lists (a duplicate is
  visited twice, an index past the end reads past the keys), torch's CPU path ignores them;
  here a bad list is a ``ValueError`` naming the field;
* a dense block-state map (0 skipped, 1 partial: the mask mod decides, 2 full) from which the
  kernels' lists are rebuilt, the transposed ``q_*`` lists included (derived, never trusted:
  a BlockMask without them, or with stale ones, works the same);
* re-blocking when ``BLOCK_SIZE`` is not a multiple of 16 (torch accepts any, e.g. 8): the
  kernel blocks are the next multiple of 16; a kernel block is full where every original
  block it overlaps is full, skipped where all are skipped, else partial, and then the mask
  is the original block state looked up per element (``mods.with_block_state``) and the mask
  mod, exactly what the original BlockMask means.

The result is cached per list tensors (identity and version) and call shape: a BlockMask reused
across layers and steps is checked once.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

NO_MASK_BLOCK = 1 << 30  # torch's BLOCK_SIZE of "no block mask given" (_LARGE_SPARSE_BLOCK_SIZE)
_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 32


@dataclass(frozen=True)
class Blocks:
    """A BlockMask for the kernels (see the module doc)."""

    sparse: object  # flydsl_kernels.attention.BlockSparse (kernel block sizes)
    state: torch.Tensor  # (B, H, q blocks, kv blocks) int32 at kernel block sizes, broadcast
    block: tuple  # kernel (Q, KV) block sizes
    orig_state: torch.Tensor | None = None  # at the BlockMask's own sizes, when re-blocked
    orig_block: tuple | None = None


def _fail(msg):
    raise ValueError(f"flex_attention: block_mask.{msg}")


def normalize(kv_num, kv_idx, full_num, full_idx, block_size, B, H, Sq, Sk) -> Blocks | None:
    """``Blocks`` for these lists at ``(B, H, Sq, Sk)``; None for torch's "no block mask"."""
    bq, bkv = (
        (int(block_size), int(block_size))
        if isinstance(block_size, int)
        else (int(block_size[0]), int(block_size[1]))
    )
    if bq == NO_MASK_BLOCK and bkv == NO_MASK_BLOCK:
        return None
    tensors = (kv_num, kv_idx, full_num, full_idx)
    key = (
        tuple((id(t), t._version) if t is not None else None for t in tensors),
        bq,
        bkv,
        B,
        H,
        Sq,
        Sk,
    )
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit[1]
    out = _normalize(kv_num, kv_idx, full_num, full_idx, bq, bkv, B, H, Sq, Sk)
    _CACHE[key] = (tensors, out)
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return out


def _dense(num, idx, name_num, name_idx, nq, nk, B, H):
    """``(count per (b, h, q block, kv block), listed)``: validated dense form of one list."""
    if num.dim() < 3 or idx.dim() != num.dim() + 1:
        _fail(
            f"{name_num} must be (B, H, q blocks) and {name_idx} (B, H, q blocks, n), got "
            f"{list(num.shape)} and {list(idx.shape)}"
        )
    if num.dim() > 3:
        _fail(f"{name_num}: extra leading dimensions {list(num.shape)}")
    if num.dtype.is_floating_point or idx.dtype.is_floating_point:
        _fail(f"{name_num} / {name_idx} must be integer tensors")
    b_, h_, rows = num.shape
    if b_ not in (1, B) or h_ not in (1, H):
        _fail(
            f"{name_num} is for batch {b_} and {h_} heads; the call has batch {B} and {H} "
            "query heads (1 broadcasts)"
        )
    if idx.shape[:3] != num.shape:
        _fail(f"{name_idx} {list(idx.shape)} does not match {name_num} {list(num.shape)}")
    if rows < nq:
        _fail(f"{name_num} covers {rows} query blocks, the query length needs {nq}")
    num = num[:, :, :nq].long()
    idx = idx[:, :, :nq].long()
    width = idx.shape[-1]
    if bool((num < 0).any()):
        _fail(f"{name_num} has a negative count")
    if bool((num > min(width, nk)).any()):
        _fail(
            f"{name_num} has a count above {min(width, nk)} (the kv blocks of the key length "
            f"and the width of {name_idx})"
        )
    live = torch.arange(width, device=idx.device) < num[..., None]
    bad = live & ((idx < 0) | (idx >= nk))
    if bool(bad.any()):
        v = int(idx[bad][0])
        _fail(f"{name_idx} lists kv block {v}; the key length has {nk} blocks")
    counts = torch.zeros((b_, h_, nq, nk + 1), dtype=torch.int32, device=idx.device)
    spot = torch.where(live, idx, nk)
    counts.scatter_add_(3, spot, torch.ones_like(spot, dtype=torch.int32))
    return counts[..., :nk]


def _normalize(kv_num, kv_idx, full_num, full_idx, bq, bkv, B, H, Sq, Sk):
    from flydsl_kernels.attention import BlockSparse

    if bq < 1 or bkv < 1:
        _fail(f"BLOCK_SIZE must be positive, got {(bq, bkv)}")
    if (full_num is None) != (full_idx is None):
        _fail("full_kv_num_blocks and full_kv_indices go together")
    nq, nk = -(-Sq // bq), -(-Sk // bkv)
    part = _dense(kv_num, kv_idx, "kv_num_blocks", "kv_indices", nq, nk, B, H)
    total = part
    full = None
    if full_num is not None:
        full = _dense(full_num, full_idx, "full_kv_num_blocks", "full_kv_indices", nq, nk, B, H)
        total = part + full  # broadcasts over (b, h)
    if bool((total > 1).any()):
        _fail("kv_indices / full_kv_indices list a kv block twice for one query block")
    state = part.clone() if full is None else (part + 2 * full)
    state = state.to(torch.int32)
    orig_state = orig_block = None
    kq, kkv = bq, bkv
    if bq % 16 or bkv % 16:
        kq, kkv = -(-bq // 16) * 16, -(-bkv // 16) * 16
        orig_state = state.expand(B, H, nq, nk)
        orig_block = (bq, bkv)
        state = _reblock(state, bq, bkv, kq, kkv, Sq, Sk)
    lists = _lists(state)
    full_lists = _lists(state, 2)
    has_full = bool((state == 2).any())
    sparse = BlockSparse(
        *lists[:2],
        *(full_lists[:2] if has_full else (None, None)),
        *lists[2:],
        *(full_lists[2:] if has_full else (None, None)),
        (kq, kkv),
    )
    return Blocks(sparse, state.expand(B, H, *state.shape[2:]), (kq, kkv), orig_state, orig_block)


def _reblock(state, bq, bkv, kq, kkv, Sq, Sk):
    """The state at kernel blocks ``(kq, kkv)``: full where every overlapped original block is
    full, skipped where all are skipped, else partial."""
    nq, nk = state.shape[2:]
    mq, mk = -(-Sq // kq), -(-Sk // kkv)
    dev = state.device

    def cover(m, k, b, n):
        lo = torch.arange(m, device=dev) * k // b
        hi = torch.clamp((torch.arange(m, device=dev) * k + k - 1) // b, max=n - 1)
        span = int((hi - lo).max()) + 1 if m else 1
        return lo, hi, span

    rlo, rhi, rs = cover(mq, kq, bq, nq)
    clo, chi, cs = cover(mk, kkv, bkv, nk)
    big = torch.iinfo(torch.int32).max
    lo_st = torch.full((*state.shape[:2], mq, mk), big, dtype=torch.int32, device=dev)
    hi_st = torch.zeros((*state.shape[:2], mq, mk), dtype=torch.int32, device=dev)
    for a in range(rs):
        rows = torch.minimum(rlo + a, rhi)
        sr = state[:, :, rows]
        for c in range(cs):
            cols = torch.minimum(clo + c, chi)
            s = sr[:, :, :, cols]
            lo_st = torch.minimum(lo_st, s)
            hi_st = torch.maximum(hi_st, s)
    out = torch.ones_like(lo_st)
    out = torch.where(lo_st == 2, 2, out)
    out = torch.where(hi_st == 0, 0, out)
    return out


def _lists(state, which=1):
    """``(num, idx, q_num, q_idx)`` int32 of the blocks in ``state`` equal to ``which``."""
    m = (state == which).to(torch.int8)
    num = m.sum(-1, dtype=torch.int32)
    idx = torch.argsort(m, dim=-1, descending=True, stable=True).to(torch.int32)
    mt = m.transpose(-1, -2)
    qnum = mt.sum(-1, dtype=torch.int32)
    qidx = torch.argsort(mt, dim=-1, descending=True, stable=True).to(torch.int32)
    return num.contiguous(), idx.contiguous(), qnum.contiguous(), qidx.contiguous()
