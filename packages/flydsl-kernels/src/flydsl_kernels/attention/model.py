"""The attention static model: config spaces, the model's launches, the ranking behind the tables.

No GPU was available to time on: every entry of ``configs.TABLES`` was chosen by this model from
cross-compiled code (``flydsl-kernels model attention [--target T]`` reprints the
ranking). A candidate (``space``) is compiled for the target at the class's representative
problem (``model_problem``) and rejected if it spills, needs scratch, overflows LDS or fails to
compile; survivors are ranked (``score``) by

0. at least 2 waves per SIMD on AMD (one wave's softmax hides behind another's MFMAs);
1. 128-bit K/V loads (the widest global load);
2. loop instructions per MFMA-equivalent (the report's ``matrix_loop_instructions`` over the
   wave's useful 32x32x16-equivalent MFMAs per KV tile; a 16x16x32 counts as half): the
   instructions every trip runs, as the core's loop finder counts them
   (``flydsl_core.backends.triton.amdgcn.loops``), a block a trip may skip (the lazy rescale)
   counted apart as in the anchors' figures (``attention.md``);
3. direct-to-LDS K/V loads (async copies), then fewer warps.

``specs``, ``forward_launches`` and ``backward_launch`` give the plan's launches with
``TensorSpec`` operands: what the model, the report cases and the compile tests compile.

``window_search`` picks the changes a table tile takes under a window or a score term at each
level of the window's shrink (a decode tile's: as grown for its rows), a prefill's over a
paged cache, and an fp32 tile's, dense or paged (``configs.WINDOW_TILES``, ``MOD_TILES``,
``PAGED_TILES``, ``FP32_TILES``, ``FP32_PAGED_TILES``); ``mod_search`` the change a tile
takes with a traced score or mask mod (``configs.TRACED_TILES``; under a left window bound
``TRACED_WINDOW_TILES``, over a paged cache ``TRACED_PAGED_TILES``, both
``TRACED_WINDOW_PAGED_TILES``); and
``check_tables`` compiles every entry plain, persistent where it ships so, and under those
problems (``window_problems``, ``decode_problems``, ``mod_problems``,
``mod_paged_problems``, ``mod_window_problems``).
"""

from __future__ import annotations

import operator
from dataclasses import replace
from functools import reduce
from itertools import combinations

import flydsl_core as fly
from flydsl_core import cdiv

from . import configs, plan
from .configs import TABLES, Config

# -- the model's problems --------------------------------------------------------------------------

#: the problem each (kind, head-dim class) is modelled at (bf16, Llama-like GQA 4:1)
MODEL_SHAPES = {
    "d64": (4, 4096, 64, 64),  # (batch, seqlen, head dim, v head dim)
    "d128": (4, 4096, 128, 128),
    "d192": (4, 4096, 192, 128),  # DeepSeek's MLA heads
    "d256": (4, 4096, 256, 256),
}
#: waves per SIMD a shipped AMD candidate should reach (model rule 0)
OCCUPANCY_FLOOR = 2
#: shipped entries below the floor, each because no candidate of the model's space reaches it
#: without spills (``--check-tables`` reports any other): the d256 dQ of gfx942 (the least, 32
#: x 32 with 4 warps, took 292 VGPRs) and of gfx1250 (64 x 32 with 4 warps: 582)
BELOW_FLOOR = {("gfx942", "bwd_dq", "d256"), ("gfx1250", "bwd_dq", "d256")}

#: the page sizes (keys) a forward entry is compiled at over a paged cache (``window_problems``,
#: ``configs.PAGED_TILES``): pages smaller than the key tile (it shrinks to one, or spans
#: several in K's lane order: ``plan.page_tile``), one tile's, and larger (one page per tile)
PAGES = (16, 32, 64, 256)


def model_problem(kind: str, dcls: str, *, causal: bool = True):
    """The ``plan.Problem`` a config of ``kind`` is compiled at (the model, the compile tests)."""
    b, s, d, dv = MODEL_SHAPES[dcls]
    if kind == "decode":
        return plan.Problem(
            64, 1, 8192, 32, 8, d, dv, causal=True, seqused=True, page_size=64, decode=True
        )
    return plan.Problem(b, s, s, 32, 8, d, dv, causal=causal)


# -- the model's launches --------------------------------------------------------------------------


def specs(p: plan.Problem, *, paged_pages=0):
    """``TensorSpec``s of the forward's operands for ``p`` (contiguous flash-attn layouts)."""
    from flydsl_core import TensorSpec

    B, Sq, Sk, H, Hk = p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_k
    G, D, Dv = p.group, p.head_dim, p.head_dim_v
    dt = p.dtype
    q = TensorSpec(dt, (B, Sq, Hk, G, D), (Sq * H * D, H * D, G * D, D, 1))
    o = TensorSpec(dt, (B, Sq, Hk, G, Dv), (Sq * H * Dv, H * Dv, G * Dv, Dv, 1))
    if p.page_size:
        k = TensorSpec(dt, (paged_pages, p.page_size, Hk, D))
        v = TensorSpec(dt, (paged_pages, p.page_size, Hk, Dv))
    else:
        k = TensorSpec(dt, (B, Sk, Hk, D))
        v = TensorSpec(dt, (B, Sk, Hk, Dv))
    lse = TensorSpec("fp32", (B, Hk, G, Sq))
    return {"q": q, "k": k, "v": v, "o": o, "lse": lse}


def forward_launches(fp: plan.FwdPlan, mod_tensors=()):
    """The launches of a forward plan with ``TensorSpec`` operands (a 4096-page cache; a traced
    mod's captured tensors: ``mod_tensors``)."""
    from flydsl_core import TensorSpec

    p = fp.problem
    sp = specs(p, paged_pages=4096)
    extra = {}
    if p.sinks:
        extra["sinks"] = TensorSpec("fp32", (1, p.heads_k, p.group))
    if p.alibi:
        extra["alibi"] = TensorSpec("fp32", (p.batch, p.heads_k, p.group))
    if p.seqused:
        extra["seqused_k"] = TensorSpec("int32", (p.batch,))
    if p.page_size:
        extra["block_table"] = TensorSpec("int32", (p.batch, cdiv(p.seqlen_k, p.page_size)))
    if fp.splits > 1:
        s, G = fp.splits, p.group
        extra["o_part"] = TensorSpec("fp32", (s, p.batch, p.seqlen_q, p.heads_k, G, p.head_dim_v))
        extra["lse_part"] = TensorSpec("fp32", (s, p.batch, p.heads_k, G, p.seqlen_q))
    return fp.launches(**sp, **extra, mod_tensors=tuple(mod_tensors))


def backward_launch(p: plan.Problem, target, which, config=None, mod_tensors=()):
    """One backward kernel's launch (``bwd_preprocess`` / ``bwd_dkdv`` / ``bwd_dq``) with
    ``TensorSpec`` operands (a traced mod's captured tensors: ``mod_tensors``); ``config``
    replaces the plan's tile for that kernel."""
    from flydsl_core import TensorSpec

    kw = {"dkdv_config": config} if which == "bwd_dkdv" else {"dq_config": config}
    bp = plan.plan_backward(p, target, **(kw if config is not None else {}))
    sp = specs(p)
    lse = TensorSpec("fp32", (p.batch, p.heads_k, p.group, p.seqlen_q))
    ld = TensorSpec("fp32", (p.batch, p.heads_k, p.group, 2, p.seqlen_q))
    alibi = TensorSpec("fp32", (p.batch, p.heads_k, p.group)) if p.alibi else None
    ls = bp.launches(
        q=sp["q"],
        k=sp["k"],
        v=sp["v"],
        o=sp["o"],
        do=sp["o"],
        lse=lse,
        ld=ld,
        dq=sp["q"],
        dk=sp["k"],
        dv=sp["v"],
        alibi=alibi,
        mod_tensors=tuple(mod_tensors),
    )
    return {"bwd_preprocess": ls[0], "bwd_dkdv": ls[1], "bwd_dq": ls[2]}[which]


def compile_config(kind: str, cfg: Config, problem=None, target: str = "gfx950"):
    """Compile the kernel of ``kind`` with ``cfg`` at ``problem`` (default: the model's) for
    ``target``; returns the ``CompiledKernel``."""
    p = problem or model_problem(kind, "d128")
    if kind in ("fwd", "decode"):
        fp = plan.plan_forward(p, target, config=cfg, splits=1, persistent=0)
        return forward_launches(fp)[0].compile(target)
    return backward_launch(p, target, kind, cfg).compile(target)


# -- the ranking -----------------------------------------------------------------------------------


def useful_mfma(kind: str, cfg: Config, problem) -> float:
    """32x32x16-equivalent MFMAs of *useful* work per wave per loop trip (``2 * 32 * 32 * 16``
    FLOPs each): a layout that makes warps repeat each other's rows (the attention.md pitfall)
    issues more MFMAs than this, and the model must not reward it."""
    d, dv = problem.head_dim, problem.head_dim_v
    unit = 32 * 32 * 16
    if kind in ("fwd", "decode"):
        rows = cfg.BM if kind == "fwd" else max(cfg.BM, 16)
        return rows / cfg.num_warps * cfg.BN * (d + dv) / unit
    if kind == "bwd_dkdv":  # per query step: S^T, dV, dP^T, dK over the program's keys
        return cfg.BN / cfg.num_warps * cfg.BM * (2 * d + 2 * dv) / unit
    return cfg.BM / cfg.num_warps * cfg.BN * (2 * d + dv) / unit  # dQ: S, dP, dQ per key tile


def figures(ck, kind=None, cfg: Config | None = None, problem=None) -> dict:
    """What the model and the compile tests read from a ``CompiledKernel``; with ``kind``,
    ``cfg`` and ``problem``, ``per_mfma`` is loop instructions per *useful* MFMA-equivalent."""
    r = ck.executable.report
    out = {
        "vgpr": r.vgpr_total,
        "agpr": r.agpr,
        "scratch": r.scratch_bytes or 0,
        "spills": (r.vgpr_spill_count or 0) + (r.sgpr_spill_count or 0),
        "lds": r.lds_bytes,
        "occ": r.occupancy,
        "loop": r.matrix_loop_instructions or 0,
        "mfma": dict(r.matrix_ops),
        "loads": {int(k): v for k, v in r.load_widths_bits.items()},
        "direct_to_lds": r.direct_to_lds_loads,
    }
    if r.matrix_loop_mfma:
        eq = r.matrix_loop_mfma
        out["loop_mfma"] = eq
        useful = useful_mfma(kind, cfg, problem) if kind is not None else eq
        out["useful_mfma"] = useful
        out["per_mfma"] = round(out["loop"] / useful, 2) if useful else None
    return out


#: tile shapes (BM, BN, warps) the model tries, per kind and head-dim class
TILES = {
    "fwd": [
        (128, 64, 4),
        (128, 32, 4),
        (64, 64, 4),
        (64, 32, 4),
        (256, 64, 8),
        (256, 32, 8),
        (128, 128, 4),
        (128, 64, 8),
        # Triton's own H100 forward tile; on sm90 it compiles clean from 3 stages (225 KiB of
        # shared memory there); not yet timed
        (128, 128, 8),
    ],
    "fwd_d256": [(64, 32, 4), (128, 32, 4), (64, 64, 4), (128, 64, 8), (256, 32, 8), (128, 32, 8)],
    "decode": [
        (16, 32, 1),
        (16, 64, 1),
        (16, 128, 1),
        (16, 32, 2),
        (16, 64, 2),
        (16, 64, 4),
        (16, 128, 4),
    ],
    # 8 warps at 32 query rows: on sm90 (warps of 32 lanes) every 4-warp tile past 16 rows
    # spills at d128 (the H200's sweep found them the fastest, 1.2-1.3x), and 32x64 with 8
    # warps and 2 stages is the one that compiles clean there (252 registers); not yet timed
    "bwd_dkdv": [
        (32, 64, 4),
        (64, 64, 4),
        (32, 128, 4),
        (64, 128, 8),
        (16, 64, 4),
        (32, 32, 4),
        (32, 64, 8),
        (32, 128, 8),
    ],
    "bwd_dq": [(64, 32, 4), (64, 64, 4), (128, 32, 4), (128, 64, 8), (32, 32, 4), (256, 32, 8)],
}


def space(kind: str, dcls: str, scheds=("",), klanes=(0,)) -> list[Config]:
    """The candidates of ``kind`` at a head-dim class: tiles x pipeline stages x MFMA shape
    (x the lazy rescale, forward only) x LLVM schedulers (``Config.sched``, AMD; ``scheds``:
    "" is LLVM's default; the gfx950 table's picks compared "", "coexec", "iterative-ilp" and
    "max-ilp") x, for one-warp decode tiles, K's lane order (``Config.klanes``: 0 and the
    target's MFMA k width, gfx950 8, gfx942 4)."""
    tiles = TILES["fwd_d256" if kind == "fwd" and dcls == "d256" else kind]
    out = []
    for bm, bn, w in tiles:
        for ns in (1, 2):
            for nk in (16, 32):
                if kind == "decode" and nk == 32:
                    continue  # 16-row tiles: 16x16x32 MFMAs only
                rows = (bn if kind == "bwd_dkdv" else bm) // w  # a warp's rows of the output
                if nk == 32 and rows < 32:
                    continue
                kls = klanes if kind == "decode" and w == 1 else (0,)
                for lazy in (True, False) if kind in ("fwd", "decode") else (True,):
                    for sched in scheds:
                        for kl in kls:
                            out.append(Config(bm, bn, w, ns, nk, lazy=lazy, sched=sched, klanes=kl))
    return out


def score(cfg: Config, fig: dict) -> tuple:
    widest = max(fig["loads"], default=0)
    per = fig.get("per_mfma") or 1e9
    return (widest, -per, fig["direct_to_lds"] > 0, -cfg.num_warps)


def rank(kind: str, dcls: str, target: str = "gfx950", candidates=None, *, jobs=None):
    """``[(Config, figures or None, rejected or None)]``, survivors best first."""
    from flydsl_core.autotune.prune import Candidate, judge
    from flydsl_core.exc import FlyDSLError
    from flydsl_core.targets import get_target

    tgt = get_target(target)
    floor = OCCUPANCY_FLOOR if target.startswith("gfx") else 1
    rows = []
    for cfg in candidates if candidates is not None else space(kind, dcls):
        try:
            ck = compile_config(kind, cfg, model_problem(kind, dcls), target)
        except FlyDSLError as e:
            rows.append((cfg, None, f"compile failed: {e.msg.splitlines()[0]}"))
            continue
        cand = judge(Candidate(None, ck.executable.report.to_dict()), tgt, floor)
        rows.append((cfg, figures(ck, kind, cfg, model_problem(kind, dcls)), cand.rejected))
    ok = sorted((r for r in rows if r[2] is None), key=lambda r: score(r[0], r[1]), reverse=True)
    return ok + [r for r in rows if r[2] is not None]


def check_tables(
    targets=tuple(TABLES), keys=None, *, windows=True, pages=PAGES, fp32=True, mods=True
) -> list[str]:
    """Compile every shipped entry of every target's table at its model problem, and the
    prefill ones under every window problem (``window_problems``; ``windows``), a forward's
    also over a cache of each of ``pages``, and with ``fp32`` each entry's fp32 problems
    (``window_problems(fp32=True)``; a forward's over those caches too), and with ``mods``
    each entry's with each traced score or mask mod of ``MOD_PROBES`` (``mod_problems``,
    16-bit and fp32, a forward's and decode's over paged caches too: ``mod_paged_problems``;
    with ``windows`` under windows too on ``MOD_WINDOW_TARGETS``: ``mod_window_problems``,
    a forward's and decode's over paged caches too);
    the problems found (compile failures, scratch, spills, LDS over the target's limit, and on
    AMD targets fewer than ``OCCUPANCY_FLOOR`` waves per SIMD outside ``BELOW_FLOOR``).
    ``keys``: only those ``(kind, dclass)`` entries."""
    from flydsl_core.exc import FlyDSLError

    bad = []
    for t in targets:
        for (kind, dcls), cfg in TABLES[t].items():
            if keys is not None and (kind, dcls) not in keys:
                continue
            try:  # the plain kernel, the persistent ones the entry ships, the windowed ones
                ck = compile_config(kind, cfg, model_problem(kind, dcls), t)
                kernels = [("", ck), *_persistent_kernels(kind, dcls, cfg, t)]
                if windows:
                    kernels += _windowed_kernels(kind, dcls, cfg, t, pages, fp32)
                if mods and kind in MOD_KINDS:
                    kernels += _mod_kernels(kind, dcls, t, windows)
            except FlyDSLError as e:
                bad.append(f"{t} {kind} {dcls}: compile failed: {e.msg.splitlines()[0]}")
                continue
            floor = floor_of(t, kind, dcls)
            for what, k, *own in kernels:  # (label, kernel[, its own floor, scratch it keeps])
                fl, keep = own or (floor, -1)
                why = shortfall(k, t, fl)
                if why and why.startswith("spill") and figures(k)["scratch"] <= keep:
                    why = None
                if why:
                    bad.append(f"{t} {kind} {dcls}{what} {cfg.as_dict()}: {why}")
    return bad


def _windowed_kernels(kind, dcls, cfg, target, pages=PAGES, fp32=True):
    """``(label, CompiledKernel)`` of a prefill entry under each of its window problems
    (``window_problems``), plain and with each score term of ``TILE_MODS``, a forward's over a
    cache of each of ``pages``, and with ``fp32`` each of them in fp32, as the plan compiles
    them (``configs.WINDOW_TILES``, ``MOD_TILES``, ``PAGED_TILES``, ``FP32_TILES`` and
    ``FP32_PAGED_TILES`` applied)."""
    out = []
    for page in (0, *pages) if kind == "fwd" else (0,):
        for mod in ("", *TILE_MODS):
            for (warps, *_), (p, _) in window_problems(kind, dcls, cfg, target, mod, page).items():
                if (target, kind, dcls, mod, warps) in TILE_SHORTFALLS:
                    continue
                what = f" window {p.window}" + ("" if p.causal else " not causal")
                what += (f" {mod}" if mod else "") + (f" pages of {page}" if page else "")
                out.append((what, window_kernel(kind, p, target)))
    if fp32:  # held to FP32_FLOOR waves, and a known shortfall to the scratch it keeps
        for page in (0, *pages) if kind == "fwd" else (0,):
            for mod in ("", *(TILE_MODS if kind in FP32_MOD_KINDS else ())):
                levels = fp32_levels(kind, dcls, cfg, target, mod, (page,))
                for (warps, windowed), probs in levels.items():
                    key = (target, kind, dcls, mod, warps, windowed)
                    keep = FP32_SHORTFALLS.get(key, (-1,))[0] if not page else -1
                    for p, _ in probs:
                        what = f" fp32 window {p.window}" + ("" if p.causal else " not causal")
                        what += (f" {mod}" if mod else "") + (f" pages of {page}" if page else "")
                        out.append((what, window_kernel(kind, p, target), FP32_FLOOR, keep))
    return out


#: the left bounds of the causal windows an entry is compiled under (``window_problems``):
#: narrow to wide around the band tile's levels (``configs.band_config`` halves a tile's rows
#: or keys with its warps until ``rows + keys <= band + 1``), so that every level and both of
#: its loop shapes (``plan.narrow_band``: whether a tile may cross both window bounds) are met
WINDOW_LEFTS = (15, 31, 47, 62, 63, 94, 95, 126, 127, 158, 159, 190, 191, 254, 255, 318, 319,
                382, 383, 510, 511, 4095)  # fmt: skip


#: band levels ``(target, kind, dclass, score term, warps)`` that no change ``window_search``
#: tries compiles clean, so ``check_tables`` leaves them out, each with what it compiles to
TILE_SHORTFALLS: dict[tuple, str] = {}

#: fp32 levels ``(target, kind, dclass, score term, warps, left bound)`` that no change
#: ``window_search(fp32=True)`` tries compiles clean: ``(scratch bytes, what)``, the most
#: scratch a problem of the level keeps with its ``configs.FP32_TILES`` change (the least the
#: search found), which ``check_tables`` holds it to (spills with no more scratch than that
#: pass), and why
FP32_SHORTFALLS: dict[tuple, tuple[int, str]] = {
    # a few VGPR spills (into AGPRs: no scratch) at every change tried
    ("gfx942", "bwd_dkdv", "d256", "", 4, True): (0, "iterative-ilp: 5 spills over 3 problems"),
    ("gfx942", "bwd_dkdv", "d256", "", 4, False): (0, "1 and 5 VGPR spills, no scratch"),
    ("gfx942", "bwd_dkdv", "d256", "alibi", 4, False): (0, "Q and dO loaded as views: 6 spills"),
    ("gfx942", "bwd_dkdv", "d256", "softcap", 4, False): (0, "max-ilp: 11 spills, no scratch"),
    ("gfx942", "bwd_dkdv", "d256", "alibi", 4, True): (0, "max-ilp: 10 spills, 2 problems"),
    ("gfx942", "bwd_dkdv", "d256", "softcap", 4, True): (0, "7 and 2 VGPR spills, no scratch"),
}

#: the score terms ``MOD_TILES`` is keyed by (``configs.tile_mod``) and the problem fields
#: that turn each on (Gemma 2's softcap)
TILE_MODS = {"alibi": {"alibi": True}, "softcap": {"softcap": 50.0}}


#: the kinds whose fp32 problems are compiled with each score term of ``TILE_MODS`` too
#: (``fp32_levels``; ``configs.FP32_TILES`` keyed by it), with and without windows; decode's
#: (``decode_problems``: 24 at every head dim and term) since 10 of the 768 fell short on
#: the plain changes (gfx942 d256 with ALiBi 18 spills and 72 B of scratch, sm90 d128 32 B)
FP32_MOD_KINDS = ("fwd", "decode", "bwd_dkdv", "bwd_dq")


def fp32_levels(kind: str, dcls: str, cfg: Config, target, mod: str = "", pages=(0,)) -> dict:
    """``{(warps, windowed): [(problem, tile), ...]}``: an entry's fp32 problems
    (``window_problems(fp32=True)``, with a score term ``mod`` of ``FP32_MOD_KINDS``) by the
    level of ``configs.FP32_TILES`` they take; a forward's over a cache of each of ``pages``
    (0: dense) for ``configs.FP32_PAGED_TILES``, the largest page first."""
    out: dict = {}
    for page in sorted(pages, reverse=True):
        for (warps, _, _, windowed, *_), pt in window_problems(
            kind, dcls, cfg, target, mod, page, True
        ).items():
            out.setdefault((warps, windowed), []).append(pt)
    return out


def window_problems(
    kind: str, dcls: str, cfg: Config, target, mod: str = "", page=0, fp32: bool = False
) -> dict:
    """``{(warps, narrow, causal, windowed): (problem, tile)}``: the windowed problems whose
    kernels differ for the entry ``cfg`` of ``kind``: causal windows (``WINDOW_LEFTS``), one
    per band level (the tile's warps after ``configs.band_config``, before any
    ``configs.WINDOW_TILES`` change) and loop shape, the narrowest first met; and a left bound
    without a right one (not causal: no band, the table's tile, no right-bound loop). With a
    score term ``mod`` (``TILE_MODS``) every problem has it, and with ``page`` (a forward's:
    ``PAGES``) every one reads a cache of pages of that many keys; with either, the problems
    without a window (causal or not) are in too; so with ``fp32`` (fp32 operands: the tile is
    ``plan.fp32_tiles``'). ``tile`` is the level's unchanged tile (over pages: with the plan's
    key tile for the page, ``plan.page_tile``). Decode (``decode_problems``): keyed ``(warps,
    narrow, causal, windowed, (queries, page, sinks))``."""
    if kind == "decode":
        return decode_problems(dcls, cfg, mod, fp32)
    out = {}
    wk = configs.band_warp_keys(target, dcls) if kind == "bwd_dkdv" else 0
    extra = (TILE_MODS[mod] if mod else {}) | ({"dtype": "fp32"} if fp32 else {})
    if fp32:
        cfg = plan.fp32_tiles(cfg, replace(model_problem(kind, dcls), dtype="fp32"))
    if page:
        extra = extra | {"page_size": page, "seqused": True}
        cfg = plan.page_tile(cfg, page, cfg.klanes)
    causal, bidi = (replace(model_problem(kind, dcls, causal=c), **extra) for c in (True, False))
    probs = [replace(causal, window=(left, 0)) for left in WINDOW_LEFTS]
    probs.append(replace(bidi, window=(WINDOW_LEFTS[-1], -1)))
    if mod or page or fp32:
        probs += [causal, bidi]
    for p in probs:
        tile = configs.band_config(kind, cfg, plan.band(p), wk)
        narrow = plan.narrow_band(p, tile.BM, tile.BN, kind)
        key = (tile.num_warps, narrow, p.causal, p.bounds[0] >= 0)
        out.setdefault(key, (p, tile))
    return out


#: a decode entry's problems (``decode_problems``): query positions per head (one, and the
#: few speculative decoding sends, which grow the tile: ``plan.grown_decode``), the caches
#: (dense and pages of 16 to 256 keys), windows (with a left bound the kernel is the same at
#: every width: a decode tile's loops are all masked) and gpt-oss's sinks
DECODE_QUERIES = (1, 4, 16)
DECODE_PAGES = (0, 16, 64, 256)
DECODE_WINDOWS = ((127, 0), (4095, -1))


def decode_problems(dcls: str, cfg: Config, mod: str = "", fp32: bool = False) -> dict:
    """``window_problems`` of a decode entry ``cfg``: its model problem at each of
    ``DECODE_QUERIES`` and ``DECODE_PAGES`` under each of ``DECODE_WINDOWS``, with and without
    sinks; with a score term ``mod`` every problem has it (no sinks), and the problems without
    a window are in too; with ``fp32`` (fp32 operands, ``plan.fp32_tiles``' tile: the rare
    case) a causal window and none, without sinks. ``tile``: the entry grown for the problem's
    rows and capped at its page."""
    out = {}
    extra = (TILE_MODS[mod] if mod else {}) | ({"dtype": "fp32"} if fp32 else {})
    base = replace(model_problem("decode", dcls), **extra)
    cfg = plan.fp32_tiles(cfg, base)
    windows = DECODE_WINDOWS + (((-1, -1),) if mod else ())
    if fp32:
        windows = (DECODE_WINDOWS[0], (-1, -1))
    for sq in DECODE_QUERIES:
        for page in DECODE_PAGES:
            for window in windows:
                for sinks in (False,) if mod or fp32 else (False, True):
                    p = replace(
                        base, seqlen_q=sq, page_size=page, window=window, sinks=sinks,
                        causal=window[1] == 0 or window == (-1, -1),
                    )  # fmt: skip
                    gp = plan.next_gp(p.group)
                    tile = plan.grown_decode(cfg, configs.decode_rows(cfg.BM, sq, gp))
                    tile = plan.page_tile(tile, page, tile.klanes)
                    key = (tile.num_warps, True, p.causal, window[0] >= 0, (sq, page, sinks))
                    out[key] = (p, tile)
    return out


def window_kernel(kind, p, target, cfg=None):
    """The kernel of ``kind`` at the windowed problem ``p``: the plan's (``cfg`` None: the table
    with its ``WINDOW_TILES`` and ``MOD_TILES`` changes) or ``cfg``'s."""
    if kind in ("fwd", "decode"):
        fp = plan.plan_forward(p, target, config=cfg, splits=1, persistent=0)
        return forward_launches(fp)[0].compile(target)
    return backward_launch(p, target, kind, cfg).compile(target)


def shortfall(ck, target, floor) -> str | None:
    """Why ``ck`` falls short of the shipped bar (``prune.judge`` at ``floor`` waves per SIMD,
    and no spill stores); None where it does not."""
    from flydsl_core.autotune.prune import Candidate, judge
    from flydsl_core.targets import get_target

    rep = ck.executable.report.to_dict()
    why = judge(Candidate(None, rep), get_target(target), floor).rejected
    return why or ("spill stores" if rep.get("spill_store_bytes") else None)


def floor_of(target, kind, dcls) -> int:
    """The waves per SIMD an entry must reach (band tiles under a window too):
    ``OCCUPANCY_FLOOR`` on AMD outside ``BELOW_FLOOR``, one elsewhere."""
    amd = str(target).startswith("gfx") and (target, kind, dcls) not in BELOW_FLOOR
    return OCCUPANCY_FLOOR if amd else 1


#: the targets whose LLVM has the coexec scheduler (elsewhere it warns and ignores it: the
#: default scheduler's kernel again)
COEXEC_TARGETS = ("gfx950", "gfx1250")


def window_changes(kind: str, tile: Config, entry: Config, target) -> list[dict]:
    """The single field changes ``window_search`` tries on a band level's ``tile`` (of the
    table's ``entry``) for ``target``: on AMD, LLVM's schedulers, the options that keep values
    live across the loop (descriptors at the entry, split offsets, direct-to-LDS loads, shared
    transposed operands, Q in lane order, the backward's loads) and a waves-per-EU hint; on
    every target the row sums as lane partials or not, K^T or not, one stage fewer (or, on
    NVIDIA, one more), a smaller tile (half the keys per forward / dQ step, half the query rows
    per dK/dV step), and the level above's tile (rows, or dK/dV's keys, and warps doubled: a
    window narrower than it then masks every trip, but each warp keeps the registers it has at
    that level); only those that change the tile."""
    amd = str(target).startswith("gfx")
    cands = []
    if amd:
        scheds = ("", "coexec", "iterative-ilp", "max-ilp")
        cands += [{"sched": s} for s in scheds if s != "coexec" or target in COEXEC_TARGETS]
        # (the 16x16 MFMA is not tried: Triton 3.9 aborted the process compiling gfx950's
        # d128 forward band tile with it)
        cands += [{"hoist_rsrc": ""}, {"split_off": False}, {"d2l": False}, {"waves_per_eu": 2}]
        if kind == "fwd":
            cands += [{"q_lanes": 0}, {"tr_wait": False}]
        elif kind == "decode":  # K's lane order, V's head-dim blocks, the row copies off
            cands += [{"klanes": 0}, {"vblk": 0}, {"fold": 0}, {"soffset": False}]
        else:
            cands += [{"share_t": False}, {"bwd_loads": "own"}, {"bwd_loads": "view"}]
    elif tile.num_stages < 2:
        cands.append({"num_stages": tile.num_stages + 1})
    cands += _tile_changes(kind, tile) + _level_above(kind, tile, entry)
    return [c for c in cands if any(getattr(tile, k) != v for k, v in c.items())]


def _tile_changes(kind: str, tile: Config) -> list[dict]:
    """One stage fewer, the row sums as lane partials or not (forward, decode), K^T off
    (forward), half the keys per forward / dQ step or half the query rows per dK/dV step."""
    cands = [{"num_stages": tile.num_stages - 1}] if tile.num_stages > 1 else []
    if kind in ("fwd", "decode"):
        cands.append({"lane_sums": not tile.lane_sums})
    if kind == "fwd":
        cands.append({"k_t": False, "kt_edge": False})
    if kind == "bwd_dkdv" and tile.BM > 16:
        cands.append({"BM": tile.BM // 2})
    elif kind != "bwd_dkdv" and tile.BN > 16:
        cands.append({"BN": tile.BN // 2})
    return cands


def _level_above(kind: str, tile: Config, entry: Config) -> list[dict]:
    """The band level above's tile (rows, or dK/dV's keys, and warps doubled) where ``tile``
    is below the table's ``entry``."""
    if tile.num_warps >= entry.num_warps:
        return []
    grown = "BN" if kind == "bwd_dkdv" else "BM"
    return [{grown: getattr(tile, grown) * 2, "num_warps": tile.num_warps * 2}]


def fp32_changes(kind: str, tile: Config, entry: Config) -> list[dict]:
    """The single field changes ``window_search`` tries on an fp32 tile (of the table's
    ``entry``): the ones that shrink what a lane holds, which fp32's registers need where the
    16-bit table's did not (the scheduler and load options of ``window_changes`` moved a few
    registers; fp32's tiles fell short by up to 267 spills or kilobytes of scratch): one stage
    fewer, the row sums as lane partials or not, K^T off, half the keys (a dK/dV step's query
    rows), the same tile over twice the warps (up to 8), the 16-row MFMA, half the output rows
    (the forward's and dQ's query rows, dK/dV's keys) at the MFMA's rows or at 16, or over
    half the warps (the level below's tile: an 8-warp block puts two waves on each SIMD, so a
    wave has half the registers of a 4-warp block's), and the level above's tile
    (``window_changes``); only those that change the tile."""
    cands = _tile_changes(kind, tile)
    if tile.num_warps < 8:
        cands.append({"num_warps": tile.num_warps * 2})
    if tile.nonkdim == 32 and kind != "decode":  # 16-row MFMAs: half a warp's rows
        cands.append({"nonkdim": 16})
    rows = "BN" if kind == "bwd_dkdv" else "BM"  # the tile's output rows, over its warps
    if kind != "decode" and getattr(tile, rows) > 16:
        half = getattr(tile, rows) // 2
        if half >= tile.num_warps * tile.nonkdim:
            cands.append({rows: half})
        if tile.nonkdim == 32 and half >= tile.num_warps * 16:
            cands.append({rows: half, "nonkdim": 16})
        if tile.num_warps > 1:  # the level below's: one wave of a 4-warp block per SIMD
            cands.append({rows: half, "num_warps": tile.num_warps // 2})
    cands += _level_above(kind, tile, entry)
    return [c for c in cands if any(getattr(tile, k) != v for k, v in c.items())]


#: waves per SIMD an fp32 level keeps where no change ``window_search`` tries reaches
#: ``OCCUPANCY_FLOOR`` without spills (``check_tables`` holds the fp32 problems to it): fp32's
#: operands take twice the registers, and a spill costs more than a wave
FP32_FLOOR = 1

#: the single changes nearest the bar whose pairs ``window_search`` tries where none alone mends
PAIR_FROM = 6


def _fewer_warps(ck, kind, cfg, p) -> float:
    """a search's figure on NVIDIA, lower is better: warps per SM, negated"""
    return -(figures(ck)["occ"] or 0)


def _combos(near, size: int) -> list[dict]:
    """The changes that join ``size`` of the ``PAIR_FROM`` singles nearest the bar (``near``:
    ``(how far off, change)`` rows) on disjoint fields, in the order of their nearness."""
    top = [ch for _, ch in sorted(near, key=lambda r: r[0])[:PAIR_FROM]]
    return [
        reduce(operator.or_, combo)
        for combo in combinations(top, size)
        if len({k for c in combo for k in c}) == sum(len(c) for c in combo)
    ]


def _trial(builds, kind, target, floor, figure=None):
    """(loop instructions per useful MFMA summed, or None; why not clean; how far off: spills,
    then registers) of a search's candidate over its problems: ``builds``, ``(problem, thunk)``
    pairs, each thunk compiling ``(kernel, config)``; the first that falls short ends it.
    ``figure(kernel, kind, config, problem)``: another figure to sum, lower better."""
    from flydsl_core.exc import FlyDSLError

    total = 0.0
    for p, build in builds:
        try:
            ck, c = build()
        except FlyDSLError as e:
            return None, f"compile failed: {e.msg.splitlines()[0]}", (1e9, 0)
        why = shortfall(ck, target, floor)
        if why:
            f = figures(ck)
            return None, why, (f["spills"] + f["scratch"], f["vgpr"] or 0)
        if figure is not None:
            total += figure(ck, kind, c, p)
        else:
            total += figures(ck, kind, c, p).get("per_mfma") or 1e9
    return total, None, (0, 0)


def window_search(
    kind: str,
    dcls: str,
    target: str,
    log=print,
    mod: str = "",
    paged: bool = False,
    fp32: bool = False,
) -> dict:
    """``{warps: changes}`` for the band levels of ``target``'s ``(kind, dcls)`` entry whose
    tile falls short of the shipped bar under a window (``shortfall``): the single change
    (``window_changes``), else the pair of them, that compiles clean at every window problem
    of the level (``window_problems``) with the fewest loop instructions per useful MFMA summed
    over them; a level no change mends is logged and left out. With a score term ``mod``
    (``TILE_MODS``): the ``MOD_TILES`` changes, on top of the ``WINDOW_TILES`` ones under a
    window. ``paged`` (a forward's): the ``PAGED_TILES`` changes for ``mod`` at every page size
    of ``PAGES``, on top of both, keyed ``(warps, windowed)``: a left bound's problems apart
    from those without a window (at the table's level), which take no change they do not
    need. ``fp32``: the ``FP32_TILES`` changes of the fp32 tile (``plan.fp32_tiles``), keyed
    so too; they replace the others (``configs.window_config``); with ``mod``, on top of the
    level's plain fp32 ones (``fp32_levels``); with ``paged`` too, the ``FP32_PAGED_TILES``
    changes, on top of the level's ``FP32_TILES`` ones (plain and ``mod``'s).
    The search tries ``fp32_changes`` and their pairs, then ``window_changes``' others, alone
    and on the size change nearest the bar; a level none brings to ``OCCUPANCY_FLOOR`` is
    searched again at ``FP32_FLOOR`` waves (none needed where it is clean at one), and one
    none brings clean there takes the change nearest the bar with the least scratch over the
    level's problems, where that is less than the tile's own (``FP32_SHORTFALLS``)."""
    from flydsl_core.exc import FlyDSLError

    cfg = TABLES[target][(kind, dcls)]
    floor = floor_of(target, kind, dcls)
    wins = configs.WINDOW_TILES.get(target, {}) if (mod or paged) and not fp32 else {}
    mods = configs.MOD_TILES.get(target, {}) if paged and mod else {}
    f32_all = configs.FP32_TILES.get(target, {})
    f32 = f32_all if fp32 and (mod or paged) else {}
    if fp32:
        levels = fp32_levels(kind, dcls, cfg, target, mod, PAGES if paged else (0,))
    else:
        levels = {}
        # the largest page first: a level's first tile (the changes' base) is the dense one's
        for page in reversed(PAGES) if paged else (0,):
            for (warps, _, _, windowed, *_), (p, tile) in window_problems(
                kind, dcls, cfg, target, mod, page
            ).items():
                level = (warps, windowed) if paged else warps
                levels.setdefault(level, []).append((p, tile))

    def before(warps, windowed):
        """the changes the plan makes to a level's tile before the searched ones"""
        if fp32:  # a score term's go on top of the level's plain fp32 ones, a page's on both
            plain = f32.get((kind, dcls, "", warps, windowed), {})
            return plain | (f32.get((kind, dcls, mod, warps, windowed), {}) if paged else {})
        w = wins.get((kind, dcls, warps), {}) if windowed else {}
        return w | mods.get((kind, dcls, mod, warps), {})

    def compiled(p, tile, changes):
        """(kernel, config) of a level's problem with ``changes`` on the plan's before ones"""
        c = replace(tile, **(before(tile.num_warps, p.bounds[0] >= 0) | changes))
        c = plan.page_tile(c, p.page_size, c.klanes)
        return window_kernel(kind, p, target, c), c

    def trial(probs, changes, floor):
        builds = [(p, lambda p=p, t=t: compiled(p, t, changes)) for p, t in probs]
        return _trial(builds, kind, target, floor)

    def kept(probs, changes, floor):
        """(scratch bytes, spills, most scratch of one problem) over the level's problems; None
        where one falls short for a reason other than spilling"""
        total = (0, 0, 0)
        for p, tile in probs:
            try:
                ck, _ = compiled(p, tile, changes)
            except FlyDSLError:
                return None
            why = shortfall(ck, target, floor)
            if why and not why.startswith("spill"):
                return None
            f = figures(ck)
            total = (total[0] + f["scratch"], total[1] + f["spills"], max(total[2], f["scratch"]))
        return total

    def best_of(probs, cands, floor):
        best, near = None, []
        for ch in cands:
            total, why, off = trial(probs, ch, floor)
            w = probs[0][1].num_warps
            log(f"{target} {kind} {dcls} {w} warps {ch}: {why or round(total, 2)}")
            if why is None and (best is None or total < best[0]):
                best = (total, ch)
            near.append((off, ch))
        return best, near

    out = {}
    # an fp32 level no change brings to the floor keeps one wave where it is clean there
    floors = (floor, FP32_FLOOR) if fp32 and floor > FP32_FLOOR else (floor,)
    for level, probs in sorted(levels.items(), reverse=True):
        warps = level[0] if paged or fp32 else level
        for fl in floors:
            # the problems that fall short unchanged first: a change that does not mend them
            # fails at its first compile
            failing = [pt for pt in probs if trial([pt], {}, fl)[1] is not None]
            if not failing:
                break
            probs = failing + [pt for pt in probs if pt not in failing]
            if fp32:  # from the level's tile, and from it with the changes before (a
                # score term's: the plain fp32 ones) or, plain, on top of the shipped ones
                start = replace(probs[0][1], **before(warps, level[1]))
                singles = fp32_changes(kind, probs[0][1], cfg)
                singles += [c for c in fp32_changes(kind, start, cfg) if c not in singles]
                shipped = {} if mod or paged else f32_all.get((kind, dcls, "", *level), {})
                if shipped:  # the shipped change stays in the race
                    on = replace(probs[0][1], **shipped)
                    ons = [shipped] + [shipped | c for c in fp32_changes(kind, on, cfg)]
                    singles += [c for c in ons if c not in singles]
            else:
                # the candidates from the level's tile and from the tile with the changes the
                # plan makes before the searched ones (a window's, a score term's)
                start = replace(probs[0][1], **before(warps, True))
                singles = window_changes(kind, probs[0][1], cfg, target)
                singles += [c for c in window_changes(kind, start, cfg, target) if c not in singles]
            best, near = best_of(probs, singles, fl)
            if best is None:  # pairs of the singles nearest the bar
                best, more = best_of(probs, _combos(near, 2), fl)
                near += more
            if best is None and fp32:  # the others, alone and on the size change nearest
                # (not LLVM's coexec scheduler: it aborted the process compiling gfx950's fp32
                # d192 and d256 1-warp tiles with the 16x16 MFMA)
                rest = [
                    c
                    for c in window_changes(kind, probs[0][1], cfg, target)
                    if c not in singles and c.get("sched") != "coexec"
                ]
                top = min(near, key=lambda r: r[0])[1] if near else {}
                rest += [top | c for c in rest if top and not set(top) & set(c)]
                best, more = best_of(probs, rest, fl)
                near += more
            if best is not None:
                out[level] = best[1]
                break
            log(f"{target} {kind} {dcls} {warps} warps: no change compiles clean at {fl} waves")
            if fp32 and fl == floors[-1]:  # the least scratch, where less than the tile's own
                own = kept(probs, {}, fl)
                tops = [ch for _, ch in sorted(near, key=lambda r: r[0])[:PAIR_FROM]]
                figs = [(f, i, ch) for i, ch in enumerate(tops) if (f := kept(probs, ch, fl))]
                least = min(figs, default=None)
                if least and own is not None and least[0] < own:
                    out[level] = least[2]
                    log(f"{target} {kind} {dcls} {warps} warps: least scratch {least[0]}")
    return out


# -- traced score and mask mods --------------------------------------------------------------------

#: the probes' sequence length (a table bias spans ``2 MOD_S - 1`` offsets)
MOD_S = 4096


def _table_bias(score, b, h, q_idx, kv_idx, table):
    """flex's learned relative-position bias: a captured table read at ``[h, q - kv]``"""
    return score + table.gather(h, q_idx - kv_idx + (MOD_S - 1)).load().to(fly.fp32)


def _alibi_like(score, b, h, q_idx, kv_idx, slopes):
    """ALiBi as a score mod: a captured slope per head times ``|q - kv|``"""
    return score - slopes.gather(h).load() * fly.abs(q_idx - kv_idx).to(fly.fp32)


def _document(b, h, q_idx, kv_idx, doc):
    """packed sequences: a captured document id per token, causal within a document"""
    return (doc.gather(q_idx).load() == doc.gather(kv_idx).load()) & (q_idx >= kv_idx)


#: the mods a traced mod's tiles are compiled with (``mod_problems``): ``(score or mask mod,
#: function, captured tensor's dtype and shape)``: a gather of a 2-D table (the per-score
#: index arithmetic and loads that spilled the prefill tiles: gfx950 d128 256 x 64, 238
#: VGPRs), ALiBi's arithmetic, and a document mask (two gathers and a compare a score)
MOD_PROBES = {
    "table": ("score", _table_bias, "fp32", (16, 2 * MOD_S - 1)),
    "alibi": ("score", _alibi_like, "fp32", (16,)),
    "document": ("mask", _document, "int32", (MOD_S,)),
}


def mod_problems(kind: str, dcls: str, fp32: bool = False) -> list:
    """``[(probe, problem, captured tensor spec)]``: a prefill of ``dcls`` (B4 H16 S4096, no
    window) with each mod of ``MOD_PROBES``, not causal and then causal (its diagonal loop
    masks with the mod's index arithmetic live: gfx1250's d64 dQ spilled SGPRs only there);
    decode: one query of 16 heads over 4 KV heads and 4096 keys; fp32 operands with
    ``fp32``."""
    from flydsl_core import TensorSpec

    from .mods import MaskMod, ScoreMod

    _, _, d, dv = MODEL_SHAPES[dcls]
    out = []
    for causal in (False,) if kind == "decode" else (False, True):
        for name, (which, fn, dt, shape) in MOD_PROBES.items():
            m = {"score_mod": ScoreMod(fn)} if which == "score" else {"mask_mod": MaskMod(fn)}
            dtype = "fp32" if fp32 else "bf16"
            p = plan.Problem(4, MOD_S, MOD_S, 16, 16, d, dv, causal=causal, dtype=dtype, **m)
            if kind == "decode":
                p = replace(p, seqlen_q=1, heads_k=4, decode=True, seqused=True)
            out.append((name, p, TensorSpec(dt, shape)))
    return out


#: the page sizes (keys) a traced mod's forward and decode problems are compiled at over a
#: paged cache (``mod_paged_problems``): a forward entry's (pages of 32 alone kept gfx1250's
#: d64 band level's 2 SGPR spills and sm90's d256 one's 8 B of scratch)
MOD_PAGES = PAGES


def mod_paged_problems(kind: str, dcls: str, fp32: bool = False) -> list:
    """``mod_problems`` of a forward or decode entry over a cache of pages of each of
    ``MOD_PAGES`` keys (``[]`` for the backward's kinds, which read no paged cache)."""
    if kind not in ("fwd", "decode"):
        return []
    return [
        (name, replace(p, page_size=page, seqused=True), spec)
        for name, p, spec in mod_problems(kind, dcls, fp32)
        for page in MOD_PAGES
    ]


#: the targets whose traced mods' band levels ``mod_search(windows=True)`` has searched
#: (``configs.TRACED_WINDOW_TILES``) and ``check_tables`` compiles: a target added to
#: ``TABLES`` joins once searched
MOD_WINDOW_TARGETS = ("gfx950", "gfx942", "gfx1250", "sm90")


def mod_window_problems(
    kind: str, dcls: str, target, fp32: bool = False, paged: bool = False
) -> dict:
    """``{warps: [(probe, problem, spec, tile), ...]}``: an entry's problems with a traced mod
    (``mod_problems``' not causal) under a left window bound, by the warps of the band level
    the plan's tile reaches (``plan.mod_band_tile``: ``tile``, before
    ``configs.TRACED_WINDOW_TILES``' changes), with each probe of ``MOD_PROBES`` (ALiBi's
    arithmetic, lighter than a gather, lost a wave or kept scratch at levels the other two
    compiled clean at: gfx942's 16-bit dQ d128 to d256 at 2 warps, sm90's fp32 dQ and dK/dV
    d128). A prefill's: under causal windows (``WINDOW_LEFTS``), the first met of each level
    and loop shape (``plan.narrow_band``), and a left bound without a right one (not causal:
    no band). A decode entry's (its tile does not shrink: one level): under each of
    ``DECODE_WINDOWS`` (the kernel is the same at every width: a decode tile's loops all
    mask; sm90's d64 and d256 kept scratch with the ALiBi-like mod only). ``paged`` (a
    forward's or decode's): those problems over a paged cache (``mod_paged_problems``), each
    page size's levels met apart (``configs.TRACED_WINDOW_PAGED_TILES``)."""
    if kind not in MOD_KINDS:
        raise ValueError(f"a traced mod's band levels are {', '.join(MOD_KINDS)}'s, not {kind!r}'s")
    out, seen = {}, set()
    for name, p0, spec in (mod_paged_problems if paged else mod_problems)(kind, dcls, fp32):
        if p0.causal:  # the windows set it
            continue
        if kind == "decode":
            probs = [replace(p0, window=w, causal=w[1] == 0) for w in DECODE_WINDOWS]
        else:
            probs = [replace(p0, window=(left, 0), causal=True) for left in WINDOW_LEFTS]
            probs.append(replace(p0, window=(WINDOW_LEFTS[-1], -1)))
        for p in probs:
            tile = plan.mod_band_tile(kind, p, target)
            band = plan.narrow_band(p, tile.BM, tile.BN, kind)
            key = (name, tile.num_warps, band, p.causal, p.page_size)
            if key not in seen:
                seen.add(key)
                out.setdefault(tile.num_warps, []).append((name, p, spec, tile))
    return out


def mod_kernel(kind: str, p, spec, target, cfg=None):
    """The kernel of ``kind`` at the mod problem ``p`` (``mod_problems``) with its captured
    tensor ``spec``: the plan's tile, or ``cfg``."""
    if kind in ("fwd", "decode"):
        fp = plan.plan_forward(p, target, config=cfg, splits=1, persistent=0)
        return forward_launches(fp, (spec,))[0].compile(target)
    return backward_launch(p, target, kind, cfg, (spec,)).compile(target)


#: the kinds whose mod problems ``check_tables`` compiles (``mod_problems``), 16-bit and fp32
MOD_KINDS = ("fwd", "decode", "bwd_dkdv", "bwd_dq")


def _mod_kernels(kind, dcls, target, windows=True):
    """``(label, kernel, floor, -1)`` of an entry at its mod problems (``MOD_KINDS``; a
    forward's and decode's over paged caches too: ``mod_paged_problems``), 16-bit at the
    entry's floor and fp32 at ``FP32_FLOOR``, as the plan compiles them; with
    ``windows`` on ``MOD_WINDOW_TARGETS`` under windows too (``mod_window_problems``, a
    forward's and decode's over paged caches too)"""
    out = []
    for fp32 in (False, True):
        fl = FP32_FLOOR if fp32 else floor_of(target, kind, dcls)
        tag = " fp32" if fp32 else ""
        for name, p, spec in mod_problems(kind, dcls, fp32) + mod_paged_problems(kind, dcls, fp32):
            what = f" mod {name}" + (" causal" if p.causal else "") + tag
            what += f" pages of {p.page_size}" if p.page_size else ""
            out.append((what, mod_kernel(kind, p, spec, target), fl, -1))
        if windows and target in MOD_WINDOW_TARGETS:
            levels = [mod_window_problems(kind, dcls, target, fp32)]
            if kind in ("fwd", "decode"):
                levels.append(mod_window_problems(kind, dcls, target, fp32, paged=True))
            for probs in (pr for lv in levels for pr in lv.values()):
                for name, p, spec, _ in probs:
                    what = f" mod {name} window {p.window}" + ("" if p.causal else " not causal")
                    what += tag + (f" pages of {p.page_size}" if p.page_size else "")
                    out.append((what, mod_kernel(kind, p, spec, target), fl, -1))
    return out


def mod_best(
    kind, dcls, target, fp32, probs, log, compile_with=None, sizes=(1, 2, 3)
) -> dict | None:
    """The change (``{}``: none needed; None: none found) that compiles every one of ``probs``
    (``(probe, problem, spec, tile)``, each with the tile the plan gives it before the
    searched change) clean at the entry's floor (fp32's: ``FP32_FLOOR``) with the fewest loop
    instructions per useful MFMA summed over them (on NVIDIA, which has no loop figure: the
    most warps per SM): the single changes (``window_changes`` and ``fp32_changes``' on the
    tile of the first problem that falls short), else a pair of the six nearest the bar, else
    a triple (``sizes``: the combination sizes tried). ``compile_with(problem, spec, config)``
    compiles a candidate (default ``mod_kernel``; ``fit.traced_tile``: the caller's launch)."""
    floor = FP32_FLOOR if fp32 else floor_of(target, kind, dcls)
    amd = str(target).startswith("gfx")

    def build(p, spec, t, changes):
        c = replace(t, **changes)
        if compile_with is not None:
            return compile_with(p, spec, c), c
        return mod_kernel(kind, p, spec, target, c), c

    def trial(changes, among=None):
        builds = [
            (p, lambda p=p, sp=spec, t=t: build(p, sp, t, changes))
            for _, p, spec, t in among or probs
        ]
        return _trial(builds, kind, target, floor, None if amd else _fewer_warps)

    # the problems that fall short unchanged first: a change that does not mend them fails
    # at its first compile
    failing = [pr for pr in probs if trial({}, [pr])[1] is not None]
    if not failing:
        return {}
    probs = failing + [pr for pr in probs if pr not in failing]
    tile = probs[0][3]
    singles = window_changes(kind, tile, tile, target)
    singles += [c for c in fp32_changes(kind, tile, tile) if c not in singles]
    if not amd and tile.BM > 16:  # NVIDIA's rows per warp need not fill an MFMA
        singles.append({"BM": tile.BM // 2})
    if not amd and tile.num_warps > 1 and {"num_warps": tile.num_warps // 2} not in singles:
        # nor its warps a row block each (sm90's fp32 forward d256 band level of 8 warps and
        # 16 rows over pages of 16: 8 to 40 B of scratch at every other single change)
        singles.append({"num_warps": tile.num_warps // 2})
    best, near, cands = None, [], singles
    for size in sizes:  # the singles, then pairs and triples of the six nearest the bar
        if size > 1:
            cands = _combos(near, size)
        for ch in cands:
            total, why, off = trial(ch)
            w = f"{tile.num_warps} warps " + ("fp32 " if fp32 else "")
            log(f"{target} {kind} {dcls} {w}{ch}: {why or round(total, 2)}")
            if why is None and (best is None or total < best[0]):
                best = (total, ch)
            if size == 1:
                near.append((off, ch))
        if best is not None:
            break
    return best[1] if best else None


def mod_search(
    kind: str,
    dcls: str,
    target: str,
    fp32: bool = False,
    log=print,
    windows: bool = False,
    paged: bool = False,
) -> dict | None:
    """The ``configs.TRACED_TILES`` change of an entry of ``MOD_KINDS`` (``{}``: none needed;
    None: none found) at its mod problems (``mod_problems``), from the plan's tile before it
    (``plan.forward_mod_tile``, ``plan.backward_tile``): ``mod_best``'s. ``windows``:
    ``{warps: change}``, ``configs.TRACED_WINDOW_TILES``' for the band levels
    that fall short under a left bound (``mod_window_problems``), each from its level's tile;
    a level no change mends is logged and left out. ``paged`` (a forward's or decode's):
    ``configs.TRACED_PAGED_TILES``' change at ``mod_paged_problems``, on top of the
    ``TRACED_TILES`` one; with ``windows``, ``{warps: change}`` of
    ``configs.TRACED_WINDOW_PAGED_TILES`` at the band levels over pages
    (``mod_window_problems(paged=True)``), on top of each level's ``TRACED_WINDOW_TILES``
    change."""
    if kind not in MOD_KINDS:
        raise ValueError(f"mod_search searches {', '.join(MOD_KINDS)}, not {kind!r}")
    if paged and kind not in ("fwd", "decode"):
        raise ValueError(f"mod_search(paged=True) searches fwd and decode, not {kind!r}")
    if windows:
        out = {}
        levels = mod_window_problems(kind, dcls, target, fp32, paged)
        for warps, probs in sorted(levels.items(), reverse=True):
            if paged:  # the paged change goes on top of the level's TRACED_WINDOW_TILES one
                probs = [
                    (n, p, sp, configs.traced_config(kind, t, dcls, target, fp32, True))
                    for n, p, sp, t in probs
                ]
            ch = mod_best(kind, dcls, target, fp32, probs, log)
            if ch is None:
                log(f"{target} {kind} {dcls} {warps} warps: no change compiles clean")
            elif ch:
                out[warps] = ch
        return out
    probs = (mod_paged_problems if paged else mod_problems)(kind, dcls, fp32)
    p0 = probs[0][1]
    if kind in ("fwd", "decode"):
        tile = plan.forward_mod_tile(p0, target, kind)
        if paged:  # the paged change goes on top of the TRACED_TILES one
            tile = configs.traced_config(kind, tile, dcls, target, fp32)
    else:
        tile = plan.backward_tile(kind, p0, target)
    return mod_best(kind, dcls, target, fp32, [(*pr, tile) for pr in probs], log)


def _persistent_kernels(kind, dcls, cfg, target):
    """``(label, CompiledKernel)`` of a forward entry's persistent grid (``Config.persist``) at
    its model problem, plain and under a causal window of 256 keys (the band tile): the
    variants ``check_tables`` holds to the same bar as the plain kernel."""
    if kind != "fwd" or not cfg.persist:
        return []
    out = []
    for label, window in ((" persistent", (-1, -1)), (" persistent window", (255, 0))):
        p = replace(model_problem(kind, dcls), window=window)
        fp = plan.plan_forward(p, target, persistent=256, splits=1)
        out.append((label, forward_launches(fp)[0].compile(target)))
    return out


def main(argv=None):  # pragma: no cover - a developer tool
    import argparse

    ap = argparse.ArgumentParser(
        prog="flydsl-kernels model attention",
        description="rank attention configs with the static model",
    )
    ap.add_argument("--target", default="gfx950")
    ap.add_argument("--kind", default="fwd", choices=["fwd", "decode", "bwd_dkdv", "bwd_dq"])
    ap.add_argument("--dclass", default="d128", choices=list(MODEL_SHAPES))
    ap.add_argument("--limit", type=int, default=0, help="only the first N candidates")
    ap.add_argument(
        "--scheds",
        default="",
        help="comma-separated LLVM schedulers to try besides the default (AMD), e.g. "
        "coexec,iterative-ilp,max-ilp",
    )
    ap.add_argument(
        "--klanes",
        default="",
        help="comma-separated K lane orders (Config.klanes) to try besides 0 for one-warp "
        "decode tiles, e.g. 8 (gfx950) or 4 (gfx942)",
    )
    ap.add_argument(
        "--check-tables", action="store_true", help="compile every shipped entry, every target"
    )
    ap.add_argument(
        "--windows",
        action="store_true",
        help="search the changes the --kind / --dclass entry's window tiles need "
        "(configs.WINDOW_TILES) on --target; with --mods: a traced mod's band levels' "
        "(configs.TRACED_WINDOW_TILES)",
    )
    ap.add_argument(
        "--mod",
        default="",
        choices=["", *TILE_MODS],
        help="with --windows: search configs.MOD_TILES' changes for this score term",
    )
    ap.add_argument(
        "--fp32",
        action="store_true",
        help="with --windows: search configs.FP32_TILES' changes (fp32 operands); with --mods: "
        "fp32's TRACED_TILES change",
    )
    ap.add_argument(
        "--mods",
        action="store_true",
        help="search configs.TRACED_TILES' change for the --kind (fwd, decode, bwd_dkdv, bwd_dq) "
        "and --dclass entry with traced score and mask mods on --target (with --fp32: fp32 "
        "operands)",
    )
    ap.add_argument(
        "--paged",
        action="store_true",
        help="with --windows (--kind fwd): search configs.PAGED_TILES' changes (with --mod: "
        "for that score term; with --fp32: configs.FP32_PAGED_TILES'); with --mods (--kind "
        "fwd or decode): configs.TRACED_PAGED_TILES' (with --windows too: "
        "configs.TRACED_WINDOW_PAGED_TILES')",
    )
    a = ap.parse_args(argv)
    if a.mods:
        print(mod_search(a.kind, a.dclass, a.target, a.fp32, windows=a.windows, paged=a.paged))
        return
    if a.windows:
        print(window_search(a.kind, a.dclass, a.target, mod=a.mod, paged=a.paged, fp32=a.fp32))
        return
    if a.check_tables:
        bad = check_tables()
        print("\n".join(bad) or "every shipped entry compiles without scratch or spills")
        for key, why in TILE_SHORTFALLS.items():
            print(f"known, left out: {' '.join(map(str, key))} warps: {why}")
        for key, (keep, why) in FP32_SHORTFALLS.items():
            level = " ".join(str(k) for k in key if k != "")  # no score term: none printed
            print(f"known, held to {keep} B of scratch: fp32 {level}: {why}")
        raise SystemExit(1 if bad else 0)
    kls = (0, *(int(x) for x in filter(None, a.klanes.split(","))))
    cands = space(a.kind, a.dclass, ("", *filter(None, a.scheds.split(","))), kls)
    if a.limit:
        cands = cands[: a.limit]
    for cfg, fig, why in rank(a.kind, a.dclass, a.target, cands):
        print(cfg.as_dict(), fig if fig else why, flush=True)


if __name__ == "__main__":  # pragma: no cover
    main()
