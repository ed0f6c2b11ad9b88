"""GEMM config spaces, the static model that ranks them, and the shipped gfx950 defaults.

No gfx950 was available to time on: every shipped default is chosen by a
*static model*, untimed. Each candidate of the space is cross-compiled for
gfx950 at bf16 NT (``flydsl_core.autotune.prune`` rejects spills, scratch,
LDS over gfx950's 160 KiB and failed compiles), and the survivors are
ranked from their ``ResourceReport`` by, in order:

0. at least 2 waves per SIMD (a 2-stage pipeline needs a second wave to
   issue while one waits on its loads; ``prune``'s occupancy floor);
1. 128-bit global loads for both operands (the widest load present);
2. the issue cost per MAC, ``k_loop * num_warps / (BM * BN * BK)``
   (wave-instructions of one K-tile iteration, counted in the AMDGCN loop
   body: the report's ``matrix_loop_instructions``, found by the core's AMDGCN loop finder
   ``flydsl_core.backends.triton.amdgcn.loops``, per multiply-accumulate of the tile):
   bigger tiles amortize the address math, LDS traffic and waits per MFMA;
3. occupancy (waves per SIMD) as the tie-break: more waves hide latency.

The shape class then caps the tile: a decode GEMM (M <= 16) takes BM = 16
(padding M further is wasted MFMA work and A traffic), a small-M GEMM
(M <= 64) BM <= 64, a large one anything. At 4096^3 the model's figures
(VGPR / LDS / instructions per K tile), since the K loop clamps operand rows
instead of masking them (``kernels._rows``), are: decode 16x128x128 4 warps
64 / 74 KiB / 89; small 64x256x64 8 warps 92 / 81 KiB / 64; medium
(M <= 256, or a large M whose 256x256 grid would not fill the 256 CUs)
128x128x64 4 warps 134 / 65 KiB / 84; large 256x256x64 8 warps nonkdim 16
254 (128 VGPR + 126 AGPR) / 132 KiB / 152, no spills (the Triton tutorial
spills at this tile). Before the clamp the model had picked 256x128x64 for
large (then 128 / 97 KiB / 89; now 120 / 86).
``python -m flydsl_kernels.gemm.configs`` reprints the ranking; the compile
tests pin the figures of the shipped entries.

Other targets (``SHIPPED_BY_TARGET``; ``select(..., target)``): the same model over a
bounded candidate list per target (``space(target)``), each table with the figures of every
candidate beside it: sm90 (3-4 stage Hopper tiles; the model's first key is whether Triton
lowered the tile to ``wgmma``; occupancy in warps per SM with a floor of one 4-warp block),
gfx942 (tiles whose two stages fit 64 KiB of LDS) and gfx1250 (16x16 WMMA, wave32).
``Config.options(target)`` gives only the options that target's compiler takes. Grids
(grid fill, split-K, the persistent grouped grid) use the target's CUs / SMs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: the GPU target the shipped defaults are for
TARGET = "gfx950"
#: gfx950's compute units (split-K and the persistent grouped grid are sized by them)
NUM_CUS = 256
#: the unit-stride operand layout the model compiles (A row-major, B = W^T of a row-major W)
MODEL_LAYOUT = "NT"


@dataclass(frozen=True)
class Config:
    """Tile constexprs and launch options of the dense / grouped GEMM kernels."""

    BM: int
    BN: int
    BK: int
    GROUP_M: int = 8
    num_warps: int = 4
    num_stages: int = 2
    nonkdim: int = 16  # matrix_instr_nonkdim: 16 -> 16x16x32 MFMA, 32 -> 32x32x16
    kpack: int = 1
    notes: dict = field(default_factory=dict, compare=False, hash=False)

    def constexprs(self) -> dict:
        return {"BM": self.BM, "BN": self.BN, "BK": self.BK, "STAGES": self.num_stages}

    def options(self, target=TARGET) -> dict:
        """Launch options for ``target``'s compiler: the MFMA options only on AMD targets
        (``_target.compiler_options``); ``target`` None keeps them all."""
        from .._target import compiler_options

        opts = {
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "matrix_instr_nonkdim": self.nonkdim,
            "kpack": self.kpack,
        }
        return compiler_options(opts, target)

    def as_dict(self, target=TARGET) -> dict:
        return {
            "BM": self.BM,
            "BN": self.BN,
            "BK": self.BK,
            "GROUP_M": self.GROUP_M,
            **self.options(target),
        }


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
    for bm, bn, bk in ((64, 128, 64), (64, 256, 32), (128, 128, 32), (128, 256, 32),
                       (256, 128, 32), (128, 64, 64)):  # fmt: skip
        for w in (4, 8):
            out.append(Config(bm, bn, bk, 8, w, 2, 16 if bm * bn >= 256 * 128 else 32, 1))
    return [c for c in out if c.BK * (c.BM + c.BN) * 2 * 2 <= 64 * 1024]


def _space_gfx1250() -> list[Config]:
    """gfx1250 (wave32, 16x16 WMMA only, 320 KiB LDS): gfx950's class tiles with nonkdim 16,
    and a few neighbours."""
    out = [Config(16, 128, 128, 1, 4, 2, 16, 1), Config(16, 256, 128, 1, 4, 2, 16, 1)]
    for bm, bn, bk, w in ((64, 256, 64, 8), (64, 128, 64, 4), (128, 128, 64, 4),
                          (128, 256, 64, 8), (256, 256, 64, 8), (256, 128, 64, 8)):  # fmt: skip
        out.append(Config(bm, bn, bk, 8, w, 2, 16, 1))
    return out


def _space_sm90() -> list[Config]:
    """Hopper tiles: 3 or 4 pipeline stages (cp.async into 227 KiB of shared memory), warp
    groups of 4 warps for wgmma (BM a multiple of 64 per warp group); decode tiles BM 16 on
    mma.sync (a 16-row tile cannot feed wgmma, and decode is weight-bandwidth-bound). Bounded
    to the shapes Triton's own Hopper matmul configs use, a few per class."""
    out = [Config(16, bn, bk, 1, 4, 3, 16, 1) for bn in (64, 128) for bk in (128, 256)]
    for bm, bn, bk, w, st in ((64, 128, 64, 4, 3), (64, 256, 64, 4, 3), (64, 128, 128, 4, 3),
                              (64, 256, 64, 8, 4), (128, 128, 64, 4, 3), (128, 128, 64, 4, 4),
                              (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 256, 64, 8, 4),
                              (128, 128, 128, 8, 3), (128, 64, 64, 4, 4)):  # fmt: skip
        out.append(Config(bm, bn, bk, 8, w, st, 16, 1))
    return out


# -- the model's launches (shared by the model, the report and the compile tests) ---------------


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
    cfg: Config, M, N, K, dtype="bf16", target=TARGET, *, out_dtype=None, layout=MODEL_LAYOUT,
    split_k=1, even_k=None,
):  # fmt: skip
    """The dense kernel's launch (with ``split_k > 1`` the one into fp32 partials) of
    ``plan.plan_gemm`` for one shape with ``TensorSpec`` operands in ``layout`` and no epilogue,
    as the API launches it on ``target`` (its XCD count and compiler options); ``even_k`` None:
    K a multiple of ``cfg.BK``."""
    from flydsl_core import TensorSpec

    from .plan import plan_gemm

    a, b = operand_specs(M, N, K, dtype, layout)
    gp = plan_gemm(M, N, K, config=cfg, split_k=split_k, even_k=even_k, target=target)
    ws = {name: TensorSpec(dt, shape) for name, (shape, dt) in gp.workspaces().items()}
    return gp.launches(a=a, b=b, out=TensorSpec(out_dtype or dtype, (1, M, N)), **ws)[0]


def compile_config(cfg: Config, M=4096, N=4096, K=4096, dtype="bf16", target=TARGET, **kw):
    """Compile ``gemm_kernel`` with ``cfg`` for ``target`` (``model_launch``'s keywords);
    returns the ``CompiledKernel``."""
    return model_launch(cfg, M, N, K, dtype, target, **kw).compile(target)


def xcds(target) -> int:
    """XCDs the program ids are remapped across: the target's count (1 where it has none and on
    the CPU backends)."""
    from flydsl_core.targets import get_target, is_cpu_target

    if target is None or is_cpu_target(target):
        return 1
    return get_target(target).num_xcds or 1


# -- the static model ------------------------------------------------------------------------------


def figures(ck) -> dict:
    """The report figures the model and the tests read, from a ``CompiledKernel``."""
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


def rank(candidates=None, target=TARGET, M=4096, N=4096, K=4096, *, compile_fn=None):
    """``[(Config, figures or None, rejected or None)]``, survivors best first.

    ``compile_fn(cfg, target)`` compiles another kernel than the dense GEMM at
    ``(M, N, K)`` (its configs need the fields ``score`` reads).
    """
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


# -- the shipped gfx950 defaults (static model, untimed) ---------------------------------------------

# generated by `python -m flydsl_kernels.gemm.configs` (Triton 3.9, gfx950, bf16 NT 4096^3): the
# best survivor per class; notes = the figures the model saw (VGPR, LDS bytes, K-loop instructions)
SHIPPED: dict[str, Config] = {
    "decode": Config(16, 128, 128, 1, 4, 2, 16, 1, notes={"vgpr": 64, "lds": 75744, "k_loop": 89}),
    "small": Config(64, 256, 64, 8, 8, 2, 32, 1, notes={"vgpr": 92, "lds": 83168, "k_loop": 64}),
    "medium": Config(128, 128, 64, 8, 4, 2, 32, 1, notes={"vgpr": 134, "lds": 66528, "k_loop": 84}),
    "large": Config(
        256, 256, 64, 8, 8, 2, 16, 1, notes={"vgpr": 254, "lds": 135104, "k_loop": 152}
    ),
}
#: the largest BM each shape class may use
CLASS_MAX_BM = {"decode": 16, "small": 64, "medium": 128, "large": 256}


#: split-K: only when the tile grid leaves most CUs idle and K is long (decode / small M)
SPLITK_MAX = 16
SPLITK_MIN_K_TILES = 4  # K tiles each split keeps (fewer and the reduce traffic dominates)


def shape_class(M: int) -> str:
    if M <= 16:
        return "decode"
    return "small" if M <= 64 else ("medium" if M <= 256 else "large")


# generated by `python -m flydsl_kernels.gemm.configs --target sm90` (Triton 3.9, sm90, bf16 NT
# 4096^3, ``space("sm90")``: 15 candidates, cross-compiled, untimed). Each candidate's figures:
# registers per thread / stack frame / shared memory / warps per SM / PTX statements of the K loop
# / matrix instruction (all loads 128-bit), in the model's order:
#   128x256x64 8w 3st 162 / 0 / 148480 / 8 / 114 wgmma m64n256k16   <- medium, large
#   128x256x64 8w 4st 162 / 0 / 197632 / 8 / 114 wgmma m64n256k16
#   128x128x64 4w 3st 166 / 0 /  99328 / 8 / 140 wgmma m64n128k16
#   128x128x64 4w 4st 166 / 0 / 132096 / 4 / 140 wgmma m64n128k16
#    64x256x64 4w 3st 168 / 0 / 123904 / 4 / 143 wgmma m64n256k16   <- small
#   128x128x128 8w 3st 116 / 0 / 197632 / 8 / 157 wgmma m64n128k16
#    64x128x128 4w 3st 128 / 0 / 148480 / 4 / 187 wgmma m64n128k16
#   128x128x64 8w 3st  96 / 0 /  99328 / 16 / 97 wgmma m64n128k16
#    64x256x64 8w 4st  96 / 0 / 164864 / 8 / 108 wgmma m64n128k16
#    64x128x64 4w 3st  96 / 0 /  74752 / 12 / 109 wgmma m64n128k16
#   128x64x64 4w 4st  112 / 0 /  99328 / 8 / 127 wgmma m64n64k16
#    16x128x256 4w 3st 88 / 0 / 148480 / 4 / 289 mma.sync m16n8k16  <- decode (BM 16: no wgmma)
#    16x128x128 4w 3st 78 / 0 /  74752 / 12 / 157 mma.sync m16n8k16
#    16x64x256 4w 3st  64 / 0 /  82944 / 8 / 177 mma.sync m16n8k16
#    16x64x128 4w 3st  48 / 8 B stack (rejected: spills)
# Every M >= 64 candidate lowers to wgmma (the model's first key); Triton's own Hopper matmul
# tutorial ships the same first pick (128x256x64, 8 warps, 3 stages).
SHIPPED_SM90: dict[str, Config] = {
    "decode": Config(
        16, 128, 256, 1, 4, 3, 16, 1, notes={"regs": 88, "smem": 148480, "k_loop": 289}
    ),
    "small": Config(
        64, 256, 64, 8, 4, 3, 16, 1, notes={"regs": 168, "smem": 123904, "k_loop": 143}
    ),
    "medium": Config(
        128, 256, 64, 8, 8, 3, 16, 1, notes={"regs": 162, "smem": 148480, "k_loop": 114}
    ),
    "large": Config(
        128, 256, 64, 8, 8, 3, 16, 1, notes={"regs": 162, "smem": 148480, "k_loop": 114}
    ),
}

# generated by `python -m flydsl_kernels.gemm.configs --target gfx942` (Triton 3.9, gfx942, bf16 NT
# 4096^3, ``space("gfx942")``: 16 candidates whose two bf16 stages fit 64 KiB of LDS). VGPR /
# scratch / LDS / waves per SIMD / K-loop instructions / MFMA (all A/B loads 128-bit):
#   128x128x32 4w nk32 130 / 0 / 16384 / 3 / 52 32x32x8_bf16   <- medium, large
#   128x256x32 4w nk16 218 / 0 / 24576 / 2 / 116 16x16x16     256x128x32 4w nk16 216 / 0 / 24576 / 2 / 118
#   128x256x32 8w nk16 124 / 0 / 24576 / 4 / 61               256x128x32 8w nk16 122 / 0 / 24576 / 4 / 61
#    64x256x32 4w nk32 136 / 0 / 20480 / 3 / 61 32x32x8_bf16   <- small
#   128x128x32 8w nk32  64 / 0 / 16384 / 8 / 35               64x256x32 8w nk32 80 / 0 / 20480 / 6 / 37
#    64x128x64 4w nk32 134 / 0 / 24576 / 2 / 75               128x64x64 4w nk32 134 / 0 / 24576 / 2 / 75
#   128x64x64 8w nk32   66 / 0 / 24576 / 4 / 48               64x128x64 8w nk32 64 / 0 / 24576 / 4 / 50
#    16x256x32 4w nk16  72 / 0 / 17408 / 3 / 48 16x16x16_bf16  <- decode
#    16x128x64 4w 74 / 0 / 18432 / 3 / 50;  16x64x128 4w 80 / 0 / 20480 / 3 / 51;  16x64x64 4w 50 / 0 / 10240 / 6 / 37
# gfx950's large tile (256x256x64) compiles on gfx942 too (232 VGPR, 64 KiB: Triton shrinks its LDS
# buffering to fit), but the model ranks the tiles that fit two stages first.
SHIPPED_GFX942: dict[str, Config] = {
    "decode": Config(16, 256, 32, 1, 4, 2, 16, 1, notes={"vgpr": 72, "lds": 17408, "k_loop": 48}),
    "small": Config(64, 256, 32, 8, 4, 2, 32, 1, notes={"vgpr": 136, "lds": 20480, "k_loop": 61}),
    "medium": Config(128, 128, 32, 8, 4, 2, 32, 1, notes={"vgpr": 130, "lds": 16384, "k_loop": 52}),
    "large": Config(128, 128, 32, 8, 4, 2, 32, 1, notes={"vgpr": 130, "lds": 16384, "k_loop": 52}),
}

# generated by `python -m flydsl_kernels.gemm.configs --target gfx1250` (Triton 3.9, gfx1250:
# wave32, 16x16x32 WMMA only, no AGPRs, 320 KiB LDS; ``space("gfx1250")``, 8 candidates). VGPR /
# scratch / LDS / waves per SIMD / K-loop instructions (all v_wmma_f32_16x16x32_bf16, 128-bit):
#   256x256x64 8w 442 / 0 / 139232 / 2 / 237   <- large
#   256x128x64 8w 247 / 0 / 104416 / 4 / 166;  128x256x64 8w 247 / 0 / 104416 / 4 / 168 <- medium
#   128x128x64 4w 282 / 0 /  69600 / 3 / 200;   64x256x64 8w 170 / 0 / 87008 / 5 / 134  <- small
#    64x128x64 4w 180 / 0 /  52192 / 5 / 149
#    16x256x128 4w 205 / 0 / 147936 / 2 / 284  <- decode;  16x128x128 4w 138 / 0 / 78304 / 4 / 176
SHIPPED_GFX1250: dict[str, Config] = {
    "decode": Config(
        16, 256, 128, 1, 4, 2, 16, 1, notes={"vgpr": 205, "lds": 147936, "k_loop": 284}
    ),
    "small": Config(64, 256, 64, 8, 8, 2, 16, 1, notes={"vgpr": 170, "lds": 87008, "k_loop": 134}),
    "medium": Config(
        128, 256, 64, 8, 8, 2, 16, 1, notes={"vgpr": 247, "lds": 104416, "k_loop": 168}
    ),
    "large": Config(
        256, 256, 64, 8, 8, 2, 16, 1, notes={"vgpr": 442, "lds": 139232, "k_loop": 237}
    ),
}

#: every target's shipped table (``_target.TUNED_TARGETS``); others use gfx950's
SHIPPED_BY_TARGET: dict[str, dict[str, Config]] = {
    "gfx950": SHIPPED,
    "gfx942": SHIPPED_GFX942,
    "gfx1250": SHIPPED_GFX1250,
    "sm90": SHIPPED_SM90,
}


def shipped_table(target=None) -> dict[str, Config]:
    """The shipped tiles of ``target`` (a name, alias or ``Target``; None and the CPU backends
    read the gfx950 default)."""
    from .._target import table_for

    return table_for(SHIPPED_BY_TARGET, target)


def _cus(target) -> int:
    from .._target import num_cus

    return num_cus(target)


def _fills_the_gpu(cfg: Config, M: int, N: int, batch: int, target=None) -> bool:
    return math.ceil(M / cfg.BM) * math.ceil(N / cfg.BN) * batch >= _cus(target)


def select(M: int, N: int, K: int, batch: int = 1, target=None) -> Config:
    """The shipped tile of ``target``'s table for a shape: by M's class, except that the large
    tile gives way to the medium one when it would leave CUs / SMs without a tile (a grid-fill
    rule, untimed)."""
    table = shipped_table(target)
    cls = shape_class(M)
    if cls == "large" and not _fills_the_gpu(table["large"], M, N, batch, target):
        cls = "medium"
    return table[cls]


#: fp32 accumulator elements per lane the fused SwiGLU may hold (both accumulators together):
#: the dense large tile's figure (256 x 256 over 8 waves of 64 lanes), which compiles without
#: spilling on gfx950
SWIGLU_MAX_ACC_PER_LANE = 128
#: LDS bytes per 4 waves a SwiGLU workgroup may take: two workgroups of 4 waves (2 waves per
#: SIMD) then fit gfx950's 160 KiB, as the dense tiles do
SWIGLU_LDS_PER_4_WAVES = 80 * 1024


def swiglu_lds(cfg: Config) -> int:
    """LDS bytes of the fused SwiGLU's pipeline: per stage an A tile and two B tiles, bf16."""
    return cfg.num_stages * (cfg.BM * cfg.BK + 2 * cfg.BK * cfg.BN) * 2


def select_swiglu(M: int, N: int, K: int, batch: int = 1, target=None) -> Config:
    """The fused SwiGLU's tile: the dense GEMM's class tile (``select``) with BN halved while its
    two accumulators (gate and up) would hold more than ``SWIGLU_MAX_ACC_PER_LANE`` fp32 values
    per lane, then BK halved while its pipeline (an A and two B tiles per stage) takes more than
    ``SWIGLU_LDS_PER_4_WAVES`` per 4 waves. Untimed; the compile tests pin that the results do
    not spill on gfx950 and keep 2 waves per SIMD."""
    from dataclasses import replace

    from .._target import lane_factor

    cfg = select(M, N, K, batch, target)
    new = replace(cfg, notes={})
    # per lane of the target's warp: 64 lanes on CDNA, 32 on sm90 / gfx1250, whose tables
    # double num_warps instead (a 64-lane count put twice the fp32 values on an sm90 lane: the
    # 128x256 prefill tile spilled 624 B there)
    lanes = 64 // lane_factor(target)
    while 2 * new.BM * new.BN // (lanes * new.num_warps) > SWIGLU_MAX_ACC_PER_LANE and new.BN > 32:
        new = replace(new, BN=new.BN // 2)
    while swiglu_lds(new) > SWIGLU_LDS_PER_4_WAVES * new.num_warps // 4 and new.BK > 32:
        new = replace(new, BK=new.BK // 2)
    return cfg if new == cfg else new


def select_grouped(m_per_group: int, N: int, K: int, target=None) -> Config:
    """The grouped kernel's tile, by the rows a group has on average (MoE: tokens per expert)."""
    return shipped_table(target)[shape_class(m_per_group)]


def grouped_programs(target) -> int:
    """Programs of the persistent grouped kernel: two per CU / SM on GPUs (the tiles loop inside);
    a few on the CPU backends, which run programs one after another anyway."""
    from flydsl_core.targets import is_cpu_target

    if target is not None and is_cpu_target(target):
        return 4
    return 2 * _cus(target)


def split_k(cfg: Config, M: int, N: int, K: int, batch: int = 1, target=None) -> int:
    """Splits of K for a ``(M, N, K)`` GEMM: enough to bring the grid near one tile per CU."""
    cus = _cus(target)
    tiles = math.ceil(M / cfg.BM) * math.ceil(N / cfg.BN) * batch
    k_tiles = math.ceil(K / cfg.BK)
    if tiles >= cus // 2 or k_tiles < 2 * SPLITK_MIN_K_TILES:
        return 1
    return max(1, min(SPLITK_MAX, cus // tiles, k_tiles // SPLITK_MIN_K_TILES))


def best_per_class(ranked) -> dict[str, Config]:
    """The model's pick per shape class from ``rank()``'s output."""
    out = {}
    for cls, cap in CLASS_MAX_BM.items():
        for cfg, _fig, why in ranked:
            if why is None and (cap >= cfg.BM if cls != "decode" else cap == cfg.BM):
                out[cls] = cfg
                break
    return out


if __name__ == "__main__":  # pragma: no cover - a developer tool
    import sys

    tgt = sys.argv[sys.argv.index("--target") + 1] if "--target" in sys.argv else TARGET
    ranked = rank(target=tgt)
    for cfg, fig, why in ranked:
        print(cfg.as_dict(tgt), f"stages={cfg.num_stages}", fig if fig else why)
    print("per class:", {k: v.as_dict(tgt) for k, v in best_per_class(ranked).items()})
