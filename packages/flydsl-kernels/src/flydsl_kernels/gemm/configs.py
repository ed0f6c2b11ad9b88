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
   body: the report's ``matrix_loop_instructions``, per multiply-accumulate of the tile):
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
"""

from __future__ import annotations

import math
import re
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

    def options(self) -> dict:
        return {
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "matrix_instr_nonkdim": self.nonkdim,
            "kpack": self.kpack,
        }

    def as_dict(self) -> dict:
        return {
            "BM": self.BM,
            "BN": self.BN,
            "BK": self.BK,
            "GROUP_M": self.GROUP_M,
            **self.options(),
        }


def space() -> list[Config]:
    """Every candidate the static model considers."""
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


# -- compile arguments (shared by the model, the report and the compile tests) -------------------


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


def compile_args(M, N, K, dtype, out_dtype=None, *, layout=MODEL_LAYOUT, split_k=1, even_k=None):
    """``(args, constexprs)`` to compile ``gemm_kernel`` for one shape (no epilogue)."""
    from flydsl_core import TensorSpec

    a, b = operand_specs(M, N, K, dtype, layout)
    o = TensorSpec("fp32" if split_k > 1 else (out_dtype or dtype), (split_k, M, N))
    args = [a, b, o, None, None, None, M, N, K, 1.0, 0.0]
    fixed = dict(
        XCDS=8,
        EVEN_K=(K % 64 == 0) if even_k is None else even_k,
        SPLIT_K=split_k,
        HAS_ALPHA=False,
        BIAS=0,
        ACT=0,
    )
    return args, fixed


def compile_config(cfg: Config, M=4096, N=4096, K=4096, dtype="bf16", target=TARGET, **kw):
    """Compile ``gemm_kernel`` with ``cfg`` for ``target``; returns the ``CompiledKernel``."""
    from .kernels import gemm_kernel

    args, fixed = compile_args(M, N, K, dtype, **kw)
    if "even_k" not in kw:
        fixed["EVEN_K"] = K % cfg.BK == 0
    return gemm_kernel.compile(
        *args,
        target=target,
        options=cfg.options(),
        **fixed,
        **cfg.constexprs(),
        GROUP_M=cfg.GROUP_M,
    )


# -- the K loop of the AMDGCN ----------------------------------------------------------------------

_LABEL = re.compile(r"^(\.?L\w+):")
_BRANCH = re.compile(r"^\s*s_cbranch_\w+\s+(\.?L\w+)")


def loop_bodies(amdgcn: str) -> list[list[str]]:
    """Instructions of each loop of ``amdgcn``: the lines from a label to a conditional branch
    back to it (a backward branch); an outer loop's body includes its inner loops."""
    lines = amdgcn.splitlines()
    labels: dict[str, int] = {}
    out: list[list[str]] = []
    for i, line in enumerate(lines):
        m = _LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = i
            continue
        b = _BRANCH.match(line)
        if b and b.group(1) in labels:
            out.append(
                [
                    ln.strip()
                    for ln in lines[labels[b.group(1)] + 1 : i + 1]
                    if ln.strip()
                    and not ln.strip().startswith((";", ".", "//"))
                    and ":" not in ln.split()[0]
                ]
            )
    return out


def k_loop_body(amdgcn: str) -> list[str]:
    """The lines of the K loop: the smallest loop holding a matrix op (the one the report's
    ``matrix_loop_instructions`` counts; under a persistent kernel's tile loop too)."""
    from flydsl_core.backends.triton.amdgcn import AMD_MATRIX_PREFIXES

    mma = [b for b in loop_bodies(amdgcn) if any(ln.startswith(AMD_MATRIX_PREFIXES) for ln in b)]
    return min(mma, key=len, default=[])


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
        "mfma": dict(r.matrix_ops),
        "loads": dict(r.load_widths_bits),
        "direct_to_lds": r.direct_to_lds_loads,
    }


def score(cfg: Config, fig: dict) -> tuple:
    widest = max((int(k) for k in fig["loads"]), default=0)
    cost = fig["k_loop"] * cfg.num_warps / (cfg.BM * cfg.BN * cfg.BK)
    return (widest, -cost, fig["occ"] or 0)


#: waves per SIMD a shipped candidate must reach (model rule 0)
OCCUPANCY_FLOOR = 2


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
    for cfg in candidates if candidates is not None else space():
        try:
            ck = compile_fn(cfg, target)
        except FlyDSLError as e:
            rows.append((cfg, None, f"compile failed: {e.msg}"))
            continue
        cand = judge(Candidate(None, ck.executable.report.to_dict()), tgt, OCCUPANCY_FLOOR)
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


def _fills_the_gpu(cfg: Config, M: int, N: int, batch: int) -> bool:
    return math.ceil(M / cfg.BM) * math.ceil(N / cfg.BN) * batch >= NUM_CUS


def select(M: int, N: int, K: int, batch: int = 1) -> Config:
    """The shipped tile for a shape: by M's class, except that the large tile gives way to the
    medium one when it would leave CUs without a tile (a grid-fill rule, untimed)."""
    cls = shape_class(M)
    if cls == "large" and not _fills_the_gpu(SHIPPED["large"], M, N, batch):
        cls = "medium"
    return SHIPPED[cls]


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


def select_swiglu(M: int, N: int, K: int, batch: int = 1) -> Config:
    """The fused SwiGLU's tile: the dense GEMM's class tile (``select``) with BN halved while its
    two accumulators (gate and up) would hold more than ``SWIGLU_MAX_ACC_PER_LANE`` fp32 values
    per lane, then BK halved while its pipeline (an A and two B tiles per stage) takes more than
    ``SWIGLU_LDS_PER_4_WAVES`` per 4 waves. Untimed; the compile tests pin that the results do
    not spill on gfx950 and keep 2 waves per SIMD."""
    from dataclasses import replace

    cfg = select(M, N, K, batch)
    new = replace(cfg, notes={})
    while 2 * new.BM * new.BN // (64 * new.num_warps) > SWIGLU_MAX_ACC_PER_LANE and new.BN > 32:
        new = replace(new, BN=new.BN // 2)
    while swiglu_lds(new) > SWIGLU_LDS_PER_4_WAVES * new.num_warps // 4 and new.BK > 32:
        new = replace(new, BK=new.BK // 2)
    return cfg if new == cfg else new


def select_grouped(m_per_group: int, N: int, K: int) -> Config:
    """The grouped kernel's tile, by the rows a group has on average (MoE: tokens per expert)."""
    return SHIPPED[shape_class(m_per_group)]


def grouped_programs(target) -> int:
    """Programs of the persistent grouped kernel: two per CU on GPUs (the tiles loop inside);
    a few on the CPU backends, which run programs one after another anyway."""
    if target is not None and str(target).startswith("cpu"):
        return 4
    return 2 * NUM_CUS


def split_k(cfg: Config, M: int, N: int, K: int, batch: int = 1) -> int:
    """Splits of K for a ``(M, N, K)`` GEMM: enough to bring the grid near one tile per CU."""
    tiles = math.ceil(M / cfg.BM) * math.ceil(N / cfg.BN) * batch
    k_tiles = math.ceil(K / cfg.BK)
    if tiles >= NUM_CUS // 2 or k_tiles < 2 * SPLITK_MIN_K_TILES:
        return 1
    return max(1, min(SPLITK_MAX, NUM_CUS // tiles, k_tiles // SPLITK_MIN_K_TILES))


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
    ranked = rank()
    for cfg, fig, why in ranked:
        print(cfg.as_dict(), fig if fig else why)
    print("per class:", {k: v.as_dict() for k, v in best_per_class(ranked).items()})
