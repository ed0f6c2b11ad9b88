"""The attention backward kernels, deterministic without atomics: the preprocess (base-2 LSE and
``delta = rowsum(dO * O)``), dK/dV per key block over every query head of its group and every
query block in a fixed order, and dQ per query block."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flydsl_core as fly

from .._masks import and_masks as _and
from .common import (
    LOG2E,
    _kv_range,
    _kv_segments,
    _load_based,
    _load_kv,
    _mask_scores,
    _segments,
    _seq_info,
    _sparse_loop,
    chunks,
    softcap_r,
)


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
    NARROW: bool = True  # as Fwd.NARROW
    #: the loop's tiles (dK/dV: Q and dO rows; dQ: K and V keys) loaded with ``load_at`` from
    #: a scalar base kept in the offsets, as the prefill forward's K and V (``Fwd.BASED``,
    #: ``Fwd.FOLD_BASE`` False; the AMD tables, ``plan.plan_backward``; the launch drops it
    #: for strides above ``common.BASED_STRIDE_MAX``)
    BASED: bool = False
    #: under ``BASED``: the loop's second tensor (dO; V) takes the first's strides (Q's; K's),
    #: which the launch found equal, so that both loads share their offsets
    SAME_STRIDES: bool = False

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
    t, z1, z2 = z_in
    if C.score_mod is not None:
        ds = C.score_mod.backward(z1, z2, ds, b, h, i, j, mt)
    if C.SOFTCAP:
        ds = ds * (1.0 - t * t)
    return ds


def _bwd_scores(s, C, scale, softcap, slope, i, j, off, b, h, mt):
    """Like ``_scores`` but also returns what the gradient chain needs: ``(z base-2 logits,
    (t = softcap's tanh or None, z1 softcapped, z2 modded))``; ``i``/``j``/``h``/``slope``
    broadcast to ``s``. Multiplies by constants are folded where nothing comes between them
    (``s * (scale * log2 e)``, ``t * (c * log2 e)``)."""
    t = 1.0 - 2.0 * softcap_r(s, scale, softcap) if C.SOFTCAP else None
    if C.score_mod is None and not C.ALIBI:
        z = t * (softcap * LOG2E) if C.SOFTCAP else s * (scale * LOG2E)
        return z, (t, None, None)
    z1 = t * softcap if C.SOFTCAP else s * scale
    z2 = C.score_mod.apply(z1, b, h, i, j, mt) if C.score_mod is not None else z1
    z = z2
    if C.ALIBI:
        z = z - slope * fly.abs(i + off - j).to(fly.fp32)
    return z * LOG2E, (t, z1, z2)


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
    # keys past sk need no mask here: K and V load as zeros there and each key's dK / dV row
    # is its own (never stored); the query blocks split as the forward's key blocks, mirrored.
    # Rows past sq need none either where their scores are exactly 0 (Q loads as zeros; no
    # score mod or ALiBi bias, which could make p overflow): their dO and Q rows are zeros, so
    # p = 2^(0 - 0) adds 0 to dV and dK
    rows_end = sq if (C.score_mod is not None or C.ALIBI) else None

    def block(m0, kind, g, h, slope):
        i = m0 + fly.arange(0, BM)
        rm = (i < sq) if kind is not None else None
        qts = [
            _load_q1(q, bq, q_off + m0, hk, g, c0, cs, BM, C.D, rm, C.BASED)
            for c0, cs in chunks(C.D)
        ]
        dst = q.stride if C.SAME_STRIDES else None
        dots = [
            _load_q1(do, bq, q_off + m0, hk, g, c0, cs, BM, C.DV, rm, C.BASED, dst)
            for c0, cs in chunks(C.DV)
        ]
        lrow = _load_row(ld, bq, hk, g, 0, q_off + m0, BM, rm)
        drow = _load_row(ld, bq, hk, g, 1, q_off + m0, BM, rm)
        sT = None
        for kt, qt in zip(kts, qts):
            d_ = fly.dot(kt, qt.T)
            sT = d_ if sT is None else sT + d_
        z, zin = _bwd_scores(sT, C, scale, softcap, slope, i[None, :], j[:, None], off, b, h, mt)
        # the row's LSE comes off before the mask (exact: a masked -inf stays -inf), so that
        # the scale and the subtraction stay one FMA in the masked loops too
        z = z - lrow[None, :]
        if kind is not None:
            z = _mask_scores(
                z, C, i, j[:, None], sk, off, wl, wr, b, h, mt, kind, rows_end, n0, 0, False
            )
        pT = fly.exp2(z)
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

    # low query blocks cross the right (causal) bound, high ones the left window bound
    names = {"low": "right", "high": "left", "both": "both", None: None}
    # without a left window bound the high-end tiles test the right bound too (``_visible``),
    # so the tiles crossing "both" fold into them
    segs = _segments(C.HAS_WR, lo, full_lo, full_hi, hi, C.NARROW and C.HAS_WL, BM)
    segs = [(a, e, names[k]) for a, e, k in segs]
    if C.mask_mod is not None:
        segs = [(lo, hi, "both")]
    for g in fly.range(0, G):
        h = hk * G + g
        slope = alibi[b, hk, g].load().to(fly.fp32) if C.ALIBI else None
        if C.SPARSE_KV:
            # the transposed lists: the query blocks that see key block n0 // SPARSE_KV
            sp = mt[4]
            kb = n0 // C.SPARSE_KV

            def tile(m0, kind, g=g, h=h, slope=slope):
                block(m0, kind, g, h, slope)

            _sparse_loop(tile, sp[0], sp[1], b, h, kb, C.SPARSE_Q, BM, "both")
            if C.SPARSE_FULL:
                _sparse_loop(tile, sp[2], sp[3], b, h, kb, C.SPARSE_Q, BM, "full")
        else:
            for start, stop, kind in segs:
                for m0 in fly.range(start, stop, BM):
                    block(m0, kind, g, h, slope)

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


def _load_q1(t, bq, row0, hk, g, c0, cs, BM, D, rmask, based=False, st=None):
    """``(BM, cs)`` rows of one head of a ``(B, S, Hk, G, D)`` tensor; interior blocks (no
    ``rmask``) load with no bounds check. ``based``: with ``load_at`` from the scalar origin
    kept in the offsets (``Bwd.BASED``), with strides ``st`` (default ``t``'s)."""
    dm = (c0 + fly.arange(0, cs) < D)[None, :] if c0 + cs > D else None
    # explicit masks only (rows past sq, the head dim's tail): every other index is in range by
    # construction, and the tensor sizes an automatic bounds check reads would stay live in
    # scalar registers across the loops
    m = _and(None if rmask is None else rmask[:, None], dm)
    if based:
        rows, cols = fly.arange(0, BM)[:, None], fly.arange(0, cs)[None, :]
        return _load_based(t, (bq, row0, hk, g, c0), rows, cols, 1, m, st, fold=False)
    view = t[bq, fly.ds(row0, BM), hk, g, fly.ds(c0, cs)]
    return view.load(m, bounds_check=False)


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

    vst = k.stride if C.SAME_STRIDES else None

    def block(n0, kind):
        j = n0 + fly.arange(0, BN)
        kmask = (j < sk) if kind not in (None, "left") else None
        kts = [
            _load_kv(k, bk, k_off + n0, hk, c0, cs, BN, C.D, 0, None, kmask, C.BASED, fold=False)
            for c0, cs in chunks(C.D)
        ]
        s = None
        for qt, kt in zip(qts, kts):
            d_ = fly.dot(qt, kt.T)
            s = d_ if s is None else s + d_
        z, zin = _bwd_scores(s, C, scale, softcap, slope, i[:, None], j[None, :], off, b, h, mt)
        z = z - lse2[:, None]  # before the mask, as in dK/dV
        if kind is not None:
            # rows past sq: never stored, and each dQ row is its own; keys past sk keep their
            # mask (a real row's p there, 2^-lse, may overflow, and inf x the zero K is NaN)
            z = _mask_scores(z, C, i, j[None, :], sk, off, wl, wr, b, h, mt, kind, n0=n0)
        p = fly.exp2(z)
        dp = None
        for dt, (c0, cs) in zip(dots, chunks(C.DV)):
            vt = _load_kv(
                v, bk, k_off + n0, hk, c0, cs, BN, C.DV, 0, None, kmask, C.BASED, vst, fold=False
            )
            d_ = fly.dot(dt, vt.T)
            dp = d_ if dp is None else dp + d_
        ds = p * (dp - drow[:, None])
        ds = _dscore(ds, zin, C, softcap, b, h, i[:, None], j[None, :], mt)
        for a, kt in zip(dqs, kts):
            a += fly.dot(ds.to(kt.dtype), kt)

    if C.SPARSE_KV:
        sp = mt[4]
        qb = i0 // C.SPARSE_Q
        _sparse_loop(block, sp[0], sp[1], b, h, qb, C.SPARSE_KV, BN, "both")
        if C.SPARSE_FULL:
            _sparse_loop(block, sp[2], sp[3], b, h, qb, C.SPARSE_KV, BN, "full")
    elif C.mask_mod is not None:
        for n0 in fly.range(lo, hi, BN):
            block(n0, "both")
    else:
        for start, stop, kind in _kv_segments(C, lo, full_lo, full_hi, hi):
            for n0 in fly.range(start, stop, BN):
                block(n0, kind)
    for (c0, cs), a in zip(chunks(C.D), dqs):
        dm = (c0 + fly.arange(0, cs) < C.D)[None, :] if c0 + cs > C.D else None
        dq[bq, fly.ds(q_off + i0, BM), hk, g, fly.ds(c0, cs)].store(
            a * scale, _and(rm[:, None], dm), bounds_check=False
        )
