"""Attention kernels in FlyDSL: forward (prefill, varlen, paged decode, split-KV), the split-KV
combine, the KV-cache append, and the backward (preprocess, dK/dV, dQ).

Tensor layouts seen by the kernels (the API builds these as views, no copies):

* ``q``: ``(B, Sq, Hk, G, D)``: flash-attn's ``(B, Sq, H, D)`` with the head axis split into
  (KV head, query head within its group); ``H = Hk * G``. Varlen passes ``(1, total, ...)``.
* ``k`` / ``v``: ``(B, Sk, Hk, D)``, or a paged cache ``(pages, P, Hk, D)`` with ``block_table``.
* ``o``: like ``q`` with ``Dv``; ``lse``: ``(B, Hk, G, Sq)`` fp32 (varlen ``(1, Hk, G, total)``).
* split-KV partials add a leading split axis to ``o`` (fp32) and ``lse``.

A program's tile has ``BM = BMS * GP`` rows: ``BMS`` query positions times ``GP`` query heads of
one KV group (``GP = 1`` for prefill; decode packs the group's heads so one K/V tile feeds all of
them). Row ``r`` is position ``i0 + r // GP`` of head ``g0 + r % GP``.

Masks are bottom-right aligned (flash-attn): query ``i`` of a sequence with ``sq`` queries and
``sk`` keys sits at key position ``i + sk - sq``; key ``j`` is visible when
``i + off - wl <= j <= i + off + wr`` (``off = sk - sq``; causal is ``wr = 0``).

The KV loop is split into masked edge blocks and an unmasked interior (no mask, no bounds
check: the loads need no ``v_cndmask`` and may go straight to LDS). The online softmax works
in base 2 (scores are scaled by ``log2(e)`` once) and skips the accumulator rescale when no
row's running max grew (one scalar branch per tile). Scores pass through, in order: the scale,
softcap (``c * tanh(s / c)``), the score mod, ALiBi (``-slope * |i + off - j|``), masks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flydsl_core as fly

from .._masks import and_masks as _and

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
#: the running max starts at the lowest finite fp32, not -inf: ``exp2(s - m)`` and the rescale
#: factor stay NaN-free for rows with no visible key yet, with no per-row select
FP32_LOWEST = -3.4028234663852886e38
NEG_INF = float("-inf")


def chunks(d: int) -> tuple[tuple[int, int], ...]:
    """Power-of-two pieces ``(offset, size)`` covering a head dim ``d`` (each >= 16, the last
    one masked past ``d`` where ``d`` is not a sum of such pieces): 192 -> 128 + 64, so a
    192 head costs no padding to 256."""
    out, off = [], 0
    while off < d:
        rest = d - off
        size = 1 << (rest.bit_length() - 1)
        if size < 16:
            size = 16
        out.append((off, size))
        off += size
    return tuple(out)


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
    LAZY_RESCALE: bool = True  # skip the rescale when no row's max grew (a scalar branch)
    SPARSE_Q: int = 0  # block sparsity: the BlockMask's (Q, KV) block sizes (0: dense)
    SPARSE_KV: int = 0
    SPARSE_FULL: bool = False  # full-block lists given (their tiles skip the mask mod)
    #: the scale is > 0 and may be folded into the softmax's ``exp2`` (``_scores``); a scale of
    #: zero or below is applied to the scores first, so masked ``-inf`` logits stay ``-inf``
    FOLD_SCALE: bool = True

    @property
    def BMS(self) -> int:
        return self.BM // self.GP


# -- trace-time helpers ------------------------------------------------------------------------


def _nonzero(x):
    """``x`` with zeros replaced by 1: the empty rows' ``1 / l`` and ``log2(l)`` are selected
    away afterwards, and this keeps them from computing inf (and the interpreter from warning)."""
    return fly.where(x > 0, x, 1.0)


def _rows(C, i0):
    """Per-row (position, head-in-group) index tiles of a BM-row tile."""
    r = fly.arange(0, C.BM)
    if C.GP == 1:
        return i0 + r, None
    return i0 + r // C.GP, r % C.GP


def _load_q(q, bq, row0, hk, g0, c0, cs, C, rmask, G):
    """``(BM, cs)`` rows of ``q`` (``(B, S, Hk, G, D)``) at positions ``row0 + [0, BMS)``;
    explicit masks only (rows, heads past ``G``, the head dim past ``D``), as the stores."""
    dm = (c0 + fly.arange(0, cs) < C.D) if c0 + cs > C.D else None
    if C.GP == 1:
        view = q[bq, fly.ds(row0, C.BMS), hk, g0, fly.ds(c0, cs)]
        m = _and(rmask[:, None], None if dm is None else dm[None, :])
        return view.load(m, bounds_check=False)
    view = q[bq, fly.ds(row0, C.BMS), hk, fly.ds(g0, C.GP), fly.ds(c0, cs)]
    gm = (g0 + fly.arange(0, C.GP)) < G
    m = _and(rmask[:, None, None] & gm[None, :, None], None if dm is None else dm[None, None, :])
    return view.load(m, bounds_check=False).reshape(C.BM, cs)


def _store_rows(o, bq, row0, hk, g0, c0, cs, C, val, rmask, G):
    """Store ``(BM, cs)`` rows with explicit masks only (rows, heads past ``G``, the head dim
    past ``DV``): no automatic bounds check, so the tensor's sizes need not stay live in scalar
    registers across the KV loop (they spilled SGPRs on gfx950)."""
    dm = (c0 + fly.arange(0, cs) < C.DV) if c0 + cs > C.DV else None
    if C.GP == 1:
        m = _and(rmask[:, None], None if dm is None else dm[None, :])
        o[bq, fly.ds(row0, C.BMS), hk, g0, fly.ds(c0, cs)].store(val, m, bounds_check=False)
    else:
        v3 = val.reshape(C.BMS, C.GP, cs)
        gm = (g0 + fly.arange(0, C.GP)) < G
        m = _and(
            rmask[:, None, None] & gm[None, :, None], None if dm is None else dm[None, None, :]
        )
        o[bq, fly.ds(row0, C.BMS), hk, fly.ds(g0, C.GP), fly.ds(c0, cs)].store(
            v3, m, bounds_check=False
        )


def _store_lse(lse, bq, row0, hk, g0, C, val, rmask, G):
    if C.GP == 1:
        lse[bq, hk, g0, fly.ds(row0, C.BMS)].store(val, rmask, bounds_check=False)
    else:
        v2 = val.reshape(C.BMS, C.GP).T
        gm = (g0 + fly.arange(0, C.GP)) < G
        lse[bq, hk, fly.ds(g0, C.GP), fly.ds(row0, C.BMS)].store(
            v2, gm[:, None] & rmask[None, :], bounds_check=False
        )


def _per_head(t, b, hk, g0, C, G):
    """A per-(batch, head) fp32 value broadcast to the tile's rows: ``(BM,)`` or a scalar."""
    if C.GP == 1:
        return t[b, hk, g0].load(bounds_check=False).to(fly.fp32)
    gm = (g0 + fly.arange(0, C.GP)) < G
    x = t[b, hk, fly.ds(g0, C.GP)].load(gm, bounds_check=False).to(fly.fp32)
    return fly.broadcast_to(x[None, :], (C.BMS, C.GP)).reshape(C.BM)


def _kv_pages(bt, btrow, n0, BN, PAGE, kmask):
    """The page ids of keys ``n0 + [0, BN)`` (a scalar when a page holds the tile, else one per
    ``PAGE`` rows), loaded once per KV tile for both K and V; None for a dense cache."""
    if PAGE == 0:
        return None
    if PAGE >= BN:
        return bt[btrow, n0 // PAGE].load(bounds_check=False)
    npg = BN // PAGE
    pidx = n0 // PAGE + fly.arange(0, npg)
    pm = None if kmask is None else fly.max(kmask.reshape(npg, PAGE).to(fly.int32), 1) > 0
    return bt[btrow, pidx].load(pm, bounds_check=False)


def _load_kv(t, bk, n0, hk, c0, cs, BN, D, PAGE, pages, kmask):
    """``(BN, cs)`` keys ``n0 + [0, BN)`` of ``t`` (dense ``(B, S, Hk, D)``, or paged with the
    tile's ``pages`` from ``_kv_pages``).

    No bounds check: ``kmask`` (keys, or None in the interior) and the head-dim mask (only
    where the chunk runs past ``D``) are the whole mask."""
    dm = None
    if c0 + cs > D:
        dm = (c0 + fly.arange(0, cs)) < D
    if PAGE == 0 or PAGE >= BN:
        if PAGE == 0:
            view = t[bk, fly.ds(n0, BN), hk, fly.ds(c0, cs)]
        else:
            view = t[pages, fly.ds(n0 % PAGE, BN), hk, fly.ds(c0, cs)]
        m = _and(None if kmask is None else kmask[:, None], None if dm is None else dm[None, :])
        return view.load(m, bounds_check=False)
    # pages smaller than the tile: gather BN // PAGE pages, each PAGE contiguous rows
    npg = BN // PAGE
    view = t[pages, fly.ds(0, PAGE), hk, fly.ds(c0, cs)]
    m = _and(
        None if kmask is None else kmask.reshape(npg, PAGE)[:, :, None],
        None if dm is None else dm[None, None, :],
    )
    return view.load(m, bounds_check=False).reshape(BN, cs)


def _scores(s, C, scale, softcap, slope, i, j, off, b, h, mt):
    """Raw ``q . k`` (fp32) -> ``(z, zc)``: base-2 logits are ``z * zc`` (``zc`` a scalar) or
    ``z`` itself (``zc`` None); scale, softcap, score mod, ALiBi applied, no masks.

    Without softcap, mods or ALiBi the scale stays out of ``z``: the softmax takes the max of
    the raw scores and folds the scale into ``exp2(z * zc - m)``, one fma per score instead of
    a multiply and a subtract (rounding is monotonic, so ``max(z) * zc == max(z * zc)``). That
    needs ``scale > 0`` (``C.FOLD_SCALE``): at zero or below, the masks' ``-inf`` times the scale
    is NaN or ``+inf``, and the max of the raw scores is not the max of the logits."""
    if C.FOLD_SCALE and not C.SOFTCAP and C.score_mod is None and not C.ALIBI:
        return s, scale * LOG2E
    z = s * scale
    if C.SOFTCAP:
        z = fly.tanh(z * (1.0 / softcap)) * softcap
    if C.score_mod is not None:
        z = C.score_mod.apply(z, b, h[:, None], i[:, None], j[None, :], mt)
    if C.ALIBI:
        z = z - slope[:, None] * fly.abs(i[:, None] + off - j[None, :]).to(fly.fp32)
    return z * LOG2E, None


NEG_INF_BITS = -8388608  # 0xFF800000, -inf's bits as an int32


def _mask_scores(z, C, i, j, sk, off, wl, wr, b, h, mt, mod=True, sq=None):
    """``z`` with ``-inf`` where a key is not visible (rows ``i`` x keys ``j``, broadcast).

    The range and window tests are sign bits of integer differences (``x >> 31`` is -1 where
    ``x < 0``), or-ed before anything is selected: LLVM turns the bit blend back into one
    compare and select per element, but one 64-bit lane mask per element instead of one per
    test plus their ``s_and_b64`` (the per-test masks kept too many SGPRs live across the
    masked loops and spilled SGPRs on gfx950). The mask mod, a bool tile, is a select."""
    inv = (sk - 1 - j) >> 31
    if sq is not None:  # the backward's rows past the sequence (varlen: the next one's)
        inv = inv | ((sq - 1 - i) >> 31)
    if C.HAS_WR:
        inv = inv | ((i + (off + wr) - j) >> 31)
    if C.HAS_WL:
        inv = inv | ((j - i - (off - wl)) >> 31)
    zb = fly.bitcast(z, fly.int32)
    z = fly.bitcast((zb & ~inv) | (inv & NEG_INF_BITS), fly.fp32)
    if C.mask_mod is not None and mod:
        z = fly.where(C.mask_mod.apply(b, h, i, j, mt), z, NEG_INF)
    return z


def _sparse_loop(block, num, idx, b, h, blk, BLOCK, T, kind):
    """Block sparsity (torch's BlockMask): the tiles of the ``num[b, h, blk]`` blocks listed in
    ``idx[b, h, blk, :]`` (block size ``BLOCK``, tiles of ``T`` keys or queries), in list order."""
    n = num[b, h, blk].load()
    for t in fly.range(0, n):
        kb = idx[b, h, blk, t].load()
        for u in fly.static_range(BLOCK // T):
            block(kb * BLOCK + u * T, kind)


@dataclass
class _Softmax:
    """The online-softmax state of one tile (handles updated in place: loop-carried)."""

    m: Any  # (BM,) running max, base 2
    l: Any  # (BM,) running sum
    acc: list  # fp32 (BM, cs) per V chunk


def _update(st: _Softmax, z, zc, vts, C):
    """Fold a tile of logits (base 2: ``z * zc``, or ``z`` when ``zc`` is None; ``-inf`` where
    masked) and its V chunks into ``st``."""
    m_tile = fly.max(z, 1) if zc is None else fly.max(z, 1) * zc
    m_new = fly.maximum(st.m, m_tile)
    if C.LAZY_RESCALE:
        # rescale only when some row's max grew: one scalar branch, taken less and less often
        grew = fly.max((m_new > st.m).to(fly.int32), 0) > 0
        with fly.if_(grew):
            alpha = fly.exp2(st.m - m_new)
            st.l *= alpha
            for a in st.acc:
                a *= alpha[:, None]
            st.m.set(m_new)
    else:
        alpha = fly.exp2(st.m - m_new)
        st.l *= alpha
        for a in st.acc:
            a *= alpha[:, None]
        st.m.set(m_new)
    p = fly.exp2((z if zc is None else z * zc) - st.m[:, None])
    st.l += fly.sum(p, 1)
    for a, vt in zip(st.acc, vts):
        a += fly.dot(p.to(vt.dtype), vt)


def _kv_range(C, i0, sq, sk, off, wl, wr):
    """``(lo, full_lo, full_hi, hi)`` key bounds of a row tile: masked ``[lo, full_lo)``,
    unmasked ``[full_lo, full_hi)``, masked ``[full_hi, hi)`` (all block starts multiples of BN
    from ``lo``)."""
    BN = C.BN
    last = fly.minimum(i0 + C.BMS, sq) - 1  # the last real row (rows past sq are padding)
    hi = sk
    if C.HAS_WR:
        hi = fly.minimum(sk, fly.maximum(last + off + wr + 1, 0))
    lo = 0
    full_lo = 0
    if C.HAS_WL:
        lo = (fly.maximum(i0 + off - wl, 0) // BN) * BN
        full_lo = ((fly.maximum(last + off - wl, 0) + (BN - 1)) // BN) * BN
    top = sk
    if C.HAS_WR:
        top = fly.minimum(sk, fly.maximum(i0 + off + wr + 1, 0))
    full_hi = (top // BN) * BN
    return lo, full_lo, full_hi, hi


def _split_range(lo, hi, split, SPLITS, BN):
    """This split's share ``[s_lo, s_hi)`` of ``[lo, hi)``: whole blocks, as even as possible."""
    nblk = (fly.maximum(hi - lo, 0) + (BN - 1)) // BN
    per = (nblk + (SPLITS - 1)) // SPLITS
    s_lo = lo + split * per * BN
    s_hi = fly.minimum(hi, s_lo + per * BN)
    return s_lo, fly.maximum(s_hi, s_lo)


def _seq_info(b, Sq, Sk, cu_q, cu_k, seqused_k, batch_idx, C):
    """``(bq, q_off, sq, bk, k_off, sk)`` of batch ``b``."""
    if C.VARLEN:
        q_off = cu_q[b].load()
        sq = cu_q[b + 1].load() - q_off
        k_off = cu_k[b].load()
        sk = cu_k[b + 1].load() - k_off
        bq, bk = 0, 0
    else:
        q_off, sq, k_off, sk, bq, bk = 0, Sq, 0, Sk, b, b
    if C.PAGE:
        k_off = 0  # a paged cache addresses each sequence's keys from 0 through its page table
    if C.SEQUSED:
        sk = seqused_k[b].load()
    if C.BATCH_IDX:
        bk = batch_idx[b].load()
    return bq, q_off, sq, bk, k_off, sk


# -- forward ----------------------------------------------------------------------------------------


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
    qts = [_load_q(q, bq, q_off + i0, hk, g0, c0, cs, C, rmask, G) for c0, cs in chunks(C.D)]
    slope = _per_head(alibi, b, hk, g0, C, G) if C.ALIBI else None
    if slope is not None and C.GP == 1:
        slope = fly.full((C.BM,), 0.0, fly.fp32) + slope
    st = _Softmax(
        fly.full((C.BM,), FP32_LOWEST, fly.fp32),
        fly.zeros((C.BM,), fly.fp32),
        [fly.zeros((C.BM, cs), fly.fp32) for _, cs in chunks(C.DV)],
    )
    lo, full_lo, full_hi, hi = _kv_range(C, i0, sq, sk, off, wl, wr)
    if C.SPLITS > 1:
        lo, hi = _split_range(lo, hi, fly.program_id(2), C.SPLITS, BN)
    btrow = b

    def block(n0, masked):
        """One KV tile: ``masked`` True (every mask), False (none: the interior) or "full" (a
        block-sparse full block: no mask mod)."""
        j = n0 + fly.arange(0, BN)
        kmask = (j < sk) if masked else None
        pages = _kv_pages(block_table, btrow, k_off + n0, BN, C.PAGE, kmask)
        s = None
        for (c0, cs), qt in zip(chunks(C.D), qts):
            kt = _load_kv(k, bk, k_off + n0, hk, c0, cs, BN, C.D, C.PAGE, pages, kmask)
            d = fly.dot(qt, kt.T)
            s = d if s is None else s + d
        z, zc = _scores(s, C, scale, softcap, slope, i, j, off, b, h, mt)
        if masked:
            z = _mask_scores(
                z, C, i[:, None], j[None, :], sk, off, wl, wr, b, h[:, None], mt, masked is True
            )
        vts = [
            _load_kv(v, bk, k_off + n0, hk, c0, cs, BN, C.DV, C.PAGE, pages, kmask)
            for c0, cs in chunks(C.DV)
        ]
        _update(st, z, zc, vts, C)

    if C.SPARSE_KV:
        sp = mt[4]
        hq = hk * G + g0  # GP == 1 under block sparsity
        qb = i0 // C.SPARSE_Q
        _sparse_loop(block, sp[0], sp[1], b, hq, qb, C.SPARSE_KV, BN, True)
        if C.SPARSE_FULL:
            _sparse_loop(block, sp[2], sp[3], b, hq, qb, C.SPARSE_KV, BN, "full")
    elif C.mask_mod is not None:
        for n0 in fly.range(lo, hi, BN):
            block(n0, True)
    else:
        a = lo
        bnd = fly.maximum(a, fly.minimum(full_lo, hi))
        c = fly.maximum(bnd, fly.minimum(full_hi, hi))
        for n0 in fly.range(a, bnd, BN):
            block(n0, True)
        for n0 in fly.range(bnd, c, BN):
            block(n0, False)
        for n0 in fly.range(c, hi, BN):
            block(n0, True)

    m, l_sum = st.m, st.l
    if C.SINKS and C.SPLITS == 1:
        sink = _per_head(sinks, 0, hk, g0, C, G) * LOG2E
        m_f = fly.maximum(m, sink)
        alpha = fly.exp2(m - m_f)
        l_sum = l_sum * alpha + fly.exp2(sink - m_f)
        scale_o = alpha / l_sum
        m = m_f
    else:
        scale_o = fly.where(l_sum > 0, 1.0 / _nonzero(l_sum), 0.0)
    row0 = q_off + i0
    for (c0, cs), a in zip(chunks(C.DV), st.acc):
        out = a * scale_o[:, None]
        dst = o if C.SPLITS == 1 else o[fly.program_id(2)]
        _store_rows(dst, bq, row0, hk, g0, c0, cs, C, out, rmask, G)
    if C.LSE:
        empty = NEG_INF if C.SPLITS > 1 else float("inf")
        lse2 = fly.where(l_sum > 0, m + fly.log2(_nonzero(l_sum)), empty)
        val = lse2 if (C.LSE_LOG2 or C.SPLITS > 1) else lse2 * LN2
        dst = lse if C.SPLITS == 1 else lse[fly.program_id(2)]
        _store_lse(dst, bq, row0, hk, g0, C, val, rmask, G)


# -- split-KV combine ---------------------------------------------------------------------------------


@fly.kernel
def attn_combine_kernel(
    o_part, lse_part, o, lse, sinks, Sq, Hk, G,
    BM: fly.constexpr, DV: fly.constexpr, SPLITS: fly.constexpr, SINKS: fly.constexpr,
    LSE: fly.constexpr, LSE_LOG2: fly.constexpr,
):  # fmt: skip
    """Merge the ``SPLITS`` normalized partials of ``BM`` rows of one (batch, head) in a fixed
    order (deterministic): weights ``2^(lse_s - M)``, plus the sink's ``2^(sink - M)`` in the
    denominator. Grid ``(cdiv(Sq, BM), B * Hk * G)``."""
    pm = fly.program_id(0)
    pid = fly.program_id(1)
    b = pid // (Hk * G)
    hk = (pid % (Hk * G)) // G
    g = pid % G
    i0 = pm * BM
    rmask = i0 + fly.arange(0, BM) < Sq
    # run-time loops over the splits, in a fixed order: unrolled, the compiler issued every
    # split's loads up front (16 splits: 144 B of spills on sm90, 32 SGPR spills on gfx950 at
    # DV 256); each pass re-reads the split's row of LSEs (BM values)
    m = fly.full((BM,), NEG_INF, fly.fp32)
    for s in fly.range(0, SPLITS):
        m.set(fly.maximum(m, lse_part[s, b, hk, g, fly.ds(i0, BM)].load(rmask, NEG_INF)))
    if SINKS:
        sink = sinks[0, hk, g].load().to(fly.fp32) * LOG2E
        m.set(fly.maximum(m, sink))
    m_safe = fly.where(m == NEG_INF, 0.0, m)
    den = fly.zeros((BM,), fly.fp32)
    for s in fly.range(0, SPLITS):
        den += fly.exp2(lse_part[s, b, hk, g, fly.ds(i0, BM)].load(rmask, NEG_INF) - m_safe)
    if SINKS:
        den += fly.exp2(sink - m_safe)
    inv = fly.where(den > 0, 1.0 / _nonzero(den), 0.0)
    for c0, cs in chunks(DV):
        acc = fly.zeros((BM, cs), fly.fp32)
        for s in fly.range(0, SPLITS):
            w = fly.exp2(lse_part[s, b, hk, g, fly.ds(i0, BM)].load(rmask, NEG_INF) - m_safe)
            part = o_part[s, b, fly.ds(i0, BM), hk, g, fly.ds(c0, cs)].load(rmask[:, None])
            acc += part * w[:, None]
        o[b, fly.ds(i0, BM), hk, g, fly.ds(c0, cs)].store(acc * inv[:, None], rmask[:, None])
    if LSE:
        lse2 = fly.where(den > 0, m_safe + fly.log2(_nonzero(den)), float("inf"))
        lse[b, hk, g, fly.ds(i0, BM)].store(lse2 if LSE_LOG2 else lse2 * LN2, rmask)


# -- KV-cache append ------------------------------------------------------------------------------------


@fly.kernel
def kv_append_kernel(
    k_new, v_new, k_cache, v_cache, cache_seqlens, block_table, batch_idx,
    HB: fly.constexpr, D: fly.constexpr, DV: fly.constexpr, PAGE: fly.constexpr,
    BATCH_IDX: fly.constexpr,
):  # fmt: skip
    """Write new token ``t`` of batch ``b`` (all KV heads) at cache position
    ``cache_seqlens[b] + t``; grid ``(Snew, B)``."""
    t = fly.program_id(0)
    b = fly.program_id(1)
    pos = cache_seqlens[b].load() + t
    bk = batch_idx[b].load() if BATCH_IDX else b
    for src, dst, dd in ((k_new, k_cache, D), (v_new, v_cache, DV)):
        for c0, cs in chunks(dd):
            x = src[b, t, fly.ds(0, HB), fly.ds(c0, cs)].load()
            if PAGE == 0:
                dst[bk, pos, fly.ds(0, HB), fly.ds(c0, cs)].store(x)
            else:
                page = block_table[b, pos // PAGE].load()
                dst[page, pos % PAGE, fly.ds(0, HB), fly.ds(c0, cs)].store(x)


# -- backward --------------------------------------------------------------------------------------------


@fly.kernel
def attn_bwd_preprocess_kernel(
    o, do, lse, ld, cu_q, Sq, Hk, G,
    BM: fly.constexpr, DV: fly.constexpr, VARLEN: fly.constexpr, LSE_LOG2: fly.constexpr,
):  # fmt: skip
    """The backward's per-row terms, side by side in ``ld (B, Hk, G, 2, S)`` fp32: the LSE in
    base 2 and ``delta = rowsum(dO * O)``. One tensor for both keeps one buffer descriptor and
    one set of strides out of the dK/dV and dQ kernels' scalar registers (they spilled SGPRs on
    gfx950), and the base-2 conversion out of their loops. Grid ``(cdiv(max sq, BM), B * Hk * G)``."""
    pm = fly.program_id(0)
    pid = fly.program_id(1)
    b = pid // (Hk * G)
    hk = (pid % (Hk * G)) // G
    g = pid % G
    if VARLEN:
        q_off = cu_q[b].load()
        sq = cu_q[b + 1].load() - q_off
        bq = 0
    else:
        q_off, sq, bq = 0, Sq, b
    i0 = pm * BM
    rmask = i0 + fly.arange(0, BM) < sq
    acc = fly.zeros((BM,), fly.fp32)
    for c0, cs in chunks(DV):
        ot = o[bq, fly.ds(q_off + i0, BM), hk, g, fly.ds(c0, cs)].load(rmask[:, None])
        dot_ = do[bq, fly.ds(q_off + i0, BM), hk, g, fly.ds(c0, cs)].load(rmask[:, None])
        acc += fly.sum(ot.to(fly.fp32) * dot_.to(fly.fp32), 1)
    lrow = lse[bq, hk, g, fly.ds(q_off + i0, BM)].load(rmask).to(fly.fp32)
    ld[bq, hk, g, 0, fly.ds(q_off + i0, BM)].store(lrow if LSE_LOG2 else lrow * LOG2E, rmask)
    ld[bq, hk, g, 1, fly.ds(q_off + i0, BM)].store(acc, rmask)


@dataclass(frozen=True)
class Bwd:
    """Compile-time facts of the backward kernels (see ``Fwd``)."""

    BM: int
    BN: int
    D: int
    DV: int
    CAUSAL: bool = False
    HAS_WL: bool = False
    HAS_WR: bool = False
    SOFTCAP: bool = False
    ALIBI: bool = False
    VARLEN: bool = False
    LSE_LOG2: bool = False
    score_mod: Any = None
    mask_mod: Any = None
    SPARSE_Q: int = 0
    SPARSE_KV: int = 0
    SPARSE_FULL: bool = False

    # the forward's helpers read these
    GP = 1
    BATCH_IDX = False
    SEQUSED = False
    PAGE = 0

    @property
    def BMS(self) -> int:
        return self.BM


def _dscore(ds, z_in, C, softcap, b, h, i, j, mt):
    """Chain the gradient w.r.t. the final (natural) logit back to the scaled ``q . k``:
    through the score mod's gradient and softcap's ``1 - tanh^2`` (ALiBi adds a constant)."""
    _, z1, z2 = z_in
    if C.score_mod is not None:
        ds = C.score_mod.backward(z1, z2, ds, b, h, i, j, mt)
    if C.SOFTCAP:
        t = z1 * (1.0 / softcap)
        ds = ds * (1.0 - t * t)
    return ds


def _bwd_scores(s, C, scale, softcap, slope, i, j, off, b, h, mt):
    """Like ``_scores`` but also returns what the gradient chain needs: ``(z2 base-2 logits,
    (x, z1 softcapped, z2 modded))``; ``i``/``j``/``h``/``slope`` broadcast to ``s``."""
    x = s * scale
    z1 = fly.tanh(x * (1.0 / softcap)) * softcap if C.SOFTCAP else x
    z2 = C.score_mod.apply(z1, b, h, i, j, mt) if C.score_mod is not None else z1
    z = z2
    if C.ALIBI:
        z = z - slope * fly.abs(i + off - j).to(fly.fp32)
    return z * LOG2E, (x, z1, z2)


@fly.kernel
def attn_bwd_dkdv_kernel(
    q, k, v, do, ld, dk, dv, alibi, cu_q, cu_k, mt0, mt1, mt2, mt3,
    q_num, q_idx, fq_num, fq_idx,
    Sq, Sk, Hk, G, scale, wl, wr, softcap,
    C: fly.constexpr,
):  # fmt: skip
    """dK and dV of ``BN`` keys of one (batch, KV head): every query head of the group and
    every query block that sees the keys, in a fixed order (no atomics, deterministic).
    Grid ``(cdiv(max sk, BN), B * Hk)``; works in the transposed orientation (keys x queries).
    """
    mt = (mt0, mt1, mt2, mt3, (q_num, q_idx, fq_num, fq_idx))
    pn = fly.program_id(0)
    pid = fly.program_id(1)
    b = pid // Hk
    hk = pid % Hk
    bq, q_off, sq, bk, k_off, sk = _seq_info(b, Sq, Sk, cu_q, cu_k, None, None, C)
    n0 = pn * C.BN
    with fly.if_(n0 < sk):
        _dkdv_tile(
            q, k, v, do, ld, dk, dv, alibi, mt, b, hk, G, bq, q_off, sq, bk, k_off,
            sk, n0, scale, wl, wr, softcap, C,
        )  # fmt: skip


def _dkdv_tile(
    q, k, v, do, ld, dk, dv, alibi, mt, b, hk, G, bq, q_off, sq, bk, k_off, sk, n0,
    scale, wl, wr, softcap, C,
):  # fmt: skip
    BM, BN = C.BM, C.BN
    j = n0 + fly.arange(0, BN)
    kmask = j < sk
    kts = [
        _load_kv(k, bk, k_off + n0, hk, c0, cs, BN, C.D, 0, None, kmask) for c0, cs in chunks(C.D)
    ]
    vts = [
        _load_kv(v, bk, k_off + n0, hk, c0, cs, BN, C.DV, 0, None, kmask) for c0, cs in chunks(C.DV)
    ]
    dks = [fly.zeros((BN, cs), fly.fp32) for _, cs in chunks(C.D)]
    dvs = [fly.zeros((BN, cs), fly.fp32) for _, cs in chunks(C.DV)]
    off = sk - sq
    # the query rows that see keys [n0, n0 + BN): i + off - wl <= j <= i + off + wr
    lo = 0
    full_lo = 0
    if C.HAS_WR:
        lo = (fly.maximum(n0 - off - wr, 0) // BM) * BM
        full_lo = ((fly.maximum(n0 + (BN - 1) - off - wr, 0) + (BM - 1)) // BM) * BM
    hi = sq
    top = sq
    if C.HAS_WL:
        hi = fly.minimum(sq, fly.maximum(n0 + BN - off + wl, 0))
        top = fly.minimum(sq, fly.maximum(n0 - off + wl + 1, 0))
    full_hi = (top // BM) * BM
    full_hi = fly.where(n0 + BN <= sk, full_hi, 0)  # a partial key block is masked throughout

    def block(m0, masked, g, h, slope):
        i = m0 + fly.arange(0, BM)
        rm = (i < sq) if masked else None
        qts = [_load_q1(q, bq, q_off + m0, hk, g, c0, cs, BM, C.D, rm) for c0, cs in chunks(C.D)]
        dots = [
            _load_q1(do, bq, q_off + m0, hk, g, c0, cs, BM, C.DV, rm) for c0, cs in chunks(C.DV)
        ]
        lrow = _load_row(ld, bq, hk, g, 0, q_off + m0, BM, rm)
        drow = _load_row(ld, bq, hk, g, 1, q_off + m0, BM, rm)
        sT = None
        for kt, qt in zip(kts, qts):
            d_ = fly.dot(kt, qt.T)
            sT = d_ if sT is None else sT + d_
        z, zin = _bwd_scores(sT, C, scale, softcap, slope, i[None, :], j[:, None], off, b, h, mt)
        if masked:
            z = _mask_scores(
                z, C, i[None, :], j[:, None], sk, off, wl, wr, b, h, mt, masked is True, sq
            )
        pT = fly.exp2(z - lrow[None, :])
        for a, dt in zip(dvs, dots):
            a += fly.dot(pT.to(dt.dtype), dt)
        dpT = None
        for vt, dt in zip(vts, dots):
            d_ = fly.dot(vt, dt.T)
            dpT = d_ if dpT is None else dpT + d_
        dsT = pT * (dpT - drow[None, :])
        dsT = _dscore(dsT, zin, C, softcap, b, h, i[None, :], j[:, None], mt)
        for a, qt in zip(dks, qts):
            a += fly.dot(dsT.to(qt.dtype), qt)

    bnd = fly.maximum(lo, fly.minimum(full_lo, hi))
    c = fly.maximum(bnd, fly.minimum(full_hi, hi))
    if C.mask_mod is not None:
        bnd, c = hi, hi
    for g in fly.range(0, G):
        h = hk * G + g
        slope = alibi[b, hk, g].load().to(fly.fp32) if C.ALIBI else None
        if C.SPARSE_KV:
            # the transposed lists: the query blocks that see key block n0 // SPARSE_KV
            sp = mt[4]
            kb = n0 // C.SPARSE_KV

            def tile(m0, kind, g=g, h=h, slope=slope):
                block(m0, kind, g, h, slope)

            _sparse_loop(tile, sp[0], sp[1], b, h, kb, C.SPARSE_Q, BM, True)
            if C.SPARSE_FULL:
                _sparse_loop(tile, sp[2], sp[3], b, h, kb, C.SPARSE_Q, BM, "full")
        else:
            for m0 in fly.range(lo, bnd, BM):
                block(m0, True, g, h, slope)
            for m0 in fly.range(bnd, c, BM):
                block(m0, False, g, h, slope)
            for m0 in fly.range(c, hi, BM):
                block(m0, True, g, h, slope)

    for (c0, cs), a in zip(chunks(C.D), dks):
        dm = (c0 + fly.arange(0, cs) < C.D)[None, :] if c0 + cs > C.D else None
        dk[bk, fly.ds(k_off + n0, BN), hk, fly.ds(c0, cs)].store(
            a * scale, _and(kmask[:, None], dm), bounds_check=False
        )
    for (c0, cs), a in zip(chunks(C.DV), dvs):
        dm = (c0 + fly.arange(0, cs) < C.DV)[None, :] if c0 + cs > C.DV else None
        dv[bk, fly.ds(k_off + n0, BN), hk, fly.ds(c0, cs)].store(
            a, _and(kmask[:, None], dm), bounds_check=False
        )


def _load_q1(t, bq, row0, hk, g, c0, cs, BM, D, rmask):
    """``(BM, cs)`` rows of one head of a ``(B, S, Hk, G, D)`` tensor; interior blocks (no
    ``rmask``) load with no bounds check."""
    view = t[bq, fly.ds(row0, BM), hk, g, fly.ds(c0, cs)]
    dm = (c0 + fly.arange(0, cs) < D)[None, :] if c0 + cs > D else None
    # explicit masks only (rows past sq, the head dim's tail): every other index is in range by
    # construction, and the tensor sizes an automatic bounds check reads would stay live in
    # scalar registers across the loops
    return view.load(_and(None if rmask is None else rmask[:, None], dm), bounds_check=False)


def _load_row(t, bq, hk, g, which, row0, BM, rmask):
    return t[bq, hk, g, which, fly.ds(row0, BM)].load(rmask, bounds_check=False)


@fly.kernel
def attn_bwd_dq_kernel(
    q, k, v, do, ld, dq, alibi, cu_q, cu_k, mt0, mt1, mt2, mt3,
    kv_num, kv_idx, fkv_num, fkv_idx,
    Sq, Sk, Hk, G, scale, wl, wr, softcap,
    C: fly.constexpr,
):  # fmt: skip
    """dQ of ``BM`` query rows of one (batch, head): the forward's key range and block split.
    Grid ``(cdiv(max sq, BM), B * Hk * G)``."""
    mt = (mt0, mt1, mt2, mt3, (kv_num, kv_idx, fkv_num, fkv_idx))
    pm = fly.program_id(0)
    pid = fly.program_id(1)
    b = pid // (Hk * G)
    hk = (pid % (Hk * G)) // G
    g = pid % G
    bq, q_off, sq, bk, k_off, sk = _seq_info(b, Sq, Sk, cu_q, cu_k, None, None, C)
    i0 = pm * C.BM
    with fly.if_(i0 < sq):
        _dq_tile(
            q, k, v, do, ld, dq, alibi, mt, b, hk, g, G, bq, q_off, sq, bk, k_off, sk,
            i0, scale, wl, wr, softcap, C,
        )  # fmt: skip


def _dq_tile(
    q, k, v, do, ld, dq, alibi, mt, b, hk, g, G, bq, q_off, sq, bk, k_off, sk, i0,
    scale, wl, wr, softcap, C,
):  # fmt: skip
    BM, BN = C.BM, C.BN
    i = i0 + fly.arange(0, BM)
    rm = i < sq
    h = hk * G + g
    off = sk - sq
    qts = [_load_q1(q, bq, q_off + i0, hk, g, c0, cs, BM, C.D, rm) for c0, cs in chunks(C.D)]
    dots = [_load_q1(do, bq, q_off + i0, hk, g, c0, cs, BM, C.DV, rm) for c0, cs in chunks(C.DV)]
    lse2 = _load_row(ld, bq, hk, g, 0, q_off + i0, BM, rm)
    drow = _load_row(ld, bq, hk, g, 1, q_off + i0, BM, rm)
    slope = alibi[b, hk, g].load().to(fly.fp32) if C.ALIBI else None
    dqs = [fly.zeros((BM, cs), fly.fp32) for _, cs in chunks(C.D)]
    lo, full_lo, full_hi, hi = _kv_range(C, i0, sq, sk, off, wl, wr)

    def block(n0, masked):
        j = n0 + fly.arange(0, BN)
        kmask = (j < sk) if masked else None
        kts = [
            _load_kv(k, bk, k_off + n0, hk, c0, cs, BN, C.D, 0, None, kmask)
            for c0, cs in chunks(C.D)
        ]
        s = None
        for qt, kt in zip(qts, kts):
            d_ = fly.dot(qt, kt.T)
            s = d_ if s is None else s + d_
        z, zin = _bwd_scores(s, C, scale, softcap, slope, i[:, None], j[None, :], off, b, h, mt)
        if masked:
            z = _mask_scores(
                z, C, i[:, None], j[None, :], sk, off, wl, wr, b, h, mt, masked is True, sq
            )
        p = fly.exp2(z - lse2[:, None])
        dp = None
        for dt, (c0, cs) in zip(dots, chunks(C.DV)):
            vt = _load_kv(v, bk, k_off + n0, hk, c0, cs, BN, C.DV, 0, None, kmask)
            d_ = fly.dot(dt, vt.T)
            dp = d_ if dp is None else dp + d_
        ds = p * (dp - drow[:, None])
        ds = _dscore(ds, zin, C, softcap, b, h, i[:, None], j[None, :], mt)
        for a, kt in zip(dqs, kts):
            a += fly.dot(ds.to(kt.dtype), kt)

    bnd = fly.maximum(lo, fly.minimum(full_lo, hi))
    c = fly.maximum(bnd, fly.minimum(full_hi, hi))
    if C.mask_mod is not None:
        bnd, c = hi, hi
    if C.SPARSE_KV:
        sp = mt[4]
        qb = i0 // C.SPARSE_Q
        _sparse_loop(block, sp[0], sp[1], b, h, qb, C.SPARSE_KV, BN, True)
        if C.SPARSE_FULL:
            _sparse_loop(block, sp[2], sp[3], b, h, qb, C.SPARSE_KV, BN, "full")
    else:
        for n0 in fly.range(lo, bnd, BN):
            block(n0, True)
        for n0 in fly.range(bnd, c, BN):
            block(n0, False)
        for n0 in fly.range(c, hi, BN):
            block(n0, True)
    for (c0, cs), a in zip(chunks(C.D), dqs):
        dm = (c0 + fly.arange(0, cs) < C.D)[None, :] if c0 + cs > C.D else None
        dq[bq, fly.ds(q_off + i0, BM), hk, g, fly.ds(c0, cs)].store(
            a * scale, _and(rm[:, None], dm), bounds_check=False
        )


KERNELS = {
    "fwd": attn_fwd_kernel,
    "combine": attn_combine_kernel,
    "kv_append": kv_append_kernel,
    "bwd_preprocess": attn_bwd_preprocess_kernel,
    "bwd_dkdv": attn_bwd_dkdv_kernel,
    "bwd_dq": attn_bwd_dq_kernel,
}
