"""The attention plan: a problem goes in; kernels, grids, arguments, constexprs, options come out.

``Problem`` describes one attention call by its sizes and features (no tensors). The
``plan_*`` functions apply the schedule rules of ``configs`` (tile, split count, persistent
grid) and return plans whose ``launches(...)`` bind operands (torch tensors, or
``TensorSpec``s for compiling without data) into ``launch.Launch``es. The function API, the
report and the static model (``model.py``) all go through here, so the three compile the same
kernels. A launch's grid may be empty (no query rows, no batch): the API skips those.

Operand layouts are the kernels' (see ``kernels.py``): ``q``/``o`` 5-D ``(B, S, Hk, G, D)``,
``lse``/``delta`` ``(B, Hk, G, S)``, ``k``/``v`` ``(B, S, Hk, D)`` or paged, ``sinks``
``(1, Hk, G)``, ``alibi`` ``(B, Hk, G)`` fp32.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

from flydsl_core import cdiv

from .._target import buffer_ops, table_target
from ..launch import Launch
from . import configs
from .common import BASED_STRIDE_MAX, PAGE_OFFSET_MAX, chunks, vblk_ok
from .kernels import (
    Bwd,
    Fwd,
    attn_bwd_dkdv_kernel,
    attn_bwd_dq_kernel,
    attn_bwd_preprocess_kernel,
    attn_combine_kernel,
    attn_fwd_kernel,
    kv_append_kernel,
)

#: rows per program of the row-wise helper kernels (split combine, backward preprocess)
ROWS_BM = 32


@dataclass(frozen=True)
class Problem:
    """One attention call, by size and feature (``seqlen_*`` are maxima for varlen / cache)."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_k: int
    head_dim: int
    head_dim_v: int
    dtype: str = "bf16"
    causal: bool = False
    window: tuple = (-1, -1)  # flash-attn's window_size; causal forces the right bound to 0
    softcap: float = 0.0
    alibi: bool = False
    sinks: bool = False
    varlen: bool = False
    seqused: bool = False  # per-batch key counts from a tensor (kv cache)
    page_size: int = 0  # paged KV cache
    batch_idx: bool = False
    lse: bool = True
    lse_log2: bool = False
    decode: bool = False  # pack the query heads of a KV group into the tile's rows
    softmax_scale: float | None = None  # None: 1 / sqrt(head_dim)
    sparse: tuple = (0, 0)  # block sparsity: the BlockMask's (Q, KV) block sizes; (0, 0) dense
    sparse_full: bool = False  # the BlockMask has full-block lists
    score_mod: Any = None
    mask_mod: Any = None

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_k

    @property
    def traced(self) -> bool:
        """A score or mask mod is traced into the kernels."""
        return self.score_mod is not None or self.mask_mod is not None

    @property
    def bounds(self) -> tuple[int, int]:
        """``(left, right)`` window bounds, -1 unbounded; causal sets ``right = 0``."""
        left, right = self.window
        if self.causal:
            right = 0 if right < 0 else min(right, 0)
        return int(left), int(right)


def _based_strides(t) -> bool:
    """Whether a K or V tensor (4-D), or the backward's Q or dO (5-D), as a torch tensor or a
    ``TensorSpec``, has the row and head-dim strides a ``Fwd.BASED`` / ``Bwd.BASED`` load
    clamps to (``common.BASED_STRIDE_MAX``): unknown strides are not."""
    st = _strides(t)
    if st is None or len(st) not in (4, 5):
        return False
    return all(s is not None and 0 <= s <= BASED_STRIDE_MAX for s in (st[1], st[-1]))


def _strides(t):
    """A torch tensor's or a ``TensorSpec``'s strides (None entries where unknown), or None."""
    st = t.stride() if callable(getattr(t, "stride", None)) else getattr(t, "stride", None)
    if st is None and hasattr(t, "shape"):  # a contiguous TensorSpec
        st, acc = [], 1
        for n in reversed(t.shape):
            st.append(acc)
            acc = acc * n if (n is not None and acc is not None) else None
        st = st[::-1]
    return st


def _page_offsets_ok(v) -> bool:
    """Whether a paged V cache's last page starts at most ``common.PAGE_OFFSET_MAX`` elements
    in (the bound a ``Fwd.VBLK`` load clamps its page offsets to): unknown sizes are not."""
    shape, st = getattr(v, "shape", None), _strides(v)
    if shape is None or st is None or len(st) != 4 or shape[0] is None or st[0] is None:
        return False
    return 0 <= (int(shape[0]) - 1) * st[0] <= PAGE_OFFSET_MAX


def _ints(p: Problem):
    left, right = p.bounds
    return max(left, 0), max(right, 0)


# -- forward ---------------------------------------------------------------------------------------


@dataclass
class FwdPlan:
    problem: Problem
    config: configs.Config
    C: Fwd
    grid: tuple
    splits: int
    persistent: int  # programs of a persistent grid, 0 if one per tile
    options: dict
    scale: float

    def launches(
        self,
        *,
        q,
        k,
        v,
        o,
        lse,
        sinks=None,
        alibi=None,
        cu_q=None,
        cu_k=None,
        seqused_k=None,
        block_table=None,
        batch_idx=None,
        mod_tensors=(),
        o_part=None,
        lse_part=None,
        sq_rows=None,
        sparse=(None,) * 4,
    ):
        """The forward launch (plus the combine when split). ``sq_rows``: the Sq extent of the
        tensors (total tokens for varlen); the grid uses the problem's (max) seqlen."""
        p = self.problem
        mt = tuple(mod_tensors) + (None,) * (4 - len(mod_tensors))
        left, right = _ints(p)
        NG = cdiv(p.group, self.C.GP)
        args = (
            q,
            k,
            v,
            o_part if self.splits > 1 else o,
            lse_part if self.splits > 1 else lse,
            sinks,
            alibi,
            cu_q,
            cu_k,
            seqused_k,
            block_table,
            batch_idx,
            *mt,
            *sparse,
            p.batch,
            p.seqlen_q,
            p.seqlen_k,
            p.heads_k,
            p.group,
            NG,
            float(self.scale),
            left,
            right,
            float(p.softcap) if p.softcap else 1.0,
        )
        C = self.C
        if C.BASED and not (_based_strides(k) and _based_strides(v)):
            C = replace(C, BASED=False)
        if C.VBLK and not (_based_strides(v) and _page_offsets_ok(v)):
            C = replace(C, VBLK=0)
        if C.VK_STRIDES:
            ks, vs = _strides(k), _strides(v)
            same = ks is not None and None not in ks and tuple(ks) == tuple(vs)
            if not (same and (C.BASED or C.VBLK)):  # a replace only where it changes
                C = replace(C, VK_STRIDES=False)
        out = [Launch(attn_fwd_kernel, self.grid, args, {"C": C}, self.options)]
        if self.splits > 1:
            rows = sq_rows if sq_rows is not None else p.seqlen_q
            bq = 1 if p.varlen else p.batch
            cgrid = (cdiv(rows, ROWS_BM), bq * p.heads_k * p.group)
            cargs = (o_part, lse_part, o, lse, sinks, rows, p.heads_k, p.group)
            cc = dict(
                BM=ROWS_BM,
                DV=p.head_dim_v,
                SPLITS=self.splits,
                SINKS=p.sinks,
                LSE=lse is not None,
                LSE_LOG2=p.lse_log2,
            )
            out.append(Launch(attn_combine_kernel, cgrid, cargs, cc, {"num_warps": 4}))
        return out


def _table(target, table):
    """The target whose table configures a launch compiled for ``target``: ``table`` where the
    caller resolved it from the tensors (``_target.table_target``), else ``target``'s own (the
    default table for None and the CPU backends)."""
    return table if table is not None else table_target(None, target)


def plan_forward(
    p: Problem, target=None, *, table=None, config=None, splits=None, persistent=None
) -> FwdPlan:
    """The forward schedule of ``p`` compiled for ``target`` with ``table``'s configs and CU
    count (default: ``target``'s; see ``configs``' module doc)."""
    table = _table(target, table)
    sparse = bool(p.sparse[0])
    kind = forward_kind(p)
    dcls = configs.dclass(p.head_dim, p.head_dim_v)
    traced = p.traced
    if config is None and traced and not sparse:  # the mod tile at its band level (its
        # changes), then the level's own for the mod under a left bound (over a paged cache,
        # its paged ones on top)
        cfg = mod_band_tile(kind, p, table)
        if p.bounds[0] >= 0:
            fp32, paged = p.dtype == "fp32", bool(p.page_size)
            cfg = configs.traced_config(kind, cfg, dcls, table, fp32, True, paged)
    else:
        cfg = config or fp32_tiles(configs.select(kind, p.head_dim, table, p.head_dim_v), p)
        if config is None and traced:  # a block mask's: the mod tile with its changes
            mt = forward_mod_tile(p, table, kind)
            cfg = configs.traced_config(kind, mt, dcls, table, p.dtype == "fp32")
        if sparse:
            cfg = sparse_tiles(cfg, p.sparse)
        cfg = fitted_tile(kind, cfg, p)
        if config is None:
            # the table's tile (fp32's: its own changes), which the window, score-term and
            # page changes were chosen for: not a block mask's (its rule shaped it above); a
            # decode tile's changes apply to it as grown for its rows
            cfg = configs.window_config(
                kind, cfg, p.bounds, dcls, table, mod=configs.tile_mod(p.alibi, bool(p.softcap)),
                tuned=not sparse, paged=bool(p.page_size), fp32=p.dtype == "fp32",
            )  # fmt: skip
    # a given config's K lane order is a 16-bit operand's (fp32's tiles have none: fp32_tiles)
    klanes = cfg.klanes if config is None or p.dtype != "fp32" else 0
    if config is None:  # the changes set the table's key tile
        cfg = page_tile(cfg, p.page_size, klanes)
    G = p.group
    GP = next_gp(G) if kind == "decode" else 1
    BM = configs.decode_rows(cfg.BM, p.seqlen_q, GP) if p.decode else cfg.BM
    left, right = p.bounds
    # every field computed first and Fwd built once: a dataclasses.replace of its 36 fields
    # costs about 15 us, and a decode call plans on every call (9 of them were 140 us of a
    # B1 decode's 210 us on the host)
    BMS = BM // GP
    # decode tiles within one page load K and V from a scalar base (Fwd.BASED; the launch
    # drops it for strides above common.BASED_STRIDE_MAX), folded into AMD's buffer base; the
    # prefill forward over a dense cache keeps its base in the offsets, which K and V share
    # (Fwd.FOLD_BASE), on the buffer-load tables only (sm90's tables were timed as they are)
    prefill_based = kind == "fwd" and p.page_size == 0 and buffer_ops(table)
    based = prefill_based or (kind == "decode" and (p.page_size == 0 or p.page_size >= cfg.BN))
    # decode tiles spanning pages of whole MFMA key blocks load V in head-dim blocks where the
    # table says so (Config.vblk, Fwd.VBLK; the launch drops it for strides or page offsets
    # above common's bounds)
    whole = bool(klanes) and p.page_size % cfg.nonkdim == 0
    vblk = cfg.vblk if kind == "decode" and whole else 0
    if vblk and not vblk_ok(vblk, p.page_size, cfg.BN, p.head_dim_v):
        vblk = 0
    # Q in the QK MFMA's lane order (Config.q_lanes): one head per tile, 16-bit operands, and
    # whole lane-group blocks of head dims and warp row blocks (Triton's MFMA layout puts the
    # warps along the rows: common._load_q_lanes)
    qlanes = cfg.q_lanes if kind == "fwd" and GP == 1 and p.dtype != "fp32" else 0
    if qlanes and not (
        BM % (cfg.num_warps * cfg.nonkdim) == 0
        and all(cs % (64 // cfg.nonkdim * qlanes) == 0 for _, cs in chunks(p.head_dim))
    ):
        qlanes = 0
    fold = decode_fold(p, cfg, kind, BM, GP, vblk)
    # a folded tile's key blocks each within one page load from a scalar base too
    based = based or (fold > 1 and p.page_size >= cfg.BN // fold)
    BM //= fold
    BMS = BM // GP
    NG = cdiv(G, GP)
    mblocks = cdiv(p.seqlen_q, BMS)
    programs = p.batch * p.heads_k * NG * mblocks
    cus = configs.num_cus(table)
    kv_blocks = cdiv(p.seqlen_k, cfg.BN)
    keys = p.seqlen_k if band(p) is None else min(p.seqlen_k, band(p) + BMS - 1)
    s = splits if splits is not None else configs.splits_for(programs, keys, cus)
    s = max(1, min(int(s), max(kv_blocks, 1)))
    if sparse:
        s = 1  # a block list is one program's walk: no split-KV
    pers = 0
    if s == 1:
        if persistent is None:
            # causal tiles cost unevenly only across m-blocks: one m-block (decode) is even
            uneven = p.causal and mblocks > 1
            pers = configs.persistent_programs(programs, cus, uneven) if cfg.persist else 0
        else:
            pers = int(persistent)
    C = Fwd(
        BM=BM,
        BN=cfg.BN,
        GP=GP,
        D=p.head_dim,
        DV=p.head_dim_v,
        CAUSAL=p.causal,
        HAS_WL=left >= 0,
        HAS_WR=right >= 0,
        SOFTCAP=bool(p.softcap),
        ALIBI=p.alibi,
        SINKS=p.sinks,
        VARLEN=p.varlen,
        SEQUSED=p.seqused,
        PAGE=p.page_size,
        BATCH_IDX=p.batch_idx,
        LSE=p.lse,
        LSE_LOG2=p.lse_log2,
        score_mod=p.score_mod,
        mask_mod=p.mask_mod,
        LAZY_RESCALE=cfg.lazy,
        SPARSE_Q=p.sparse[0],
        SPARSE_KV=p.sparse[1],
        SPARSE_FULL=p.sparse_full,
        FOLD_SCALE=scale_of(p) > 0,
        NARROW=narrow_band(p, BMS, cfg.BN, "fwd"),
        KLANES=klanes,
        KROWS=cfg.nonkdim,
        QLANES=qlanes,
        QWARPS=cfg.num_warps,
        LANE_SUMS=cfg.lane_sums and cfg.BN % 16 == 0,  # forward.LANE_SUM_N
        KEY_LANE_BITS=configs.key_lane_bits(table, cfg.nonkdim),
        SK_TAIL=kind == "fwd" and configs.sk_tail(table, dcls),
        KT=cfg.k_t and not p.page_size and not klanes and fold == 1,
        KT_EDGE=cfg.kt_edge,
        BASED=based,
        FOLD_BASE=not prefill_based,
        VBLK=vblk,
        FOLD=fold,
        # where the launch finds V's strides equal to K's, V's offsets take K's (Fwd.VK_STRIDES):
        # on the buffer-load tables only (sm90's d64 page256 decode went 80 -> 89 registers)
        VK_STRIDES=bool(based or vblk) and buffer_ops(table),
        SPLITS=s if s > 1 else 1,
        PERSIST=s == 1 and bool(pers),
    )
    if s > 1:
        grid = (mblocks, p.batch * p.heads_k * NG, s)
    elif pers:
        grid = (min(pers, max(programs, 1)), 1, 1)
    else:
        grid = (mblocks, p.batch * p.heads_k * NG, 1)
    if programs == 0:
        grid = (0, 0, 0)
    return FwdPlan(p, cfg, C, grid, s, pers, cfg.options(target), scale_of(p))


def forward_kind(p: Problem) -> str:
    """The forward's table kind for ``p``: ``decode`` (no block mask), else ``fwd``."""
    return "decode" if p.decode and not p.sparse[0] else "fwd"


def retile_forward(fp: FwdPlan, target, cfg: configs.Config, table=None) -> FwdPlan:
    """``fp``'s problem planned again with the tile ``cfg`` (a change of ``fp.config``:
    ``fit.traced_tile``'s), capped at the page as the plan caps its own, with ``fp``'s split
    count and persistent grid."""
    p = fp.problem
    cfg = page_tile(cfg, p.page_size, cfg.klanes if p.dtype != "fp32" else 0)
    kw = dict(table=table, config=cfg, splits=fp.splits, persistent=fp.persistent)
    return plan_forward(p, target, **kw)


def page_tile(cfg: configs.Config, page: int, klanes: int) -> configs.Config:
    """``cfg`` over a cache of pages of ``page`` keys (0: dense) with K in lane order
    ``klanes`` (``Config.klanes``; fp32's tile has none: ``fp32_tiles``)."""
    if page and cfg.d2l:
        # K's and V's rows come through the block table: their direct-to-LDS copies' offsets,
        # computed in the copies' write layout, held more registers (gfx950 fwd d256: one wave
        # under a (62, 0) window with ALiBi over pages of 64 and 256; a VGPR spill and 8 B of
        # scratch with a traced table bias under (4095, -1)), so a paged tile loads through
        # registers
        cfg = replace(cfg, d2l=False)
    if page and page < cfg.BN and not (klanes and page % cfg.nonkdim == 0):
        # a tile spanning several pages gathers them row by row, which held scalar registers
        # (gfx950 decode d128: 19 SGPR spills at 4 pages of 16 per tile, 23 at 2 of 32): the
        # tile shrinks to one page (16 keys at least), whose id is one scalar per tile. With K
        # loaded in MFMA lane order (``Config.klanes``) a page of 16 keys or more is a whole
        # key block of the load: no spill on the targets whose tables set it (gfx950 decode
        # d128, pages of 16: 64-key tiles, 4 pages, no padding of P @ V's 16-key reduction)
        return replace(cfg, BN=max(page, 16))
    return cfg


def fp32_tiles(cfg: configs.Config, p: Problem) -> configs.Config:
    """fp32 operands (flex_attention's fp32 inputs) hold twice the registers and LDS of the
    16-bit ones the tables are tuned for: half the key tile (at least 16), LLVM's default
    scheduler, K's plain load (its lane order is a 16-bit operand's: ``Config.klanes``); the
    level's ``configs.FP32_TILES`` changes go on top (``window_config``)."""
    if p.dtype != "fp32":
        return cfg
    # LLVM's default scheduler: the one checked
    return replace(cfg, BN=max(16, cfg.BN // 2), sched="", klanes=0)


def band(p: Problem) -> int | None:
    """Keys a query sees at most under a window bounded on both sides (``left + right + 1``);
    None without one (``configs.band_of``)."""
    return configs.band_of(p.bounds)


@functools.lru_cache(maxsize=256)
def _both_bounds_cross(sq, sk, rows, keys, left, right, mirrored) -> bool:
    """Whether some tile of ``rows`` queries x ``keys`` keys (forward / dQ: query tiles walking
    key tiles; ``mirrored``: dK/dV's key tiles walking query tiles) crosses both window bounds:
    the kernels' ``_kv_range`` / ``_dkdv_tile`` bounds and ``_segments``' "both" loop, in Python."""
    off = sk - sq

    def both(lo, full_lo, full_hi, hi):
        b = max(lo, min(full_lo, full_hi, hi))
        c = max(b, min(full_hi, hi))
        return max(c, min(full_lo, hi)) > c

    if not mirrored:
        for i0 in range(0, sq, rows):
            last = min(i0 + rows, sq) - 1
            hi = min(sk, max(last + off + right + 1, 0))
            lo = (max(i0 + off - left, 0) // keys) * keys
            full_lo = -(-max(last + off - left, 0) // keys) * keys
            full_hi = (min(sk, max(i0 + off + right + 1, 0)) // keys) * keys
            if both(lo, full_lo, full_hi, hi):
                return True
        return False
    for n0 in range(0, sk, keys):
        lo = (max(n0 - off - right, 0) // rows) * rows
        full_lo = -(-max(n0 + keys - 1 - off - right, 0) // rows) * rows
        hi = min(sq, max(n0 + keys - off + left, 0))
        full_hi = (min(sq, max(n0 - off + left + 1, 0)) // rows) * rows
        if both(lo, full_lo, full_hi, hi):
            return True
    return False


def narrow_band(p: Problem, rows: int, keys: int, kind: str) -> bool:
    """``Fwd.NARROW`` / ``Bwd.NARROW``: False when no tile of ``p`` can cross both window bounds
    (so the kernel traces no loop for such tiles); True where it can, or where the sequence
    lengths are not known here (varlen, a KV cache's per-batch lengths)."""
    if band(p) is None or p.varlen or p.seqused or p.decode:
        return True
    left, right = p.bounds
    return _both_bounds_cross(p.seqlen_q, p.seqlen_k, rows, keys, left, right, kind == "bwd_dkdv")


def sparse_tiles(cfg: configs.Config, blocks) -> configs.Config:
    """``cfg`` with tiles that divide the BlockMask's blocks (a block is walked tile by tile):
    the largest power of two dividing the block size, at most the config's tile."""
    from dataclasses import replace as _replace

    def fit(t, blk):
        while t > 16 and blk % t:
            t //= 2
        return t

    return _replace(cfg, BM=fit(cfg.BM, blocks[0]), BN=fit(cfg.BN, blocks[1]))


def next_gp(G: int) -> int:
    return configs.next_pow2(max(G, 1))


def grown_decode(cfg: configs.Config, rows: int) -> configs.Config:
    """``cfg`` for a decode tile whose rows grew past the table's (``configs.decode_rows``:
    several query positions per head, as speculative decoding sends): a warp per table tile
    of rows, so each warp keeps the rows the table was tuned for, and K's lane order off (a
    one-warp load: ``Config.klanes``). One warp of 64 rows spilled on every target (gfx950
    decode d64, 8 positions of a group of 8: 71 registers, one wave; d128: 81 and 132 B of
    scratch; sm90 d128: 280 B of scratch); 4 warps of 16 rows take 184 VGPRs there (d128:
    192) with no spill, and K's lane order at 2 or 4 warps spilled SGPRs on gfx950 d64 at pages
    of 16 and 64 (27, 28). At most 8 warps (sm90's d192 / d256 entries already take 8 at 16
    rows: 32 took scratch there). ``cfg`` itself where the rows did not grow."""
    if rows <= cfg.BM:
        return cfg
    warps = min(cfg.num_warps * (rows // cfg.BM), max(cfg.num_warps, 8))
    return replace(cfg, BM=rows, num_warps=warps, klanes=0, notes={})


#: the fewest keys a folded decode tile's copy takes (``decode_fold``): the P @ V reduction of
#: gfx950's and gfx1250's 16x16x32 matrix instructions, which a 16-key block pads to 32 (and
#: gfx1250's 16-key copies at pages of 32 took 168 -> 174 loop instructions per trip)
FOLD_KEYS_MIN = 32


def decode_fold(p: Problem, cfg: configs.Config, kind: str, rows: int, gp: int, vblk: int) -> int:
    """The row copies of a decode tile (``Fwd.FOLD``): how many times the tile's real rows
    (the group's heads times its query positions, each a power of two) fit in the ``rows``
    the MFMA computes, up to ``Config.fold``, while each copy keeps a key block of at least
    ``FOLD_KEYS_MIN``. 1 where the table leaves it off, and for what the
    folded loop does not handle: score and mask mods, ALiBi, V in head-dim blocks."""
    if not (kind == "decode" and cfg.fold and not vblk and not p.alibi):  # decode: not sparse
        return 1
    if p.traced:
        return 1
    real = configs.next_pow2(max(p.seqlen_q, 1)) * gp
    f = 1
    while f < cfg.fold and rows // (2 * f) >= real and cfg.BN // (2 * f) >= FOLD_KEYS_MIN:
        f *= 2
    return f


def append_launch(
    p: Problem,
    *,
    k_new,
    v_new,
    k_cache,
    v_cache,
    cache_seqlens,
    block_table,
    batch_idx,
    snew: int,
    target=None,
) -> Launch:
    """Writes ``snew`` new tokens per batch into the cache at ``cache_seqlens[b] + t``."""
    cc = dict(
        HB=configs.next_pow2(p.heads_k),
        D=p.head_dim,
        DV=p.head_dim_v,
        PAGE=p.page_size,
        BATCH_IDX=p.batch_idx,
    )
    args = (k_new, v_new, k_cache, v_cache, cache_seqlens, block_table, batch_idx)
    return Launch(kv_append_kernel, (snew, p.batch), args, cc, {"num_warps": 4})


# -- backward --------------------------------------------------------------------------------------


@dataclass
class BwdPlan:
    problem: Problem
    dkdv: configs.Config
    dq: configs.Config
    C_dkdv: Bwd
    C_dq: Bwd
    scale: float
    target: Any

    def launches(
        self,
        *,
        q,
        k,
        v,
        o,
        do,
        lse,
        ld,
        dq,
        dk,
        dv,
        alibi=None,
        cu_q=None,
        cu_k=None,
        mod_tensors=(),
        sq_rows=None,
        sparse_kv=(None,) * 4,
        sparse_q=(None,) * 4,
    ):
        p = self.problem
        mt = tuple(mod_tensors) + (None,) * (4 - len(mod_tensors))
        left, right = _ints(p)
        G = p.group
        rows = sq_rows if sq_rows is not None else p.seqlen_q
        pre = Launch(
            attn_bwd_preprocess_kernel,
            (cdiv(p.seqlen_q, ROWS_BM), p.batch * p.heads_k * G),
            (o, do, lse, ld, cu_q, rows, p.heads_k, G),
            dict(BM=ROWS_BM, DV=p.head_dim_v, VARLEN=p.varlen, LSE_LOG2=p.lse_log2),
            {"num_warps": 4},
        )
        tail = (
            p.seqlen_q,
            p.seqlen_k,
            p.heads_k,
            G,
            float(self.scale),
            left,
            right,
            float(p.softcap) if p.softcap else 1.0,
        )
        dkdv = Launch(
            attn_bwd_dkdv_kernel,
            (cdiv(p.seqlen_k, self.C_dkdv.BN), p.batch * p.heads_k),
            (q, k, v, do, ld, dk, dv, alibi, cu_q, cu_k, *mt, *sparse_q, *tail),
            {"C": _bwd_based(self.C_dkdv, q, do)},
            self.dkdv.options(self.target),
        )
        dql = Launch(
            attn_bwd_dq_kernel,
            (cdiv(p.seqlen_q, self.C_dq.BM), p.batch * p.heads_k * G),
            (q, k, v, do, ld, dq, alibi, cu_q, cu_k, *mt, *sparse_kv, *tail),
            {"C": _bwd_based(self.C_dq, k, v)},
            self.dq.options(self.target),
        )
        if p.batch == 0 or p.heads_k == 0:
            return []
        return [pre, dkdv, dql]


def _bwd_based(C: Bwd, a, b) -> Bwd:
    """``C`` for a launch whose loop loads tensors ``a`` and ``b`` (dK/dV: Q and dO; dQ: K and
    V): ``Bwd.BASED`` only where both have row and head-dim strides a based load clamps to,
    ``Bwd.SAME_STRIDES`` only where their strides are equal."""
    if not C.BASED:
        return C
    if not (_based_strides(a) and _based_strides(b)):
        return replace(C, BASED=False, SAME_STRIDES=False)
    if not C.SAME_STRIDES:
        return C
    sa, sb = _strides(a), _strides(b)
    same = None not in sa and tuple(sa) == tuple(sb)
    return C if same else replace(C, SAME_STRIDES=False)


def forward_mod_tile(p: Problem, table, kind: str = "fwd") -> configs.Config:
    """The forward's (``kind`` ``"fwd"`` or ``"decode"``) tile for ``p`` with a traced score or
    mask mod from ``table`` (a target name): ``configs.mod_config`` of the entry (fp32's:
    ``fp32_tiles``'), before ``configs.TRACED_TILES``' changes (a decode tile's: before it
    grows for its rows)."""
    c = fp32_tiles(configs.select(kind, p.head_dim, table, p.head_dim_v), p)
    return configs.mod_config(c)


def mod_band_tile(kind: str, p: Problem, table) -> configs.Config:
    """The tile of kernel ``kind`` for ``p`` with a traced score or mask mod and no block mask,
    before ``configs.TRACED_WINDOW_TILES``' changes (``plan_forward``'s and ``plan_backward``'s;
    under a left bound those of its warps follow): the forward's mod tile with its
    ``TRACED_TILES`` changes (over a paged cache ``TRACED_PAGED_TILES``' too), fitted to the
    problem (``fitted_tile``: a decode tile grown for its rows; capped at the page) and shrunk
    for the window; the backward's ``backward_tile``."""
    dcls = configs.dclass(p.head_dim, p.head_dim_v)
    if kind not in ("fwd", "decode"):
        return backward_tile(kind, p, table)
    mt = forward_mod_tile(p, table, kind)
    paged = bool(p.page_size)
    c = configs.traced_config(kind, mt, dcls, table, p.dtype == "fp32", paged=paged)
    return configs.window_config(kind, fitted_tile(kind, c, p), p.bounds, dcls, table, tuned=False)


def fitted_tile(kind: str, cfg: configs.Config, p: Problem) -> configs.Config:
    """A forward tile ``cfg`` fitted to ``p``'s rows and cache: a decode tile grown for its
    rows (``grown_decode``), then the key tile capped at ``p``'s page (``page_tile``)."""
    if kind == "decode":
        cfg = grown_decode(cfg, configs.decode_rows(cfg.BM, p.seqlen_q, next_gp(p.group)))
    return page_tile(cfg, p.page_size, cfg.klanes if p.dtype != "fp32" else 0)


def backward_tile(kind: str, p: Problem, table) -> configs.Config:
    """The tile of the backward kernel ``kind`` (``"bwd_dkdv"`` / ``"bwd_dq"``) for ``p`` from
    ``table`` (a target name): the entry (fp32's: ``fp32_tiles``') with its level's window,
    score-term and fp32 changes (``configs.window_config``), before a traced mod's."""
    d, dv = p.head_dim, p.head_dim_v
    dcls = configs.dclass(d, dv)
    mod = configs.tile_mod(p.alibi, bool(p.softcap))
    wk = configs.band_warp_keys(table, dcls) if kind == "bwd_dkdv" else 0
    c = fp32_tiles(configs.select(kind, d, table, dv), p)
    fp32 = p.dtype == "fp32"
    return configs.window_config(kind, c, p.bounds, dcls, table, wk, mod, fp32=fp32)


def plan_backward(
    p: Problem, target=None, *, table=None, dkdv_config=None, dq_config=None
) -> BwdPlan:
    """The backward's three launches of ``p`` compiled for ``target`` with ``table``'s configs."""
    table = _table(target, table)
    dcls = configs.dclass(p.head_dim, p.head_dim_v)

    def tile(kind):
        """``backward_tile``, with a traced score or mask mod's changes: without a left bound
        (causal's right bound keeps the table's tile) ``TRACED_TILES``', under one the band
        level's ``TRACED_WINDOW_TILES``'"""
        c = backward_tile(kind, p, table)
        if p.traced:
            windowed = p.bounds[0] >= 0
            c = configs.traced_config(kind, c, dcls, table, p.dtype == "fp32", windowed)
        return c

    c1 = dkdv_config or tile("bwd_dkdv")
    c2 = dq_config or tile("bwd_dq")
    if p.sparse[0]:
        c1, c2 = sparse_tiles(c1, p.sparse), sparse_tiles(c2, p.sparse)
    left, right = p.bounds
    common = dict(
        D=p.head_dim,
        DV=p.head_dim_v,
        CAUSAL=p.causal,
        HAS_WL=left >= 0,
        HAS_WR=right >= 0,
        SOFTCAP=bool(p.softcap),
        ALIBI=p.alibi,
        VARLEN=p.varlen,
        LSE_LOG2=p.lse_log2,
        score_mod=p.score_mod,
        mask_mod=p.mask_mod,
        SPARSE_Q=p.sparse[0],
        SPARSE_KV=p.sparse[1],
        SPARSE_FULL=p.sparse_full,
    )
    n1 = narrow_band(p, c1.BM, c1.BN, "bwd_dkdv")
    n2 = narrow_band(p, c2.BM, c2.BN, "bwd_dq")
    # the loops' tiles from a scalar base kept in the offsets (Bwd.BASED), as the prefill
    # forward's, on the buffer-load tables, where the config says so (Config.bwd_loads)
    amd = bool(buffer_ops(table))

    def loads(c):
        return dict(
            BASED=amd and c.bwd_loads != "view", SAME_STRIDES=amd and c.bwd_loads == "shared"
        )

    return BwdPlan(
        p,
        c1,
        c2,
        Bwd(BM=c1.BM, BN=c1.BN, NARROW=n1, **loads(c1), **common),
        Bwd(BM=c2.BM, BN=c2.BN, NARROW=n2, **loads(c2), **common),
        scale_of(p),
        target,
    )


def scale_of(p: Problem) -> float:
    return float(p.softmax_scale) if p.softmax_scale is not None else 1.0 / math.sqrt(p.head_dim)
