"""Trace-time helpers shared by the attention kernels (``forward``, ``decode``, ``backward``):
head-dim chunks, the tile loads and stores, scores and masks, key ranges, sequence bounds.

The conventions (layouts, bottom-right aligned masks, base-2 softmax) are in ``kernels``.
"""

from __future__ import annotations

import flydsl_core as fly

from .._masks import and_masks as _and

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
#: the running max starts at the lowest finite fp32, not -inf: ``exp2(s - m)`` and the rescale
#: factor stay NaN-free for rows with no visible key yet, with no per-row select
FP32_LOWEST = -3.4028234663852886e38
NEG_INF = float("-inf")
#: the lazy rescale's threshold (base 2): probabilities stay below 2^8 = 256 between rescales
RESCALE_TAU = 8.0


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


def _load_q_lanes(q, bq, row0, hk, g0, c0, cs, C, nrows):
    """``_load_q``'s ``(BM, cs)`` tile (``GP == 1``; the rows from ``nrows`` on masked), loaded
    in the lane order of the ``C.KROWS`` MFMA's A operand with ``C.QLANES`` head dims per lane
    and ``C.QWARPS`` warps along the rows: with ``ng = 64 / KROWS`` lane groups, as ``(BM /
    (QWARPS KROWS), cs / (ng QLANES), QWARPS, ng, KROWS, QLANES)`` (row block, head-dim block,
    warp, lane group, row, head dim) permuted back. The load's coalesced layout (``QLANES``
    contiguous head dims per lane, lanes along the rows, then the groups, then the warps) is
    then the operand's: the plain load took a round trip through LDS (its writes, a barrier,
    its reads and their wait, which the first KV loop's barrier waited on again)."""
    kw, nk, nw = C.QLANES, C.KROWS, C.QWARPS
    ng = 64 // nk
    kb = ng * kw
    d = (
        c0
        + fly.arange(0, cs // kb)[None, :, None, None, None, None] * kb
        + fly.arange(0, ng)[None, None, None, :, None, None] * kw
        + fly.arange(0, kw)[None, None, None, None, None, :]
    )
    r = (
        fly.arange(0, C.BM // (nw * nk))[:, None, None, None, None, None] * (nw * nk)
        + fly.arange(0, nw)[None, None, :, None, None, None] * nk
        + fly.arange(0, nk)[None, None, None, None, :, None]
    )
    m = r < nrows
    if c0 + cs > C.D:
        m = m & (d < C.D)
    x = q.gather(bq, row0 + r, hk, g0, d).load(m, bounds_check=False)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(C.BM, cs)


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


def _kv_pages(bt, btrow, n0, BN, PAGE, kmask, klast=None):
    """The page ids of keys ``n0 + [0, BN)`` (a scalar when a page holds the tile, else one per
    ``PAGE`` rows), loaded once per KV tile for both K and V; None for a dense cache. With
    ``klast`` (the sequence's last key, on a masked tile) the pages past it are its page
    (``Fwd.VBLK``: rows past the last key read that key's row, ``_load_v_blocks``)."""
    if PAGE == 0:
        return None
    if PAGE >= BN:
        # the row's start apart from the page index (load_at): LLVM computes the row's
        # address before the KV loop and reads the entry at the page index's byte offset
        return bt.load_at(btrow * bt.stride[0], (n0 // PAGE) * bt.stride[1])
    npg = BN // PAGE
    pidx = n0 // PAGE + fly.arange(0, npg)
    if klast is not None and kmask is not None:
        return bt[btrow, fly.minimum(pidx, klast // PAGE)].load(bounds_check=False)
    pm = None if kmask is None else fly.max(kmask.reshape(npg, PAGE).to(fly.int32), 1) > 0
    return bt[btrow, pidx].load(pm, bounds_check=False)


#: the row and head-dim strides (elements) a ``Fwd.BASED`` load takes: the per-element offsets
#: are built from strides clamped to it (the identity for the tensors the plan lets through),
#: so that Triton can prove them below 2 GiB in bytes and keep AMD buffer loads
BASED_STRIDE_MAX = 1 << 19


def _clamped(s):
    """A stride clamped to ``[0, BASED_STRIDE_MAX]``: the same value where the plan checked
    the tensor, and a range Triton's analysis sees (a power-of-two bound keeps the stride's
    divisibility, so 128-bit loads stay)."""
    if isinstance(s, int):
        return s
    return fly.minimum(fly.maximum(s, 0), BASED_STRIDE_MAX)


def _load_based(t, origin, rows, cols, row_stride_dim, mask, st=None, fold=True):
    """``t``'s elements at ``origin`` (a scalar index per dimension) plus ``rows`` along
    dimension ``row_stride_dim`` and ``cols`` along the last (index tiles broadcast to the
    tile's shape), loaded with ``load_at``: the origin is the scalar base, the rest
    per-element offsets from clamped strides (``Fwd.BASED``). ``st``: the strides to take
    (another tensor's where they are equal: ``Fwd.VK_STRIDES``), default ``t``'s. ``fold``:
    ``load_at``'s ``fold_base`` (``Fwd.FOLD_BASE``)."""
    st = t.stride if st is None else st
    base = 0
    for d, i in enumerate(origin):
        base = base + i * st[d]
    offs = rows * _clamped(st[row_stride_dim]) + cols * _clamped(st[t.ndim - 1])
    return t.load_at(base, offs, mask, fold_base=fold)


#: the largest page offset (``(pages - 1) * stride(0)``, elements) of a V cache that
#: ``Fwd.VBLK`` loads: its per-element page offsets are clamped to it (the identity for the
#: caches the plan lets through), so that Triton can bound them and keep buffer loads. With
#: the in-page offsets (fewer than 128 rows and 256 head dims at strides of at most
#: ``BASED_STRIDE_MAX``: below 2^28) every offset stays below 2^30 elements, 2 GiB of 16-bit
#: values
PAGE_OFFSET_MAX = (1 << 30) - (1 << 28)


def vblk_ok(vblk: int, page: int, bn: int, dv: int) -> bool:
    """Whether a forward tile of ``bn`` keys loads V (``dv`` wide, pages of ``page`` keys) in
    ``vblk``-wide head-dim blocks (``_load_v_blocks``): pages smaller than the tile, one
    power-of-two V chunk. The plan asks before it builds ``Fwd``; the kernel asks of ``C``."""
    return (
        vblk > 0
        and 0 < page < bn
        and bn % page == 0
        and dv % vblk == 0
        and (chunks(dv) == ((0, dv),))
    )


def _load_v_blocks(t, n0, hk, C, pages, klast, st):
    """V keys ``n0 + [0, BN)`` of a paged cache (pages of ``PAGE < BN`` keys, ``pages`` from
    ``_kv_pages``) as ``(DV / VBLK, BN, VBLK)`` head-dim blocks, for a batched P @ V.

    Why blocks: the plain ``(BN, DV)`` load puts 16 lanes along a row's head dims, so each of
    a lane's loads is another row (another page, another multiple of the runtime row stride):
    one address add per load. A ``VBLK = 32`` block puts 4 lanes along the head dims and 16
    along a page's rows: a lane's loads are its row in each page (one add per page) and the
    head-dim blocks, whose offsets (added last, so that LLVM sees the constants) become the
    buffer loads' immediate offsets. The load's layout goes to LDS for the transposed reads
    of the dot operand as the plain tile's does (a reshape or permute after the load made
    Triton shuffle it in registers instead: 128 ``v_perm`` per tile). Offsets are relative to
    the head's scalar base (``load_at``), from clamped strides and page offsets
    (``_clamped``, ``PAGE_OFFSET_MAX``: the plan checks the tensor) so that they stay 32-bit
    buffer offsets.

    No mask: with ``klast`` (a masked tile) rows past the sequence's last key read that key's
    row (and ``pages`` are clamped to its page), finite data that P's zeros drop, as every
    key below the sequence's end is read whatever the attention mask. ``st``: V's strides
    (or K's where they are equal: ``Fwd.VK_STRIDES``)."""
    BN, PAGE, W = C.BN, C.PAGE, C.VBLK
    npg = BN // PAGE
    prow = fly.broadcast_to(pages[:, None], (npg, PAGE)).reshape(BN)
    if klast is None:
        r = fly.arange(0, BN) % PAGE
    else:
        r = fly.minimum(n0 + fly.arange(0, BN), klast) % PAGE
    s3 = _clamped(st[3])
    inner = r[None, :, None] * _clamped(st[1]) + fly.arange(0, W)[None, None, :] * s3
    pp = fly.minimum(fly.maximum(prow * st[0], 0), PAGE_OFFSET_MAX)[None, :, None]
    blk = fly.arange(0, C.DV // W)[:, None, None] * (W * s3)
    return t.load_at(hk * st[2], (pp + inner) + blk)


def based_ok(C) -> bool:
    """Whether a forward tile loads K and V with ``load_at`` (``Fwd.BASED``): one page per
    tile, or per key block of a folded tile (``Fwd.FOLD``), or a dense cache."""
    return C.BASED and (C.PAGE == 0 or C.PAGE >= C.BN // C.FOLD)


def _load_kv(
    t, bk, n0, hk, c0, cs, BN, D, PAGE, pages, kmask, based=False, st=None, fold=True, k0=0
):
    """``(BN, cs)`` keys ``n0 + [0, BN)`` of ``t`` (dense ``(B, S, Hk, D)``, or paged with the
    tile's ``pages`` from ``_kv_pages``).

    No bounds check: ``kmask`` (keys, or None in the interior) and the head-dim mask (only
    where the chunk runs past ``D``) are the whole mask. ``k0`` (a constant; one page per
    tile): the keys start ``k0`` past ``n0``, in ``n0``'s page (``Fwd.FOLD``'s key blocks:
    the block's offset a constant of the per-element offsets, not another page offset)."""
    dm = None
    if c0 + cs > D:
        dm = (c0 + fly.arange(0, cs)) < D
    if based:
        m = _and(None if kmask is None else kmask[:, None], None if dm is None else dm[None, :])
        origin = (bk, n0, hk, c0) if PAGE == 0 else (pages, n0 % PAGE, hk, c0)
        r = fly.arange(0, BN)[:, None] + k0
        return _load_based(t, origin, r, fly.arange(0, cs)[None, :], 1, m, st, fold)
    if PAGE == 0 or PAGE >= BN:
        if PAGE == 0:
            view = t[bk, fly.ds(n0 + k0, BN), hk, fly.ds(c0, cs)]
        else:
            view = t[pages, fly.ds(n0 % PAGE + k0, BN), hk, fly.ds(c0, cs)]
        m = _and(None if kmask is None else kmask[:, None], None if dm is None else dm[None, :])
        return view.load(m, bounds_check=False)
    # pages smaller than the tile: each row from its page (a 2-D gather, whose layout is the
    # dense tile's: a 3-D (pages, rows, dims) load reshaped to 2-D cost gfx950 64 v_perm and
    # 32 LDS round trips per V tile of 2 pages)
    npg = BN // PAGE
    prow = fly.broadcast_to(pages[:, None], (npg, PAGE)).reshape(BN)
    r = fly.arange(0, BN) % PAGE
    view = t.gather(prow[:, None], r[:, None], hk, (c0 + fly.arange(0, cs))[None, :])
    m = _and(None if kmask is None else kmask[:, None], None if dm is None else dm[None, :])
    return view.load(m, bounds_check=False)


def _load_kT(t, bk, n0, hk, c0, cs, BN, D, based=False, fold=True):
    """``_load_kv``'s ``(BN, cs)`` K tile of a dense ``(B, S, Hk, D)`` tensor, transposed:
    ``(cs, BN)``, head dims along rows (each lane's 128-bit load still runs along them), keys
    ``n0 + [0, BN)`` all in range (an interior tile: no key mask); only head dims past ``D``
    are masked. ``based`` / ``fold``: as ``_load_kv``'s (``Fwd.BASED``, ``Fwd.FOLD_BASE``)."""
    cols = c0 + fly.arange(0, cs)
    rows = n0 + fly.arange(0, BN)
    m = (cols < D)[:, None] if c0 + cs > D else None
    if based:
        keys = fly.arange(0, BN)[None, :]
        return _load_based(t, (bk, n0, hk, c0), keys, fly.arange(0, cs)[:, None], 1, m, None, fold)
    return t.gather(bk, rows[None, :], hk, cols[:, None]).load(m, bounds_check=False)


def _load_k_lanes(t, bk, n0, hk, c0, cs, BN, PAGE, pages, kmask, kw, nk=16, based=False, k0=0):
    """``_load_kv``'s ``(BN, cs)`` K tile, loaded in the lane order of a one-warp ``nk x nk``
    MFMA's B operand with ``kw`` (its k width) head dims per lane, so that ``q @ k.T`` takes K
    as loaded. With ``ng = 64 / nk`` lane groups, loaded as ``(BN / nk, cs / (ng kw), ng, nk,
    kw)`` (key block, head-dim block, lane group, key, head dim) and permuted back: the load's
    coalesced layout (``kw`` contiguous head dims per lane, lanes along the ``nk`` keys, then
    the groups) is then the operand's, where the plain ``(BN, cs)`` load put 8 lanes along the
    head dim and Triton moved every element across lanes (gfx950 decode d64: 32
    ``ds_bpermute`` and 64 ``v_cndmask`` per KV tile) or through LDS (d128: 8 writes, 8 reads,
    their waits). A key block never spans pages (``k_lanes_fit``). ``k0``: as ``_load_kv``'s."""
    ng = 64 // nk
    kb = ng * kw
    nb = BN // nk
    d = (
        c0
        + fly.arange(0, cs // kb)[None, :, None, None, None] * kb
        + fly.arange(0, ng)[None, None, :, None, None] * kw
        + fly.arange(0, kw)[None, None, None, None, :]
    )
    key = fly.arange(0, nk)[None, None, None, :, None] + k0
    m = None if kmask is None else kmask.reshape(nb, nk)[:, None, None, :, None]
    if based:
        key = key + fly.arange(0, nb)[:, None, None, None, None] * nk
        origin = (bk, n0, hk, c0) if PAGE == 0 else (pages, n0 % PAGE, hk, c0)
        x = _load_based(t, origin, key, d - c0, 1, m)
        return x.permute(0, 3, 1, 2, 4).reshape(BN, cs)
    if PAGE == 0 or PAGE >= BN:
        key = key + fly.arange(0, nb)[:, None, None, None, None] * nk
        if PAGE == 0:
            view = t.gather(bk, n0 + key, hk, d)
        else:
            view = t.gather(pages, n0 % PAGE + key, hk, d)
    else:  # each key block lies in one of the tile's pages
        per = PAGE // nk
        blk = fly.broadcast_to(pages[:, None], (BN // PAGE, per)).reshape(nb)
        key = key + ((fly.arange(0, nb) % per) * nk)[:, None, None, None, None]
        view = t.gather(blk[:, None, None, None, None], key, hk, d)
    x = view.load(m, bounds_check=False)
    return x.permute(0, 3, 1, 2, 4).reshape(BN, cs)


def k_lanes_fit(C, cs: int) -> bool:
    """Whether ``_load_k_lanes`` applies to a K chunk of ``cs`` head dims (``C.KLANES`` set;
    ``C.KROWS`` the MFMA's rows): whole lane-group blocks of head dims and key blocks, and
    pages (if any) of whole key blocks."""
    kw, nk = C.KLANES, C.KROWS
    return kw > 0 and cs % (64 // nk * kw) == 0 and C.BN % nk == 0 and C.PAGE % nk == 0


def _scores(s, C, scale, softcap, slope, i, j, off, b, h, mt):
    """Raw ``q . k`` (fp32) -> ``(z, zc)``: base-2 logits are ``z * zc`` (``zc`` a positive
    scalar) or ``z`` itself (``zc`` None); scale, softcap, score mod, ALiBi applied, no masks.

    Where nothing follows the last multiply, it stays out of ``z``: the softmax takes the max
    of ``z`` and folds ``zc`` into ``exp2(z * zc - m)``, one fma per score instead of a multiply
    and a subtract (rounding is monotonic, so ``max(z) * zc == max(z * zc)`` for ``zc > 0``).
    That is the scale alone (``zc = scale * log2(e)``, only where ``scale > 0``:
    ``C.FOLD_SCALE``; at zero or below the masks' ``-inf`` times the scale is NaN or ``+inf``
    and the max of the raw scores is not the max of the logits), or softcap's ``-r``
    (``softcap_r``; ``zc = 2c log2(e)``, positive whatever the scale's sign): its logits less
    the constant ``c log2(e)``, which ``softcap_shift`` gives back to the LSE."""
    if C.FOLD_SCALE and not C.SOFTCAP and C.score_mod is None and not C.ALIBI:
        return s, scale * LOG2E
    if C.SOFTCAP:
        r = softcap_r(s, scale, softcap)
        if C.score_mod is None and not C.ALIBI:
            # c tanh(y) = c - 2c r: the constant c is the same for every score and cancels in
            # the softmax (``softcap_shift`` puts it back into the LSE), so the logit is -r
            # scaled by 2c log2(e), folded into the softmax's fma
            return -r, 2.0 * softcap * LOG2E
        z = (1.0 - 2.0 * r) * softcap
    else:
        z = s * scale
    if C.score_mod is not None:
        z = C.score_mod.apply(z, b, h[:, None], i[:, None], j[None, :], mt)
    if C.ALIBI:
        z = z - slope[:, None] * fly.abs(i[:, None] + off - j[None, :]).to(fly.fp32)
    return z * LOG2E, None


def softcap_r(s, scale, softcap):
    """``r = 1 / (1 + e^(2y))``, ``y = s * scale / c``, so that softcap's ``tanh(y) = 1 - 2r``:
    an exp2, an add and the hardware reciprocal (``fly.reciprocal``) per score instead of
    ``fly.tanh``'s formula (about 16 instructions on gfx950), the same in the forward and the
    backward. Accurate to ``ulp(1)`` absolutely, not relatively, near ``y = 0``: all a logit
    ``c tanh(y)`` needs (its error, ``2c ulp(r)``, moves a probability by under 1e-5 for
    ``c <= 50``). ``y -> +inf`` gives ``r = 0`` (tanh 1), ``-inf`` gives 1, NaN stays NaN."""
    return fly.reciprocal(1.0 + fly.exp2(s * (2.0 * LOG2E * scale / softcap)))


def softcap_shift(C, softcap):
    """What ``_scores`` left out of the base-2 logits and the LSE must get back: ``c log2(e)``
    where it returns softcap's ``-r`` form, else 0."""
    if C.SOFTCAP and C.score_mod is None and not C.ALIBI:
        return softcap * LOG2E
    return 0.0


INT32_MIN = -2147483648


def _visible(
    C, i, n0, BN, sk, off, wl, wr, sq, kax, left=True, right=True, sk_bound=True, lane_bits=0
):
    """The bool tile "key ``n0 + c`` is visible from query ``i``" for ``c < BN``, keys along
    axis ``kax`` (1: a ``(queries, keys)`` tile; 0: the backward's transposed one). ``left`` /
    ``right``: which bounds to test (``_kv_segments`` knows which a tile can cross); the right
    one includes the keys past ``sk`` (unless ``sk_bound`` is False) and the rows past ``sq``
    (where ``sq`` is given). None: every key is visible (no bound to test).

    The bounds are folded per query first (``hi = min(sk - 1, i + off + wr)``, ``-1`` for rows
    past ``sq``; ``lo = i + off - wl``) and moved to the tile's key offsets, so each element
    costs one compare of a constant key offset against its query's bound and the select: the
    earlier sign-bit blend of per-element differences cost about seven instructions per
    element on gfx950. Bounds are exact in int32 for sequences and windows below 2^30.

    ``lane_bits``: the bits of a key offset that the lane holding it decides in the score tile's
    register layout (``configs.key_lane_bits``). A one-sided test ``c <= hi`` is then written
    ``(c & ~lane_bits) <= hi - (c & lane_bits)``: the left side is a per-element constant (an
    inline operand of the compare) and the right side one value per query and lane, instead of a
    key-offset register per element held across the loop (gfx950 gpt-oss forward: 200 -> 170
    VGPRs, 30 key-offset registers). The same test for any ``lane_bits``: only the registers
    depend on the layout matching."""
    c = fly.arange(0, BN)
    cx = c[None, :] if kax == 1 else c[:, None]
    cl = None
    if lane_bits:
        cl = cx & lane_bits

    def q(v):  # a per-query value, broadcast along the keys
        return v[:, None] if kax == 1 else v[None, :]

    hi = (sk - 1 - n0) if sk_bound else None
    per_query = False
    if C.HAS_WR:
        hi = i + (off + wr - n0) if hi is None else fly.minimum(i + (off + wr - n0), hi)
        per_query = True
    if sq is not None:  # the backward's rows past the sequence (varlen: the next one's) see nothing
        hi = fly.where(i < sq, BN - 1 if hi is None else hi, -1)  # BN - 1: the whole tile
        per_query = True
    left = left and C.HAS_WL
    if not left:
        if hi is None:
            return None
        if cl is not None and C.HAS_WR and not sk_bound and sq is None:
            # hi is i + (off + wr - n0): the lane's part (i - cl), loop-invariant, apart from
            # the trip's scalar (one add per trip, not two: gfx950 gpt-oss 263 -> 262)
            return (cx & ~lane_bits) <= (q(i) - cl) + (off + wr - n0)
        hi = q(hi) if per_query else hi
        return cx <= hi if cl is None else (cx & ~lane_bits) <= hi - cl
    lo = i + (off - wl - n0)
    if not right or hi is None:
        if cl is None:
            return cx >= q(lo)
        return (cx & ~lane_bits) >= (q(i) - cl) + (off - wl - n0)  # as above
    # lo <= c <= hi as one unsigned test, (c - lo) <u (hi - lo + 1), written signed: flipping
    # the sign bit of both sides (c - (lo ^ MIN) <s count ^ MIN). Two compares and an and per
    # element kept two 64-bit lane masks per element live and spilled SGPRs on gfx950
    count = fly.maximum(hi - lo + 1, 0)
    return (cx - q(lo ^ INT32_MIN)) < q(count ^ INT32_MIN)


def _mask_scores(
    z,
    C,
    i,
    j,
    sk,
    off,
    wl,
    wr,
    b,
    h,
    mt,
    kind="both",
    sq=None,
    n0=None,
    kax=1,
    sk_bound=True,
    lane_bits=0,
):
    """``z`` with ``-inf`` where a key is not visible: queries ``i`` (1-D) and the tile's keys
    ``n0 + [0, BN)`` along axis ``kax`` of ``z``; ``kind`` is the tile's ``_kv_segments`` kind
    (which bounds it can cross; ``"full"``: a block-sparse full block, every bound but no mask
    mod). ``j`` (the keys, broadcast against ``i``) and ``h`` only feed the mask mod, a bool
    tile and one more select. ``sq`` (the backward): rows past it see nothing; ``sk_bound``
    False: keys past ``sk`` are not masked (a backward whose padded rows' results are never
    stored, ``backward.py`` says where; a forward tile below ``sk``). ``lane_bits``:
    ``_visible``'s (one-sided tests only)."""
    ib = i[:, None] if kax == 1 else i[None, :]
    left = kind in ("both", "left", "full")
    right = kind in ("both", "right", "full")
    if kax == 0 and C.HAS_WL and left and right:
        z = _mask_bits(z, C, ib, j, sk if sk_bound else None, off, wl, wr, sq)
    else:
        vis = _visible(
            C, i, n0, z.shape[kax], sk, off, wl, wr, sq, kax, left, right, sk_bound, lane_bits
        )
        if vis is not None:
            z = fly.where(vis, z, NEG_INF)
    if C.mask_mod is not None and kind != "full":
        z = fly.where(C.mask_mod.apply(b, h, ib, j, mt), z, NEG_INF)
    return z


NEG_INF_BITS = -8388608  # 0xFF800000, -inf's bits as an int32


def _mask_bits(z, C, i, j, sk, off, wl, wr, sq):
    """``_visible``'s test as sign bits of per-element differences (``x >> 31`` is -1 where
    ``x < 0``), or-ed and blended into ``z``'s bits: what the backward's transposed tile takes
    with a window on both sides, where a lane's elements span several queries and the
    per-query bounds of ``_visible`` were recomputed per element (gfx950, gpt-oss dK/dV: 451
    against 394 masked-loop instructions)."""
    inv = (j - i - (off - wl)) >> 31
    if sk is not None:
        inv = inv | ((sk - 1 - j) >> 31)
    if sq is not None:
        inv = inv | ((sq - 1 - i) >> 31)
    if C.HAS_WR:
        inv = inv | ((i + (off + wr) - j) >> 31)
    zb = fly.bitcast(z, fly.int32)
    return fly.bitcast((zb & ~inv) | (inv & NEG_INF_BITS), fly.fp32)


def _sparse_loop(block, num, idx, b, h, blk, BLOCK, T, kind):
    """Block sparsity (torch's BlockMask): the tiles of the ``num[b, h, blk]`` blocks listed in
    ``idx[b, h, blk, :]`` (block size ``BLOCK``, tiles of ``T`` keys or queries), in list order."""
    n = num[b, h, blk].load()
    for t in fly.range(0, n):
        kb = idx[b, h, blk, t].load()
        for u in fly.static_range(BLOCK // T):
            block(kb * BLOCK + u * T, kind)


def _kv_range(C, i0, sq, sk, off, wl, wr):
    """``(lo, full_lo, full_hi, hi)`` key bounds of a row tile ``[i0, i0 + BMS)``: its keys are
    ``[lo, hi)``; from ``full_lo`` on, every row's left window bound is met; below
    ``full_hi``, every row's right bound and ``sk`` (``lo``, ``full_lo``, ``full_hi`` are
    multiples of BN)."""
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


def _segments(low, lo, full_lo, full_hi, hi, narrow=True, tile=None):
    """A tile loop over ``[lo, hi)`` as ``[(start, stop, kind)]`` (tiles from ``start``):
    ``"low"`` tiles can cross only the bound at the low end (below ``full_lo``), None tiles no
    bound, ``"both"`` tiles both (only where the band is narrower than the tile), ``"high"``
    tiles only the bound at the high end (from ``full_hi`` on). ``low``: whether the low-end
    bound exists (without it, ``full_lo`` is ``lo`` and the "low" and "both" loops are not
    traced); ``narrow`` False: the plan proved the "both" loop empty (``plan.narrow_band``),
    so it is not traced either.

    ``tile``: the loop step (``lo``, ``full_lo``, ``full_hi`` are multiples of it). ``hi`` is
    rounded up to a multiple first: the tiles starting below it are the same, and every
    segment bound is then a visible multiple of the tile (a max / min of multiples), so the
    compiler knows each trip's start is aligned: the dK/dV kernel's per-query row loads (LSE,
    delta) were 32 scalar loads per trip under gpt-oss's window, not 4 vector ones."""
    if tile is not None:
        hi = ((hi + (tile - 1)) // tile) * tile
    if not low:
        c = fly.maximum(lo, fly.minimum(full_hi, hi))
        return [(lo, c, None), (c, hi, "high")]
    b = fly.maximum(lo, fly.minimum(fly.minimum(full_lo, full_hi), hi))
    c = fly.maximum(b, fly.minimum(full_hi, hi))
    if not narrow:
        return [(lo, b, "low"), (b, c, None), (c, hi, "high")]
    d = fly.maximum(c, fly.minimum(full_lo, hi))
    return [(lo, b, "low"), (b, c, None), (c, d, "both"), (d, hi, "high")]


def _kv_segments(C, lo, full_lo, full_hi, hi):
    """A query tile's KV loop (``_kv_range``'s bounds; ``lo`` / ``hi`` may be a split's share)
    as ``_segments`` with the forward's kinds: ``"left"`` tiles cross only the left window
    bound (and lie below ``sk``: no key mask), None tiles nothing (no mask, no bounds check),
    ``"both"``, ``"right"`` tiles the right bound and the sequence's end. With a left bound the
    interior exists wherever the window is wider than the tile (``configs.band_config``)."""
    names = {"low": "left", "high": "right", "both": "both", None: None}
    segs = _segments(C.HAS_WL, lo, full_lo, full_hi, hi, C.NARROW, C.BN)
    return [(a, b, names[k]) for a, b, k in segs]


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
