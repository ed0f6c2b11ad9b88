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
"""

from __future__ import annotations

from dataclasses import replace

from flydsl_core import cdiv

from . import plan
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


def forward_launches(fp: plan.FwdPlan):
    """The launches of a forward plan with ``TensorSpec`` operands (a 4096-page cache)."""
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
    return fp.launches(**sp, **extra)


def backward_launch(p: plan.Problem, target, which, config=None):
    """One backward kernel's launch (``bwd_preprocess`` / ``bwd_dkdv`` / ``bwd_dq``) with
    ``TensorSpec`` operands; ``config`` replaces the table's for that kernel."""
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


def check_tables(targets=tuple(TABLES), keys=None) -> list[str]:
    """Compile every shipped entry of every target's table at its model problem; the problems
    found (compile failures, scratch, spills, LDS over the target's limit, and on AMD targets
    fewer than ``OCCUPANCY_FLOOR`` waves per SIMD outside ``BELOW_FLOOR``). ``keys``: only
    those ``(kind, dclass)`` entries."""
    from flydsl_core.autotune.prune import Candidate, judge
    from flydsl_core.exc import FlyDSLError
    from flydsl_core.targets import get_target

    bad = []
    for t in targets:
        tgt = get_target(t)
        for (kind, dcls), cfg in TABLES[t].items():
            if keys is not None and (kind, dcls) not in keys:
                continue
            try:  # the plain kernel, then the persistent ones the entry ships
                ck = compile_config(kind, cfg, model_problem(kind, dcls), t)
                kernels = [("", ck), *_persistent_kernels(kind, dcls, cfg, t)]
            except FlyDSLError as e:
                bad.append(f"{t} {kind} {dcls}: compile failed: {e.msg.splitlines()[0]}")
                continue
            amd = t.startswith("gfx") and (t, kind, dcls) not in BELOW_FLOOR
            floor = OCCUPANCY_FLOOR if amd else 1
            for what, k in kernels:
                rep = k.executable.report.to_dict()
                why = judge(Candidate(None, rep), tgt, floor).rejected
                if why or rep.get("spill_store_bytes"):
                    bad.append(f"{t} {kind} {dcls}{what} {cfg.as_dict()}: {why or 'spill stores'}")
    return bad


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
    a = ap.parse_args(argv)
    if a.check_tables:
        bad = check_tables()
        print("\n".join(bad) or "every shipped entry compiles without scratch or spills")
        raise SystemExit(1 if bad else 0)
    kls = (0, *(int(x) for x in filter(None, a.klanes.split(","))))
    cands = space(a.kind, a.dclass, ("", *filter(None, a.scheds.split(","))), kls)
    if a.limit:
        cands = cands[: a.limit]
    for cfg, fig, why in rank(a.kind, a.dclass, a.target, cands):
        print(cfg.as_dict(), fig if fig else why, flush=True)


if __name__ == "__main__":  # pragma: no cover
    main()
