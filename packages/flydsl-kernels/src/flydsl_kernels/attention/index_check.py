"""The paged KV cache's index check on the device, as one kernel.

A paged decode call on a GPU checks every index its kernels will trust before they run:
``cache_seqlens`` (>= 0, and with the appended tokens within the capacity the block table
addresses) and each page id a sequence reads (in the pool). As a dozen small torch ops this
was 13 kernel launches and a sync per call, most of a small decode call's time on the H200
(0.5 to 1 ms of host time against 0.05 ms of attention kernels, 2026-12-04). Here it is one
launch writing one flag per sequence, which ``validate.kvcache`` reads back in its one sync,
and re-checks on the host for the exact message only where a flag is set.
"""

from __future__ import annotations

import flydsl_core as fly

#: block-table columns one loop trip reads
BLOCK = 128


@fly.kernel
def paged_index_check_kernel(
    seqlens, block_table, bad, P, lim, snew, page, pool, BLOCK: fly.constexpr,
):  # fmt: skip
    """``bad[b] = 1`` where sequence ``b`` breaks a rule, else 0; grid ``(B,)``.

    The rules: ``0 <= cache_seqlens[b] <= lim`` (``lim``: the capacity the block table
    addresses less the ``snew`` appended tokens; compared so, ``+ snew`` cannot wrap an int32),
    and the first ``cdiv(cache_seqlens[b] + snew, page)`` entries of ``block_table[b]`` (of its
    ``P`` columns) in ``[0, pool)``; entries past them (padding, -1 say) are not read."""
    b = fly.program_id(0)
    n = seqlens[b].load()
    broken = fly.where((n < 0) | (n > lim), 1, 0)
    keys = fly.minimum(fly.maximum(n, 0), fly.maximum(lim, 0)) + snew  # <= the capacity
    need = fly.minimum((keys + page - 1) // page, P)
    lane = fly.arange(0, BLOCK)
    hits = fly.zeros((BLOCK,), fly.int32)
    for c0 in fly.range(0, need, BLOCK):
        used = c0 + lane < need
        ids = block_table[b, fly.ds(c0, BLOCK)].load(used, 0)
        hits += fly.where(used & ((ids < 0) | (ids >= pool)), 1, 0)
    bad[b].store(fly.maximum(broken, fly.minimum(fly.max(hits, 0), 1)))
