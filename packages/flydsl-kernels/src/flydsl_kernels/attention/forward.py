"""The attention forward kernel: prefill, varlen, GQA-packed paged decode, split-KV partials,
a persistent grid; its online softmax (``_Softmax``, ``_update``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flydsl_core as fly

from .common import (
    FP32_LOWEST,
    LN2,
    LOG2E,
    NEG_INF,
    RESCALE_TAU,
    _kv_pages,
    _kv_range,
    _kv_segments,
    _load_k_lanes,
    _load_kT,
    _load_kv,
    _load_q,
    _load_q_lanes,
    _load_v_blocks,
    _mask_scores,
    _nonzero,
    _per_head,
    _rows,
    _scores,
    _seq_info,
    _sparse_loop,
    _split_range,
    _store_lse,
    _store_rows,
    based_ok,
    chunks,
    k_lanes_fit,
    softcap_shift,
    vblk_ok,
)


@dataclass(frozen=True)
class Fwd:
    """Compile-time facts of one forward kernel (one constexpr, so the signature stays short).

    ``score_mod`` / ``mask_mod`` are ``mods.ScoreMod`` / ``mods.MaskMod`` or None.
    """

    BM: int  # rows per tile (BMS positions x GP heads)
    BN: int  # keys per tile
    GP: int  # query heads per tile (1, or the KV group size rounded up to a power of two)
    D: int  # q/k head dim
    DV: int  # v head dim
    CAUSAL: bool = False
    HAS_WL: bool = False  # a left window bound (sliding window)
    HAS_WR: bool = False  # a right bound (causal or a window)
    SOFTCAP: bool = False
    ALIBI: bool = False
    SINKS: bool = False
    VARLEN: bool = False
    SEQUSED: bool = False  # per-batch key counts from a tensor (kv cache)
    PAGE: int = 0  # page size of a paged cache (0: not paged)
    BATCH_IDX: bool = False  # cache_batch_idx
    LSE: bool = True  # store the LSE
    LSE_LOG2: bool = False  # in base 2 (else natural log)
    SPLITS: int = 1  # split-KV: partial outputs per split, combined by attn_combine_kernel
    PERSIST: bool = False  # a persistent grid walking the tiles (configs.persistent_programs)
    score_mod: Any = None
    mask_mod: Any = None
    LAZY_RESCALE: bool = True  # per-row stale max, the rescale skipped per wave (fly.rescale)
    SPARSE_Q: int = 0  # block sparsity: the BlockMask's (Q, KV) block sizes (0: dense)
    SPARSE_KV: int = 0
    SPARSE_FULL: bool = False  # full-block lists given (their tiles skip the mask mod)
    #: the scale is > 0 and may be folded into the softmax's ``exp2`` (``_scores``); a scale of
    #: zero or below is applied to the scores first, so masked ``-inf`` logits stay ``-inf``
    FOLD_SCALE: bool = True
    # a tile may cross both window bounds (plan.narrow_band: False where the plan proves that
    # no tile of the problem does, so that loop is not traced)
    NARROW: bool = True
    #: decode, one warp: K loaded in the lane order of the QK MFMA's B operand with this many
    #: head dims per lane (``common._load_k_lanes``; 0: the plain load). ``Config.klanes``
    KLANES: int = 0
    KROWS: int = 16  # that MFMA's rows and columns (16 or 32)
    #: prefill with one head per tile (``GP == 1``): Q loaded in the lane order of the QK
    #: MFMA's A operand with this many head dims per lane (``common._load_q_lanes``, the
    #: ``KROWS`` MFMA, ``QWARPS`` warps along the rows); 0 the plain load. ``Config.q_lanes``
    QLANES: int = 0
    QWARPS: int = 1
    #: the softmax's row sums as ``(BM, LANE_SUM_N)`` partial sums (``Config.lane_sums``):
    #: a KV tile's keys are added within each lane, the sum across lanes runs once after the loop
    LANE_SUMS: bool = False
    #: the key-offset bits a lane decides in the score tile's registers (``configs.key_lane_bits``;
    #: ``common._visible``: the mask's compares then take constant key offsets)
    KEY_LANE_BITS: int = 0
    #: the right-bound tiles split at ``sk``: those below it load K and V without a key mask,
    #: the one crossing it runs outside the loop (``plan.plan_forward``: prefill; decode's right
    #: segment is that one tile)
    SK_TAIL: bool = False
    #: interior KV tiles load K as ``K^T`` (``Config.k_t``; dense K only)
    KT: bool = False
    #: with ``KT``: the unmasked edge tiles ("left" ones and right-bound ones below ``sk``: no
    #: key mask) load ``K^T`` too (``Config.kt_edge``)
    KT_EDGE: bool = False
    #: K and V tiles loaded with ``load_at`` (``common._load_based``): the tile's
    #: scalar origin (its page, first key, head) apart from the per-element offsets, which
    #: then stay fixed across the KV loop (AMD buffer loads: no address add per load). Needs
    #: a tile within one page (or a dense cache) and row / head-dim strides of at most
    #: ``common.BASED_STRIDE_MAX`` (``plan.FwdPlan.launches`` checks the tensors)
    BASED: bool = False
    #: decode with pages smaller than the tile: V loaded as ``(DV / VBLK, BN, VBLK)`` head-dim
    #: blocks and P @ V as a batched dot into a ``(DV / VBLK, BM, VBLK)`` accumulator
    #: (``common._load_v_blocks``: one address add per page instead of one per row load).
    #: Needs V's row and head-dim strides of at most ``common.BASED_STRIDE_MAX`` and page
    #: offsets of at most ``common.PAGE_OFFSET_MAX`` (``plan.FwdPlan.launches`` checks)
    VBLK: int = 0
    #: under ``BASED``: ``load_at``'s ``fold_base``. False for the prefill forward (a dense
    #: cache, ``plan.plan_forward``): its scalar origin stays in the offsets, which K and V then
    #: share (``VK_STRIDES``), and LLVM carries each shared offset register across the KV loop
    #: with one add per trip (gfx950 llama main loop 234 -> 230 instructions per trip, gpt-oss
    #: 214 -> 204, d256 194 -> 187; a folded base built a buffer descriptor per tensor and trip:
    #: 232, 207, 189, decode's 230 / 220 / 273 would go to 259 / 253 / 312 unfolded)
    FOLD_BASE: bool = True
    #: under ``VBLK`` or ``BASED``: V's strides are K's (the launch compares them), so V's
    #: offsets take K's stride arguments and LLVM computes each page's offset once for both
    #: (gfx950 loop instructions per trip: d128 page16 234 -> 230, page64 224 -> 220, d64
    #: page256 279 -> 273)
    VK_STRIDES: bool = False
    #: decode whose real rows (``BM``: the group's heads times the query positions) fill only
    #: part of the MFMA's rows (``plan.decode_fold``, ``Config.fold``): the tile computes
    #: ``FOLD * BM`` rows, copy ``f`` of the real rows taking key block ``f`` of each KV tile
    #: (``BN / FOLD`` keys). Q enters copy ``f``'s rows only, so one ``q @ k.T`` per key block
    #: accumulates the copies' scores side by side: the same MFMAs as the padded tile, and the
    #: softmax over the tile's ``BM x BN`` scores instead of ``FOLD * BM x BN``, half of them
    #: padding. Each copy keeps its own running max, sum and accumulator (one per key block:
    #: P @ V of a copy's keys; the other copies' rows in it are never read), merged per real
    #: row once after the loop as split-KV partials are (``_fold_merge``)
    FOLD: int = 1

    @property
    def BMS(self) -> int:
        return self.BM // self.GP


#: partial sums per row under ``Fwd.LANE_SUMS``: the 16x16 MFMA's columns, so that a tile's
#: keys fold onto them within each lane (its ``BN / 16`` column blocks)
LANE_SUM_N = 16


@dataclass
class _Softmax:
    """The online-softmax state of one tile (handles updated in place: loop-carried)."""

    m: Any  # (BM,) running max, base 2
    l: Any  # (BM,) running sum, or (BM, LANE_SUM_N) partial sums (``Fwd.LANE_SUMS``)
    acc: list  # fp32 (BM, cs) per V chunk


def _update(st: _Softmax, z, zc, vts, C):
    """Fold a tile of logits (base 2: ``z * zc``, or ``z`` when ``zc`` is None; ``-inf`` where
    masked) and its V chunks into ``st``."""
    m_tile = fly.max(z, 1) if zc is None else fly.max(z, 1) * zc
    if C.LAZY_RESCALE:
        # per row, keep a stale running max until the row's max passes it by more than
        # RESCALE_TAU (FA4's rule): p = 2^(s - m) stays below 2^TAU. A stale row's factor is
        # exactly 1 (2^0), and fly.rescale skips the accumulator's multiply where a whole wave's
        # factors are 1 (a compare and a branch on AMD CDNA, no workgroup-wide vote): after the
        # first tiles, rows' maxima rarely grow by 2^TAU. A row that grew takes m_tile itself,
        # above its old max by the test (no maximum: one instruction per trip)
        d = m_tile - st.m
        grow = d > RESCALE_TAU
        m_new = fly.where(grow, m_tile, st.m)
        # the factor's exponent from the test's own difference (st.m - m_new is -d or 0): the
        # old max dies at the new one, which LLVM then keeps in its register with no
        # loop-carried copy (gfx950 fwd d128: 1 instruction per trip)
        alpha = fly.exp2(fly.where(grow, -d, 0.0))
        st.l *= alpha[:, None] if C.LANE_SUMS else alpha
        for a in st.acc:
            a.set(fly.rescale(a, _rows_of(alpha, a)))
        st.m.set(m_new)
    else:
        m_new = fly.maximum(st.m, m_tile)
        alpha = fly.exp2(st.m - m_new)
        st.l *= alpha[:, None] if C.LANE_SUMS else alpha
        for a in st.acc:
            a *= _rows_of(alpha, a)
        st.m.set(m_new)
    p = fly.exp2((z if zc is None else z * zc) - st.m[:, None])
    if C.LANE_SUMS:
        # the tile's column blocks added within each lane; the cross-lane sum (2 lane swaps, their
        # moves and adds per row) waits until after the loop (gfx950, the report's decode
        # cases: d128 266 -> 262 instructions per KV tile, d64 328 -> 322). The row sums on
        # the matrix core instead (P @ ones: 258 and 305) summed the bf16-rounded P, 4e-4 off
        # in the LSE
        n = st.l.shape[1]
        st.l += fly.sum(p.reshape(p.shape[0], p.shape[1] // n, n), 1)
    else:
        st.l += fly.sum(p, 1)
    for a, vt in zip(st.acc, vts):
        pv = p.to(vt.dtype)
        if vt.ndim == 3:  # head-dim blocks (Fwd.VBLK): P broadcast over them
            pv = fly.broadcast_to(pv[None, :, :], (vt.shape[0], *pv.shape))
        a += fly.dot(pv, vt)


def _fold_rows(x, F):
    """``x`` (per row: ``(BM,)`` or ``(BM, n)``) repeated for the ``F`` row copies of a folded
    tile (``Fwd.FOLD``): row ``f BM + r`` is row ``r``."""
    bm = x.shape[0]
    return fly.broadcast_to(x[None], (F, *x.shape)).reshape(F * bm, *x.shape[1:])


def _fold_visible(C, i, j, sk, off, wl, wr, kind, sk_bound=True):
    """``common._visible``'s test on a folded tile (``Fwd.FOLD``), whose rows' keys differ per
    copy: ``i`` the rows' positions, ``j`` their ``(rows, keys)`` key indices; None where
    ``kind`` crosses no bound."""
    vis = None
    if kind in ("both", "right"):
        if sk_bound:
            vis = j < sk
        if C.HAS_WR:
            hi = j <= i[:, None] + (off + wr)
            vis = hi if vis is None else vis & hi
    if kind in ("both", "left") and C.HAS_WL:
        lo = j >= i[:, None] + (off - wl)
        vis = lo if vis is None else vis & lo
    return vis


def _fold_merge(m, l_sum, acc, C):
    """A folded tile's copies (``Fwd.FOLD``) merged per real row, as split-KV partials are:
    ``(m, l, [acc per V chunk])`` of the ``BM`` rows from the ``FOLD`` copies' running maxima,
    sums and accumulators (``FOLD`` per V chunk, copy ``f``'s rows of the ``f``-th valid). A
    copy that saw no key has the lowest max and a zero sum: its weight is 0, or 1 with every
    other copy's where no copy saw one (sum 0: the empty row's output)."""
    F, BM = C.FOLD, C.BM
    mr = m.reshape(F, BM)
    mx = fly.max(mr, 0)
    w = fly.exp2(mr - mx[None, :])
    l_out = fly.sum(w * l_sum.reshape(F, BM), 0)
    wrow = w.reshape(F * BM)
    fr = fly.arange(0, F * BM) // BM
    out = []
    for ci, (_, cs) in enumerate(chunks(C.DV)):
        rows = None
        for f in range(F):
            a = fly.where((fr == f)[:, None], acc[ci * F + f], 0.0)
            rows = a if rows is None else rows + a
        out.append(fly.sum((rows * wrow[:, None]).reshape(F, BM, cs), 0))
    return mx, l_out, out


def _rows_of(x, a):
    """A per-row ``(BM,)`` factor shaped for an accumulator ``a``: ``(BM, cs)`` or the head-dim
    blocks ``(DV / VBLK, BM, VBLK)`` of ``Fwd.VBLK``."""
    return x[:, None] if a.ndim == 2 else x[None, :, None]


@fly.kernel
def attn_fwd_kernel(
    q, k, v, o, lse, sinks, alibi, cu_q, cu_k, seqused_k, block_table, batch_idx,
    mt0, mt1, mt2, mt3, kv_num, kv_idx, fkv_num, fkv_idx,
    B, Sq, Sk, Hk, G, NG, scale, wl, wr, softcap,
    C: fly.constexpr,
):  # fmt: skip
    """One ``BM``-row tile of one (batch, KV head, head group) per program.

    Grid ``(cdiv(max sq, BMS), B * Hk * NG, SPLITS)``. With ``SPLITS > 1`` the program handles
    its split's share of the keys and writes a normalized fp32 partial output and its base-2
    LSE (``-inf`` when the split saw no key) for ``attn_combine_kernel``. With ``C.PERSIST``
    the grid is ``(P,)`` and each program walks the tiles in zig-zag cost order
    (``configs.persistent_programs``). ``kv_num`` / ``kv_idx`` (and ``fkv_*`` for full blocks):
    a BlockMask's ``(B, H, q blocks)`` counts and ``(B, H, q blocks, kv blocks)`` indices.
    """
    mt = (mt0, mt1, mt2, mt3, (kv_num, kv_idx, fkv_num, fkv_idx))
    if C.PERSIST:
        nbh = B * Hk * NG
        mb = (Sq + (C.BMS - 1)) // C.BMS
        total = nbh * mb
        P = fly.num_programs(0)
        me = fly.program_id(0)
        for step in fly.range(0, (total + (P - 1)) // P):
            # even steps: this program's rank among the heaviest; odd steps: mirrored
            u = step * P + fly.where(step % 2 == 0, me, P - 1 - me)
            with fly.if_(u < total):
                pm = mb - 1 - u // nbh  # rank 0 = the last m-block: the most keys when causal
                _fwd_program(
                    q, k, v, o, lse, sinks, alibi, cu_q, cu_k, seqused_k, block_table,
                    batch_idx, mt, pm, u % nbh, Sq, Sk, Hk, G, NG, scale, wl, wr, softcap, C,
                )  # fmt: skip
    else:
        _fwd_program(
            q, k, v, o, lse, sinks, alibi, cu_q, cu_k, seqused_k, block_table, batch_idx, mt,
            fly.program_id(0), fly.program_id(1), Sq, Sk, Hk, G, NG, scale, wl, wr, softcap, C,
        )  # fmt: skip


def _fwd_program(
    q, k, v, o, lse, sinks, alibi, cu_q, cu_k, seqused_k, block_table, batch_idx, mt, pm, pid,
    Sq, Sk, Hk, G, NG, scale, wl, wr, softcap, C,
):  # fmt: skip
    b = pid // (Hk * NG)
    rest = pid % (Hk * NG)
    hk = rest // NG
    g0 = (rest % NG) * C.GP
    bq, q_off, sq, bk, k_off, sk = _seq_info(b, Sq, Sk, cu_q, cu_k, seqused_k, batch_idx, C)
    i0 = pm * C.BMS
    with fly.if_(i0 < sq):
        _fwd_tile(
            q, k, v, o, lse, sinks, alibi, block_table, mt, b, hk, g0, G, i0,
            bq, q_off, sq, bk, k_off, sk, scale, wl, wr, softcap, C,
        )  # fmt: skip


def _fwd_tile(
    q, k, v, o, lse, sinks, alibi, block_table, mt, b, hk, g0, G, i0,
    bq, q_off, sq, bk, k_off, sk, scale, wl, wr, softcap, C,
):  # fmt: skip
    BN = C.BN
    i, gr = _rows(C, i0)
    rmask = (fly.arange(0, C.BMS) + i0) < sq
    h = hk * G + (g0 if gr is None else g0 + gr)  # query head of each row (mods)
    if gr is None:
        h = fly.full((C.BM,), 0, fly.int32) + h
    off = sk - sq
    if C.QLANES:
        qts = [
            _load_q_lanes(q, bq, q_off + i0, hk, g0, c0, cs, C, sq - i0) for c0, cs in chunks(C.D)
        ]
    else:
        qts = [_load_q(q, bq, q_off + i0, hk, g0, c0, cs, C, rmask, G) for c0, cs in chunks(C.D)]
    F = C.FOLD
    MR = C.BM * F  # the rows the tile computes: FOLD copies of its rows (Fwd.FOLD)
    if F > 1:
        # copy f of Q in copy f's rows, zeros elsewhere: q_f @ k_f.T puts key block f's
        # scores in those rows only, so the copies' dots add up to the folded score tile
        fr = fly.arange(0, MR) // C.BM
        qts = [
            [fly.where((fr == f)[:, None], _fold_rows(qt, F), 0.0).to(qt.dtype) for f in range(F)]
            for qt in qts
        ]
        i = _fold_rows(i, F)
    slope = _per_head(alibi, b, hk, g0, C, G) if C.ALIBI else None
    if slope is not None and C.GP == 1:
        slope = fly.full((C.BM,), 0.0, fly.fp32) + slope
    shift = softcap_shift(C, softcap)  # the logits' constant left out by _scores
    m0 = fly.full((MR,), FP32_LOWEST, fly.fp32)
    l0 = fly.zeros((MR, LANE_SUM_N) if C.LANE_SUMS else (MR,), fly.fp32)
    if C.SINKS and C.SPLITS == 1:
        # the sink is a logit with no value row: the softmax starts from it (running max the
        # sink, sum 1; the lowest fp32 and 0 for a -inf sink), so nothing of it stays live
        # across the KV loop (gfx950 gpt-oss: its pointer, then its value, spilled SGPRs there
        # under coexec with lane sums) and no epilogue folds it in
        sink = _per_head(sinks, 0, hk, g0, C, G) * LOG2E - shift
        if F > 1:  # the sink starts copy 0 only (-inf: max and sum unchanged in the others)
            sink = fly.where(
                fr == 0, _fold_rows(fly.full((C.BM,), 0.0, fly.fp32) + sink, F), NEG_INF
            )
        m0 = fly.maximum(m0, sink)
        e0 = fly.exp2(sink - m0)
        if C.LANE_SUMS:
            # spread over the row's partial sums (e0 is 1, or 0 for a -inf sink: a sixteenth
            # of it is exact). In one column, the lanes holding it started from other values
            # than their neighbours and LLVM paired the loop-carried sums off by one register
            # with the tile's sums: a v_pk_mov shuffle per trip (gfx950 gpt-oss 277 / 202 /
            # 274 -> 274 / 198 / 270 instructions per trip)
            l0 = l0 + (e0 * (1.0 / LANE_SUM_N))[:, None]
        else:
            l0 = l0 + e0
    vblk = vblk_ok(C.VBLK, C.PAGE, C.BN, C.DV)
    if vblk:  # V's head-dim blocks (Fwd.VBLK): one (DV / VBLK, BM, VBLK) accumulator
        acc0 = [fly.zeros((C.DV // C.VBLK, C.BM, C.VBLK), fly.fp32)]
    else:  # FOLD accumulators per V chunk (copy f's key block's P @ V)
        acc0 = [fly.zeros((MR, cs), fly.fp32) for _, cs in chunks(C.DV) for _ in range(F)]
    st = _Softmax(m0, l0, acc0)
    lo, full_lo, full_hi, hi = _kv_range(C, i0, sq, sk, off, wl, wr)
    if C.SPLITS > 1:
        lo, hi = _split_range(lo, hi, fly.program_id(2), C.SPLITS, BN)
    btrow = b
    based = based_ok(C)

    def block(n0, kind, below_sk=False):
        """One KV tile of ``_kv_segments`` kind (None: the interior, no mask; ``"full"``: a
        block-sparse full block, no mask mod). A "left" tile lies below every row's right
        bound and ``sk``: its loads need no key mask either, nor a tile known to end at or
        below ``sk`` (``below_sk``), whose scores then skip the test against ``sk`` too
        (``sk_bound=False``; gfx950 right-bound loops per trip: gpt-oss 266 -> 263
        instructions, d256 softcap 202 -> 200, MLA 329 -> 326, main loops and the model
        problems unchanged; gfx942 gpt-oss 552 -> 549, MLA 335 -> 333. An earlier try, before
        the sk tail's split and K^T edge tiles, took MLA's main loop 268 -> 269)."""
        j = n0 + fly.arange(0, BN)
        kmask = (j < sk) if kind not in (None, "left") and not below_sk else None
        klast = None if (kmask is None or not vblk) else sk - 1
        pages = _kv_pages(block_table, btrow, k_off + n0, BN, C.PAGE, kmask, klast)
        s = None
        for (c0, cs), qt in zip(chunks(C.D), qts):
            if k_lanes_fit(C, cs):
                kt = _load_k_lanes(k, bk, k_off + n0, hk, c0, cs, BN, C.PAGE, pages, kmask,
                                   C.KLANES, C.KROWS, based)  # fmt: skip
            elif C.KT and (kind is None or (C.KT_EDGE and kmask is None)):
                # interior tile, or (KT_EDGE) an unmasked edge one: no key mask (a masked K^T
                # load took more instructions). The edge tiles with K^T: gfx950 gpt-oss's
                # masked loops 274 / 270 -> 273 / 266 (2 barriers fewer), but the main loops of
                # d256 softcap 11.31 -> 11.38 and MLA 6.42 -> 6.53 per MFMA: per table entry
                kt = _load_kT(k, bk, k_off + n0, hk, c0, cs, BN, C.D, based, C.FOLD_BASE)
                d = fly.dot(qt, kt)
                s = d if s is None else s + d
                continue
            else:
                kt = _load_kv(
                    k, bk, k_off + n0, hk, c0, cs, BN, C.D, C.PAGE, pages, kmask, based,
                    fold=C.FOLD_BASE,
                )  # fmt: skip
            d = fly.dot(qt, kt.T)
            s = d if s is None else s + d
        z, zc = _scores(s, C, scale, softcap, slope, i, j, off, b, h, mt)
        if kind is not None:
            z = _mask_scores(
                z, C, i, j[None, :], sk, off, wl, wr, b, h[:, None], mt, kind, n0=n0,
                sk_bound=not below_sk, lane_bits=C.KEY_LANE_BITS,
            )  # fmt: skip
        if vblk:
            vst = k.stride if C.VK_STRIDES else v.stride
            vts = [_load_v_blocks(v, k_off + n0, hk, C, pages, klast, vst)]
        else:
            vst = k.stride if C.VK_STRIDES else None
            vts = [
                _load_kv(
                    v,
                    bk,
                    k_off + n0,
                    hk,
                    c0,
                    cs,
                    BN,
                    C.DV,
                    C.PAGE,
                    pages,
                    kmask,
                    based,
                    vst,
                    fold=C.FOLD_BASE,
                )
                for c0, cs in chunks(C.DV)
            ]
        _update(st, z, zc, vts, C)

    def fold_block(n0, kind, below_sk=False):
        """``block`` of a folded decode tile (``Fwd.FOLD``; no mods, ALiBi or sparsity): copy
        ``f``'s rows take keys ``n0 + f BNF + [0, BNF)``. A page holding the tile: its id once,
        each block at a constant offset ``k0`` in it; else each block's own pages."""
        BNF = BN // F
        masked = kind not in (None, "left") and not below_sk
        kms = [(n0 + f * BNF + fly.arange(0, BNF)) < sk if masked else None for f in range(F)]
        if 0 < C.PAGE < BN:
            pgs = [_kv_pages(block_table, btrow, k_off + n0 + f * BNF, BNF, C.PAGE, kms[f])
                   for f in range(F)]  # fmt: skip
            starts = [(k_off + n0 + f * BNF, 0) for f in range(F)]
        else:
            pgs = [_kv_pages(block_table, btrow, k_off + n0, BN, C.PAGE, None)] * F
            starts = [(k_off + n0, f * BNF) for f in range(F)]
        s = None
        for (c0, cs), qf in zip(chunks(C.D), qts):
            for f in range(F):
                (nf, k0), pg = starts[f], pgs[f]
                if k_lanes_fit(C, cs):
                    kt = _load_k_lanes(k, bk, nf, hk, c0, cs, BNF, C.PAGE, pg, kms[f],
                                       C.KLANES, C.KROWS, based, k0)  # fmt: skip
                else:
                    kt = _load_kv(
                        k, bk, nf, hk, c0, cs, BNF, C.D, C.PAGE, pg, kms[f], based,
                        fold=C.FOLD_BASE, k0=k0,
                    )  # fmt: skip
                d = fly.dot(qf[f], kt.T)
                s = d if s is None else s + d
        z, zc = _scores(s, C, scale, softcap, None, i, None, off, b, h, mt)
        if kind is not None:
            j = n0 + (fr * BNF)[:, None] + fly.arange(0, BNF)[None, :]
            vis = _fold_visible(C, i, j, sk, off, wl, wr, kind, not below_sk)
            if vis is not None:
                z = fly.where(vis, z, NEG_INF)
        vst = k.stride if C.VK_STRIDES else None
        vts = [
            _load_kv(
                v,
                bk,
                starts[f][0],
                hk,
                c0,
                cs,
                BNF,
                C.DV,
                C.PAGE,
                pgs[f],
                kms[f],
                based,
                vst,
                fold=C.FOLD_BASE,
                k0=starts[f][1],
            )
            for c0, cs in chunks(C.DV)
            for f in range(F)
        ]
        _update(st, z, zc, vts, C)

    step = fold_block if F > 1 else block

    if C.SPARSE_KV:
        sp = mt[4]
        hq = hk * G + g0  # GP == 1 under block sparsity
        qb = i0 // C.SPARSE_Q
        _sparse_loop(step, sp[0], sp[1], b, hq, qb, C.SPARSE_KV, BN, "both")
        if C.SPARSE_FULL:
            _sparse_loop(step, sp[2], sp[3], b, hq, qb, C.SPARSE_KV, BN, "full")
    elif C.mask_mod is not None:
        for n0 in fly.range(lo, hi, BN):
            step(n0, "both")
    else:
        for start, stop, kind in _kv_segments(C, lo, full_lo, full_hi, hi):
            if kind != "right" or not C.SK_TAIL:
                for n0 in fly.range(start, stop, BN):
                    step(n0, kind)
                continue
            # the right-bound tiles below sk load without a key mask (gfx950: its compares
            # and address selects were 15 of the gpt-oss diagonal loop's 309 instructions per
            # trip); the one tile that can cross sk (``stop`` is at most sk rounded up to a
            # tile) runs once, outside the loop. Before it, not after: after the loop, gfx950's
            # gpt-oss tile spilled 4 SGPRs (kernel pointers the epilogue reads)
            e = fly.maximum(start, fly.minimum(stop, (sk // BN) * BN))
            with fly.if_(e < stop):
                step(e, kind)
            for n0 in fly.range(start, e, BN):
                step(n0, kind, below_sk=True)

    m, l_sum = st.m, st.l
    if C.LANE_SUMS:
        l_sum = fly.sum(l_sum, 1)
    acc = st.acc
    if F > 1:
        m, l_sum, acc = _fold_merge(m, l_sum, acc, C)
    scale_o = fly.where(l_sum > 0, 1.0 / _nonzero(l_sum), 0.0)
    row0 = q_off + i0
    if vblk:  # the head-dim blocks side by side: (BM, DV)
        acc = [acc[0].permute(1, 0, 2).reshape(C.BM, C.DV)]
    for (c0, cs), a in zip(chunks(C.DV), acc):
        out = a * scale_o[:, None]
        dst = o if C.SPLITS == 1 else o[fly.program_id(2)]
        _store_rows(dst, bq, row0, hk, g0, c0, cs, C, out, rmask, G)
    if C.LSE:
        empty = NEG_INF if C.SPLITS > 1 else float("inf")
        lse2 = m + fly.log2(_nonzero(l_sum))
        if C.SOFTCAP:
            lse2 = lse2 + shift
        lse2 = fly.where(l_sum > 0, lse2, empty)
        val = lse2 if (C.LSE_LOG2 or C.SPLITS > 1) else lse2 * LN2
        dst = lse if C.SPLITS == 1 else lse[fly.program_id(2)]
        _store_lse(dst, bq, row0, hk, g0, C, val, rmask, G)
