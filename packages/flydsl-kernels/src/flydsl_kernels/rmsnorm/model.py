"""The RMSNorm static model: config spaces, the model's launches, the ranking that chose the tables.

No gfx950 was available to time on, so every shipped default of ``configs.TABLES`` was
chosen by this model, not by measurement: each candidate of a kernel's config space
(``space``) is cross-compiled for gfx950 (``flydsl_core.autotune.prune``: a candidate that
spills, needs scratch or too much LDS, or fails to compile is rejected) and the survivors are
ranked from their ``ResourceReport`` (``score``) by, in order:

1. the widest global load (128-bit ``buffer_load_dwordx4`` where the
   candidate allows it; RMSNorm is bandwidth-bound);
2. the occupancy (waves per SIMD, at most 8 on gfx950): enough waves in
   flight hide HBM latency, and a row kernel has nothing else to hide it with;
3. the issue cost per element, ``instruction_count * num_warps /
   elements`` (elements = the ``R * BLOCK`` a program moves per pass): the
   fewest wave-instructions spent on each element (index math and the
   cross-wave reduction amortized over more elements per lane);
4. fewer warps (a smaller workgroup waits less at its reduction barrier).

``flydsl-kernels model rmsnorm`` re-derives the tables and prints them; the
compile-tier tests check that the shipped entries are what the model picks for a sample of
them and that none spills. ``model_launch`` is the launch every compile of a config goes
through (the model, the compile tests and the report cases): the plan's, with ``TensorSpec``
operands.
"""

from __future__ import annotations

from .configs import TARGET, Config, backward_programs, cols_programs, elem_bytes, next_pow2
from .plan import (
    bwd_cols_launch,
    bwd_rowdot_launch,
    bwd_rows_launch,
    dw_reduce_launch,
    plan_forward,
)

# -- the config spaces -----------------------------------------------------------------------------

WARPS = (1, 2, 4, 8, 16)


def space(kernel: str, N: int, nbytes: int) -> list[Config]:
    """Every candidate the static model considers for ``kernel`` at row length ``N``."""
    b = next_pow2(N)
    out = []
    if kernel in ("fwd_rows", "bwd_rows"):
        rs = (1, 2, 4, 8, 16, 32, 64)
        for r in rs:
            for w in WARPS:
                # at least one element per lane, and tiles of at most 32K elements
                if 64 * w <= r * b <= 32768:
                    out.append(Config(kernel, b, r, w))
    elif kernel == "fwd_row":
        out = [Config(kernel, b, 1, w) for w in WARPS if 64 * w <= b]
    elif kernel in ("fwd_looped", "bwd_rowdot"):
        # 8 or 16 warps per row: long rows come in small batches, and one row per program must
        # then bring several waves per SIMD (upstream's gfx950 RMSNorm uses 1024 threads here)
        for blk in (1024, 2048, 4096, 8192, 16384):
            for w in (8, 16):
                if blk <= max(b // 2, 1024) and 64 * w <= blk:
                    out.append(Config(kernel, blk, 1, w))
    elif kernel == "bwd_cols":
        for blk in (256, 512, 1024, 2048, 4096):
            for w in (1, 2, 4, 8):
                if 64 * w <= blk:
                    out.append(Config(kernel, blk, 1, w))
    elif kernel == "dw_reduce":
        # 64 columns per program: the grid is N / BLOCK programs, and 64 fp32 columns are the
        # narrowest block whose rows are still whole 256-byte segments (16 lanes x 128 bits)
        for blk in (64,):
            for rb in (8, 16, 32, 64, 128):
                for w in (1, 2, 4, 8):
                    if 64 * w <= blk * rb <= 8192:
                        out.append(Config(kernel, blk, rb, w))
    else:
        raise KeyError(f"unknown RMSNorm kernel {kernel!r}")
    return out


# -- the model's launches --------------------------------------------------------------------------

#: the rows the model's problems have (``fwd_rows`` takes M at run time; the size is immaterial)
MODEL_ROWS = 4096
#: rows per program and partial rows the model compiles the backward kernels at (run-time ints,
#: specialized only on divisibility by 16)
MODEL_CHUNK, MODEL_PARTIALS = 16, 512


def model_launch(
    cfg: Config, N: int, dtype, *, weight: bool = True, residual: bool = False, mode: int = 0
):
    """The launch of ``cfg``'s kernel for rows of ``N`` elements of ``dtype`` with ``TensorSpec``
    operands: contiguous rows (row stride ``N``), aligned, 32-bit offsets, as the function API
    passes contiguous inputs; the backward with a deterministic dweight (partials, no atomics)."""
    from flydsl_core import TensorSpec

    big = 1 << 24  # any size: the kernels never read a flat tensor's extent
    t = TensorSpec(dtype, (big,))
    f32 = TensorSpec("fp32", (big,))
    w = TensorSpec(dtype, (N,)) if weight else None
    k = cfg.kernel
    if k.startswith("fwd"):
        res = t if residual else None
        fp = plan_forward(
            MODEL_ROWS, N, dtype, SR=N if residual else 0, mode=mode, eps=1e-6, config=cfg
        )
        return fp.launches(x=t, res=res, w=w, y=t, res_out=res, rstd=f32)[0]
    if k == "dw_reduce":
        return dw_reduce_launch(cfg, part=f32, dw=TensorSpec(dtype, (N,)), P=MODEL_PARTIALS, N=N)
    rows = dict(g=t, x=t, rstd=f32, w=w, M=MODEL_ROWS, N=N, SG=N, SX=N)
    if k == "bwd_rowdot":
        return bwd_rowdot_launch(cfg, coef=f32, **rows)
    part = f32 if weight else None
    if k == "bwd_rows":
        grid = (backward_programs(MODEL_ROWS, cfg.R)[0],)
        return bwd_rows_launch(cfg, grid, MODEL_CHUNK, dx=t, part=part, acc=None, **rows)
    grid = cols_programs(MODEL_ROWS, N, cfg.BLOCK)[:2]
    return bwd_cols_launch(cfg, grid, MODEL_CHUNK, coef=f32, dx=t, part=part, acc=None, **rows)


def compile_config(cfg: Config, N: int, dtype, target: str = TARGET, **kw):
    """Compile one config for ``target`` (``model_launch``: contiguous rows; ``kw``:
    ``weight``, ``residual``, ``mode``); returns the ``CompiledKernel``."""
    return model_launch(cfg, N, dtype, **kw).compile(target)


# -- the ranking -----------------------------------------------------------------------------------


def _elements(cfg: Config) -> int:
    if cfg.kernel in ("fwd_rows", "bwd_rows", "dw_reduce"):
        return cfg.R * cfg.BLOCK
    return cfg.BLOCK


def figures(ck, kind=None, cfg=None, problem=None) -> dict:
    """The figures ``score`` reads, from a ``CompiledKernel``: its resource report (as the
    model's pruning hands it over). ``kind``, ``cfg`` and ``problem``: unused here (the one
    signature of every family's model)."""
    return ck.executable.report.to_dict()


def score(cfg: Config, fig: dict) -> tuple:
    """The static model's sort key for a surviving candidate (larger is better)."""
    widths = fig.get("load_widths_bits") or {}
    widest = max((int(k) for k in widths), default=0)
    occ = fig.get("occupancy") or 0
    # "enough" occupancy: every wave slot on AMD (8 per SIMD); half the warp slots on NVIDIA,
    # where each thread's 128-bit loads keep more bytes in flight than a CDNA lane's
    cap = 8 if fig.get("occupancy_unit") != "warps_per_sm" else (fig["occupancy_max"] // 2)
    cost = fig["instruction_count"] * cfg.num_warps / _elements(cfg)
    return (widest, min(occ, cap), -cost, -cfg.num_warps)


def rank(kernel: str, N: int, dtype, target: str = TARGET, *, candidates=None, jobs=None, **kw):
    """All candidates of ``kernel`` at ``N`` compiled and judged, best first.

    Returns ``[(Config, report dict or None, rejected reason or None)]``.
    """
    from flydsl_core.autotune import config as at
    from flydsl_core.autotune.prune import prune

    cands = list(candidates) if candidates is not None else space(kernel, N, elem_bytes(dtype))
    by_key = {}
    spaces = []
    launch = None
    for c in cands:
        launch = model_launch(c, N, dtype, **kw)  # the run-time arguments are the same for all
        ac = at.Config.make(**launch.constexprs, **launch.options)
        by_key[ac] = c
        spaces.append(ac)
    if launch is None:
        return []
    res = prune(launch.kernel, launch.args, spaces, target, jobs=jobs)
    rows = [(by_key[c.config], c.report, c.rejected) for c in res.candidates]
    ok = sorted((r for r in rows if r[2] is None), key=lambda r: score(r[0], r[1]), reverse=True)
    return ok + [r for r in rows if r[2] is not None]


def best(kernel: str, N: int, dtype, target: str = TARGET, **kw) -> Config:
    ranked = rank(kernel, N, dtype, target, **kw)
    if not ranked or ranked[0][2] is not None:
        raise RuntimeError(f"no config of {kernel} at N={N} {dtype} survives on {target}")
    return ranked[0][0]


# -- the generator of the gfx950 table -------------------------------------------------------------


def main(argv=None):  # pragma: no cover - a developer tool
    import argparse

    import torch

    from .configs import ROWS_MAX_BLOCK

    ap = argparse.ArgumentParser(
        prog="flydsl-kernels model rmsnorm",
        description="re-derive the gfx950 RMSNorm tables with the static model and print them",
    )
    ap.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: auto)")
    jobs = ap.parse_args(argv).jobs

    for dtype in (torch.bfloat16, torch.float32):
        nb = elem_bytes(dtype)
        for b in [1 << k for k in range(0, 17)]:
            for kern in ("fwd_rows",) if b <= ROWS_MAX_BLOCK else ("fwd_row",):
                r = rank(kern, b, dtype, jobs=jobs)
                c, rep, why = r[0]
                print(kern, nb, b, c.as_dict(), _fig(rep) if rep else why)
        for kern, n in (("fwd_looped", 131072), ("bwd_rowdot", 131072), ("bwd_cols", 131072)):
            c, rep, _ = rank(kern, n, dtype, jobs=jobs)[0]
            print(kern, nb, c.as_dict(), _fig(rep))
        for b in [1 << k for k in range(0, 16)]:
            c, rep, why = rank("bwd_rows", b, dtype, jobs=jobs)[0]
            print("bwd_rows", nb, b, c.as_dict(), _fig(rep) if rep else why)
        c, rep, _ = rank("dw_reduce", 8192, dtype, jobs=jobs)[0]
        print("dw_reduce", nb, c.as_dict(), _fig(rep))


def _fig(rep: dict) -> str:
    return (
        f"vgpr={rep['vgpr']} sgpr={rep['sgpr']} instr={rep['instruction_count']} "
        f"occ={rep['occupancy']} ld={rep['load_widths_bits']} st={rep['store_widths_bits']}"
    )


if __name__ == "__main__":  # pragma: no cover
    main()
