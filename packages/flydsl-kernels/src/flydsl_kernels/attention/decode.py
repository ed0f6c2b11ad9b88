"""Decode's helper kernels: the split-KV combine (a fixed-order merge of the forward's
normalized partials) and the KV-cache append."""

from __future__ import annotations

import flydsl_core as fly

from .common import LN2, LOG2E, NEG_INF, _nonzero, chunks


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
