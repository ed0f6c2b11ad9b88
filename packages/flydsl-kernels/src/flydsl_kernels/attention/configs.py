"""Attention configs: the ``Config``, per-target tables (``TABLES``), ``select``, schedule rules.

No GPU was available to time on: every shipped entry was chosen by the static model in
``model.py`` from cross-compiled code (``flydsl-kernels model attention [--target T]``
reprints the ranking), untimed. ``select(kind, head_dim, target)`` reads the table entry of a
kind (``fwd``, ``decode``, ``bwd_dkdv``, ``bwd_dq``) and head-dim class; no config depends on
the rows of a problem (its grid does: the split and persistent rules below).

Schedule rules (``plan.py`` applies them, the tests pin their boundaries):

* **tile**: by head dim class (``dclass``), prefill vs decode (decode packs the query heads of
  a KV group into the tile's rows: ``GP = next_pow2(G)`` heads x ``BM / GP`` positions);
* **split-KV** (decode and any forward whose grid leaves CUs idle), from the sequence length:
  with ``T`` programs each walking ``K`` keys (the key length, or under a two-sided window
  the band plus the tile's rows), ``splits = 1`` when ``T >= CUs / 2`` or ``K < 2 *
  MIN_KEYS_PER_SPLIT``; else ``min(MAX_SPLITS, ceil(CUs / T), K // MIN_KEYS_PER_SPLIT)``: every
  split keeps at least ``MIN_KEYS_PER_SPLIT`` keys (the combine and each split's Q load and
  epilogue amortize over them), whatever the tile or page size;
* **window tiles** (``band_config``): a window narrower than the tile shrinks the tile until
  the window is wider than it (the KV loop then has unmasked interior trips); dK/dV then
  trades query rows per step for keys per warp where ``BAND_WARP_KEYS`` says; under a left
  bound, and under ALiBi or softcap, the tile then takes the changes ``WINDOW_TILES`` and
  ``MOD_TILES`` list for its level (``window_config``), over a paged cache ``PAGED_TILES``'
  too, and with fp32 operands ``FP32_TILES``' instead (a score term's on top of the level's);
* **persistent grid** (forward, not split, where the table entry sets ``Config.persist``):
  ``T = B * Hk * NG * ceil(Sq / BMS)`` tiles. With
  uneven tile costs (causal with more than one m-block: a tile's keys grow with its m-block;
  decode's single m-block is even) and ``CUs <= T <
  PERSIST_WAVES * CUs`` (a few waves, so the last wave's imbalance is a large share of the
  time), the grid is ``CUs`` programs walking tiles ``pid, pid + P, ...`` with the m-blocks in
  zig-zag order (step ``s`` of every program takes the heaviest remaining blocks when ``s`` is
  even, the lightest when odd), which evens out the work per program; otherwise one program
  per tile (uniform tiles gain nothing from it, many waves amortize the tail, and below
  ``CUs`` tiles split-KV is the fix).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from .._target import compiler_options
from .._target import num_cus as _num_cus
from .._target import table_for as _table_for

MAX_SPLITS = 16
MIN_KEYS_PER_SPLIT = 512
PERSIST_WAVES = 4


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


#: the ``Config`` fields ``as_dict`` always reports (the rest only where not at their default)
_ALWAYS = ("BM", "BN", "num_warps", "num_stages", "nonkdim")


@dataclass(frozen=True)
class Config:
    """Tile and launch options of one attention kernel."""

    BM: int  # query rows per tile (forward / dQ) or per step (dK/dV)
    BN: int  # keys per tile (forward / dQ) or per program (dK/dV)
    num_warps: int = 4
    num_stages: int = 1
    nonkdim: int = 32  # AMD matrix_instr_nonkdim: 32 -> 32x32x16 MFMA, 16 -> 16x16x32
    waves_per_eu: int = 0  # AMD occupancy hint (0: the compiler's choice)
    lazy: bool = True  # forward: the lazy per-row rescale (forward._update, fly.rescale)
    #: AMD: LLVM's machine scheduler for the kernel (``amdgpu-sched-strategy``: "coexec",
    #: "iterative-ilp", ...; Triton's ``llvm_fn_attrs``, passed on AMD targets only); "" its
    #: default
    sched: str = ""
    #: decode, one warp: load K in the lane order of the 16x16 MFMA's B operand with this many
    #: head dims per lane (its k width: 8 for gfx950's 16x16x32, 4 for gfx942's 16x16x16), so
    #: ``q @ k.T`` takes K as loaded (``common._load_k_lanes``); 0 the plain load. A tile may
    #: then span pages of 16 keys or more (``plan.plan_forward``)
    klanes: int = 0
    #: forward and decode: the softmax's row sums kept as per-lane partial sums across the KV
    #: loop and reduced across lanes once after it (``forward.Fwd.LANE_SUMS``)
    lane_sums: bool = False
    #: decode with K in lane order (``klanes``) and pages of whole MFMA key blocks smaller
    #: than the tile: V loaded in head-dim blocks this wide with a batched P @ V
    #: (``forward.Fwd.VBLK``, ``common._load_v_blocks``); 0 the plain per-row gather
    vblk: int = 0
    #: prefill: interior KV tiles load K as ``K^T`` (head dims x keys, ``common._load_kT``), so
    #: ``q @ K^T`` reads it from LDS as loaded; ``k.T`` of the row-major tile took a layout
    #: conversion through LDS scratch (one more write, barrier pair and wait per tile)
    k_t: bool = False
    #: prefill, with ``k_t``: the unmasked edge tiles (those crossing only the left window
    #: bound, and the right-bound ones below the key length) load ``K^T`` too
    #: (``forward.Fwd.KT_EDGE``): one LDS round trip of the transpose fewer there, but other
    #: classes' main loops grew with it (gfx950 d256 softcap 11.31 -> 11.38, MLA 6.42 -> 6.53)
    kt_edge: bool = False
    #: backward, on the AMD (buffer-load) tables: how its loop loads the two tensors it walks
    #: (dK/dV: Q and dO rows; dQ: K and V keys). "shared": with ``load_at`` from a scalar base
    #: kept in the offsets, which both take where their strides are equal
    #: (``backward.Bwd.BASED``, ``Bwd.SAME_STRIDES``); "own": so, each with its own offsets;
    #: "view": plain view loads (one address add per load and trip)
    bwd_loads: str = "shared"
    #: AMD: each buffer descriptor that several loops' loads share (K's, V's in the
    #: forward's unmasked and masked KV loops) built once at the kernel's entry (the core's
    #: ``hoist_rsrc`` option): fewer descriptor copies in the loops. "shared": those built
    #: more than once; "all": every descriptor of a kernel argument; "": off
    hoist_rsrc: str = ""
    #: AMD: a tile the loop reads both as a dot operand and transposed as another's (dK/dV:
    #: Q and dO) staged through LDS once and read both ways (the core's TTGIR rewrite,
    #: ``flydsl_core.backends.triton.shared_operands``), where Triton 3.9 stages it twice
    share_t: bool = False
    #: AMD: K's and V's scalar origin (``Fwd.BASED``, folded) in each buffer load's scalar
    #: offset, read through the tensor's own descriptor (the core's ``buffer_soffset`` LLVM IR
    #: rewrite): the page's 32-bit byte offset once per KV tile for both tensors, where a
    #: folded base built two 64-bit bases and their descriptors
    soffset: bool = False
    #: AMD: each buffer load in a loop whose offset is a scalar step plus the lanes' own
    #: offsets takes the step as its scalar offset (``soffset``; the core's LLVM IR rewrite,
    #: ``flydsl_core.backends.triton.llir.split_buffer_offsets``), where Triton 3.9 adds it to
    #: every lane's offset and shifts the sum into bytes on each trip
    split_off: bool = False
    #: prefill, one head per tile: Q loaded in the lane order of the QK MFMA's A operand with
    #: this many head dims per lane (its k width: 8 for gfx950's bf16 MFMAs;
    #: ``forward.Fwd.QLANES``, ``common._load_q_lanes``), so that it needs no round trip
    #: through LDS; 0 the plain load
    q_lanes: int = 0
    #: AMD gfx9: one ``s_waitcnt lgkmcnt(0)`` before the P @ V MFMAs that take V's transposed
    #: LDS reads (gfx950's ``ds_read_b64_tr_b16``; the core's LLVM IR rewrite,
    #: ``flydsl_core.backends.triton.llir.wait_tr_reads``), where LLVM waited before most of
    #: them one read at a time
    tr_wait: bool = False
    #: gfx950: K's and V's tiles (and any other tile a matrix product reads from LDS) loaded
    #: straight into LDS by the buffer loads (``buffer_load_dwordx4 ... lds``; the core's TTGIR
    #: rewrite, ``flydsl_core.backends.triton.direct_lds``), where Triton 3.9 loads them into
    #: VGPRs and writes them to LDS outside its pipeliner
    d2l: bool = False
    #: decode whose query rows (the group's heads times the query positions, rounded up to a
    #: power of two) fill only part of the MFMA's rows: up to this many copies of them, the
    #: spare rows taking the tile's other key blocks (``forward.Fwd.FOLD``,
    #: ``plan.decode_fold``: each copy its own online softmax over its keys, merged once after
    #: the KV loop), so the softmax runs on the scores the tile needs, not on padding rows; 0
    #: or 1 off
    fold: int = 0
    #: prefill: the persistent grid where the schedule rule asks for one (``persistent_programs``:
    #: causal tiles of uneven cost, one to ``PERSIST_WAVES`` waves of them). Set per entry where
    #: the persistent kernel compiles as cleanly as the plain one (``model.check_tables``
    #: compiles it, with and without a window): its loop over tiles keeps more values live, and
    #: on most AMD entries it spilled or lost a wave (gfx950 d128 228 -> 256 VGPRs and a spill,
    #: windowed 268 VGPRs at one wave; d192 93 spills and 236 B of scratch)
    persist: bool = False
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
        if self.sched:
            opts["llvm_fn_attrs"] = f"amdgpu-sched-strategy={self.sched}"
        if self.hoist_rsrc:
            opts["hoist_rsrc"] = True if self.hoist_rsrc == "shared" else self.hoist_rsrc
        if self.share_t:
            opts["share_transposed_operands"] = True
        if self.soffset:
            opts["buffer_soffset"] = True
        if self.split_off:
            opts["split_buffer_offsets"] = True
        if self.tr_wait:
            opts["wait_tr_reads"] = True
        if self.d2l:
            opts["direct_lds"] = True
        return compiler_options(opts, target)

    def as_dict(self) -> dict:
        """The tile and launch fields, then every other field that is not at its default (the
        notes aside), in the class's order."""
        d = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _ALWAYS or (f.name != "notes" and v != f.default):
                d[f.name] = v
        return d


def dclass(head_dim: int, head_dim_v: int | None = None) -> str:
    """The head-dim class of a table: by the larger of the q/k and v head dims, 64 (<= 64), 128
    (<= 128), 256 (above); q/k dims up to 192 with v dims up to 128 (DeepSeek's MLA heads,
    192 / 128) are a class of their own, "d192": their accumulators are those of a 128 head,
    so they take wider tiles than a 256 head can."""
    dv = head_dim if head_dim_v is None else head_dim_v
    d = max(head_dim, dv)
    if d <= 64:
        return "d64"
    if d <= 128:
        return "d128"
    return "d192" if head_dim <= 192 and dv <= 128 else "d256"


# -- the shipped tables (static model, untimed) ----------------------------------------------------
# kinds: fwd (prefill), decode (GQA-packed rows), bwd_dkdv (BM = query rows per step, BN = keys per
# program), bwd_dq (BM = query rows per program, BN = keys per step). notes: the figures the model
# saw (VGPR total, LDS bytes, loop instructions, loop MFMA-equivalents).


def _c(
    bm,
    bn,
    w,
    ns,
    nk,
    lazy,
    vgpr=None,
    loop=None,
    per=None,
    sched="",
    klanes=0,
    ls=False,
    kt=False,
    kte=False,
    vblk=0,
    bl="shared",
    hr="",
    st=False,
    so=False,
    sp=False,
    ql=0,
    tw=False,
    fo=0,
    pe=False,
    dl=False,
):
    notes = {k: v for k, v in (("vgpr", vgpr), ("loop", loop), ("per_mfma", per)) if v is not None}
    return Config(
        bm,
        bn,
        w,
        ns,
        nk,
        lazy=lazy,
        sched=sched,
        klanes=klanes,
        lane_sums=ls,
        k_t=kt,
        kt_edge=kte,
        vblk=vblk,
        bwd_loads=bl,
        hoist_rsrc=hr,
        share_t=st,
        soffset=so,
        split_off=sp,
        q_lanes=ql,
        tr_wait=tw,
        fold=fo,
        persist=pe,
        d2l=dl,
        notes=notes,
    )


#: LLVM machine schedulers (``Config.sched``) the gfx950 entries take where they gave fewer
#: loop instructions per MFMA than LLVM's default, with no spill and 2 waves per SIMD
COEXEC, ILP, MAX_ILP = "coexec", "iterative-ilp", "max-ilp"

#: gfx950, picked by the static model (``flydsl-kernels model attention``; Triton
#: 3.9) at the model problems (``model_problem``): notes = VGPRs, instructions per trip of the
#: main loop (per KV tile; per query step for dK/dV) and per useful 32x32x16 MFMA-equivalent.
#: Every entry: no scratch, no VGPR or SGPR spills, 2+ waves per SIMD, 128-bit K/V loads
#: (decode also at page sizes 16 to 256, its tiles spanning pages: ``klanes``). Decode loads K
#: in its MFMA's lane order (``klanes = 8``): d128 16x32 184 -> 157 loop instructions per trip,
#: and 16x64, which spilled 4 SGPRs with the plain load, 265 (16.56 per MFMA); d64 16x64 284
#: -> 181, 16x128 318 (19.88); 16x128 d128 and 16x256 d64 spill SGPRs. Row sums as per-lane
#: partials (``lane_sums``): d128 265 -> 255, d64 318 -> 310 (gfx942: 303 -> 294, 388 -> 385
#: at the report's decode cases); the row sums as ``P @ ones`` MFMAs took fewer still (d64
#: 305 at the report's case) but summed the bf16-rounded P, 4e-4 off in the LSE. Tiles with fewer
#: instructions per MFMA that need one wave per SIMD (dK/dV d128 32x128 with 4 warps: 8.16;
#: fwd d128 256x64 with 4 warps: 7.39) or spill (fwd d128 256x128: 8.19 with 5 SGPR spills
#: under LLVM's minimal-register scheduler, 243 spills under the default one) were passed over.
#: Decode runs one warp per tile: with two, Triton's layouts issued 12 MFMA-equivalents for 8
#: of work. The lazy rescale is on for every forward entry (decode: below): per row, and skipped by
#: a wave as one where no row it holds grew its max (``fly.rescale``: a compare and a branch
#: per trip, the multiplies counted apart); fwd d128 282 -> 261 instructions per trip. Its
#: earlier form, a workgroup-wide vote through LDS and a barrier, cost more than it skipped
#: (298). The scheduler (``sched``) is the static model's pick per entry among LLVM's
#: default, coexec, iterative-ilp and max-ilp (fwd d128: coexec 261 -> 248 per trip; dK/dV
#: d128: iterative-ilp 174 -> 163; dQ d128: coexec 166 -> 143).
_GFX950 = {
    # prefill (main / worst loop per MFMA at the model problems, then the report's cases): the
    # row sums as lane partials (``lane_sums``) and K loaded as K^T on interior tiles (``k_t``)
    # on every head-dim class. d64 with coexec (was iterative-ilp): 12.25 / 16.81 -> 11.56 /
    # 15.69; gpt-oss's window tile (band_config: 64 x 64, 2 warps) 13.81 / 19.38 -> 13.38 /
    # 17.94 with the masks' constant key offsets, the sk tail and the sink starting the softmax
    # (forward.py; coexec with lane sums spilled SGPRs while the sink stayed live across the
    # loop), 200 -> 168 VGPRs, 3 waves. d128 248 -> 238 loop instructions with lane sums, 234
    # with K^T (llama 7.75 / 10.34 -> 7.31 / 9.72). d192 with lane sums 6.67 / 9.65 -> 6.55 /
    # 8.3 (MLA; K^T alone 6.7 / 9.68 -> 6.67 / 9.65). d256 173 -> 163 (the Gemma-style softcap
    # case 12.69 / 14.12 -> 12.12 / 13.12). Without lane sums d64 kept one more wave (196 -> 195
    # instructions at 256 x 64 under iterative-ilp, 3 -> 2 waves). K and V from a scalar base
    # kept in their shared offsets (forward.Fwd.FOLD_BASE) and the lazy rescale's new max
    # without its redundant maximum: d64 185 -> 183, d128 234 -> 229 (llama 7.31 / 9.72 ->
    # 7.16 / 9.47), d192 262 (MLA 6.55 / 8.3 -> 6.55 / 8.25), d256 163 -> 156 (12.12 / 13.12
    # -> 11.62 / 12.69); gpt-oss 13.38 / 17.94 -> 12.69 / 17.38. K's and V's buffer descriptors
    # built once at the kernel's entry for both KV loops, their constant words each from its
    # own s_mov_b32 (``hr``: Config.hoist_rsrc, the core's hoist_rsrc; the main loop had
    # rebuilt them with 4 s_mov_b32 per trip), and the lazy rescale's factor from the grow
    # test's difference (forward._update: no loop-carried copy of the max): d128 229 -> 224
    # (llama 7.16 / 9.47 -> 7.0 / 9.44), d192 262 -> 257 (MLA 6.55 / 8.25 -> 6.42 / 8.22),
    # d256 156 -> 152 (softcap 11.62 / 12.69 -> 11.31 / 12.62), d64 183 -> 182 (gpt-oss 12.69 /
    # 17.38 -> 12.62 / 17.31, without hr); decode d128 page16 14.38 -> 14.0; dQ d128 below.
    # hr is off for gpt-oss's window tile: 164 -> 184 VGPRs, 3 -> 2 waves. Tried for the
    # forward d128 without a win (Triton 3.9; TTGIR edited by hand): K's and V's LDS buffers
    # apart (Triton's allocator gives them one offset as their live ranges do not overlap)
    # with a barrier before the loop, 4 -> 2 barriers but the 16 K reads then each wait on
    # their own (lgkmcnt), 229 -> 231; with V's load issued before K's, 238
    # gpt-oss's window tile (loops left / main / right, instructions per trip): 277 / 202 / 274
    # -> 274 / 198 / 270 with the sink spread over the lane sums (forward._fwd_tile), and with
    # the right-bound tiles below sk skipping the mask's sk test and the masks' per-lane bound
    # apart from the trip's scalar (common._visible) 273 / 198 / 262 (12.62 / 17.31 -> 12.38 /
    # 17.06 per MFMA). Masking stays 2 instructions a score (32 v_cmp, 32 v_cndmask per trip),
    # and the left loop's 32 lane masks (64 SGPRs) push K's and V's descriptors out (4
    # s_mov_b32 per trip): hr "shared" 273 -> 263 there but 176 VGPRs (2 waves), with
    # waves_per_eu 3 a VGPR spill; iterative-ilp 279 / 206 / 279, max-ilp 284 / 221 / 282.
    # K^T on the unmasked edge tiles too (kte: Config.kt_edge), for gpt-oss's window tile: its
    # masked loops 274 / 270 -> 273 / 266 instructions per trip (gfx942: 620 -> 552, 4 -> 2
    # SGPR spills, main 512 -> 513; model problem 527 -> 529); gfx1250's took 3 -> 2 waves
    # with it, so not there
    # With the split buffer offsets (sp) and every descriptor at the entry (hr "all"), which
    # the split left room for: gpt-oss 273 / 198 / 262 -> 258 / 193 / 256 (12.38 / 17.06 ->
    # 12.06 / 16.12, 166 VGPRs, 3 waves; hr "shared": 176, 2 waves), the model problem 182 ->
    # 178. The left loop's 2 over 16 per MFMA are its masks: 32 v_cmp, 32 v_cndmask and the
    # bound, 65 over the main loop's 193 (the right loop's 63, two waits fewer)
    # Q loaded in the QK MFMA's lane order (ql: Config.q_lanes): no LDS round trip for it,
    # and the left loop's first barrier no longer waits on Q's reads: gpt-oss 258 / 193 / 256
    # -> 257 / 193 / 256 (16.12 -> 16.06, 166 -> 168 VGPRs, 3 waves), the model problem 178
    # -> 177 (152 -> 156 VGPRs, 3 waves). The lazy rescale's new max as the old one less
    # alpha's exponent (a subtract for the tile max's multiply and a select) took every lazy
    # loop 1 lower (gpt-oss 256 / 192 / 255) but is wrong from the first tile on: the old max
    # is FP32_LOWEST there, and m + (m_tile - m) cancels to 0
    # One s_waitcnt lgkmcnt(0) before the P @ V MFMAs (tw: Config.tr_wait, the core's
    # wait_tr_reads), where LLVM's wait insertion waited on V's ds_read_b64_tr_b16 one read at a
    # time before most of the 8 MFMAs (6 waits in gpt-oss's left and main loops, 5 in the right
    # one; 2 with it), all long returned by then (issued before the softmax): gpt-oss 257 / 193
    # / 256 -> 253 / 189 / 253 (16.06 -> 15.81, 168 VGPRs, 3 waves), the model problems fwd d64
    # 177 -> 173, d128 222 -> 219 (llama 6.94 / 9.41 -> 6.84 / 9.31), d192 250 -> 247 (MLA 6.25
    # / 7.97 -> 6.17 / 7.9), dQ d128 137 -> 133 (5.71 / 7.58 -> 5.54 / 7.42), registers
    # unchanged. Not taken: fwd d256 151 -> 152, dK/dV d64 188 -> 193 (218 -> 226 VGPRs), d128
    # 144 -> 145, dQ d64 212 -> 212, decode d128 209 -> 505 (its reads right before the MFMAs).
    # Tried first: the P @ V MFMAs interleaved in the LLVM IR as the right loop orders them
    # (acc0 k0, acc1 k0, acc0 k1, ...): LLVM's scheduler reorders them back, 257 / 193 / 256
    ("fwd", "d64"): _c(
        256,
        64,
        8,
        1,
        32,
        True,
        156,
        173,
        10.81,
        sched=COEXEC,
        ls=True,
        kt=True,
        kte=True,
        hr="all",
        sp=True,
        ql=8,
        tw=True,
    ),
    ("fwd", "d128"): _c(
        256,
        64,
        8,
        1,
        32,
        True,
        228,
        219,
        6.84,
        sched=COEXEC,
        ls=True,
        kt=True,
        hr="shared",
        sp=True,
        tw=True,
    ),
    # K and V loaded straight into LDS (dl: Config.d2l, the core's direct_lds): the loads' waits and
    # LDS writes gone, gfx950's M0 set per load instead, the tiles in padded LDS layouts, and V's
    # copy issued before Q K^T and waited for after its MFMAs (direct_lds._over_product, pin_waits:
    # LLVM had hoisted the wait to right after the copy, V's global latency uncovered). At the
    # model problems (VGPRs, loop instructions): d256 212 / 151 -> 200 / 146 (softcap 11.25 /
    # 12.44 -> 10.88 / 11.81); dQ d64 224 / 212 -> 226 / 206 (8.83 -> 8.58; its traced-window
    # levels searched again: TRACED_WINDOW_TILES); dQ d192 238 / 275 -> 224 / 258 (8.59 / 10.12
    # -> 8.06 / 10.03; its dO tile outside the loop). Over a paged cache plan.page_tile turns it
    # off. Not taken: fwd d64 156 / 173 -> 146 / 170 (10.81 / 14.88 -> 10.62 / 14.69; gpt-oss
    # 11.81 -> 11.75) spilled 1 to 15 SGPRs under windows, most with ALiBi (check_tables);
    # d192 248 / 247 -> 254 / 277 (MLA 6.17 -> 6.92; 238 with the wait left where LLVM put it),
    # d128 219 -> 217 with its masked loop 298 -> 308 (llama 6.84 / 9.31 -> 6.78 / 9.62), dQ d128
    # 133 -> 148, dQ d256 181 -> 181; dK/dV's Q and dO (share_t) and decode's gathers are not
    # rewritten
    ("fwd", "d192"): _c(
        256, 64, 8, 1, 32, True, 248, 247, 6.17, ls=True, kt=True, hr="shared", sp=True, tw=True
    ),
    # d256 at 16 query rows a warp pays 3 LDS reads per MFMA-equivalent (K 1, V 2) and the
    # softcap case an exp, an add and a reciprocal per score (softcap_r; 1.75 per MFMA): 11.31 /
    # 12.62 at the report's softcap case. Tried there without a win at two waves (Triton 3.9):
    # 128 x 64 with 8 warps spills 12 to 82 VGPRs (or 13.41 under max-ilp). The warp tile of
    # AMD's CK tile FMHA at d256 (4 warps of 32 rows, 32x32x16 MFMAs), here 128 x 32, reaches
    # 8.06 with 329 registers (73 of them AGPRs), one wave per SIMD (model.OCCUPANCY_FLOOR): a
    # candidate to time on an MI355X, not one to ship untimed
    ("fwd", "d256"): _c(
        128,
        32,
        8,
        1,
        16,
        True,
        200,
        146,
        9.12,
        sched=ILP,
        ls=True,
        kt=True,
        hr="shared",
        sp=True,
        dl=True,
    ),
    # decode: the rescale on every trip (lazy off) under iterative-ilp took fewer loop
    # instructions at the report's decode cases than the lazy one's compare and branch (d128
    # page16 262 -> 256, page64 260 -> 260, d64 page256 322 -> 318; at the model problem d128
    # 255 -> 258 under max-ilp's lazy entry, d64 310 -> 306). Tiles within one page load K and
    # V from a scalar base (forward.Fwd.BASED): d128 page64 260 -> 224 (model problem 258 ->
    # 223, 252 VGPRs), d64 page256 318 -> 279; with it the lazy rescale took 227 / 283, LLVM's
    # default scheduler, max-ilp and coexec 234-248 / 282-295 (d64 spilling under each).
    # Tiles over pages of 16 or 32 keys load V in 32-wide head-dim blocks (vblk, Fwd.VBLK):
    # d128 page16 256 -> 234 per trip (16.00 / 24.56 -> 14.62 / 22.88 per MFMA, 230 -> 216
    # VGPRs), page32 252 -> 232; d64 page16 320 -> 310 but its masked trip 33.06 -> 33.94
    # (left off); gfx942 (d128 page16 283 -> 323), pages of 4 and 8 and gfx1250 lose with it.
    # V's offsets from K's equal strides (Fwd.VK_STRIDES): page16 230 (14.38 / 22.62),
    # page32 229, page64 224 -> 220 (13.75 / 21.25), d64 page256 279 -> 273 (17.06 / 27.12);
    # the model problem (page64, B64) 223 -> 219. The block table's row read from a pointer
    # computed before the KV loop, the page index its SMEM load's scalar offset (scalar
    # load_at), and K's and V's folded origin in their buffer loads' scalar offset (so:
    # Config.soffset, the core's buffer_soffset; the page's 32-bit byte offset once per tile
    # where two 64-bit bases and descriptors were built): d64 page256 273 -> 266 -> 262
    # (17.06 / 27.12 -> 16.38 / 26.44), d128 page64 220 -> 212 (13.75 / 21.25 -> 13.25 /
    # 20.94), model problem 216 -> 209; page16 unchanged (its V origin is outside the loop,
    # which the rewrite leaves). gfx942 loses with so (d64 347 -> 356, d128 256 -> 261 at its
    # model problems). That left d64 page256 above the decode goal (15 per MFMA, 240 per
    # trip): its 262 were 112 memory and MFMA instructions (32 loads, 16 LDS writes and 32
    # transposed reads of V, 32 MFMAs), 112 softmax ones, 13 of page walk and loop, 16 waits
    # and nops. Half the softmax was padding: a group of 8 heads (4 at the model problem)
    # fills 8 of the MFMA's 16 rows. Two row copies, each over half of the tile's keys (fo:
    # Config.fold, Fwd.FOLD; the same MFMAs, 16 of 33 exps): page256 262 -> 214 (16.38 /
    # 26.44 -> 13.38 / 24.25, 240 -> 236 VGPRs); at the model problem (pages of 64, each
    # copy's keys on its own page) 306 -> 216 (19.12 -> 13.5 per MFMA, 230 -> 238 VGPRs),
    # pages of 16 320 -> 268, of 256 262 -> 214 (4 copies there 224). d128 page64 212 -> 233
    # (two 32-key copies: their accumulators' eager rescale and K's waits), 202 at one wave
    # without hr, 221 under max-ilp: not set
    ("decode", "d64"): _c(
        16, 128, 1, 1, 16, False, 238, 216, 13.5, sched=ILP, klanes=8, ls=True, so=True, fo=2
    ),
    ("decode", "d128"): _c(
        16,
        64,
        1,
        1,
        16,
        False,
        254,
        209,
        13.06,
        sched=ILP,
        klanes=8,
        ls=True,
        vblk=32,
        hr="shared",
        so=True,
    ),
    ("decode", "d192"): _c(16, 32, 2, 1, 16, True, sched=MAX_ILP),
    ("decode", "d256"): _c(16, 32, 2, 1, 16, True, 234, 202, sched=ILP),
    # the backward's loops load from a scalar base kept in offsets the two tensors share
    # (Config.bwd_loads "shared"; d192's Q / dO and K / V differ in width, so each its own):
    # dK/dV d64 210 -> 207, d192 229 -> 227, d256 151 -> 150; dQ d64 227 -> 221, d128 143 ->
    # 142, d256 198 -> 192 loop instructions per trip at the model problems; gpt-oss dK/dV
    # 12.12 / 15.94 -> 11.5 / 15.31, dQ 9.96 / 14.29 -> 9.54 / 13.46. dK/dV d128 takes its
    # own offsets per tensor: 163 -> 161, where shared ones (170) crowd its 244 VGPRs (LDS
    # addresses copied every trip). Q and dO staged through LDS once per query step and read
    # both ways (share_t; Triton staged each twice: 8 barriers and 6 LDS writes per step at
    # d128, 2 and 2 with it): d64 207 -> 200 (max-ilp 197, but gpt-oss's band tile took 171
    # under it and 159 under iterative-ilp: 11.5 / 15.31 -> 9.94 / 13.75), d128 161 -> 150
    # (llama 10.06 / 12.31 -> 9.38 / 12.06), d192 227 -> 222, d256 150 -> 145. Every buffer
    # descriptor of a kernel argument built at the entry (hr "all", Config.hoist_rsrc: no
    # per-trip copies of dO's and the LSE rows' constant words): d64 200 -> 190 (gpt-oss 9.94
    # / 13.75 -> 9.69 / 13.5), d128 150 -> 146 (llama 9.38 -> 9.12), d192 222 -> 218, d256 145
    # -> 141; dQ d64 217 -> 213, d192 284 -> 280, d256 186 -> 182
    ("bwd_dkdv", "d64"): _c(
        64, 128, 8, 1, 16, True, 218, 188, 11.75, sched=ILP, st=True, hr="all", sp=True
    ),
    # Every loop's buffer loads take the uniform part of their offsets as the scalar offset
    # (``sp``: Config.split_off, the core's split_buffer_offsets), the lanes' part shifted once
    # outside the loop: dK/dV d128's LSE and delta rows then share one vector offset (their
    # 4 v_add_lshl per query step gone), the forward's K and V step one scalar offset. At the
    # model problems (VGPRs, loop instructions): fwd d128 224 / 224 -> 228 / 222, d192 250 /
    # 257 -> 248 / 250, d256 152 -> 151; dK/dV d64 190 -> 188, d128 146 -> 144 (9.12 -> 9.0),
    # d192 234 / 218 -> 238 / 210; dQ d64 220 / 213 -> 224 / 212,
    # d128 138 -> 137, d192 280 -> 275, d256 244 / 182 -> 240 / 181. The report's cases (main /
    # worst per MFMA): llama fwd 7.0 / 9.44 -> 6.94 / 9.41, MLA 6.42 / 8.22 -> 6.25 / 8.05,
    # softcap 11.31 / 12.62 -> 11.25 / 12.56, llama dK/dV 9.12 / 11.81 -> 9.0 / 11.56, dQ
    # 5.75 -> 5.71; gpt-oss dK/dV 9.69 / 13.5 -> 9.12 / 13.12, dQ 9.5 / 12.46 -> 9.25 / 12.25.
    # Decode unchanged (left off); fwd d64 takes it with hr "all" (its note above). dK/dV d256
    # left off: 141 -> 132, but LLVM kept a masked loop's LSE offset in a VGPR and read it
    # through two readfirstlane loops (a waterfall; test_attention_compile checks every entry
    # with it for one). gfx942 and gfx1250 take it per entry (after the tables).
    # Split for dK/dV d128's LSE and delta rows alone: 143 (their second 16-row block's
    # constant as the immediate offset instead of a scalar add: LLVM hoisted it into a VGPR of
    # its own, 150 at 256 VGPRs; Q's and dO's rows split alone: 154 to 176, register copies)
    # dK/dV d128's LSE and delta rows cost 4 v_add_lshl and 2 s_add per query step (one
    # offset per plane and row block). Sharing them, tried without a win: the delta plane
    # passed as a second tensor at the LSE's offsets, 146 -> 151 (LLVM carried the offsets
    # across the loop and, at 254 VGPRs, copied 12 LDS addresses every trip); each plane's base
    # folded into its buffer descriptor (load_at fold_base), 151 with 2 VGPRs spilled (160 to
    # 172 under the other schedulers); the planes interleaved in 16-row chunks so that delta
    # sits at a constant offset from the LSE, 150 (LLVM adds the constant before the byte
    # shift: no immediate offset). 64-row query steps spill (201 VGPRs; 1 under LLVM's default
    # scheduler, at 10.44)
    ("bwd_dkdv", "d128"): _c(
        32, 128, 8, 1, 16, True, 242, 144, 9.0, sched=ILP, bl="own", st=True, hr="all", sp=True
    ),
    ("bwd_dkdv", "d192"): _c(
        32, 128, 8, 1, 16, True, 238, 210, 10.5, sched=MAX_ILP, st=True, hr="all", sp=True
    ),
    ("bwd_dkdv", "d256"): _c(16, 64, 8, 1, 16, True, 206, 141, sched=ILP, st=True, hr="all"),
    # iterative-ilp over coexec (9.38 here): gpt-oss's band tile (64 x 64, 2 warps) takes it,
    # 10.21 -> 9.96 there, where coexec gave 10.62
    # dQ's K (q @ K^T and dS @ K) staged once too (share_t): d64 221 -> 217 (gpt-oss 9.54 /
    # 13.46 -> 9.5 / 12.46), d192 293 -> 284, d256 192 -> 186; not d128 (3 VGPR spills). dQ
    # d128 with its K and V descriptors built at the entry (Config.hoist_rsrc): 142 -> 138
    ("bwd_dq", "d64"): _c(
        128, 64, 4, 1, 32, True, 226, 206, 8.58, sched=ILP, st=True, hr="all", sp=True, dl=True
    ),
    ("bwd_dq", "d128"): _c(
        256, 32, 8, 1, 32, True, 246, 133, 5.54, sched=COEXEC, hr="shared", sp=True, tw=True
    ),
    ("bwd_dq", "d192"): _c(
        128, 64, 8, 1, 16, True, 224, 258, 8.06, st=True, hr="all", sp=True, dl=True
    ),
    ("bwd_dq", "d256"): _c(
        128, 32, 8, 1, 16, True, 240, 181, 7.54, sched=ILP, st=True, hr="all", sp=True
    ),
}
#: sm90 (H200): tiles that compile without spills there (checked: every entry, ptxas -v). The
#: d128 entries are the fastest of ``tools/tune_attention.py``'s timed sweep on the H200
#: (docs/gpu-results.md, run 3; the model problem B4 S4096 H32/8 causal, decode B64 ctx8192
#: page 64): forward 64x64 with 4 warps and 3 stages, 1.25x the earlier 128x64 / 8 warps / 2
#: stages; dQ 64x64 1.09x; decode with 2 warps (a warp is 32 threads there) and 2 stages
#: 1.35x. dK/dV keeps 16 query rows and 1 stage: every faster tile of the sweep (32x64 with 3
#: stages 1.31x, 64x64 1.29x, 16x64 with 3 stages 1.21x) spills 60 to 1072 B on sm90 under
#: Triton 3.9 (dK and dV alone are 128 fp32 registers a thread at 4 warps). d64 (run 4, the
#: same problem at d64): forward 3 stages 1.14x, dQ 64x64 with 3 stages 1.12x, decode 2 warps
#: and 3 stages 1.15x; dK/dV 32x64 with 1 stage 1.13x, the fastest that does not spill at
#: gpt-oss's window (64x64 with 3 stages, 1.18x, spills 316 B). d192 / d256 are untimed
_SM90 = {
    **_GFX950,
    ("fwd", "d64"): _c(128, 64, 8, 3, 32, False),
    ("fwd", "d128"): _c(64, 64, 4, 3, 32, False),
    ("fwd", "d256"): _c(64, 32, 4, 2, 32, False),
    ("decode", "d64"): _c(16, 64, 2, 3, 16, False),
    ("decode", "d128"): _c(16, 64, 2, 2, 16, False),
    ("decode", "d256"): _c(16, 32, 8, 1, 16, False),
    ("bwd_dkdv", "d64"): _c(32, 64, 4, 1, 16, True),
    ("bwd_dkdv", "d128"): _c(16, 64, 4, 1, 16, True),
    ("bwd_dkdv", "d256"): _c(16, 32, 8, 1, 16, True),
    ("bwd_dq", "d64"): _c(64, 64, 4, 3, 32, True),
    ("bwd_dq", "d128"): _c(64, 64, 4, 2, 32, True),
    ("bwd_dq", "d256"): _c(64, 16, 4, 1, 16, True),
}
for _k in ("fwd", "decode", "bwd_dkdv", "bwd_dq"):  # MLA heads: the d256 tiles there
    _SM90[(_k, "d192")] = _SM90[(_k, "d256")]


def _reset(tab: dict, name: str) -> None:
    """``tab``'s entries with the field ``name`` back at ``Config``'s default, for the tables
    that start from gfx950's (each call says why)."""
    default = next(f.default for f in fields(Config) if f.name == name)
    for k, c in list(tab.items()):
        if getattr(c, name) != default:
            tab[k] = replace(c, **{name: default})


def _eager(tab: dict, keys=None) -> None:
    """The forward and decode entries of ``tab`` (or ``keys``) with the rescale on every trip:
    where ``fly.rescale`` is a plain multiply (no ``Target.has_wave_skip_asm``, or its asm did
    not fit the registers), the lazy rule's per-row select only adds instructions."""
    for k, c in list(tab.items()):
        if (keys is None and k[0] in ("fwd", "decode")) or (keys is not None and k in keys):
            tab[k] = replace(c, lazy=False)


def _k_rows(tab: dict, keys) -> None:
    """``tab``'s ``keys`` with K loaded row-major on every tile (``k_t`` off): where gfx950's
    K^T load took more loop instructions (gfx942 MLA 16.3 -> 16.55 per MFMA; gfx1250 d192 270
    -> 271, d256 431 -> 480 at the model problems; gfx942 d128 9.59 -> 9.25, d256 10.44 ->
    10.31 and gfx1250 d128 839 -> 810 keep it)."""
    for k in keys:
        tab[k] = replace(tab[k], k_t=False)


def _row_sums(tab: dict) -> None:
    """``tab``'s forward entries with the row sums reduced across lanes on every trip: the
    per-lane partials (``lane_sums``) of gfx950's prefill entries took more loop instructions
    where checked elsewhere (gfx942 fwd d256 300 -> 301, gfx1250 fwd d128 839 -> 850, d256
    431 -> 451 at the model problems; gfx1250 d64 worst loop 36.31 -> 36.56 per MFMA, MLA main
    27.0 -> 27.8); decode entries keep their own."""
    for k, c in list(tab.items()):
        if k[0] == "fwd" and c.lane_sums:
            tab[k] = replace(c, lane_sums=False)


_eager(_SM90)
# LLVM's default scheduler: the tables that start from gfx950's take its schedulers only where
# checked there (coexec is gfx950 / gfx1250 only in LLVM, and the others spilled some of
# gfx942's and gfx1250's tiles). gfx1250 then sets its own per entry, each checked on gfx1250
# (the notes at its overrides).
_reset(_SM90, "sched")  # an AMD option: ignored on NVIDIA targets, dropped for clarity
_reset(_SM90, "d2l")  # gfx950's buffer loads alone write 16 bytes a lane to LDS

#: gfx942 (MI300X: 32x32x8 MFMAs, 64 KiB LDS): gfx950's tiles where they compile without
#: scratch or spills there, smaller ones where those spill (untuned beyond that). Forward
#: d128: 128x64 with 4 warps spilled 2 SGPRs without the causal mask and needed AGPRs (one wave
#: per SIMD); 128x32 compiles to 220 VGPRs with two (about 10% more loop instructions per MFMA)
_GFX942 = {
    **_GFX950,
    # K in the lane order of gfx942's 16x16x16 MFMA (4 head dims per lane); gfx950's wider
    # tiles (d64 128 keys, d128 64) took one wave per SIMD here (and SGPR spills at d64)
    # two row copies (fo, as gfx950's): at the model problem 347 -> 265 loop instructions per
    # trip, pages of 16 401 -> 296, of 256 350 -> 268 (4 copies 269 with 236 VGPRs), the
    # report's gpt-oss case 21.88 / 27.0 ->
    # 16.75 / 22.31 per MFMA; d128 page64 16.62 / 20.56 -> 16.56 / 20.81: not set
    ("decode", "d64"): _c(16, 64, 1, 1, 16, True, klanes=4, ls=True, fo=2),
    ("decode", "d128"): _c(16, 32, 1, 1, 16, True, klanes=4, ls=True),
    ("fwd", "d128"): _c(128, 32, 4, 1, 32, True, kt=True),
    ("decode", "d256"): _c(16, 32, 2, 1, 16, False),
    # 32 query rows per step: gfx950's 64 took one wave per SIMD here under gpt-oss's window
    # (its band tile, 64 x 64 with 4 warps: 262 VGPRs); 32 x 64 with 4 warps takes 161 (3
    # waves; 19.06 against 15.03 loop instructions per 32x32x8 MFMA), 3 waves at the model
    # problem too (37.88 against 35.25). Q and dO staged once (share_t, as gfx950's): d64 304
    # -> 299 (3 waves; gpt-oss 18.88 / 21.25 -> 18.69 / 21.0), d128 259 -> 224 (llama 16.19 /
    # 17.38 -> 14.0 / 15.38); d256 unchanged (262), so not set. Every descriptor built at the
    # entry (hr "all"): gpt-oss 18.69 -> 18.44, llama 14.0 -> 13.75
    ("bwd_dkdv", "d64"): _c(32, 64, 4, 1, 16, True, st=True, hr="all"),
    ("bwd_dkdv", "d128"): _c(16, 64, 4, 1, 16, True, st=True, hr="all"),
    ("bwd_dkdv", "d256"): _c(16, 32, 4, 1, 16, True),
    # the static model's pick (``flydsl-kernels model attention --target gfx942 --kind bwd_dq
    # --dclass d64``): gfx950's 128 x 64 took 260 VGPRs here at the causal model problem, one
    # wave per SIMD (17.04 loop instructions per 32x32x16-equivalent), and one wave again as
    # gpt-oss's band tile (64 x 64, 2 warps: 290); 128 x 32 with 2 stages takes 182 (2 waves,
    # 20.17), and its band tile 64 x 32 takes 210 (2 waves)
    ("bwd_dq", "d64"): _c(128, 32, 4, 2, 32, True, 182, 242, 20.17),
    # no d256 dQ candidate reaches 2 waves here (the least: 32 x 32 with 4 warps, 292 VGPRs);
    # at one wave 128 x 32 with 32x32x8 MFMAs takes 447 (with AGPRs) and 8.65 loop instructions
    # per 32x32x16-equivalent, against 13.96 for 64 x 32 with 16x16x16 ones
    # view loads (Config.bwd_loads): shared based ones took 429 loop instructions here, their
    # own 501 in the masked loop (492)
    ("bwd_dq", "d256"): _c(128, 32, 4, 1, 32, True, 447, 415, 8.65, bl="view"),
}
# gfx950's dQ d128 with shared based loads spilled 49 B here; their own ones: 363 -> 360
_GFX942[("bwd_dq", "d128")] = replace(_GFX942[("bwd_dq", "d128")], bwd_loads="own")
for _k in ("fwd", "bwd_dkdv", "bwd_dq"):  # gfx950's MLA tiles spill here: the d256 ones
    _GFX942[(_k, "d192")] = _GFX942[(_k, "d256")]
# ... but MLA's dQ keeps 64 x 32 (16x16x16 MFMAs, 230 VGPRs: 2 waves; 128 x 32 took one)
_GFX942[("bwd_dq", "d192")] = _c(64, 32, 4, 1, 16, True)
# the lazy rescale's asm fits the forward's d64 and d128 tiles here (d128: 10.63 -> 9.59 loop
# instructions per 32x32x8 MFMA); elsewhere LLVM's registers miss its guard (plain multiplies)
_eager(_GFX942, [k for k in _GFX942 if k[0] == "decode" or k[1] in ("d192", "d256")])
_reset(_GFX942, "sched")
_row_sums(_GFX942)
# Q's plain load in the forward: gfx950's ``q_lanes`` is its MFMAs' k width
# (gfx942's bf16 MFMAs take 4 head dims per lane, gfx1250's wave32 WMMA another order). With 4,
# gpt-oss's window tile (loops left / main / right, instructions per trip): gfx942 544 / 504 /
# 535 -> 543 / 504 / 670 and an SGPR spill, gfx1250 743 / 544 / 693 -> 783 / 549 / 687.
_reset(_GFX942, "q_lanes")
# no ``tr_wait``: it is for gfx950's transposed LDS reads (the rewrite finds none on gfx942 and
# leaves gfx1250's text alone: its own wait counters), dropped for clarity.
_reset(_GFX942, "tr_wait")
_reset(_GFX942, "d2l")  # its buffer loads write 4 bytes a lane to LDS: not rewritten
_k_rows(_GFX942, [("fwd", "d192")])
#: gfx1250 (wave32, WMMA): gfx950's tiles where they compile without spills there; untuned.
#: Their share_t (Q / dO or K staged once) holds here too: llama dK/dV 23.69 / 28.88 -> 23.38
#: / 28.0 (2 -> 3 waves), gpt-oss dQ 22.67 / 33.67 -> 20.71 / 31.92
_GFX1250 = {
    **_GFX950,
    ("fwd", "d192"): _GFX950[("fwd", "d256")],  # gfx950's 256x64 spilled 11 VGPRs here
    ("decode", "d64"): _c(16, 64, 2, 1, 16, False),
    ("decode", "d128"): _c(
        16, 32, 1, 1, 16, False
    ),  # wave32 WMMA: gfx950's K lane order is not its
    ("decode", "d256"): _c(16, 16, 2, 1, 16, False),
    # 32 query rows per step: gfx950's 64, shrunk to 64 keys under gpt-oss's window
    # (band_config), spilled 25 SGPRs here
    ("bwd_dkdv", "d64"): _c(32, 64, 4, 1, 16, True),
    # the static model's pick (2 waves per SIMD; 456 VGPRs, 22.21 loop instructions per
    # 32x32x16-equivalent): 128 x 32 with 4 warps took 553 VGPRs, one wave (15.79), and
    # gfx950's 256 x 32 with 8 warps spilled 6 VGPRs
    ("bwd_dq", "d128"): _c(128, 64, 8, 2, 16, True, 456, 533, 22.21),
    ("bwd_dq", "d256"): _c(64, 32, 4, 1, 16, True),
}
# shared based loads (Config.bwd_loads) on gfx950's dK/dV d128 tile: main loop 384 -> 379
_GFX1250[("bwd_dkdv", "d128")] = replace(_GFX1250[("bwd_dkdv", "d128")], bwd_loads="shared")
_eager(_GFX1250)  # wave32: no skipping asm (Target.has_wave_skip_asm)
_reset(_GFX1250, "sched")
_row_sums(_GFX1250)
_reset(_GFX1250, "q_lanes")
_reset(_GFX1250, "tr_wait")
_reset(_GFX1250, "d2l")  # gfx1250 copies to LDS its own way (not rewritten)
_k_rows(_GFX1250, [("fwd", "d192"), ("fwd", "d256")])
# gfx950's K^T edge tiles (Config.kt_edge): gpt-oss's window tile took 3 -> 2 waves here,
# masked loops 753 / 706 -> 787 / 708 instructions per trip (main 574 -> 562)
_GFX1250[("fwd", "d64")] = replace(_GFX1250[("fwd", "d64")], kt_edge=False)
# The scalar buffer offsets (Config.split_off; decode: Config.soffset), set per entry where
# neither the model problem nor any report case using the entry took more instructions in any
# loop, with no spill, no scratch, no waterfall loop (s_and_saveexec) and no fewer waves.
# Figures: loop instructions per trip (main / worst loop; dK/dV: left / main / right), before ->
# after. gfx942: fwd d64 (with hr "shared" for gfx950's "all") gpt-oss's window tile 559 /
# 513 / 548 -> 544 / 504 / 535 and its 3 SGPR spills gone (hr "all": 544 / 504 / 534, 3
# spills), model problem 525 / 585 unchanged; fwd d128 with hr "shared" 288 / 346 -> 278 /
# 340 (llama 9.0 / 10.81 -> 8.69 / 10.62 per MFMA; sp alone 282 / 340); fwd d192 321 -> 320
# (MLA 16.05 -> 16.0); fwd d256 304 / 323 -> 298 / 316 (softcap 10.41 / 11.0 -> 10.22 /
# 10.78); dK/dV d64 under gfx950's iterative-ilp 330 / 295 / 332 -> 328 / 291 / 324 (3 -> 4
# waves; gpt-oss 330 / 295 / 332 -> 325 / 292 / 325; sp alone 338 / 291 / 326, iterative-ilp
# alone 332 / 293 / 328, max-ilp with sp 315 / 280 / 316 at 2 waves); decode d192 284 / 329
# -> 268 / 315, d256 327 / 399 -> 320 / 392 (pages of 16 to 256: each loop fewer). Left off:
# dK/dV d128, d192, d256 (waterfall loops), dQ d64 241 -> 247, d128 356 -> 359, d192 295 ->
# 298, d256 415 -> 426; decode so d64 347 -> 356, d128 256 -> 261
_GFX942.update(
    {
        ("fwd", "d64"): replace(_GFX942[("fwd", "d64")], split_off=True, hoist_rsrc="shared"),
        ("fwd", "d128"): replace(_GFX942[("fwd", "d128")], split_off=True, hoist_rsrc="shared"),
        ("fwd", "d192"): replace(_GFX942[("fwd", "d192")], split_off=True),
        ("fwd", "d256"): replace(_GFX942[("fwd", "d256")], split_off=True),
        ("bwd_dkdv", "d64"): replace(_GFX942[("bwd_dkdv", "d64")], split_off=True, sched=ILP),
        ("bwd_dq", "d128"): replace(_GFX942[("bwd_dq", "d128")], split_off=False),
        ("decode", "d192"): replace(_GFX942[("decode", "d192")], soffset=True),
        ("decode", "d256"): replace(_GFX942[("decode", "d256")], soffset=True),
    }
)
# gfx1250: fwd d64 472 / 575 -> 432 / 548 (gpt-oss 752 / 574 / 706 -> 743 / 544 / 693); fwd
# d128 with iterative-ilp 787 / 984 -> 717 / 850 (llama 24.59 / 30.75 -> 22.41 / 26.56 per
# MFMA, non-causal 724 / 894 -> 717 / 815; sp alone took the non-causal main loop 724 -> 775,
# with hr off 722; iterative-ilp alone 723 / 877); dK/dV d64 305 / 232 / 306 -> 285 / 232 /
# 293 (gpt-oss 300 / 233 / 302 -> 285 / 232 / 289), d128 444 / 370 / 432 -> 440 / 355 / 431,
# d256 373 / 318 / 373 -> 368 / 308 / 368; dQ d64 486 / 707 -> 483 / 687 (gpt-oss 642 / 497 /
# 766 -> 638 / 483 / 746), d192 639 / 732 -> 608 / 707, d256 423 / 454 -> 407 / 444 (one wave
# either way: BELOW_FLOOR); decode so d64 308 / 407 -> 302 / 401 (page256 311 / 413 -> 304 /
# 406), d192 300 / 381 -> 289 / 370, d256 284 / 324 -> 277 / 307 (pages of 16 to 256: each
# loop fewer). Left off: fwd d192 (model 270 / 315 -> 260 / 306 but MLA's masked loop 317 ->
# 320; coexec with sp 270 / 298 at 3 waves, was 4), fwd d256 410 / 515 -> 406 / 523, dK/dV
# d192 361 -> 368, dQ d128 512 -> 536 (these three take sp with iterative-ilp: below), decode
# d128 so (page64's masked loop 411 -> 413; 402 -> 413 under iterative-ilp)
_GFX1250.update(
    {
        ("fwd", "d128"): replace(_GFX1250[("fwd", "d128")], sched=ILP),
        ("fwd", "d192"): replace(_GFX1250[("fwd", "d192")], split_off=False),
        ("fwd", "d256"): replace(_GFX1250[("fwd", "d256")], split_off=False),
        ("bwd_dkdv", "d64"): replace(_GFX1250[("bwd_dkdv", "d64")], split_off=True),
        ("bwd_dkdv", "d192"): replace(_GFX1250[("bwd_dkdv", "d192")], split_off=False),
        ("bwd_dkdv", "d256"): replace(_GFX1250[("bwd_dkdv", "d256")], split_off=True),
        ("bwd_dq", "d256"): replace(_GFX1250[("bwd_dq", "d256")], split_off=True),
        # two row copies (Config.fold): at the model problem 286 -> 244 loop instructions
        # per trip, pages of 256 289 -> 247 (4 copies: 342, 3 waves), of 16 and 32 unchanged
        # (their tiles shrink to a page, below plan.FOLD_KEYS_MIN), gpt-oss's decode 48.17 /
        # 61.5 -> 41.17 / 58.33 per MFMA (5 -> 4 waves); d128 (page64 42.38 -> 34.25) took
        # one wave at the model problem: not set
        ("decode", "d64"): replace(_GFX1250[("decode", "d64")], soffset=True, fold=2),
        ("decode", "d192"): replace(_GFX1250[("decode", "d192")], soffset=True),
        ("decode", "d256"): replace(_GFX1250[("decode", "d256")], soffset=True),
    }
)
# gfx1250's schedulers per entry. ``_reset(_GFX1250, "sched")`` (above) drops gfx950's picks,
# which were never checked here; these picks were checked here. Each entry compared LLVM's default,
# iterative-ilp, max-ilp and coexec, with split_off on and off (decode: soffset). A pick is kept
# only where neither the model problem nor any report case using the entry took more
# instructions in any loop, with no spill, no scratch, no waterfall loop and no fewer waves
# (decode: also pages of 16 and 256 at the model problem).
# Figures: loop instructions per trip, before -> after.
# - fwd d256, iterative-ilp with sp: 410 / 515 -> 347 / 404 (softcap 497 / 546 -> 421 / 473,
#   31.06 / 34.12 -> 26.31 / 29.56 per MFMA; without sp 350 / 420, softcap 424 / 470).
# - dK/dV d128, iterative-ilp: 440 / 355 / 431 -> 417 / 332 / 417 (llama the same, 3 waves;
#   coexec 418 / 323 / 418 at 2).
# - dK/dV d192, iterative-ilp with sp: 432 / 361 / 456 -> 377 / 291 / 387 (without sp 372 /
#   307 / 380).
# - dK/dV d256, iterative-ilp: 368 / 308 / 368 -> 325 / 276 / 315.
# - dQ d64, iterative-ilp: 483 / 687 -> 475 / 678 (gpt-oss 638 / 483 / 746 -> 613 / 437 / 701).
# - dQ d128, iterative-ilp with sp: 512 / 655 -> 441 / 525 (llama the same; without sp 456 /
#   519, max-ilp 475 / 597, coexec 495 / 632).
# - dQ d192, iterative-ilp: 608 / 707 -> 484 / 675.
# - dQ d256, iterative-ilp: 407 / 444 -> 365 / 440 (one wave either way: BELOW_FLOOR; 577 ->
#   720 VGPRs).
# - decode d64, max-ilp: 302 / 401 -> 286 / 368 (page256 304 / 406 -> 289 / 369; page16 at the
#   model problem 117 / 146 -> 118 / 140).
# Left off:
# - fwd d64: iterative-ilp with sp 432 / 548 -> 392 / 549, and gpt-oss went 3 -> 2 waves.
# - fwd d128: max-ilp with sp 717 / 850 -> 695 / 942.
# - fwd d192: every other scheduler took 4 -> 3 waves.
# - dK/dV d64: iterative-ilp took gpt-oss 285 / 232 / 289 -> 308 / 238 / 306 (4 -> 3 waves).
# - decode d128: iterative-ilp with so 326 / 409 -> 300 / 394, but page64's masked loop
#   went 411 -> 413.
# - decode d192: max-ilp 289 / 370 -> 276 / 377.
# - decode d256: iterative-ilp 277 / 307 -> 288 / 311.
# coexec compiled the same as the default at every decode entry, dK/dV d64, dQ d64 and dQ d256.
_GFX1250.update(
    {
        ("fwd", "d256"): replace(_GFX1250[("fwd", "d256")], sched=ILP, split_off=True),
        ("bwd_dkdv", "d128"): replace(_GFX1250[("bwd_dkdv", "d128")], sched=ILP),
        ("bwd_dkdv", "d192"): replace(_GFX1250[("bwd_dkdv", "d192")], sched=ILP, split_off=True),
        ("bwd_dkdv", "d256"): replace(_GFX1250[("bwd_dkdv", "d256")], sched=ILP),
        ("bwd_dq", "d64"): replace(_GFX1250[("bwd_dq", "d64")], sched=ILP),
        ("bwd_dq", "d128"): replace(_GFX1250[("bwd_dq", "d128")], sched=ILP, split_off=True),
        ("bwd_dq", "d192"): replace(_GFX1250[("bwd_dq", "d192")], sched=ILP),
        ("bwd_dq", "d256"): replace(_GFX1250[("bwd_dq", "d256")], sched=ILP),
        ("decode", "d64"): replace(_GFX1250[("decode", "d64")], sched=MAX_ILP),
    }
)

# The persistent grid (Config.persist) on the forward entries whose persistent kernel compiles
# as cleanly as the plain one at the model problem and under a window of 256 (VGPRs, spills,
# scratch, waves: plain -> persistent). Set: gfx942 d192 177 -> 230 and d256 219 -> 250 (no
# spill, 2 waves either way), gfx1250 d192 250 -> 307 (4 -> 3 waves) and d256 438 -> 484,
# sm90 d64, d128 and d192 (no spill, no scratch). Left off: every gfx950 entry (d64 156 ->
# 177 with 6 SGPR spills, d128 228 -> 256 with 1 and 268 at one wave windowed, d192 93 spills
# and 236 B of scratch, d256 7 spills and 32 B), gfx942 d64 and d128 (windowed: 37 and 2
# spills), gfx1250 d64 (windowed: 5 spills, 3 -> 2 waves) and d128 (75 spills, 228 B of
# scratch), sm90 d256 (16 B of scratch, 80 windowed). The rule was never timed: the plain grid
# is what every table was tuned and timed on
for _tab, _dcls in ((_GFX942, ("d192", "d256")), (_GFX1250, ("d192", "d256")),
                    (_SM90, ("d64", "d128", "d192"))):  # fmt: skip
    for _d in _dcls:
        _tab[("fwd", _d)] = replace(_tab[("fwd", _d)], persist=True)

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


def select(kind: str, head_dim: int, target=None, head_dim_v: int | None = None) -> Config:
    """The shipped config of ``kind`` (``fwd``, ``decode``, ``bwd_dkdv``, ``bwd_dq``) for a head
    dim (and v head dim) in ``target``'s table."""
    return table(target)[(kind, dclass(head_dim, head_dim_v))]


def num_cus(target) -> int:
    """CUs / SMs the split and persistent rules size grids by (``_target.num_cus``)."""
    return _num_cus(target)


#: dK/dV's window tile (``band_config``): the keys each warp keeps, per target (0: as shrunk).
#: A warp's 16x16 MFMAs read Q and dO from LDS once per trip whatever its keys, so 32 keys per
#: warp halve those reads per MFMA. gfx950, gpt-oss's window (127, 0), d64: 64 x 64 with 4
#: warps -> 32 x 64 with 2 warps: 235 -> 198 loop instructions per trip (14.69 -> 12.38 per
#: MFMA; masked trips 348 -> 271, 21.75 -> 16.94), 56.0 -> 45.7 instructions per key per wave
#: over a key block's trips; 2 waves per SIMD either way. gfx942: 32 x 64 x 4 -> 16 x 64 x 2,
#: 126.9 -> 101.9 per key per wave, 3 -> 2 waves. gfx1250 (wave32): 114.5 -> 118.4 and 4 -> 2
#: waves, so not there. 32 x 128 with 4 warps scored 10.75 / 15.19 per MFMA on gfx950 but with
#: no unmasked trip and 256 query rows per 128-key window: 59.6 per key per wave (passed over).
#: d128 (gfx950 32 x 64 x 4 -> 16 x 64 x 2) fell to one wave per SIMD: per head-dim class
BAND_WARP_KEYS = {"gfx950": {"d64": 32}, "gfx942": {"d64": 32}, "gfx1250": {}, "sm90": {}}


def band_warp_keys(target, dcls: str) -> int:
    """``BAND_WARP_KEYS`` of ``target`` (an untuned one reads gfx950's) and a head-dim class."""
    return _table_for(BAND_WARP_KEYS, target).get(dcls, 0)


def band_config(kind: str, cfg: Config, band: int | None, warp_keys: int = 0) -> Config:
    """``cfg`` shrunk so that a window of ``band`` keys per query (both bounds) is wider than a
    tile (``tile rows + tile keys <= band + 1``): then a tile's KV loop has unmasked interior
    trips and masks only at the window's edges (``common._segments``). The forward and dQ
    halve their query rows, dK/dV its keys per program, with the warps (each warp keeps its
    rows), down to one warp; None (no two-sided window) or a wide window: ``cfg`` itself.
    ``warp_keys`` (dK/dV): then halve the query rows per step with the warps until each warp
    holds that many keys (``BAND_WARP_KEYS``), down to 16 rows and one warp."""
    if band is None:
        return cfg
    c = cfg
    if kind in ("fwd", "bwd_dq"):
        while band + 1 < c.BM + c.BN and c.num_warps > 1 and c.BM > 16:
            c = replace(c, BM=c.BM // 2, num_warps=c.num_warps // 2, notes={})
    elif kind == "bwd_dkdv":
        while band + 1 < c.BN + c.BM and c.num_warps > 1 and c.BN > 16:
            c = replace(c, BN=c.BN // 2, num_warps=c.num_warps // 2, notes={})
        if c is not cfg:  # only a tile the window shrank
            while c.BN // c.num_warps < warp_keys and c.num_warps > 1 and c.BM > 16:
                c = replace(c, BM=c.BM // 2, num_warps=c.num_warps // 2, notes={})
    return c


#: per target: the field changes the tile of a problem with a left window bound takes, by
#: ``(kind, dclass, warps)``, ``warps`` those of the tile ``band_config`` left (each step of its
#: shrink halves them: one key per level). A left bound adds the KV loops that mask at the
#: window's edges (``common._segments``), whose per-lane bounds and masks the table's entry,
#: tuned without a window, has no room for: at some levels it spilled or lost a wave. Chosen
#: by ``model.window_search`` (``flydsl-kernels model attention --windows``), which compiles
#: each level at its narrowest window and at a wide one and takes the change with the fewest
#: loop instructions per MFMA that compiles clean at every window of the level;
#: ``model.check_tables`` compiles every level of every entry under a window
#: (Triton 3.9, the model problems; before: what the plain tile compiled to at that level).
#: gfx950: fwd d64 2 warps (gpt-oss's tile) Q's lane order off, 1 SGPR spill before (the
#: gpt-oss report case 11.81 / 15.81 -> 11.81 / 15.88, its sinks had hidden the spill); d128 2
#: warps K^T off (260 VGPRs, one wave), 1 warp 32 keys (298, 7 spills); d192 8, 4 and 2 warps
#: 32 keys (7 spills and 32 B of scratch, with a left bound alone 4 spills and 20 B; 324 VGPRs
#: and 3 spills; 304 and 1), 1 warp the 2-warp tile at 32 keys (38 SGPR spills; 32 keys alone
#: one wave); d256 1 warp LLVM's
#: default scheduler (300 VGPRs, one wave); dQ d128 2 warps the default scheduler (268, one
#: wave), 1 warp 16 keys (290); dQ d256 8 warps the default scheduler (41 spills, 152 B of
#: scratch), 4 and 2 coexec (292 and 308 VGPRs, one wave), 1 warp 16 keys (332). gfx942: dQ
#: d128 16 keys at every level (8 warps: 52 spills, 212 B of scratch), its 1-warp level the
#: 2-warp tile; dQ d256 (one wave allowed: ``model.BELOW_FLOOR``) 84 spills and 340 B of
#: scratch at 2 warps before; fwd d64 8 warps K's and V's descriptors in the loop (a left
#: bound alone: 2 SGPR spills), 4 warps iterative-ilp (269 VGPRs, a spill, one wave). sm90:
#: scratch (8 to 128 B) at its smallest tiles before. Decode under a window (gpt-oss's 128 keys,
#: Gemma's, Mistral's; ``model.decode_problems``: 1 to 16 queries, dense and paged caches,
#: sinks; no shrink: ``warps`` those of the tile grown for its rows), whose tables were tuned
#: without one: gfx950 d64 and d128 one wave, or at pages of 16 keys 37 to 43 SGPR spills,
#: gfx942 d64 13 spills, sm90 d128 and d256 16 to 32 B of scratch before; half the keys
#: (gfx942: iterative-ilp)
WINDOW_TILES: dict[str, dict[tuple[str, str, int], dict]] = {
    "gfx950": {
        ("fwd", "d64", 2): {"q_lanes": 0},
        ("fwd", "d128", 2): {"k_t": False, "kt_edge": False},
        ("fwd", "d128", 1): {"BN": 32},
        ("fwd", "d192", 8): {"BN": 32},
        ("fwd", "d192", 4): {"BN": 32},
        ("fwd", "d192", 2): {"BN": 32},
        ("fwd", "d192", 1): {"BM": 64, "BN": 32, "num_warps": 2},
        ("fwd", "d256", 1): {"sched": ""},
        ("bwd_dkdv", "d192", 1): {"sched": ""},
        ("bwd_dq", "d128", 2): {"sched": ""},
        ("bwd_dq", "d128", 1): {"BN": 16},
        ("bwd_dq", "d192", 1): {"BN": 32},
        ("bwd_dq", "d256", 8): {"sched": ""},
        ("bwd_dq", "d256", 4): {"sched": "coexec"},
        ("bwd_dq", "d256", 2): {"sched": "coexec"},
        ("bwd_dq", "d256", 1): {"BN": 16},
        ("decode", "d64", 1): {"BN": 64},
        ("decode", "d128", 1): {"BN": 32},
    },
    "gfx942": {
        ("fwd", "d64", 8): {"hoist_rsrc": ""},
        ("fwd", "d64", 4): {"sched": "iterative-ilp"},
        ("fwd", "d128", 1): {"BN": 16},
        ("fwd", "d256", 1): {"BN": 16},
        ("bwd_dkdv", "d256", 2): {"BN": 32, "num_warps": 4},
        ("bwd_dq", "d128", 8): {"BN": 16},
        ("bwd_dq", "d128", 4): {"BN": 16},
        ("bwd_dq", "d128", 2): {"BN": 16},
        ("bwd_dq", "d128", 1): {"BM": 64, "BN": 16, "num_warps": 2},
        ("bwd_dq", "d192", 1): {"BN": 16},
        ("bwd_dq", "d256", 2): {"BM": 128, "num_warps": 4},
        ("bwd_dq", "d256", 1): {"BM": 64, "BN": 16, "num_warps": 2},
        ("decode", "d64", 1): {"sched": "iterative-ilp"},
    },
    "gfx1250": {
        ("fwd", "d128", 2): {"waves_per_eu": 2},
        ("fwd", "d128", 1): {"BN": 32},
        ("fwd", "d256", 2): {"waves_per_eu": 2},
        ("fwd", "d256", 1): {"BN": 16},
        ("bwd_dq", "d64", 1): {"sched": ""},
        ("bwd_dq", "d128", 4): {"num_stages": 1},
        ("bwd_dq", "d128", 2): {"num_stages": 1},
        ("bwd_dq", "d128", 1): {"BN": 32, "num_stages": 1},
        ("bwd_dq", "d192", 2): {"BN": 32},
        ("bwd_dq", "d192", 1): {"BN": 32},
        ("bwd_dq", "d256", 1): {"split_off": False},
    },
    "sm90": {
        ("fwd", "d128", 1): {"BN": 32},
        ("fwd", "d256", 2): {"BN": 16},
        ("fwd", "d256", 1): {"BN": 16},
        ("bwd_dkdv", "d128", 1): {"BN": 32, "num_warps": 2},
        ("bwd_dq", "d64", 1): {"BN": 32},
        ("bwd_dq", "d128", 2): {"BN": 32},
        ("bwd_dq", "d128", 1): {"BN": 32},
        ("bwd_dq", "d192", 2): {"num_stages": 2},
        ("bwd_dq", "d256", 1): {"num_stages": 2},
        ("decode", "d128", 2): {"BN": 32},
        ("decode", "d256", 8): {"BN": 16},
    },
}


#: per target: the field changes a tile takes under a score term the table's entry was not
#: tuned with, by ``(kind, dclass, mod, warps)``: ``mod`` "alibi" (a slope per head and the
#: key-query distance in every score) or "softcap" (``cap * tanh(s / cap)``: an exp, a
#: reciprocal and their operands per score; ``tile_mod``), ``warps`` as in ``WINDOW_TILES``,
#: whose changes they go on top of under a window. Chosen by ``model.window_search`` at the
#: model problems with the term, with and without windows (``model.window_problems``). Before
#: (the table's tiles, Triton 3.9): gfx950 fwd d128 with ALiBi and no window 30 VGPR spills and
#: 124 B of scratch, its dQ d256 39 and 152 B, ALiBi or softcap under a window one wave at most
#: band levels; gfx1250 fwd d128 with softcap (Gemma 2 27B's: d128, window 4096) 82 spills and
#: 212 B, with ALiBi under a window 277 and 764 B; gfx942 fwd d64 with ALiBi 14 SGPR spills at
#: one warp; sm90 dK/dV d64 and dQ d256 scratch; decode with ALiBi (``model.decode_problems``):
#: gfx950 d64 and d128 one wave, sm90 d64 and d128 8 to 24 B of scratch. ALiBi and softcap are
#: off the report's cases: none of its figures moved
MOD_TILES: dict[str, dict[tuple[str, str, str, int], dict]] = {
    "gfx950": {
        ("bwd_dq", "d128", "alibi", 8): {"sched": ""},
        ("bwd_dq", "d128", "alibi", 4): {"sched": ""},
        ("bwd_dq", "d128", "alibi", 2): {"BM": 128, "num_warps": 4},
        ("bwd_dq", "d128", "alibi", 1): {"BM": 64, "num_warps": 2},
        ("bwd_dq", "d192", "alibi", 4): {"BM": 128, "num_warps": 8},
        ("bwd_dq", "d192", "alibi", 2): {"BN": 32},
        ("bwd_dq", "d256", "alibi", 8): {"sched": ""},
        ("bwd_dq", "d256", "alibi", 4): {"BM": 128, "num_warps": 8},
        ("bwd_dq", "d256", "alibi", 2): {"BN": 16},
        ("bwd_dq", "d64", "alibi", 4): {"BN": 32},
        ("bwd_dq", "d64", "alibi", 2): {"BN": 32},
        ("bwd_dq", "d64", "alibi", 1): {"BN": 32},
        ("fwd", "d128", "alibi", 8): {"BN": 32},
        ("fwd", "d128", "alibi", 4): {"BN": 32},
        ("fwd", "d128", "alibi", 2): {"BN": 32},
        ("fwd", "d128", "alibi", 1): {"BM": 64, "num_warps": 2},
        ("fwd", "d192", "alibi", 8): {"BN": 32},
        ("fwd", "d192", "alibi", 4): {"BM": 256, "num_warps": 8},
        ("fwd", "d192", "alibi", 2): {"BN": 16},
        ("fwd", "d192", "alibi", 1): {"BN": 16},
        ("fwd", "d256", "alibi", 4): {"waves_per_eu": 2},
        ("fwd", "d256", "alibi", 2): {"sched": ""},
        ("fwd", "d256", "alibi", 1): {"BN": 16},
        ("fwd", "d64", "alibi", 8): {"q_lanes": 0},
        ("fwd", "d64", "alibi", 1): {"sched": "max-ilp"},
        ("bwd_dkdv", "d128", "softcap", 1): {"BM": 16},
        ("bwd_dkdv", "d192", "softcap", 2): {"BM": 16},
        ("bwd_dkdv", "d192", "softcap", 1): {"BM": 16},
        ("bwd_dkdv", "d64", "softcap", 1): {"sched": ""},
        ("bwd_dq", "d128", "softcap", 2): {"BN": 16},
        ("bwd_dq", "d192", "softcap", 2): {"BM": 64, "num_warps": 4},
        ("bwd_dq", "d256", "softcap", 2): {"sched": "max-ilp"},
        ("fwd", "d128", "softcap", 8): {"split_off": False},
        ("fwd", "d128", "softcap", 4): {"hoist_rsrc": ""},
        ("fwd", "d128", "softcap", 2): {"sched": "iterative-ilp"},
        ("fwd", "d256", "softcap", 2): {"BM": 64, "num_warps": 4},
        ("fwd", "d64", "softcap", 2): {"hoist_rsrc": ""},
        ("decode", "d64", "alibi", 4): {"BN": 64},
        ("decode", "d64", "alibi", 1): {"BN": 64},
        ("decode", "d128", "alibi", 1): {"BN": 32},
    },
    "gfx942": {
        ("bwd_dq", "d128", "alibi", 8): {"BN": 16},
        ("bwd_dq", "d128", "alibi", 2): {"BM": 128, "num_warps": 4},
        ("bwd_dq", "d128", "alibi", 1): {"BM": 128, "num_warps": 4},
        ("bwd_dq", "d192", "alibi", 2): {"BM": 64, "num_warps": 4},
        ("bwd_dq", "d256", "alibi", 4): {"BN": 16},
        ("bwd_dq", "d256", "alibi", 2): {"BN": 16},
        ("bwd_dq", "d256", "alibi", 1): {"BM": 128, "num_warps": 4},
        ("fwd", "d256", "alibi", 2): {"BM": 64, "num_warps": 4},
        ("fwd", "d64", "alibi", 8): {"BN": 32},
        ("fwd", "d64", "alibi", 4): {"waves_per_eu": 2},
        ("fwd", "d64", "alibi", 2): {"BN": 32},
        ("fwd", "d64", "alibi", 1): {"BN": 32},
        ("bwd_dq", "d128", "softcap", 8): {"BN": 16},
        ("bwd_dq", "d128", "softcap", 1): {"waves_per_eu": 2},
        ("bwd_dq", "d192", "softcap", 2): {"BM": 64, "num_warps": 4},
        ("bwd_dq", "d256", "softcap", 4): {"BN": 16},
        ("bwd_dq", "d256", "softcap", 2): {"BN": 16},
        ("fwd", "d256", "softcap", 2): {"BM": 64, "num_warps": 4},
    },
    "gfx1250": {
        ("bwd_dq", "d128", "alibi", 8): {"sched": ""},
        ("bwd_dq", "d128", "alibi", 2): {"BM": 64, "num_warps": 4},
        ("bwd_dq", "d192", "alibi", 8): {"BN": 32},
        ("bwd_dq", "d192", "alibi", 4): {"BN": 32},
        ("bwd_dq", "d64", "alibi", 1): {"BN": 32},
        ("fwd", "d128", "alibi", 2): {"BN": 32},
        ("bwd_dq", "d128", "softcap", 4): {"BN": 32},
        ("bwd_dq", "d128", "softcap", 2): {"BN": 32},
        ("bwd_dq", "d192", "softcap", 8): {"BN": 32},
        ("bwd_dq", "d192", "softcap", 4): {"BN": 32},
        ("bwd_dq", "d192", "softcap", 1): {"BM": 32, "num_warps": 2},
        ("bwd_dq", "d64", "softcap", 4): {"waves_per_eu": 2},
        ("bwd_dq", "d64", "softcap", 2): {"BN": 32},
        ("fwd", "d128", "softcap", 8): {"BN": 32},
        ("fwd", "d128", "softcap", 4): {"BN": 32},
        ("fwd", "d128", "softcap", 2): {"BN": 32},
        ("fwd", "d128", "softcap", 1): {"sched": ""},
        ("fwd", "d256", "softcap", 2): {"BM": 64, "num_warps": 4},
    },
    "sm90": {
        ("bwd_dkdv", "d64", "alibi", 1): {"BM": 16},
        # the window's 32 keys over 4 warps (tried by hand: the search's candidates had the 2-
        # and 4-warp levels' tiles, 40 and 56 B of scratch): clean
        ("bwd_dkdv", "d128", "alibi", 1): {"num_warps": 4},
        ("bwd_dq", "d256", "alibi", 4): {"num_stages": 2},
        ("bwd_dkdv", "d192", "softcap", 4): {"num_stages": 2},
        ("bwd_dkdv", "d64", "softcap", 1): {"BM": 16},
        ("decode", "d64", "alibi", 2): {"lane_sums": True},
        ("decode", "d128", "alibi", 2): {"num_stages": 1, "BN": 16},
    },
}


#: per target: the field changes the prefill forward's tile takes over a paged KV cache
#: (``flash_attn_with_kvcache`` with many queries: chunked prefill), by ``(kind, dclass, mod,
#: warps, left)``: ``mod`` and ``warps`` as in ``MOD_TILES`` (``mod`` "" without a score
#: term), ``left`` whether the window has a left bound (a tile without one takes only what it
#: needs: most compiled clean with the table's tile), on top of the
#: ``WINDOW_TILES`` and ``MOD_TILES`` changes; the plan then caps the key tile at the page
#: again (``plan.plan_forward``). A page's id is a scalar per tile (or a vector of them where
#: a tile spans pages) that each KV loop carries beside the dense tile's offsets. Chosen by
#: ``model.window_search`` (``--windows --paged``) at pages of ``model.PAGES`` keys, with and
#: without windows. Before (Triton 3.9, the table's tiles with the window's shrink alone):
#: gfx950 fwd d128 at pages of 64 keys or more 1 to 55 SGPR spills under a window, with ALiBi
#: and no window 31 spills and 100 B of scratch, under a window up to 244 and 564 B; with
#: softcap 12 and 28 B; gfx942 d64 4 to 13 SGPR spills, gfx1250 d64 and d128 3 to 55, sm90
#: 24 to 248 B of scratch under narrow windows. With the window's and the score term's changes
#: as well, 126 of the 1264 kernels of those problems (4 targets, pages of 16 to 256, every
#: level, with and without ALiBi and softcap) still fell short; with these, none
PAGED_TILES: dict[str, dict[tuple[str, str, str, int, bool], dict]] = {
    "gfx950": {
        ("fwd", "d64", "", 8, True): {"BN": 32},
        ("fwd", "d64", "", 4, True): {"BN": 32},
        ("fwd", "d64", "", 2, True): {"BN": 32},
        ("fwd", "d64", "", 1, True): {"lane_sums": False},
        ("fwd", "d64", "alibi", 8, True): {"sched": "iterative-ilp"},
        ("fwd", "d64", "alibi", 4, True): {"sched": "iterative-ilp"},
        ("fwd", "d64", "alibi", 2, True): {"BN": 32},
        ("fwd", "d64", "alibi", 1, True): {"waves_per_eu": 2},
        ("fwd", "d64", "softcap", 8, True): {"sched": "iterative-ilp"},
        ("fwd", "d64", "softcap", 4, True): {"sched": "iterative-ilp"},
        ("fwd", "d64", "softcap", 2, True): {"sched": "iterative-ilp"},
        ("fwd", "d64", "softcap", 1, True): {"sched": "iterative-ilp"},
        ("fwd", "d128", "", 8, True): {"BN": 32},
        ("fwd", "d128", "", 4, True): {"BN": 32},
        ("fwd", "d128", "", 2, True): {"BN": 32},
        ("fwd", "d128", "alibi", 2, True): {"BM": 128, "num_warps": 4},
        ("fwd", "d128", "alibi", 1, True): {"BM": 128, "num_warps": 4},
        ("fwd", "d128", "softcap", 8, True): {"BN": 32},
        ("fwd", "d128", "softcap", 4, True): {"BN": 32},
        ("fwd", "d128", "softcap", 2, True): {"BN": 32},
        ("fwd", "d192", "alibi", 8, True): {"lane_sums": False},
        ("fwd", "d192", "alibi", 8, False): {"lane_sums": False},
        ("fwd", "d192", "alibi", 4, True): {"lane_sums": False},
        ("fwd", "d192", "softcap", 8, False): {"sched": "iterative-ilp"},
        ("fwd", "d256", "", 2, True): {"BM": 64, "num_warps": 4},
        ("fwd", "d256", "", 1, True): {"BM": 32, "num_warps": 2},
        ("fwd", "d256", "alibi", 4, True): {"BM": 128, "num_warps": 8},
        ("fwd", "d256", "softcap", 1, True): {"BM": 32, "num_warps": 2},
    },
    "gfx942": {
        ("fwd", "d64", "", 8, True): {"sched": "iterative-ilp"},
        # without a window too: 1 SGPR spill over pages of 256 at the 2026-12-05 full check
        ("fwd", "d64", "", 8, False): {"sched": "iterative-ilp"},
        ("fwd", "d64", "", 1, True): {"BM": 64, "num_warps": 2},
        ("fwd", "d64", "softcap", 2, True): {"sched": "iterative-ilp"},
        ("fwd", "d64", "softcap", 1, True): {"waves_per_eu": 2},
        ("fwd", "d256", "", 2, True): {"BM": 64, "num_warps": 4},
    },
    "gfx1250": {
        ("fwd", "d64", "", 4, True): {"BM": 256, "num_warps": 8},
        ("fwd", "d64", "", 2, True): {"BN": 32},
        ("fwd", "d64", "", 1, True): {"BN": 32},
        ("fwd", "d64", "alibi", 4, True): {"sched": "iterative-ilp"},
        ("fwd", "d64", "alibi", 2, True): {"sched": "iterative-ilp"},
        ("fwd", "d64", "alibi", 1, True): {"sched": "iterative-ilp"},
        ("fwd", "d64", "softcap", 4, True): {"BM": 256, "num_warps": 8},
        ("fwd", "d64", "softcap", 2, True): {"sched": "iterative-ilp"},
        ("fwd", "d64", "softcap", 1, True): {"BN": 32},
        ("fwd", "d128", "", 4, True): {"BM": 256, "num_warps": 8},
        ("fwd", "d128", "", 2, True): {"BN": 32},
        ("fwd", "d128", "alibi", 4, True): {"BN": 32},
        ("fwd", "d256", "alibi", 2, True): {"BM": 64, "num_warps": 4},
    },
    "sm90": {
        ("fwd", "d64", "", 1, True): {"BN": 32},
        ("fwd", "d64", "alibi", 1, True): {"BN": 32},
        ("fwd", "d64", "softcap", 1, True): {"BN": 32},
        ("fwd", "d128", "", 2, True): {"BN": 32},
        ("fwd", "d128", "", 1, True): {"BM": 32, "num_warps": 2},
        ("fwd", "d128", "alibi", 2, True): {"BN": 32},
        ("fwd", "d128", "alibi", 1, True): {"BM": 32, "num_warps": 2},
        ("fwd", "d128", "softcap", 2, True): {"BN": 32},
        ("fwd", "d128", "softcap", 1, True): {"BM": 32, "num_warps": 2},
        ("fwd", "d192", "", 1, True): {"BN": 16},
        ("fwd", "d192", "alibi", 1, True): {"BM": 32, "num_warps": 2},
        ("fwd", "d192", "softcap", 1, True): {"BM": 32, "num_warps": 2},
        ("fwd", "d256", "", 1, True): {"BM": 32, "num_warps": 2},
        ("fwd", "d256", "alibi", 1, True): {"BM": 32, "num_warps": 2},
        ("fwd", "d256", "softcap", 1, True): {"BM": 32, "num_warps": 2},
    },
}


#: per target: the field changes the tile of a problem with fp32 operands takes
#: (flex_attention's and ``flash_attn_func``'s fp32 inputs: IEEE products, twice the registers
#: and LDS per operand of the 16-bit ones the tables were tuned for), by ``(kind, dclass, score
#: term, warps, left)``: ``warps`` those of ``plan.fp32_tiles``' tile (half the keys) after the
#: window's shrink (a decode tile's: as grown for its rows), ``left`` whether the window has a
#: left bound (a tile without one takes only what it needs). A score term's (``tile_mod``)
#: changes go on top of the level's plain ones (``""``). Chosen by ``model.window_search``
#: (``--windows --fp32``) at the model problems in fp32, with and without windows, which
#: ``model.check_tables`` compiles too, holding them to no spill or scratch and one wave per
#: SIMD (``model.FP32_FLOOR``; the search takes two where a change reaches it). Before (Triton
#: 3.9, ``plan.fp32_tiles``' tile with the window's shrink alone), 264 of the 701 fp32
#: problems fell short: gfx950 63 (25 spilling, up to 276 VGPR spills and 812 B of scratch:
#: dQ d256; fwd d192 59 spills and 240 B at the model problem), gfx942 66 (28 spilling, dQ
#: d256 up to 433 spills and 928 B), gfx1250 40 (15, up to 156 B), sm90 95 (every one
#: spilling: fwd d128 7136 B of scratch at the model problem, dQ d256 15896 B), the others one
#: wave per SIMD where a change reaches two. With ALiBi or softcap (``--mod``; searched and
#: checked at every level: ``model.fp32_levels``) on the plain changes alone, 13 of the 96
#: causal model problems fell short (gfx950 fwd d192 with ALiBi 100 spills and 364 B of
#: scratch, with softcap 20 B; gfx1250 dQ d192 with ALiBi 36 spills and 148 B, dK/dV d128 and
#: d256 12 to 40 B; sm90 fwd d128 272 B, dQ d192 with ALiBi 440 B; gfx942 dK/dV d256 7 and 8
#: spills into AGPRs), and sm90's d64 dK/dV with ALiBi not causal 24 B. The search on top of
#: the shipped changes (``model.window_search``) then mended plain fp32 levels too: sm90's fwd
#: d128 at 4 warps without a window (272 B before), at 2 warps (232 B) and, by hand, at 4
#: warps under a left bound (264 B), and its dQ d192 at 4 warps (608 B windowed, 32 B without).
#: Under windows with a score term (the plain changes alone), 33 of the 442 problems: gfx950 5
#: (fwd d256 with ALiBi 40 B), gfx942 7 (fwd d256 92 B; dK/dV d256 spills into AGPRs, kept:
#: ``model.FP32_SHORTFALLS``), gfx1250 5 (up to 28 B), sm90 16 (up to 408 B). Decode with
#: ALiBi or softcap (``model.decode_problems``, 768 kernels on the plain changes alone): 10
#: fell short (gfx942 d256 with ALiBi 18 spills and 72 B, with softcap 8 B; sm90 d64 8 B, d128
#: with ALiBi 32 B, d256 24 B), and four levels took one wave where a change reaches two
FP32_TILES: dict[str, dict[tuple[str, str, str, int, bool], dict]] = {
    "gfx950": {
        ("fwd", "d128", "", 8, True): {"BM": 128, "nonkdim": 16},
        ("fwd", "d128", "", 2, True): {"k_t": False, "kt_edge": False},
        ("fwd", "d128", "", 1, True): {"num_warps": 2},
        ("fwd", "d192", "", 8, True): {"BM": 128, "nonkdim": 16, "BN": 16},
        ("fwd", "d192", "", 8, False): {"lane_sums": False},
        ("fwd", "d192", "", 4, True): {"BM": 64, "nonkdim": 16},
        ("fwd", "d192", "", 2, True): {"num_warps": 4, "nonkdim": 16},
        ("fwd", "d192", "", 1, True): {"BN": 16},
        ("fwd", "d256", "", 8, True): {"k_t": False, "kt_edge": False},
        ("fwd", "d256", "", 4, True): {"num_warps": 8},
        ("fwd", "d256", "", 2, True): {"num_warps": 4, "k_t": False, "kt_edge": False},
        ("decode", "d256", "", 8, True): {"lane_sums": True},
        ("decode", "d256", "", 8, False): {"lane_sums": True},
        ("decode", "d256", "", 2, True): {"num_warps": 4, "lane_sums": True},
        ("decode", "d256", "", 2, False): {"num_warps": 4},
        ("decode", "d128", "alibi", 1, True): {"BN": 16},
        ("bwd_dkdv", "d192", "", 2, True): {"BN": 32, "num_warps": 4},
        ("bwd_dq", "d128", "", 8, True): {"BM": 128, "nonkdim": 16},
        ("bwd_dq", "d128", "", 8, False): {"BM": 128, "nonkdim": 16},
        ("bwd_dq", "d128", "", 4, True): {"BM": 64, "nonkdim": 16},
        ("bwd_dq", "d128", "", 2, True): {"BM": 32, "nonkdim": 16},
        ("bwd_dq", "d128", "", 1, True): {"num_warps": 2, "nonkdim": 16},
        ("bwd_dq", "d192", "", 8, True): {"BN": 16},
        ("bwd_dq", "d192", "", 8, False): {"BN": 16},
        ("bwd_dq", "d192", "", 4, True): {"BN": 16},
        ("bwd_dq", "d192", "", 2, True): {"BN": 16, "BM": 64, "num_warps": 4},
        ("bwd_dq", "d192", "", 1, True): {"BN": 16, "num_warps": 2},
        ("bwd_dq", "d256", "", 8, True): {"BM": 64, "num_warps": 4},
        ("bwd_dq", "d256", "", 8, False): {"BM": 64, "num_warps": 4},
        ("fwd", "d192", "alibi", 8, False): {"BM": 128, "nonkdim": 16, "lane_sums": True},
        ("fwd", "d192", "softcap", 8, False): {"BM": 128, "nonkdim": 16, "BN": 16},
        # a score term under a left bound (before: the level's plain fp32 changes alone;
        # the worst problem's)
        ("fwd", "d192", "alibi", 4, True): {"BM": 128, "num_warps": 8},  # two waves (one)
        ("fwd", "d192", "alibi", 2, True): {"BM": 128, "num_warps": 8},  # two waves (one)
        ("fwd", "d192", "alibi", 1, True): {"BM": 16, "nonkdim": 16, "num_warps": 2},  # 1 spill
        ("fwd", "d256", "alibi", 8, True): {"BM": 64, "num_warps": 4, "lane_sums": False},  # 40 B
        ("fwd", "d256", "softcap", 8, True): {"BM": 64, "num_warps": 4},  # 16 B
        ("bwd_dkdv", "d192", "alibi", 2, True): {"BM": 16},  # 7 SGPR spills
    },
    "gfx942": {
        ("fwd", "d128", "", 4, True): {"BM": 64, "nonkdim": 16},
        ("fwd", "d128", "", 4, False): {"BM": 64, "nonkdim": 16},
        ("fwd", "d128", "", 2, True): {"BM": 32, "nonkdim": 16},
        ("fwd", "d128", "", 1, True): {"BM": 16, "nonkdim": 16},
        ("fwd", "d256", "", 8, True): {"BM": 64, "num_warps": 4},
        ("fwd", "d256", "", 8, False): {"BM": 64, "num_warps": 4},
        ("fwd", "d256", "", 4, True): {"num_warps": 8},
        ("fwd", "d256", "", 2, True): {"num_warps": 4, "waves_per_eu": 2},
        ("decode", "d256", "", 8, False): {"sched": "max-ilp"},
        ("decode", "d256", "", 2, True): {"num_warps": 4},
        ("decode", "d256", "", 2, False): {"num_warps": 4},
        ("decode", "d128", "alibi", 1, True): {"lane_sums": False},
        ("decode", "d256", "alibi", 8, True): {"sched": "iterative-ilp"},
        ("decode", "d256", "softcap", 8, True): {"sched": "iterative-ilp"},
        ("bwd_dkdv", "d128", "", 2, True): {"BN": 32, "num_warps": 4},
        ("bwd_dkdv", "d256", "", 4, True): {"sched": "iterative-ilp"},
        ("bwd_dq", "d64", "", 1, True): {"BM": 64, "num_warps": 2},
        ("bwd_dq", "d128", "", 8, True): {"BM": 128, "nonkdim": 16},
        ("bwd_dq", "d128", "", 8, False): {"BM": 128, "nonkdim": 16},
        ("bwd_dq", "d128", "", 4, True): {"BM": 64, "nonkdim": 16},
        ("bwd_dq", "d128", "", 2, True): {"BM": 32, "nonkdim": 16},
        ("bwd_dq", "d128", "", 1, True): {"num_warps": 2, "nonkdim": 16},
        ("bwd_dq", "d192", "", 4, True): {"num_warps": 8},
        ("bwd_dq", "d192", "", 4, False): {"num_warps": 8},
        ("bwd_dq", "d256", "", 4, True): {"BM": 64, "nonkdim": 16},
        ("bwd_dq", "d256", "", 4, False): {"BM": 64, "nonkdim": 16},
        ("bwd_dq", "d256", "", 2, True): {"BM": 32, "nonkdim": 16},
        ("bwd_dq", "d256", "", 1, True): {"num_warps": 2, "nonkdim": 16},
        ("bwd_dkdv", "d256", "alibi", 4, False): {"bwd_loads": "view"},
        ("bwd_dkdv", "d256", "softcap", 4, False): {"sched": "max-ilp"},
        ("bwd_dkdv", "d256", "alibi", 4, True): {"sched": "max-ilp"},  # 11 spills, no scratch
        ("fwd", "d256", "alibi", 4, True): {"hoist_rsrc": ""},  # 1 spill, 8 B
        ("fwd", "d256", "alibi", 2, True): {"num_warps": 8},  # 28 spills, 92 B
        ("fwd", "d256", "softcap", 8, True): {"num_warps": 8},  # two waves (one)
        ("fwd", "d256", "softcap", 2, True): {"BM": 64, "num_warps": 8},  # 22 spills, 92 B
    },
    "gfx1250": {
        ("fwd", "d128", "", 8, True): {"BN": 16},
        ("fwd", "d128", "", 8, False): {"BM": 128, "num_warps": 4},
        ("fwd", "d128", "", 4, True): {"BN": 16},
        ("fwd", "d128", "", 2, True): {"BN": 16},
        ("fwd", "d128", "", 1, True): {"BN": 16},
        ("fwd", "d256", "", 8, True): {"lane_sums": True},
        ("fwd", "d256", "", 8, False): {"lane_sums": True},
        ("fwd", "d256", "", 4, True): {"num_warps": 8},
        ("fwd", "d256", "", 2, True): {"num_warps": 4},
        ("fwd", "d256", "", 1, True): {"num_warps": 2},
        ("decode", "d256", "", 2, True): {"num_warps": 4},
        ("decode", "d256", "alibi", 2, False): {"num_warps": 4},
        ("decode", "d256", "softcap", 2, False): {"num_warps": 4},
        ("bwd_dkdv", "d128", "", 2, True): {"BN": 32, "num_warps": 4},
        ("bwd_dkdv", "d192", "", 8, True): {"BM": 16},
        ("bwd_dkdv", "d192", "", 8, False): {"BM": 16},
        ("bwd_dkdv", "d192", "", 4, True): {"BM": 16},
        ("bwd_dkdv", "d192", "", 2, True): {"BM": 16},
        ("bwd_dkdv", "d256", "", 4, True): {"BN": 32, "num_warps": 8},
        ("bwd_dq", "d128", "", 4, True): {"num_stages": 1},
        ("bwd_dq", "d128", "", 2, True): {"BN": 16},
        ("bwd_dq", "d128", "", 1, True): {"BN": 16, "BM": 32, "num_warps": 2},
        ("bwd_dq", "d192", "", 8, True): {"BM": 64, "num_warps": 4, "BN": 16},
        ("bwd_dq", "d192", "", 4, True): {"BN": 16},
        ("bwd_dq", "d192", "", 2, True): {"BN": 16},
        ("bwd_dq", "d192", "", 1, True): {"BN": 16, "num_warps": 2},
        ("bwd_dkdv", "d128", "alibi", 8, False): {"BN": 32, "num_warps": 4},
        ("bwd_dkdv", "d128", "softcap", 8, False): {"BM": 16},
        ("bwd_dkdv", "d256", "alibi", 8, False): {"hoist_rsrc": ""},
        ("bwd_dkdv", "d256", "softcap", 8, False): {"sched": "max-ilp"},
        ("bwd_dq", "d192", "alibi", 8, False): {"BM": 64, "num_warps": 4, "BN": 16},
        # a score term under a left bound (the worst problem's, on the plain changes alone)
        ("fwd", "d256", "alibi", 8, True): {"sched": "iterative-ilp"},  # 1 spill, 8 B
        ("bwd_dkdv", "d128", "alibi", 8, True): {"BN": 32, "num_warps": 4},  # 2 spills, 12 B
        ("bwd_dkdv", "d256", "softcap", 8, True): {"sched": "max-ilp"},  # 6 spills, 28 B
        ("bwd_dkdv", "d256", "softcap", 4, True): {"sched": "max-ilp"},  # 6 spills, 28 B
    },
    "sm90": {
        ("fwd", "d64", "", 8, True): {"BN": 16, "BM": 64, "num_warps": 4},
        ("fwd", "d64", "", 8, False): {"BN": 16, "BM": 64, "num_warps": 4},
        ("fwd", "d64", "", 4, True): {"BN": 16},
        ("fwd", "d64", "", 2, True): {"BN": 16},
        ("fwd", "d64", "", 1, True): {"BN": 16},
        # a stage fewer and twice the warps on the search's least-scratch pick (280 B), tried
        # by hand (the search tries pairs, not triples): clean, 24 warps per SM
        ("fwd", "d128", "", 4, True): {"BN": 16, "num_warps": 8, "BM": 32, "num_stages": 1},
        ("fwd", "d128", "", 4, False): {"BN": 16, "num_warps": 8, "lane_sums": True},
        ("fwd", "d128", "", 2, True): {"num_warps": 8, "BN": 16},
        ("fwd", "d128", "", 1, True): {"num_warps": 2, "BN": 16},
        ("fwd", "d192", "", 4, True): {"num_warps": 8, "lane_sums": True},
        ("fwd", "d192", "", 4, False): {"num_warps": 8, "num_stages": 1},
        ("fwd", "d192", "", 2, True): {"num_warps": 4, "num_stages": 1},
        ("fwd", "d192", "", 1, True): {"num_warps": 2, "lane_sums": True},
        ("fwd", "d256", "", 4, True): {"num_warps": 8},
        ("fwd", "d256", "", 4, False): {"num_warps": 8},
        ("fwd", "d256", "", 2, True): {"num_warps": 4},
        ("fwd", "d256", "", 1, True): {"num_warps": 2},
        ("decode", "d64", "", 8, True): {"lane_sums": True},
        ("decode", "d64", "", 8, False): {"num_stages": 2},
        ("decode", "d64", "", 2, True): {"num_stages": 2},
        ("decode", "d128", "", 8, True): {"BN": 16, "lane_sums": True},
        ("decode", "d128", "", 8, False): {"BN": 16, "num_stages": 1},
        ("decode", "d128", "", 2, True): {"num_warps": 4, "num_stages": 1},
        ("decode", "d128", "", 2, False): {"num_warps": 4, "BN": 16},
        ("decode", "d64", "alibi", 2, False): {"lane_sums": True},
        ("decode", "d64", "softcap", 8, False): {"lane_sums": True},
        ("decode", "d128", "alibi", 2, True): {"lane_sums": True},
        ("decode", "d256", "alibi", 8, True): {"num_stages": 2},
        ("bwd_dkdv", "d64", "", 4, True): {"BM": 16},
        ("bwd_dkdv", "d64", "", 4, False): {"BM": 16},
        ("bwd_dkdv", "d64", "", 2, True): {"BM": 16},
        ("bwd_dkdv", "d128", "", 4, True): {"num_warps": 8},
        ("bwd_dkdv", "d128", "", 4, False): {"num_warps": 8},
        ("bwd_dkdv", "d192", "", 8, True): {"num_stages": 2},
        ("bwd_dkdv", "d192", "", 8, False): {"num_stages": 2},
        ("bwd_dq", "d64", "", 4, True): {"BN": 16},
        ("bwd_dq", "d64", "", 4, False): {"BN": 16},
        ("bwd_dq", "d64", "", 2, True): {"num_warps": 4},
        ("bwd_dq", "d64", "", 1, True): {"BN": 16},
        ("bwd_dq", "d128", "", 4, True): {"num_warps": 8, "BN": 16},
        ("bwd_dq", "d128", "", 4, False): {"BN": 16, "num_warps": 8},
        ("bwd_dq", "d128", "", 2, True): {"num_warps": 4, "BN": 16},
        ("bwd_dq", "d128", "", 1, True): {"BN": 16, "num_warps": 2},
        ("bwd_dq", "d192", "", 4, True): {"num_warps": 4, "num_stages": 2, "BM": 32},
        ("bwd_dq", "d192", "", 4, False): {"num_warps": 4, "num_stages": 2, "BM": 32},
        ("bwd_dq", "d192", "", 2, True): {"num_warps": 4, "num_stages": 2},
        ("bwd_dq", "d192", "", 1, True): {"num_warps": 2, "num_stages": 2},
        ("bwd_dq", "d256", "", 4, True): {"num_warps": 8, "num_stages": 2},
        ("bwd_dq", "d256", "", 4, False): {"num_warps": 8, "num_stages": 2},
        ("bwd_dq", "d256", "", 2, True): {"num_warps": 4, "num_stages": 2},
        ("bwd_dq", "d256", "", 1, True): {"num_warps": 2, "num_stages": 2},
        ("bwd_dkdv", "d64", "alibi", 4, False): {"num_warps": 8},
        # a score term under a left bound (before: the level's plain fp32 changes alone)
        ("fwd", "d128", "alibi", 1, True): {"lane_sums": True},  # 272 B
        ("fwd", "d128", "softcap", 1, True): {"lane_sums": True},  # 256 B
        ("fwd", "d192", "alibi", 4, True): {"num_stages": 1},  # 280 B
        ("fwd", "d192", "softcap", 4, True): {"num_stages": 1},  # 272 B
        ("bwd_dkdv", "d64", "alibi", 4, True): {"num_warps": 8},  # 16 B
        ("bwd_dkdv", "d64", "alibi", 2, True): {"num_warps": 4},  # 16 B
        ("bwd_dkdv", "d64", "softcap", 2, True): {"num_warps": 4},  # 32 B
        ("bwd_dq", "d64", "alibi", 4, True): {"num_warps": 8},  # 16 B
        # 32 rows over the plain change's 8 warps, found by hand (the search's singles and
        # pairs kept 312 B or more): clean, 24 warps per SM
        ("bwd_dq", "d128", "softcap", 4, True): {"BM": 32},  # 320 B
        ("bwd_dq", "d128", "softcap", 2, True): {"num_warps": 8},  # 312 B
        ("bwd_dq", "d192", "softcap", 1, True): {"num_warps": 4},  # 408 B
    },
}


#: per target: the field changes the tile of an fp32 prefill forward over a paged KV cache
#: takes (``flash_attn_with_kvcache`` with many fp32 queries), by ``PAGED_TILES``' key, on top
#: of the ``FP32_TILES`` ones (``PAGED_TILES``' were chosen for 16-bit operands); the plan then
#: caps the key tile at the page again. Chosen by ``model.window_search`` (``--windows --paged
#: --fp32 [--mod alibi|softcap]``) at pages of ``model.PAGES`` keys, with and without windows,
#: held to no spill or scratch and, where a change reaches it, two waves (``model.FP32_FLOOR``).
#: Before (Triton 3.9, the ``FP32_TILES`` changes alone), 140 of the 1296 kernels of those
#: problems (4 targets, every level, plain, with ALiBi and with softcap) fell short at one
#: wave: gfx950 25 (fwd d192 without a window up to 304 B of scratch, d128 with ALiBi 92 B),
#: gfx942 31 (d256 up to 64 B), gfx1250 9 (d256 with softcap 28 B), sm90 75 (d192 up to 280 B,
#: d256 at every level up to 1232 B: its fp32 tiles' two stages)
FP32_PAGED_TILES: dict[str, dict[tuple[str, str, str, int, bool], dict]] = {
    "gfx950": {
        ("fwd", "d128", "", 8, False): {"lane_sums": False},
        ("fwd", "d128", "", 4, True): {"num_warps": 8},
        ("fwd", "d128", "", 2, True): {"BM": 32, "nonkdim": 16},
        ("fwd", "d128", "", 1, True): {"lane_sums": False},
        ("fwd", "d128", "alibi", 8, False): {"BM": 128, "nonkdim": 16},
        ("fwd", "d128", "alibi", 4, True): {"BM": 64, "nonkdim": 16},
        ("fwd", "d128", "alibi", 2, True): {"BM": 32, "nonkdim": 16},
        ("fwd", "d128", "alibi", 1, True): {"nonkdim": 16},
        ("fwd", "d128", "softcap", 8, False): {"lane_sums": False},
        ("fwd", "d128", "softcap", 4, True): {"num_warps": 8},
        ("fwd", "d128", "softcap", 2, True): {"BM": 32, "nonkdim": 16},
        ("fwd", "d128", "softcap", 1, True): {"lane_sums": False},
        ("fwd", "d192", "", 8, False): {"BM": 128, "nonkdim": 16, "lane_sums": True},
        ("fwd", "d192", "", 1, True): {"BM": 16, "nonkdim": 16, "lane_sums": False},
        ("fwd", "d192", "softcap", 1, True): {"BM": 16, "nonkdim": 16, "lane_sums": False},
        ("fwd", "d256", "alibi", 8, True): {"lane_sums": True, "num_warps": 8},
        ("fwd", "d256", "alibi", 8, False): {"hoist_rsrc": ""},
        ("fwd", "d256", "softcap", 8, True): {"num_warps": 8},
    },
    "gfx942": {
        ("fwd", "d64", "alibi", 1, True): {"BM": 64, "num_warps": 2},
        ("fwd", "d192", "alibi", 2, True): {"BM": 64, "num_warps": 4},
        ("fwd", "d256", "", 8, False): {"lane_sums": True, "num_warps": 8},
        ("fwd", "d256", "", 4, True): {"sched": "iterative-ilp"},
        ("fwd", "d256", "", 2, True): {"num_warps": 8},
        ("fwd", "d256", "alibi", 4, True): {"sched": "iterative-ilp"},
        ("fwd", "d256", "alibi", 1, True): {"lane_sums": True},
        ("fwd", "d256", "softcap", 8, True): {"sched": "iterative-ilp"},
        ("fwd", "d256", "softcap", 8, False): {"lane_sums": True, "num_warps": 8},
        ("fwd", "d256", "softcap", 4, True): {"sched": "iterative-ilp"},
        ("fwd", "d256", "softcap", 2, True): {"BM": 32, "num_warps": 4},
        ("fwd", "d256", "softcap", 1, True): {"lane_sums": True},
    },
    "gfx1250": {
        ("fwd", "d128", "", 1, True): {"BM": 64, "num_warps": 2},
        ("fwd", "d128", "alibi", 8, False): {"BM": 256, "num_warps": 8},
        ("fwd", "d128", "alibi", 1, True): {"BM": 64, "num_warps": 2},
        ("fwd", "d128", "softcap", 8, False): {"BN": 16},
        ("fwd", "d128", "softcap", 1, True): {"BM": 64, "num_warps": 2},
        ("fwd", "d256", "", 1, True): {"BM": 32, "num_warps": 4},
        ("fwd", "d256", "alibi", 8, False): {"sched": "iterative-ilp"},
        ("fwd", "d256", "alibi", 1, True): {"BM": 32, "num_warps": 4},
        ("fwd", "d256", "softcap", 8, True): {"sched": "iterative-ilp"},
        ("fwd", "d256", "softcap", 1, True): {"BM": 32, "num_warps": 4},
    },
    "sm90": {
        ("fwd", "d192", "", 4, True): {"num_stages": 1},
        ("fwd", "d192", "", 1, True): {"num_warps": 4},
        ("fwd", "d192", "alibi", 1, True): {"num_warps": 4},
        ("fwd", "d192", "softcap", 1, True): {"num_warps": 4},
        ("fwd", "d256", "", 4, True): {"num_stages": 1},
        ("fwd", "d256", "", 4, False): {"num_stages": 1},
        ("fwd", "d256", "", 2, True): {"num_stages": 1},
        ("fwd", "d256", "alibi", 4, True): {"num_stages": 1},
        ("fwd", "d256", "alibi", 4, False): {"num_stages": 1},
        ("fwd", "d256", "alibi", 2, True): {"num_stages": 1},
        ("fwd", "d256", "softcap", 4, True): {"num_stages": 1},
        ("fwd", "d256", "softcap", 4, False): {"num_stages": 1},
        ("fwd", "d256", "softcap", 2, True): {"num_stages": 1},
    },
}


def tile_mod(alibi: bool, softcap: bool) -> str:
    """The ``MOD_TILES`` key of a problem's score terms: ALiBi's (the heavier: a slope and the
    distance live per score) before softcap's; "" neither."""
    return "alibi" if alibi else "softcap" if softcap else ""


def band_of(bounds: tuple[int, int]) -> int | None:
    """Keys a query sees at most under window ``bounds`` (``Problem.bounds``) bounded on both
    sides (``left + right + 1``); None without such a window (``plan.band``)."""
    left, right = bounds
    return left + right + 1 if left >= 0 and right >= 0 else None


def window_config(
    kind: str,
    cfg: Config,
    bounds: tuple[int, int],
    dcls: str,
    target,
    warp_keys: int = 0,
    mod: str = "",
    tuned: bool = True,
    paged: bool = False,
    fp32: bool = False,
) -> Config:
    """``cfg`` for a problem with window ``bounds`` (``Problem.bounds``: ``(left, right)``, -1
    unbounded) and score term ``mod`` (``tile_mod``): shrunk by ``band_config`` under a
    two-sided window, then with the ``WINDOW_TILES`` changes of ``target`` (an untuned one
    reads gfx950's) at the level it reached under a left bound, the ``MOD_TILES`` ones under
    ``mod``, and over a ``paged`` cache the ``PAGED_TILES`` ones (the plan then caps the key
    tile at the page). ``tuned`` False (a tile another rule shaped: a score or mask mod's, a
    block mask's; the changes set tile sizes that may not fit it): the shrink alone. ``fp32``
    (fp32 operands, ``cfg`` the plan's fp32 tile: ``plan.fp32_tiles``): the ``FP32_TILES``
    changes at the level (and ``mod``'s on top, and over a ``paged`` cache the
    ``FP32_PAGED_TILES`` ones) instead of the others, which were chosen for 16-bit operands."""
    c = band_config(kind, cfg, band_of(bounds), warp_keys)
    if not tuned:
        return c
    if fp32:  # the level's fp32 changes, then its score term's, then a paged cache's on top
        tab = _table_for(FP32_TILES, target)
        changes = dict(tab.get((kind, dcls, "", c.num_warps, bounds[0] >= 0), {}))
        if mod:
            changes.update(tab.get((kind, dcls, mod, c.num_warps, bounds[0] >= 0), {}))
        if paged:
            key = (kind, dcls, mod, c.num_warps, bounds[0] >= 0)
            changes.update(_table_for(FP32_PAGED_TILES, target).get(key, {}))
        return replace(c, notes={}, **changes) if changes else c
    changes = {}
    if bounds[0] >= 0:  # a left bound
        changes.update(_table_for(WINDOW_TILES, target).get((kind, dcls, c.num_warps), {}))
    if mod:
        changes.update(_table_for(MOD_TILES, target).get((kind, dcls, mod, c.num_warps), {}))
    if paged:
        key = (kind, dcls, mod, c.num_warps, bounds[0] >= 0)
        changes.update(_table_for(PAGED_TILES, target).get(key, {}))
    return replace(c, notes={}, **changes) if changes else c


#: the key-offset bits a lane decides in the forward's score tile, per target and MFMA size
#: (``Config.nonkdim``): Triton's AMD attention accumulators are transposed MFMA layouts, a lane
#: holding one query row's keys ``32 b + 8 g + 4 (lane // 32) + k`` in a 32x32 block, so bit 2
#: is the lane's. ``common._visible`` then compares constant key offsets against a bound per
#: query and lane (gfx950 gpt-oss forward 200 -> 170 VGPRs; masked loops 310 -> 309 and 293 ->
#: 292 instructions; llama non-causal's 326 -> 318, MLA's 387 -> 374). 16x16 tiles: bits 2-3,
#: but the d256 tile's masked loop grew by one instruction (8 scores per lane), so not set.
#: gfx942 (same accumulator layout): its gpt-oss tile spilled 5 SGPRs with it, so not set
KEY_LANE_BITS = {"gfx950": {32: 4}, "gfx942": {}, "gfx1250": {}, "sm90": {}}


def key_lane_bits(target, nonkdim: int) -> int:
    """``KEY_LANE_BITS`` of ``target`` (an untuned one and the CPU backends read gfx950's) at an
    MFMA size; 0 where unknown (the masks' test is the same either way)."""
    return _table_for(KEY_LANE_BITS, target).get(nonkdim, 0)


#: the head-dim classes whose prefill forward splits its right-bound tiles at the key length,
#: per target (``forward.Fwd.SK_TAIL``: the tiles below it load K and V unmasked, the one
#: crossing it runs outside the loop). gfx950, the report's cases (main / worst loop per MFMA,
#: with the table's lane sums and K^T loads): gpt-oss 13.38 / 19.31 -> 13.38 / 17.94, d256
#: softcap 12.12 / 13.56 -> 12.12 / 13.12, MLA 6.53 / 9.07 -> 6.55 / 8.3; not d128, whose main
#: loop took one more s_waitcnt (llama 7.31 / 9.72 -> 7.34 / 9.5). gfx942: gpt-oss 16.34 / 20.19
#: -> 16.34 / 19.62, MLA 16.3 / 17.1 -> 16.25 / 16.85; not d128 and d256, whose main loops grew
#: (llama 9.25 -> 9.28, d256 softcap 10.31 -> 10.34). gfx1250: gpt-oss's, d256's and MLA's main
#: loops grew (39.69 -> 40.81, 31.25 -> 31.75, 27.0 -> 27.1, MLA 4 -> 3 waves), so none; sm90
#: unchecked (predicated loads)
SK_TAIL_TARGETS = {
    "gfx950": frozenset({"d64", "d192", "d256"}),
    "gfx942": frozenset({"d64", "d192"}),
    "gfx1250": frozenset(),
    "sm90": frozenset(),
}


def sk_tail(target, dcls: str) -> bool:
    """Whether ``SK_TAIL_TARGETS`` of ``target`` (an untuned one and the CPU backends read
    gfx950's) holds the head-dim class ``dcls``."""
    return dcls in _table_for(SK_TAIL_TARGETS, target)


#: keys per tile (at most) and MFMA shape of a forward tile that traces a score or mask mod
MOD_BN, MOD_NONKDIM = 32, 16


def mod_config(cfg: Config) -> Config:
    """The forward's tile where a score or mask mod is traced in: a mod's per-score index
    arithmetic and gathers (a captured table read at ``[h, q - kv]``) hold registers for every
    score a lane owns, and the prefill tiles spilled with one (gfx950 d128 256x64: 238 VGPRs
    spilled, 576 B of scratch, with a 2-D table lookup; 3 with ALiBi's arithmetic). A warp
    keeps 16 query rows (16x16 MFMAs) of at most ``MOD_BN`` keys: a quarter of the scores per
    lane (gfx950 d128 128x32 with 8 warps: 176 VGPRs with the table, no spill on gfx950,
    gfx942, gfx1250 or sm90). The rescale stays eager (the lazy rule's registers did not pay
    for themselves next to a gather), the row sums reduced on every trip and LLVM's default
    scheduler (the ones checked); then ``TRACED_TILES``' changes (``traced_config``).
    Untimed."""
    bm = min(cfg.BM, 16 * cfg.num_warps)
    return replace(
        cfg,
        BM=bm,
        BN=max(16, min(cfg.BN, MOD_BN)),
        nonkdim=MOD_NONKDIM,
        lazy=False,
        sched="",
        lane_sums=False,
        notes={},
    )


#: per target: the field changes a tile takes where a score or mask mod is traced in, by
#: ``(kind, dclass, fp32)``: a forward's (prefill or decode) on ``mod_config``'s tile (of fp32's
#: half-key tile: ``plan.fp32_tiles``; ``plan.forward_mod_tile``), before a window's shrink (a
#: decode tile's before it grows for its rows); a backward kernel's on
#: ``plan.backward_tile``'s, without a left bound (under one: ``TRACED_WINDOW_TILES``). A
#: mod's per-score index arithmetic and gathers
#: (and, for the dS it differentiates, its backward) hold registers the tables' tiles, tuned
#: without one, had no room for. Chosen by ``model.mod_search`` (``flydsl-kernels model
#: attention --mods``) at B4 H16 S4096, not causal and causal, with each mod of
#: ``model.MOD_PROBES`` (flex's learned
#: bias as a captured table read at ``[h, q - kv]``, an ALiBi-like slope per head, a document
#: mask from captured ids): the change with the fewest loop instructions per MFMA, summed over
#: them, that compiles each clean (``model.OCCUPANCY_FLOOR`` waves per SIMD on AMD, fp32
#: ``model.FP32_FLOOR``); ``model.check_tables`` compiles them all. Before (Triton 3.9): the
#: forward's fp32 tiles, gfx950 d256 29 VGPR spills (120 B of scratch), d192 9 with the
#: document mask (40 B), gfx942 d256 68 spills and 204 B, gfx1250 d256 6 and 28 B, sm90 64 to
#: 9944 B at every head dim (16-bit: every forward clean); the backward's 16-bit tiles (every
#: dK/dV but gfx950's d64 and every sm90 one clean), gfx950 dQ with the table 172 SGPR
#: spills at d64, 10 at d128 (ALiBi-like: 2 VGPRs, 12 B of scratch), 37 at d192, d256 37
#: VGPR spills and 144 B, dK/dV d64 20 SGPR spills; gfx942 dQ d64 26 SGPR spills, d128 49
#: VGPR spills and 200 B, d256 7 and 32 B; gfx1250 dQ 112, 32 and 25 SGPR spills at d64,
#: d128, d192; fp32: gfx950 dQ d64 6 SGPR spills, gfx1250 dQ d128 and
#: d192 88 to 164 B, sm90 dQ d128 to d256 48 to 912 B, gfx950 fp32 dK/dV d64 1 SGPR spill
#: with the document mask; decode (one query, 16 heads over 4): gfx1250 d128 15 SGPR spills
#: with the table, sm90 fp32 d128 792 to 1096 B. Causal (its diagonal loop masks with the
#: mod's index arithmetic live; before, the plan gave a causal backward the tile without these
#: changes: gfx950's d64 dQ 173 SGPR spills): with them, gfx1250's 16-bit d64 dK/dV and dQ 2
#: and 4 SGPR spills with the table, fp32 dQ d64 6 with the document mask, fp32 dK/dV d128
#: and d256 16 and 20 B with the table, gfx942's fp32 dK/dV d256 2 VGPR spills with the
#: ALiBi-like mod, sm90's fp32 forward d64 24 B with the table: searched again over both.
#: A mod heavier than the probes is met at its first launch on a GPU (``fit.traced_tile``: the
#: same search on the caller's kernel where the plan's tile falls short)
TRACED_TILES: dict[str, dict[tuple[str, str, bool], dict]] = {
    "gfx950": {
        ("fwd", "d192", True): {"sched": "iterative-ilp"},
        ("fwd", "d256", True): {"BM": 64, "num_warps": 4},
        ("bwd_dkdv", "d64", False): {"BM": 32},
        ("bwd_dkdv", "d64", True): {"sched": "coexec"},
        ("bwd_dq", "d64", False): {"BM": 64, "nonkdim": 16, "BN": 32},
        ("bwd_dq", "d128", False): {"BM": 128, "nonkdim": 16},
        ("bwd_dq", "d192", False): {"BN": 32},
        ("bwd_dq", "d256", False): {"sched": "coexec"},
        ("bwd_dq", "d64", True): {"BN": 16},
    },
    "gfx942": {
        ("fwd", "d256", True): {"BM": 64, "num_warps": 4},
        ("bwd_dq", "d64", False): {"BN": 16},
        ("bwd_dq", "d128", False): {"BN": 16},
        ("bwd_dq", "d256", False): {"BN": 16},
        ("bwd_dkdv", "d256", True): {"bwd_loads": "view"},
    },
    "gfx1250": {
        ("fwd", "d256", True): {"sched": "iterative-ilp"},
        ("decode", "d128", False): {"lane_sums": True},
        ("bwd_dkdv", "d64", False): {"sched": "max-ilp"},
        ("bwd_dq", "d64", False): {"BN": 32, "num_warps": 8},
        ("bwd_dq", "d128", False): {"BN": 32},
        ("bwd_dq", "d192", False): {"BN": 32},
        ("bwd_dq", "d64", True): {"sched": "iterative-ilp"},
        ("bwd_dq", "d128", True): {"BN": 16},
        ("bwd_dq", "d192", True): {"sched": "iterative-ilp"},
        ("bwd_dkdv", "d128", True): {"sched": "coexec"},
        ("bwd_dkdv", "d256", True): {"sched": "coexec"},
    },
    "sm90": {
        ("fwd", "d64", True): {"BM": 64, "num_stages": 2},
        ("decode", "d128", True): {"num_warps": 4, "BN": 16},
        ("fwd", "d128", True): {"BN": 16, "BM": 32, "num_warps": 8},
        ("fwd", "d192", True): {"BM": 32, "num_warps": 8},
        ("fwd", "d256", True): {"BM": 32},
        ("bwd_dq", "d128", True): {"BM": 32},
        ("bwd_dq", "d192", True): {"BM": 16},
        ("bwd_dq", "d256", True): {"BM": 32, "num_warps": 4},
    },
}


#: per target: the field changes a traced score or mask mod's tile takes under a left window
#: bound, by ``(kind, dclass, fp32, warps)``, ``warps`` those of the band level the plan's tile
#: reached (``band_config``'s shrink of the forward's mod tile, with its ``TRACED_TILES``
#: changes; a decode tile's, which does not shrink, as grown for its rows; the backward's
#: ``plan.backward_tile``, with the level's ``WINDOW_TILES`` ones), on top of it. A left
#: bound adds the loops that mask at the window's edges, whose bounds and masks the mod's
#: gathers had no room next to. Chosen by ``model.mod_search(windows=True)``
#: (``flydsl-kernels model attention --mods --windows``) at the probes' window problems
#: (``model.mod_window_problems``), as ``TRACED_TILES``' are; ``model.check_tables`` compiles
#: them all. Before (Triton 3.9, the worst problem of the level): at each entry; the levels
#: not listed compile clean with no change
TRACED_WINDOW_TILES: dict[str, dict[tuple[str, str, bool, int], dict]] = {
    "gfx950": {
        # 16-bit dQ: the table bias's levels spilled SGPRs (most of all d64's, 171) or lost a
        # wave; the document mask's d64 and d128 too. d64's with its K and V copied straight
        # to LDS (Config.d2l); before it, 301 and 247 spills at 4 and 2 warps, which took
        # 64 x 32 tiles of 16x16 MFMAs and one warp of 32 rows
        ("bwd_dq", "d64", False, 4): {"BN": 32},  # 171 SGPR spills
        ("bwd_dq", "d64", False, 2): {"BN": 32},  # one wave
        ("bwd_dq", "d64", False, 1): {"BN": 32},  # 84
        ("bwd_dq", "d128", False, 8): {"BM": 128, "nonkdim": 16},  # 26 spills, 12 B
        ("bwd_dq", "d128", False, 4): {"BN": 16},  # 17 SGPR spills
        ("bwd_dq", "d128", False, 2): {"BN": 16},  # 38
        ("bwd_dq", "d128", False, 1): {"nonkdim": 16},  # one wave
        ("bwd_dq", "d192", False, 8): {"BN": 32},  # 47 SGPR spills
        ("bwd_dq", "d192", False, 4): {"BN": 32},  # 47
        ("bwd_dq", "d192", False, 2): {"BN": 32},  # 41
        ("bwd_dq", "d256", False, 4): {"sched": ""},  # one wave
        ("bwd_dq", "d256", False, 2): {"BN": 16},  # one wave
        # 16-bit dK/dV: the table bias's
        ("bwd_dkdv", "d64", False, 8): {"BM": 32},  # 32 SGPR spills
        ("bwd_dkdv", "d64", False, 2): {"BM": 16},  # 23
        ("bwd_dkdv", "d64", False, 1): {"BM": 32},  # 48
        ("bwd_dkdv", "d128", False, 1): {"sched": ""},  # 1 SGPR spill, one wave
        ("bwd_dkdv", "d192", False, 2): {"sched": ""},  # one wave
        ("bwd_dkdv", "d192", False, 1): {"BM": 16},  # 6 SGPR spills, one wave
        # 16-bit forward d256 at one warp (both probes): one wave
        ("fwd", "d256", False, 1): {"BN": 16},
        # fp32 (at FP32_FLOOR's one wave): the table bias's dQ d64 SGPR spills, dK/dV d64's
        # (the document mask's at 8 warps), d256's dQ and the forward's
        ("bwd_dq", "d64", True, 4): {"BN": 16},  # 20 SGPR spills
        ("bwd_dq", "d64", True, 2): {"BN": 16},  # 12
        ("bwd_dq", "d64", True, 1): {"BN": 16},  # 21
        ("bwd_dq", "d256", True, 1): {"split_off": False},  # 1
        ("bwd_dkdv", "d64", True, 8): {"sched": "coexec"},  # 11
        ("bwd_dkdv", "d64", True, 1): {"sched": "iterative-ilp"},  # 7
        ("fwd", "d128", True, 8): {"k_t": False, "kt_edge": False},  # 2 spills, 12 B
        ("fwd", "d192", True, 1): {"split_off": False},  # 13 spills
    },
    "gfx942": {
        # 16-bit: the table bias's dQ d64 SGPR spills, dQ d256's scratch (one wave allowed:
        # model.BELOW_FLOOR), the forward d256's spills and lost waves (both probes)
        ("bwd_dq", "d64", False, 4): {"BN": 16},  # 42 SGPR spills
        ("bwd_dq", "d64", False, 2): {"BN": 16},  # 36
        ("bwd_dq", "d64", False, 1): {"BN": 16},  # 22
        ("bwd_dq", "d256", False, 4): {"BN": 16},  # 164 spills, 488 B of scratch
        # the ALiBi-like mod's 2-warp dQ levels: one wave (d256: 7 spills, 32 B)
        ("bwd_dq", "d128", False, 2): {"nonkdim": 16},
        ("bwd_dq", "d192", False, 2): {"BN": 16},
        ("bwd_dq", "d256", False, 2): {"nonkdim": 16},
        ("fwd", "d256", False, 4): {"lane_sums": True},  # one wave
        ("fwd", "d256", False, 2): {"BN": 16},  # one wave
        ("fwd", "d256", False, 1): {"BN": 16},  # 7 SGPR spills, one wave
        # decode (one level: the tile does not shrink), fp32 d256 with the table bias
        ("decode", "d256", True, 2): {"num_warps": 4},  # 7 SGPR spills
    },
    "gfx1250": {
        # 16-bit dQ: SGPR spills at every level, the table bias's 8-warp d128 and d192 tiles
        # 612 and 620 B of scratch too
        ("bwd_dq", "d64", False, 4): {"BN": 32, "num_warps": 8},  # 184 SGPR spills
        ("bwd_dq", "d64", False, 2): {"BN": 32, "num_warps": 4},  # 154
        ("bwd_dq", "d64", False, 1): {"BM": 16, "nonkdim": 16, "BN": 32},  # 61
        ("bwd_dq", "d128", False, 8): {"BN": 32, "num_stages": 1},  # 268 spills, 612 B
        ("bwd_dq", "d128", False, 4): {"BN": 32},  # 32 SGPR spills
        ("bwd_dq", "d128", False, 2): {"BN": 32},  # 32, one wave
        ("bwd_dq", "d192", False, 8): {"BN": 32},  # 278 spills, 620 B
        ("bwd_dq", "d192", False, 4): {"BN": 32},  # 32 SGPR spills, one wave
        # 16-bit dK/dV with the table bias, and the forward d256's one-warp level (both)
        ("bwd_dkdv", "d64", False, 4): {"sched": "max-ilp"},  # 2 SGPR spills
        ("bwd_dkdv", "d64", False, 2): {"sched": "iterative-ilp"},  # 2
        ("bwd_dkdv", "d64", False, 1): {"sched": "iterative-ilp"},  # 3
        ("bwd_dkdv", "d128", False, 1): {"split_off": False},  # 2, one wave
        ("bwd_dkdv", "d192", False, 2): {"num_warps": 4},  # one wave
        ("bwd_dkdv", "d192", False, 1): {"num_warps": 2},  # 18 SGPR spills, one wave
        ("bwd_dkdv", "d256", False, 2): {"num_warps": 4},  # one wave
        ("fwd", "d256", False, 1): {"num_warps": 2},  # 82 SGPR spills, one wave
        # fp32: the table bias's (dQ d64's, the document mask's too)
        ("bwd_dq", "d64", True, 4): {"BN": 16},  # 8 SGPR spills
        ("bwd_dq", "d64", True, 2): {"BM": 32, "num_warps": 1},  # 6
        ("bwd_dq", "d64", True, 1): {"sched": "iterative-ilp"},  # 7
        ("bwd_dq", "d128", True, 8): {"BN": 16},  # 44 VGPR spills, 180 B
        ("bwd_dkdv", "d128", True, 8): {"sched": "coexec"},  # 3, 16 B
        ("bwd_dkdv", "d256", True, 8): {"sched": "iterative-ilp"},  # 5, 24 B
        ("fwd", "d128", True, 1): {"split_off": False},  # 22 SGPR spills
        # decode, 16-bit d128 with the table bias
        ("decode", "d128", False, 1): {"sched": "iterative-ilp"},  # 2 SGPR spills
    },
    "sm90": {
        # 16-bit: local memory (scratch) in the one- to four-warp levels
        ("bwd_dq", "d64", False, 1): {"BN": 16},  # 24 B with the document mask
        ("bwd_dq", "d192", False, 1): {"num_stages": 2, "num_warps": 2},  # 8 B
        ("bwd_dq", "d256", False, 4): {"num_stages": 2},  # 40 B
        ("bwd_dq", "d256", False, 2): {"num_warps": 4},  # 8 B
        ("fwd", "d128", False, 1): {"BN": 16},  # 32 B
        ("fwd", "d192", False, 1): {"BN": 16},  # 40 B
        ("fwd", "d256", False, 4): {"BN": 16},  # 32 B
        ("fwd", "d256", False, 2): {"BM": 16},  # 96 B
        ("fwd", "d256", False, 1): {"num_warps": 2},  # 1096 B
        # fp32: the table bias's dQ, the document mask's forward d192
        ("bwd_dq", "d64", True, 4): {"num_warps": 8},  # 8 B (the ALiBi-like mod's)
        ("bwd_dq", "d128", True, 4): {"BM": 16},  # 320 B
        ("bwd_dq", "d128", True, 2): {"num_warps": 4},  # 312 B (the ALiBi-like mod's)
        ("bwd_dq", "d192", True, 4): {"num_warps": 8},  # 592 B
        ("bwd_dq", "d192", True, 2): {"num_warps": 4},  # 400 B (the ALiBi-like mod's)
        ("bwd_dkdv", "d128", True, 2): {"num_warps": 4},  # 240 B (the ALiBi-like mod's)
        ("bwd_dq", "d256", True, 8): {"BM": 32, "num_warps": 4},  # 912 B
        ("fwd", "d192", True, 8): {"BM": 16},  # 24 B
        # decode: 16-bit d256 and fp32 d64 with the ALiBi-like mod, fp32 d256 with the
        # document mask
        ("decode", "d256", False, 8): {"num_stages": 2},  # 16 B
        ("decode", "d64", True, 2): {"num_stages": 2},  # 24 B
        ("decode", "d256", True, 8): {"num_stages": 2},  # 8 B
    },
}

#: per target: the field changes a traced score or mask mod's forward tile (prefill and decode)
#: takes over a paged KV cache (``flash_attn_with_kvcache`` with ``score_mod`` / ``mask_mod``), by
#: ``(kind, dclass, fp32)``, on top of its ``TRACED_TILES`` ones; the plan then caps the key tile at
#: the page (``plan.fitted_tile``). Chosen by ``model.mod_search`` (``--mods --paged``) at
#: ``model.mod_paged_problems``: the mod problems over pages of ``model.MOD_PAGES`` keys. Before
#: (Triton 3.9, ``TRACED_TILES``' alone), 19 of the 576 kernels of those problems over pages of 16
#: and 256 (4 targets, forward and decode, 16-bit and fp32, the three probes; over pages of 32 and
#: 64 none) fell short: gfx950 fp32 fwd d192 3 SGPR spills with the table over pages of 256, gfx942
#: fp32 decode d256 2, sm90 8 B at a few (16-bit decode d128, fwd d256; fp32 decode d128, fwd d128)
#: and its fp32 fwd d256 952 to 1128 B with every probe and page
TRACED_PAGED_TILES: dict[str, dict[tuple[str, str, bool], dict]] = {
    "gfx950": {
        ("fwd", "d192", True): {"sched": "max-ilp"},
    },
    "gfx942": {
        ("decode", "d256", True): {"num_warps": 4},
    },
    "gfx1250": {},
    "sm90": {
        ("fwd", "d128", True): {"BM": 16},
        ("fwd", "d256", False): {"BM": 32},
        ("fwd", "d256", True): {"num_warps": 8, "BM": 16},
        ("decode", "d128", False): {"num_warps": 4},
        ("decode", "d128", True): {"num_stages": 1},
    },
}


#: per target: the field changes a traced score or mask mod's forward tile (prefill and
#: decode) takes under a left window bound over a paged KV cache, by ``(kind, dclass, fp32,
#: warps)`` as ``TRACED_WINDOW_TILES``' (the band level the plan's tile reached, over the
#: page: ``plan.mod_band_tile``), on top of that table's changes; the plan then caps the key
#: tile at the page. A page's gather (its id per key tile, the page table's bounds) holds
#: scalar registers the window's edge loops and the mod's index arithmetic had no room next
#: to. Chosen by ``model.mod_search(windows=True, paged=True)`` (``--mods --windows
#: --paged``) at ``model.mod_window_problems(paged=True)``: the band levels over pages of
#: ``model.MOD_PAGES`` keys. Before (Triton 3.9, ``TRACED_WINDOW_TILES``' alone), over pages of
#: 16 and 256 85 of those 1242 kernels (4 targets, 16-bit and fp32, the three probes) fell
#: short: gfx950 17 (SGPR spills, up to 41 in fp32 d192 with the table bias), gfx942 15,
#: gfx1250 29 (up to 13, and d256's lost waves), sm90 24 (8 to 40 B of scratch); over pages of
#: 32 and 64, 2 of 1242 more (the two entries that say so). The worst problem of the level at
#: each entry; the levels not listed compile clean with no change
TRACED_WINDOW_PAGED_TILES: dict[str, dict[tuple[str, str, bool, int], dict]] = {
    "gfx950": {
        # SGPR spills, all over pages of 256 but d256 fp32's (VGPRs, pages of 16)
        ("fwd", "d64", False, 1): {"sched": "max-ilp"},  # 2 SGPR spills
        ("fwd", "d128", False, 4): {"waves_per_eu": 2},  # 2
        ("fwd", "d192", False, 1): {"BN": 16},  # 4
        ("fwd", "d256", False, 2): {"BN": 16},  # 2
        ("fwd", "d64", True, 4): {"sched": "iterative-ilp"},  # 2
        ("fwd", "d64", True, 1): {"BN": 16},  # 9
        ("fwd", "d128", True, 8): {"BN": 16},  # 4
        ("fwd", "d128", True, 4): {"sched": "coexec"},  # 9
        ("fwd", "d128", True, 1): {"BN": 16},  # 23
        ("fwd", "d192", True, 2): {"BN": 16},  # 9
        ("fwd", "d192", True, 1): {"BN": 16},  # 41
        ("fwd", "d256", True, 4): {"sched": "iterative-ilp"},  # 2 VGPR spills
    },
    "gfx942": {
        ("fwd", "d128", False, 4): {"BM": 32, "num_warps": 2},  # 1 SGPR spill
        ("fwd", "d192", False, 1): {"waves_per_eu": 2},  # 1
        ("fwd", "d256", False, 8): {"waves_per_eu": 2},  # 2
        ("fwd", "d256", False, 4): {"BN": 16},  # 3, and the ALiBi-like mod one wave
        ("fwd", "d192", True, 1): {"sched": "iterative-ilp"},  # 13
        ("fwd", "d256", True, 4): {"sched": "iterative-ilp"},  # 1 VGPR spill
        ("fwd", "d256", True, 2): {"BM": 16, "num_warps": 1},  # 11 SGPR spills
        # decode over pages of 16 with the table bias: K in lane order gathered a page per
        # MFMA key block
        ("decode", "d64", False, 1): {"klanes": 0},  # 4
        ("decode", "d128", False, 1): {"klanes": 0},  # 2
    },
    "gfx1250": {
        # SGPR spills over pages of 256; d256's one wave over pages of 16 too
        ("fwd", "d64", False, 4): {"sched": "max-ilp"},  # 6 SGPR spills
        ("fwd", "d64", False, 2): {"sched": "max-ilp"},  # 6
        ("fwd", "d128", False, 4): {"sched": "max-ilp"},  # 6
        ("fwd", "d128", False, 2): {"sched": "max-ilp"},  # 6
        ("fwd", "d128", False, 1): {"BN": 16},  # 3
        ("fwd", "d192", False, 4): {"sched": "iterative-ilp"},  # 4
        ("fwd", "d192", False, 2): {"sched": "iterative-ilp"},  # 5
        ("fwd", "d192", False, 1): {"BN": 16},  # 5
        ("fwd", "d256", False, 8): {"BN": 16},  # 8
        ("fwd", "d256", False, 4): {"num_warps": 8},  # 13, one wave
        ("fwd", "d256", False, 2): {"num_warps": 4},  # 10, one wave
        ("fwd", "d256", False, 1): {"BN": 16},  # 5
        ("fwd", "d64", True, 4): {"sched": "iterative-ilp"},  # 5
        ("fwd", "d64", True, 2): {"BN": 16},  # 3
        ("fwd", "d64", True, 1): {"BN": 16},  # 6
        ("fwd", "d128", True, 8): {"waves_per_eu": 2},  # 1
        ("fwd", "d128", True, 4): {"BN": 16},  # 13
        ("fwd", "d128", True, 2): {"BN": 16},  # 8
        ("fwd", "d128", True, 1): {"BN": 16},  # 2
        ("fwd", "d64", False, 1): {"sched": "max-ilp"},  # 2 over pages of 32
    },
    "sm90": {
        # local memory (scratch)
        ("fwd", "d64", False, 2): {"BM": 16},  # 8 B
        ("fwd", "d64", False, 1): {"num_warps": 2},  # 32 B
        ("fwd", "d128", False, 2): {"lane_sums": True},  # 8 B
        ("fwd", "d128", False, 1): {"num_stages": 2, "num_warps": 2},  # 32 B
        ("fwd", "d192", False, 1): {"num_warps": 2},  # 32 B
        ("fwd", "d256", False, 2): {"num_warps": 4},  # 8 B over pages of 32
        ("fwd", "d64", True, 8): {"num_stages": 1},  # 24 B
        ("fwd", "d64", True, 2): {"num_stages": 1},  # 24 B
        ("fwd", "d256", True, 8): {"num_warps": 4},  # 40 B over pages of 16
        ("decode", "d192", False, 8): {"num_stages": 2},  # 8 B
        ("decode", "d256", False, 8): {"BN": 16},  # 16 B
        ("decode", "d64", True, 2): {"num_warps": 4},  # 8 B
        ("decode", "d256", True, 8): {"num_stages": 1, "lane_sums": True},  # 8 B
    },
}


def traced_config(
    kind: str,
    cfg: Config,
    dcls: str,
    target,
    fp32: bool,
    windowed: bool = False,
    paged: bool = False,
) -> Config:
    """A tile of ``kind`` with a traced score or mask mod: the ``TRACED_TILES`` changes of
    ``target`` (an untuned one reads gfx950's) for ``(kind, dcls, fp32)``, and over a ``paged``
    cache the ``TRACED_PAGED_TILES`` ones on top; ``windowed`` (a left window bound, ``cfg``
    the band level's tile): ``TRACED_WINDOW_TILES``' at its warps, over a ``paged`` cache
    ``TRACED_WINDOW_PAGED_TILES``' on top."""
    if windowed:
        key = (kind, dcls, fp32, cfg.num_warps)
        changes = dict(_table_for(TRACED_WINDOW_TILES, target).get(key, {}))
        if paged:
            changes.update(_table_for(TRACED_WINDOW_PAGED_TILES, target).get(key, {}))
    else:
        changes = dict(_table_for(TRACED_TILES, target).get((kind, dcls, fp32), {}))
        if paged:
            changes.update(_table_for(TRACED_PAGED_TILES, target).get((kind, dcls, fp32), {}))
    return replace(cfg, notes={}, **changes) if changes else cfg


#: decode tiles hold at most this many rows (positions x packed heads) unless a group is larger
DECODE_ROWS_MAX = 64


def packs_heads(seqlen_q: int, group: int) -> bool:
    """Decode packing (the query heads of a KV group share a tile) pays when a KV head's
    queries are few: ``seqlen_q * next_pow2(group) <= DECODE_ROWS_MAX``. A group of one (MHA)
    then runs the decode tile too: its rows are the table's 16, grown with the queries
    (``decode_rows``), where the prefill tile held a few real rows among 256 (8 warps' MFMAs
    and softmax on padding)."""
    return seqlen_q * next_pow2(group) <= DECODE_ROWS_MAX


def decode_rows(bm: int, seqlen_q: int, gp: int) -> int:
    """Rows of a decode tile: the table's ``bm`` (the matrix-instruction minimum), grown to
    hold every query position of the group up to ``DECODE_ROWS_MAX``, and at least one group."""
    return max(min(max(bm, next_pow2(max(seqlen_q, 1)) * gp), DECODE_ROWS_MAX), gp, bm)


def splits_for(programs: int, keys: int, cus: int) -> int:
    """Split-KV count from the keys each program walks (see the module doc): 1 unless the grid
    leaves most CUs idle and the sequence is long enough to share."""
    if programs >= cus // 2 or keys < 2 * MIN_KEYS_PER_SPLIT:
        return 1
    return max(1, min(MAX_SPLITS, math.ceil(cus / max(programs, 1)), keys // MIN_KEYS_PER_SPLIT))


def persistent_programs(tiles: int, cus: int, uneven: bool) -> int:
    """Programs of a persistent forward grid, or 0 for one program per tile (module doc)."""
    if uneven and cus <= tiles < PERSIST_WAVES * cus:
        return cus
    return 0
