"""The GEMM static model: candidate spaces, the model's launches, the ranking that chose the tables.

No gfx950 was available to time on: every shipped tile of ``configs.TABLES`` is chosen by
this model, untimed. Each candidate of the space (``space``) is cross-compiled for gfx950 at
bf16 NT (``flydsl_core.autotune.prune``'s judgement rejects spills, scratch, LDS over
gfx950's 160 KiB and failed compiles), and the survivors are ranked from their
``ResourceReport`` (``score``) by, in order:

0. at least 2 waves per SIMD (a 2-stage pipeline needs a second wave to
   issue while one waits on its loads; ``prune``'s occupancy floor);
1. 128-bit global loads for both operands (the widest load present);
2. the issue cost per MAC, ``k_loop * num_warps / (BM * BN * BK)``
   (wave-instructions of one K-tile iteration, counted in the AMDGCN loop
   body: the report's ``matrix_loop_instructions``, per multiply-accumulate of the tile):
   bigger tiles amortize the address math, LDS traffic and waits per MFMA;
3. occupancy (waves per SIMD) as the tie-break: more waves hide latency.

The shape class then caps the tile (``best_per_class``): a decode GEMM (M <= 16) takes BM =
16 (padding M further is wasted MFMA work and A traffic), a small-M GEMM (M <= 64) BM <= 64, a
large one anything. At 4096^3 the model's figures (VGPR / LDS / instructions per K tile),
since the K loop clamps operand rows instead of masking them (``kernels._rows``), are: decode
16x128x128 4 warps 64 / 74 KiB / 89; small 64x256x64 8 warps 92 / 81 KiB / 64; medium (M <=
256, or a large M whose 256x256 grid would not fill the 256 CUs) 128x128x64 4 warps 134 / 65
KiB / 84; large 256x256x64 8 warps nonkdim 16 254 (128 VGPR + 126 AGPR) / 132 KiB / 152, no
spills (the Triton tutorial spills at this tile). Before the clamp the model had picked
256x128x64 for large (then 128 / 97 KiB / 89; now 120 / 86). ``flydsl-kernels model gemm [--target T]`` reprints the ranking; the compile tests pin the
figures of the shipped entries.

Other targets: the same model over a bounded candidate list per target (``space(target)``),
each table with the figures of every candidate beside it: sm90 (3-4 stage Hopper tiles; the
model's first key is whether Triton lowered the tile to ``wgmma``; occupancy in warps per SM
with a floor of one 4-warp block), gfx942 (tiles whose two stages fit 64 KiB of LDS) and
gfx1250 (16x16 WMMA, wave32).

The K loop's figures come from the report (``matrix_loop_instructions``,
``matrix_loop_mfma``), that is from the core's one AMDGCN loop finder
(``flydsl_core.backends.triton.amdgcn.loops``), which the attention model reads too.
"""

from __future__ import annotations

from .configs import TARGET, Config
from .plan import plan_gemm

#: the unit-stride operand layout the model compiles (A row-major, B = W^T of a row-major W)
MODEL_LAYOUT = "NT"
#: the largest BM each shape class may use
CLASS_MAX_BM = {"decode": 16, "small": 64, "medium": 128, "large": 256}


# -- the candidate spaces --------------------------------------------------------------------------


def space(target: str = TARGET) -> list[Config]:
    """Every candidate the static model considers for ``target`` (bounded per target: the
    other targets' spaces keep the shapes their hardware favours, not gfx950's whole grid)."""
    if target == "sm90":
        return _space_sm90()
    if target == "gfx942":
        return _space_gfx942()
    if target == "gfx1250":
        return _space_gfx1250()
    out = []
    for bm in (16, 32, 64, 128, 256):
        for bn in (64, 128, 256):
            if bm == 16 and bn < 256:  # decode tiles: 4 waves side by side along N
                out += [Config(16, bn, bk, 1, 4, 2, 16, 1) for bk in (128, 256)]
            for bk in (64, 128, 256):
                for w in (4, 8):
                    for nk in (16, 32):
                        # at least one MFMA tile per wave, tiles of at most 64K fp32 accumulators
                        if bm < nk or bm * bn > 65536 or bm * bn < 64 * w * 16:
                            continue
                        if bk * (bm + bn) * 2 * 2 > 160 * 1024:  # two stages of bf16 A + B in LDS
                            continue
                        out.append(Config(bm, bn, bk, 8, w, 2, nk, 1))
    return out


def _space_gfx942() -> list[Config]:
    """gfx942 tiles whose two bf16 stages of A + B fit its 64 KiB of LDS (bounded: the gfx950
    grid minus what cannot fit, a few per class)."""
    out = [Config(16, 64, 128, 1, 4, 2, 16, 1), Config(16, 128, 64, 1, 4, 2, 16, 1)]
    out += [Config(16, 64, 64, 1, 4, 2, 16, 1), Config(16, 256, 32, 1, 4, 2, 16, 1)]
    for bm, bn, bk in (
        (64, 128, 64),
        (64, 256, 32),
        (128, 128, 32),
        (128, 256, 32),
        (256, 128, 32),
        (128, 64, 64),
    ):
        for w in (4, 8):
            out.append(Config(bm, bn, bk, 8, w, 2, 16 if bm * bn >= 256 * 128 else 32, 1))
    return [c for c in out if c.BK * (c.BM + c.BN) * 2 * 2 <= 64 * 1024]


def _space_gfx1250() -> list[Config]:
    """gfx1250 (wave32, 16x16 WMMA only, 320 KiB LDS): gfx950's class tiles with nonkdim 16,
    and a few neighbours."""
    out = [Config(16, 128, 128, 1, 4, 2, 16, 1), Config(16, 256, 128, 1, 4, 2, 16, 1)]
    for bm, bn, bk, w in (
        (64, 256, 64, 8),
        (64, 128, 64, 4),
        (128, 128, 64, 4),
        (128, 256, 64, 8),
        (256, 256, 64, 8),
        (256, 128, 64, 8),
    ):
        out.append(Config(bm, bn, bk, 8, w, 2, 16, 1))
    return out


def _space_sm90() -> list[Config]:
    """Hopper tiles: 3 or 4 pipeline stages (cp.async into 227 KiB of shared memory), warp
    groups of 4 warps for wgmma (BM a multiple of 64 per warp group); decode tiles BM 16 on
    mma.sync (a 16-row tile cannot feed wgmma, and decode is weight-bandwidth-bound). Bounded
    to the shapes Triton's own Hopper matmul configs use, a few per class."""
    out = [Config(16, bn, bk, 1, 4, 3, 16, 1) for bn in (64, 128) for bk in (128, 256)]
    for bm, bn, bk, w, st in (
        (64, 128, 64, 4, 3),
        (64, 256, 64, 4, 3),
        (64, 128, 128, 4, 3),
        (64, 256, 64, 8, 4),
        (128, 128, 64, 4, 3),
        (128, 128, 64, 4, 4),
        (128, 128, 64, 8, 3),
        (128, 256, 64, 8, 3),
        (128, 256, 64, 8, 4),
        (128, 128, 128, 8, 3),
        (128, 64, 64, 4, 4),
    ):
        out.append(Config(bm, bn, bk, 8, w, st, 16, 1))
    return out


# -- the model's launches (shared by the model, the report and the compile tests) ------------------


def operand_specs(M, N, K, dtype, layout=MODEL_LAYOUT, batch=1):
    """``TensorSpec``s of 3-D ``a (batch, M, K)`` and ``b (batch, K, N)`` in ``layout``.

    ``layout`` letters say whether A and B are stored as given (N) or as the
    transpose (T): NT is ``a`` row-major and ``b`` a transposed view of a
    row-major ``(N, K)`` weight (``F.linear``).
    """
    from flydsl_core import TensorSpec

    sa = (M * K, K, 1) if layout[0] == "N" else (M * K, 1, M)
    sb = (K * N, N, 1) if layout[1] == "N" else (K * N, 1, K)
    return TensorSpec(dtype, (batch, M, K), sa), TensorSpec(dtype, (batch, K, N), sb)


def model_launch(
    cfg: Config,
    M,
    N,
    K,
    dtype="bf16",
    target=TARGET,
    *,
    out_dtype=None,
    layout=MODEL_LAYOUT,
    split_k=1,
    even_k=None,
):
    """The dense kernel's launch (with ``split_k > 1`` the one into fp32 partials) of
    ``plan.plan_gemm`` for one shape with ``TensorSpec`` operands in ``layout`` and no epilogue,
    as the API launches it on ``target`` (its XCD count and compiler options); ``even_k`` None:
    K a multiple of ``cfg.BK``."""
    from flydsl_core import TensorSpec

    a, b = operand_specs(M, N, K, dtype, layout)
    gp = plan_gemm(M, N, K, config=cfg, split_k=split_k, even_k=even_k, target=target)
    ws = {name: TensorSpec(dt, shape) for name, (shape, dt) in gp.workspaces().items()}
    return gp.launches(a=a, b=b, out=TensorSpec(out_dtype or dtype, (1, M, N)), **ws)[0]


def compile_config(cfg: Config, M=4096, N=4096, K=4096, dtype="bf16", target=TARGET, **kw):
    """Compile ``gemm_kernel`` with ``cfg`` for ``target`` (``model_launch``'s keywords);
    returns the ``CompiledKernel``."""
    return model_launch(cfg, M, N, K, dtype, target, **kw).compile(target)


# -- the ranking -----------------------------------------------------------------------------------


def figures(ck, kind=None, cfg=None, problem=None) -> dict:
    """The report figures the model and the tests read, from a ``CompiledKernel``. ``kind``,
    ``cfg`` and ``problem``: unused here (the one signature of every family's model)."""
    r = ck.executable.report
    return {
        "vgpr": r.vgpr,
        "agpr": r.agpr,
        "vgpr_total": r.vgpr_total,
        "sgpr": r.sgpr,
        "scratch": r.scratch_bytes,
        "lds": r.lds_bytes,
        "occ": r.occupancy,
        "instr": r.instruction_count,
        "k_loop": r.matrix_loop_instructions or 0,
        "k_loop_mfma": r.matrix_loop_mfma,
        "mfma": dict(r.matrix_ops),
        "loads": dict(r.load_widths_bits),
        "direct_to_lds": r.direct_to_lds_loads,
    }


def score(cfg: Config, fig: dict) -> tuple:
    """Larger is better: (warp-group MMA on NVIDIA, widest load, -issue cost per MAC,
    occupancy). On sm90 a tile Triton lowers to ``wgmma`` beats any ``mma.sync`` tile."""
    wgmma = any(op.startswith("wgmma") for op in fig["mfma"])
    widest = max((int(k) for k in fig["loads"]), default=0)
    cost = fig["k_loop"] * cfg.num_warps / (cfg.BM * cfg.BN * cfg.BK)
    return (wgmma, widest, -cost, fig["occ"] or 0)


#: waves per SIMD a shipped AMD candidate must reach (model rule 0)
OCCUPANCY_FLOOR = 2
#: the same floor on NVIDIA, in warps per SM: one resident block of 4 warps (occupancy there
#: is in warps per SM; two waves per SIMD have no such unit)
OCCUPANCY_FLOOR_NVIDIA = 4


def occupancy_floor(target) -> int:
    from flydsl_core.targets import get_target

    return OCCUPANCY_FLOOR if get_target(target).is_amd else OCCUPANCY_FLOOR_NVIDIA


def rank(
    kind: str = "dense",
    target=TARGET,
    candidates=None,
    *,
    M=4096,
    N=4096,
    K=4096,
    compile_fn=None,
):
    """``[(Config, figures or None, rejected or None)]``, survivors best first: the candidates
    (default: ``space(target)``) compiled for ``target`` at ``(M, N, K)``. The model ranks the
    dense kernel's tiles (``kind``; the other kinds derive from them); ``compile_fn(cfg,
    target)`` compiles another kernel instead (its configs need the fields ``score`` reads:
    the MX family's model ranks its tiles so)."""
    if kind != "dense" and compile_fn is None:
        raise ValueError(f"the GEMM model ranks the dense tiles, not {kind!r}")
    from flydsl_core.autotune.prune import Candidate, judge
    from flydsl_core.exc import FlyDSLError
    from flydsl_core.targets import get_target

    tgt = get_target(target)
    compile_fn = compile_fn or (lambda cfg, target: compile_config(cfg, M, N, K, target=target))
    rows = []
    for cfg in candidates if candidates is not None else space(tgt.name):
        try:
            ck = compile_fn(cfg, target)
        except FlyDSLError as e:
            rows.append((cfg, None, f"compile failed: {e.msg}"))
            continue
        cand = judge(Candidate(None, ck.executable.report.to_dict()), tgt, occupancy_floor(tgt))
        rows.append((cfg, figures(ck), cand.rejected))
    ok = sorted((r for r in rows if r[2] is None), key=lambda r: score(r[0], r[1]), reverse=True)
    return ok + [r for r in rows if r[2] is not None]


def best_per_class(ranked) -> dict[str, Config]:
    """The model's pick per shape class from ``rank()``'s output."""
    out = {}
    for cls, cap in CLASS_MAX_BM.items():
        for cfg, _fig, why in ranked:
            if why is None and (cap >= cfg.BM if cls != "decode" else cap == cfg.BM):
                out[cls] = cfg
                break
    return out


def main(argv=None):  # pragma: no cover - a developer tool
    import argparse

    ap = argparse.ArgumentParser(
        prog="flydsl-kernels model gemm",
        description="rank dense GEMM configs with the static model and print the table",
    )
    ap.add_argument("--target", default=TARGET)
    tgt = ap.parse_args(argv).target
    ranked = rank("dense", tgt)
    for cfg, fig, why in ranked:
        print(cfg.as_dict(tgt), f"stages={cfg.num_stages}", fig if fig else why)
    print("per class:", {k: v.as_dict(tgt) for k, v in best_per_class(ranked).items()})


if __name__ == "__main__":  # pragma: no cover
    main()
