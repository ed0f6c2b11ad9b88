"""Attention configs: the ``Config``, per-target tables (``TABLES``), ``select``, schedule rules.

No GPU was available to time on: every shipped entry was chosen by the static model in
``model.py`` from cross-compiled code (``python -m flydsl_kernels.attention.model [--target T]``
reprints the ranking), untimed. ``select(kind, head_dim, target)`` reads the table entry of a
kind (``fwd``, ``decode``, ``bwd_dkdv``, ``bwd_dq``) and head-dim class; no config depends on
the rows of a problem (its grid does: the split and persistent rules below).

Schedule rules (``plan.py`` applies them, the tests pin their boundaries):

* **tile**: by head dim class (``dclass``), prefill vs decode (decode packs the query heads of
  a KV group into the tile's rows: ``GP = next_pow2(G)`` heads x ``BM / GP`` positions);
* **split-KV** (decode and any forward whose grid leaves CUs idle): with ``T`` programs and
  ``NB`` KV blocks per program, ``splits = 1`` when ``T >= CUs / 2`` or ``NB < 2 *
  MIN_BLOCKS_PER_SPLIT``; else ``min(MAX_SPLITS, ceil(CUs / T), NB // MIN_BLOCKS_PER_SPLIT)``;
* **persistent grid** (forward, not split): ``T = B * Hk * NG * ceil(Sq / BMS)`` tiles. With
  uneven tile costs (causal: a tile's keys grow with its m-block) and ``CUs <= T <
  PERSIST_WAVES * CUs`` (a few waves, so the last wave's imbalance is a large share of the
  time), the grid is ``CUs`` programs walking tiles ``pid, pid + P, ...`` with the m-blocks in
  zig-zag order (step ``s`` of every program takes the heaviest remaining blocks when ``s`` is
  even, the lightest when odd), which evens out the work per program; otherwise one program
  per tile (uniform tiles gain nothing from it, many waves amortize the tail, and below
  ``CUs`` tiles split-KV is the fix).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .._target import compiler_options
from .._target import num_cus as _num_cus
from .._target import table_for as _table_for

MAX_SPLITS = 16
MIN_BLOCKS_PER_SPLIT = 4
PERSIST_WAVES = 4


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class Config:
    """Tile and launch options of one attention kernel."""

    BM: int  # query rows per tile (forward / dQ) or per step (dK/dV)
    BN: int  # keys per tile (forward / dQ) or per program (dK/dV)
    num_warps: int = 4
    num_stages: int = 1
    nonkdim: int = 32  # AMD matrix_instr_nonkdim: 32 -> 32x32x16 MFMA, 16 -> 16x16x32
    waves_per_eu: int = 0  # AMD occupancy hint (0: the compiler's choice)
    lazy: bool = True  # forward: the rescale behind a scalar branch (kernels._update)
    notes: dict = field(default_factory=dict, compare=False, hash=False)

    def options(self, target) -> dict:
        """Launch options for ``target``'s compiler (``_target.compiler_options``: the MFMA
        options on AMD targets only, ``num_warps`` alone on the CPU backends)."""
        opts = {
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "matrix_instr_nonkdim": self.nonkdim,
        }
        if self.waves_per_eu:
            opts["waves_per_eu"] = self.waves_per_eu
        return compiler_options(opts, target)

    def as_dict(self) -> dict:
        d = {"BM": self.BM, "BN": self.BN, "num_warps": self.num_warps}
        d["num_stages"] = self.num_stages
        d["nonkdim"] = self.nonkdim
        if self.waves_per_eu:
            d["waves_per_eu"] = self.waves_per_eu
        if not self.lazy:
            d["lazy"] = False
        return d


def dclass(head_dim: int) -> str:
    """The head-dim class of a table: 64 (<= 64), 128 (<= 128), 256 (above, 192 included)."""
    if head_dim <= 64:
        return "d64"
    return "d128" if head_dim <= 128 else "d256"


# -- the shipped tables (static model, untimed) ----------------------------------------------------
# kinds: fwd (prefill), decode (GQA-packed rows), bwd_dkdv (BM = query rows per step, BN = keys per
# program), bwd_dq (BM = query rows per program, BN = keys per step). notes: the figures the model
# saw (VGPR total, LDS bytes, loop instructions, loop MFMA-equivalents).


def _c(bm, bn, w, ns, nk, lazy, vgpr=None, loop=None, per=None):
    notes = {k: v for k, v in (("vgpr", vgpr), ("loop", loop), ("per_mfma", per)) if v is not None}
    return Config(bm, bn, w, ns, nk, lazy=lazy, notes=notes)


#: gfx950, picked by the static model (``python -m flydsl_kernels.attention.model``; Triton
#: 3.9): notes = VGPRs, loop instructions per KV tile (per query step for dK/dV) and per useful
#: 32x32x16 MFMA-equivalent. Every entry: no scratch, no VGPR or SGPR spills, 2+ waves per
#: SIMD, 128-bit K/V loads (decode also at page sizes 16 to 256: tiles never span pages). Where a wider tile was better per MFMA
#: but spilled SGPRs (fwd d64 256x128: 11.56, 5 SGPR spills), the model took the next one. The lazy rescale is off where it costs more than it
#: saves (everywhere, in Triton: its scalar branch needs a workgroup-wide max through LDS and a
#: barrier; fwd d128 256x64: 295 instructions with the branch vs 280 rescaling always).
_GFX950 = {
    ("fwd", "d64"): _c(256, 64, 8, 1, 32, False, 164, 214, 13.38),
    ("fwd", "d128"): _c(256, 64, 8, 1, 32, False, 254, 280, 8.75),
    ("fwd", "d256"): _c(128, 32, 8, 1, 16, False, 206, 219, 13.69),
    ("decode", "d64"): _c(16, 64, 1, 1, 16, False, 140, 286),
    ("decode", "d128"): _c(16, 64, 2, 1, 16, False, 178, 245),
    ("decode", "d256"): _c(16, 32, 2, 1, 16, False, 224, 247),
    ("bwd_dkdv", "d64"): _c(64, 128, 8, 1, 16, True, 224, 305, 19.06),
    ("bwd_dkdv", "d128"): _c(32, 128, 8, 1, 16, True, 222, 216, 13.5),
    ("bwd_dkdv", "d256"): _c(16, 64, 8, 1, 16, True, 208, 174, 21.75),
    ("bwd_dq", "d64"): _c(128, 64, 4, 1, 32, True, 244, 246, 10.25),
    ("bwd_dq", "d128"): _c(128, 32, 4, 1, 32, True, 240, 181, 7.54),
    ("bwd_dq", "d256"): _c(128, 32, 8, 1, 16, True, 238, 206, 8.58),
}
#: sm90 (H200): tiles that compile without spills there (checked: every entry, ptxas -v):
#: prefill 128x64 with 8 warps and cp.async double buffering, decode with 4 warps (a warp is 32
#: threads there), dK/dV 16 query rows per step; untimed
_SM90 = {
    **_GFX950,
    ("fwd", "d64"): _c(128, 64, 8, 2, 32, False),
    ("fwd", "d128"): _c(128, 64, 8, 2, 32, False),
    ("fwd", "d256"): _c(64, 32, 4, 2, 32, False),
    ("decode", "d64"): _c(16, 64, 4, 1, 16, False),
    ("decode", "d128"): _c(16, 64, 4, 1, 16, False),
    ("decode", "d256"): _c(16, 32, 8, 1, 16, False),
    ("bwd_dkdv", "d64"): _c(16, 64, 4, 1, 16, True),
    ("bwd_dkdv", "d128"): _c(16, 64, 4, 1, 16, True),
    ("bwd_dkdv", "d256"): _c(16, 32, 8, 1, 16, True),
    ("bwd_dq", "d64"): _c(64, 32, 4, 1, 32, True),
    ("bwd_dq", "d128"): _c(64, 32, 4, 1, 32, True),
    ("bwd_dq", "d256"): _c(64, 16, 4, 1, 16, True),
}

#: gfx942 (MI300X: 32x32x8 MFMAs, 64 KiB LDS): gfx950's tiles where they compile without
#: scratch or spills there, smaller ones where those spill (untuned beyond that). Forward
#: d128: 128x64 with 4 warps spilled 2 SGPRs without the causal mask and needed AGPRs (one wave
#: per SIMD); 128x32 compiles to 220 VGPRs with two (about 10% more loop instructions per MFMA)
_GFX942 = {
    **_GFX950,
    ("fwd", "d128"): _c(128, 32, 4, 1, 32, False),
    ("decode", "d256"): _c(16, 32, 2, 1, 16, False),
    ("bwd_dkdv", "d128"): _c(16, 64, 4, 1, 16, True),
    ("bwd_dkdv", "d256"): _c(16, 32, 4, 1, 16, True),
    ("bwd_dq", "d256"): _c(64, 32, 4, 1, 16, True),
}
#: gfx1250 (wave32, WMMA): gfx950's tiles where they compile without spills there; untuned
_GFX1250 = {
    **_GFX950,
    ("decode", "d64"): _c(16, 64, 2, 1, 16, False),
    ("decode", "d256"): _c(16, 16, 2, 1, 16, False),
    ("bwd_dq", "d256"): _c(64, 32, 4, 1, 16, True),
}

#: one table per tuned target (``_target.TUNED_TARGETS``); any other target reads gfx950's
TABLES: dict[str, dict[tuple[str, str], Config]] = {
    "gfx950": _GFX950,
    "gfx942": _GFX942,
    "gfx1250": _GFX1250,
    "sm90": _SM90,
}


def table(target=None) -> dict:
    """``target``'s table (a name, an alias or a ``Target``); None, the CPU backends and
    untuned targets read gfx950's (``_target.table_for``)."""
    return _table_for(TABLES, target)


#: deprecated: ``table``
table_for = table


def select(kind: str, head_dim: int, target=None) -> Config:
    """The shipped config of ``kind`` (``fwd``, ``decode``, ``bwd_dkdv``, ``bwd_dq``) for a head
    dim in ``target``'s table."""
    return table(target)[(kind, dclass(head_dim))]


def num_cus(target) -> int:
    """CUs / SMs the split and persistent rules size grids by (``_target.num_cus``)."""
    return _num_cus(target)


#: decode tiles hold at most this many rows (positions x packed heads) unless a group is larger
DECODE_ROWS_MAX = 64


def packs_heads(seqlen_q: int, group: int) -> bool:
    """Decode packing (the query heads of a KV group share a tile) pays when a KV head's
    queries are few: ``seqlen_q * next_pow2(group) <= DECODE_ROWS_MAX`` and ``group > 1``."""
    return group > 1 and seqlen_q * next_pow2(group) <= DECODE_ROWS_MAX


def decode_rows(bm: int, seqlen_q: int, gp: int) -> int:
    """Rows of a decode tile: the table's ``bm`` (the matrix-instruction minimum), grown to
    hold every query position of the group up to ``DECODE_ROWS_MAX``, and at least one group."""
    return max(min(max(bm, next_pow2(max(seqlen_q, 1)) * gp), DECODE_ROWS_MAX), gp, bm)


def splits_for(programs: int, kv_blocks: int, cus: int) -> int:
    """Split-KV count (see the module doc): 1 unless the grid leaves most CUs idle and each
    program has enough KV blocks to share."""
    if programs >= cus // 2 or kv_blocks < 2 * MIN_BLOCKS_PER_SPLIT:
        return 1
    return max(
        1, min(MAX_SPLITS, math.ceil(cus / max(programs, 1)), kv_blocks // MIN_BLOCKS_PER_SPLIT)
    )


def persistent_programs(tiles: int, cus: int, uneven: bool) -> int:
    """Programs of a persistent forward grid, or 0 for one program per tile (module doc)."""
    if uneven and cus <= tiles < PERSIST_WAVES * cus:
        return cus
    return 0
