"""Attention kernels in FlyDSL: forward (prefill, varlen, paged decode, split-KV), the split-KV
combine, the KV-cache append, and the backward (preprocess, dK/dV, dQ).

Modules: ``forward`` (the forward kernel and its online softmax), ``decode`` (split-KV combine,
KV-cache append), ``backward`` (preprocess, dK/dV, dQ) and ``common`` (the trace-time helpers
they share); this one holds the conventions below and ``KERNELS``.

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
in base 2 (scores are scaled by ``log2(e)`` once); with ``LAZY_RESCALE`` a row's running max
stays stale until the row's max passes it by more than ``RESCALE_TAU``, and the accumulator's
rescale is ``fly.rescale`` (skipped by a wave where none of its rows changed). Scores pass
through, in order: the scale,
softcap (``c * tanh(s / c)``), the score mod, ALiBi (``-slope * |i + off - j|``), masks.
"""

from __future__ import annotations

from .backward import (
    Bwd,
    attn_bwd_dkdv_kernel,
    attn_bwd_dq_kernel,
    attn_bwd_preprocess_kernel,
)
from .common import chunks
from .decode import attn_combine_kernel, kv_append_kernel
from .forward import Fwd, attn_fwd_kernel

KERNELS = {
    "fwd": attn_fwd_kernel,
    "combine": attn_combine_kernel,
    "kv_append": kv_append_kernel,
    "bwd_preprocess": attn_bwd_preprocess_kernel,
    "bwd_dkdv": attn_bwd_dkdv_kernel,
    "bwd_dq": attn_bwd_dq_kernel,
}


__all__ = [
    "KERNELS",
    "Bwd",
    "Fwd",
    "attn_bwd_dkdv_kernel",
    "attn_bwd_dq_kernel",
    "attn_bwd_preprocess_kernel",
    "attn_combine_kernel",
    "attn_fwd_kernel",
    "chunks",
    "kv_append_kernel",
]
