"""MX configs: each MX kernel's config, per-target tables (``TABLES``), ``select``, ``m_choice``.

No gfx950 timings exist yet: the dense GEMM's gfx950 tiles follow the shapes that map onto
the scaled MFMA (``v_mfma_scale_f32_16x16x128_f8f6f4`` needs K tiles of 128 elements) and
keep the pipelined LDS footprint well under gfx950's 160 KiB; the quantizer's tile is sized
for 16-byte loads and a short register life. The grouped MX GEMM's tiles and the other
targets' dense tiles come from the static model in ``model.py`` (cross-compiled, ranked as
the GEMM family's model does; untimed).

Kinds (``select(kind, *sizes, target=None)``):

* ``"gemm"`` ``(m, n, k, a_format, b_format)``: the dense MX GEMM's tile, decode (M <= 32)
  or large;
* ``"grouped"`` ``(m_per_group, n, k, a_format, b_format)``: the grouped MX GEMM's tile by
  the rows a group has on average, in the GEMM family's shape classes;
* ``"quant"`` / ``"dequant"`` ``(m, k)``: the (de)quantizer's tile, 2048 elements per
  program.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .._target import DEFAULT_TABLE, TUNED_TARGETS, table_for, target_name
from ..choice import Choice, MChoice
from ..gemm.configs import CLASS_BOUNDS, shape_class

#: the GPU target the shipped defaults are for (and the default table)
TARGET = "gfx950"
#: the selection kinds (``select``'s first argument)
KINDS = ("gemm", "grouped", "quant", "dequant")
#: the decode class of the dense MX GEMM: M up to this takes the decode tile
GEMM_DECODE_MAX_M = 32

# Pre-shuffled scales: investigated, not shipped (static gfx950 figures, Triton 3.9, no GPU).
# A K step loads a (BM, BK/32) E8M0 tile per operand: 32 x 8 = 256 bytes of A scales and
# 64 x 8 = 512 bytes of B scales at the decode config, for 256 lanes. Row-major today, that is
# one buffer_load_ubyte (A) and one buffer_load_ushort (B) per lane, staged through LDS by the
# pipeliner (ds_write_b8 + ds_write_b16) and read back as 12 ds_read_u8 per K step. A variant
# that reads the gfx950 32x8-tiled layout (hipBLASLt BLK32_UE8M0_32_8, Triton's
# GFX950MXScaleLayout: per 32 rows x 8 scales, bytes (r, c), (r+16, c), (r, c+4), (r+16, c+4)
# adjacent), loading (BM/32, BK) contiguous bytes and un-shuffling in registers (reshape /
# permute), compiled to the same global loads, the same LDS staging and the same 12
# ds_read_u8: K-loop instructions / total / VGPR, row-major -> shuffled, M=32 N=4096 K=4096:
#   fp8 x fp8 246 / 824 / 126 -> 244 / 835 / 128; fp4 x fp4 139 / 527 / 96 -> 138 / 541 / 102;
#   fp8 x fp4 179 / 656 / 134 -> 178 / 672 / 136; and 1024x8192x8192 fp8 (BM 64, BN 128)
#   295 / 823 / 212 -> 293 / 826 / 218 (ushort + dword scale loads either way).
# Off the shipped config it only moves LDS reads: STAGES=1 165 -> 156 K-loop instructions
# (ds_read_u8 x4 + ds_read_u16 x4 -> ds_read_u16 x2 + ds_read_b32 x2, global loads unchanged);
# 16x16 MFMA, 2 stages 180 -> 180 (494 -> 652 instructions). Wider K steps widen the row-major
# loads by themselves (fp4, BK 1024: 4 scale bytes per lane, buffer_load_dword), and there too
# the shuffled order changes nothing (389 -> 380 K-loop instructions, 48 ds_read_u8 both):
# Triton stages the scale operand of dot_scaled through LDS and reads it back a byte at a time
# whatever the global order. So no shuffle_scales helpers: they would pay off only if the
# scale load could feed the scaled MFMA without the LDS round trip.


@dataclass(frozen=True)
class GemmConfig:
    BM: int = 32
    BN: int = 64
    BK: int = 256
    STAGES: int = 2
    num_warps: int = 4

    def constexprs(self) -> dict:
        return {"BM": self.BM, "BN": self.BN, "BK": self.BK, "STAGES": self.STAGES}

    def options(self) -> dict:
        return {"num_warps": self.num_warps}

    def as_dict(self) -> dict:
        return {"kernel": "gemm", **asdict(self)}


@dataclass(frozen=True)
class QuantConfig:
    R: int = 1  # rows per program
    NB: int = 64  # 32-blocks per program (2048 elements)
    num_warps: int = 4

    def constexprs(self) -> dict:
        return {"R": self.R, "NB": self.NB}

    def options(self) -> dict:
        return {"num_warps": self.num_warps}

    def as_dict(self) -> dict:
        return {"kernel": "quantize", **asdict(self)}


@dataclass(frozen=True)
class DequantConfig(QuantConfig):
    """The dequantizer's tile: the quantizer's, (R rows, NB 32-blocks) per program."""

    def as_dict(self) -> dict:
        return {"kernel": "dequantize", **asdict(self)}


def _pow2_at_most(n: int, cap: int) -> int:
    p = 1
    while p * 2 <= min(n, cap):
        p *= 2
    return p


# -- the tables ------------------------------------------------------------------------------------

#: the dense MX GEMM's tiles per target: "decode" for M <= 32, "large" above. gfx950's map onto
#: the scaled MFMA (K tiles of 128 elements; BK 256 = 128 bytes of fp4); the other targets'
#: come from the static model (``model.rank("gemm", ...)``)
#
# sm90 (no MX MMA: Triton upcasts both operands to bf16 in registers, then wgmma / mma.sync):
# generated by `flydsl-kernels model mx --dense --target sm90` (Triton 3.9, cross-
# compiled, untimed; decode at 32x4096x4096 mxfp8, large at 1024x8192x8192 mxfp4). Registers per
# thread / stack frame / shared memory / PTX statements of the K loop, in the model's order:
#   decode 32x64x128 4w  186 / 0 / 25856 / 2028 mma.sync   (a8w4: 168 / 16 B stack: rejected)
#          32x128x128 8w 194 / 0 / 42496 / 2082;  32x64x64 4w 88 / 0 / 13440 / 1046  <- shipped
#          32x64x128 8w  141 / 0 / 25856 / 1391;  16x64x128 4w 144 / 0 / 21760 / 1418
#          32x64x256 4w  255 / 192 B stack (rejected: gfx950's tile, which spilled 104 B at 2 stages)
#   large  128x128x64 8w 144 / 0 / 33792 / 468 wgmma m64n128k16   <- shipped
#          64x128x128 4w 224 / 0 / 59392 / 1095;  64x128x64 4w 167 / 0 / 29696 / 580
#          128x64x128 8w 143 / 0 / 41984 / 701;  64x128x128 8w 152 / 0 / 58368 / 867
#          64x128x256 4w 255 / 304 B stack (rejected; gfx950's large tile spilled 424 B)
# Shipped picks are the best-ranked tiles that compile clean in every format of the report
# (mxfp8, mxfp4, a8w4: 32x64x64 4w is 88 / 108 / 96 registers, no stack) and keep <= 232
# registers (10% under the 255 cap) for Triton versions that allocate a few more (3.6: +3 on
# the bf16 GEMM); the report's sm90 rows pin them.
_GEMM: dict[str, dict[str, GemmConfig]] = {
    "gfx950": {
        "decode": GemmConfig(BM=32, BN=64, BK=256, STAGES=2, num_warps=4),
        "large": GemmConfig(BM=64, BN=128, BK=256, STAGES=2, num_warps=4),
    },
    "sm90": {
        "decode": GemmConfig(BM=32, BN=64, BK=64, STAGES=3, num_warps=4),
        "large": GemmConfig(BM=128, BN=128, BK=64, STAGES=3, num_warps=8),
    },
}
#: NVIDIA registers per thread a shipped MX tile may use (of 255): headroom for other formats
NVIDIA_MAX_REGS = 232


# generated by `flydsl-kernels model mx` (Triton 3.9, gfx950, mxfp8 x mxfp8 at
# model.GROUPED_MODEL_SHAPE; cross-compiled, untimed): the best survivor per shape class
# (gemm.model.best_per_class). The figures the model saw (VGPR / AGPR, LDS bytes, inner K-loop
# instructions, scaled MFMAs per wave and K tile):
#   decode 16x256x128 8 warps: 107 / 0, 6144, 135, 4 x 16x16x128
#   small  64x256x128 4 warps: 218 / 0, 19184, 243, 16 x 32x32x64
#   large 256x128x128 8 warps: 128 / 85, 102384, 199, 16 x 32x32x64
_GROUPED_GFX950: dict[str, GemmConfig] = {
    "decode": GemmConfig(BM=16, BN=256, BK=128, STAGES=2, num_warps=8),
    "small": GemmConfig(BM=64, BN=256, BK=128, STAGES=2, num_warps=4),
    "large": GemmConfig(BM=256, BN=128, BK=128, STAGES=2, num_warps=8),
}
# sm90: `flydsl-kernels model mx --target sm90` (Triton 3.9, mxfp8 x mxfp8 at
# model.GROUPED_MODEL_SHAPE, ``model.space("grouped", target="sm90")``, 3 stages; cross-compiled,
# untimed). Registers / stack / shared memory / K-loop PTX statements, in the model's order
# (survivors):
#   256x128x64 8w 255 / 0 / 66560 / 1020 wgmma;   128x128x128 8w 255 / 0 / 99328 / 1321 wgmma
#   128x128x64 8w 226 / 0 / 50176 /  695 wgmma   <- large (the best under NVIDIA_MAX_REGS)
#    64x128x64 4w 238 / 0 / 41984 / 1008 wgmma;    64x128x128 8w 192 / 0 / 82944 / 1324 wgmma <- small
#    16x128x128 4w 140 / 0 / 38912 / 2098 mma.sync <- decode;  16x256x128 8w 156 / 0 / 72704 / 2099
# rejected (stack frame): 64x128x128 4w 64 B, 64x256x64 4w 48 B, 128x64x128 4w 24 B; gfx950's
# large tile (256x128x128 8w) spilled 192-224 B on sm90.
_GROUPED_SM90: dict[str, GemmConfig] = {
    "decode": GemmConfig(BM=16, BN=128, BK=128, STAGES=3, num_warps=4),
    "small": GemmConfig(BM=64, BN=128, BK=128, STAGES=3, num_warps=8),
    "large": GemmConfig(BM=128, BN=128, BK=64, STAGES=3, num_warps=8),
}
# gfx942 (no scaled MFMA: Triton upcasts to bf16 v_mfma_f32_32x32x8 / 16x16x16): `python -m
# flydsl_kernels.mx.configs --target gfx942` (Triton 3.9, 2 stages, cross-compiled, untimed).
# VGPR / scratch / LDS / waves per SIMD / K-loop instructions, in the model's order:
#    64x256x64 4w 242 / 0 / 21504 / 2 / 1238;   128x128x64 8w 144 / 0 / 16384 / 3 / 914  <- large
#    64x128x64 4w 163 / 0 / 12288 / 3 /  920 <- small;  64x128x128 8w 153 / 0 / 25600 / 3 / 1200
#    16x128x128 4w 152 / 0 / 19456 / 3 / 954 <- decode;  16x256x128 8w 166 / 0 / 36864 / 2 / 955
# rejected: 64x128x128 4w and 128x64x128 4w (256 VGPR + AGPRs: 1 wave per SIMD), 128x128x128 8w
# (8 B scratch), 256x128x64 8w (24 B); gfx950's large tile (256x128x128 8w) spilled 352-432 B.
# The same register headroom as on sm90 (<= 232 of 256 arch VGPRs) passes over 64x256x64.
_GROUPED_GFX942: dict[str, GemmConfig] = {
    "decode": GemmConfig(BM=16, BN=128, BK=128, STAGES=2, num_warps=4),
    "small": GemmConfig(BM=64, BN=128, BK=64, STAGES=2, num_warps=4),
    "large": GemmConfig(BM=128, BN=128, BK=64, STAGES=2, num_warps=8),
}
_GROUPED: dict[str, dict[str, GemmConfig]] = {
    "gfx950": _GROUPED_GFX950,
    "gfx942": _GROUPED_GFX942,
    "sm90": _GROUPED_SM90,
}


#: every tuned target's tables, ``{"gemm": dense tiles by class, "grouped": grouped tiles by
#: class}`` (``_target.TUNED_TARGETS``); a target without its own tiles of a kind ships gfx950's
TABLES: dict[str, dict[str, dict[str, GemmConfig]]] = {
    t: {"gemm": _GEMM.get(t, _GEMM[TARGET]), "grouped": _GROUPED.get(t, _GROUPED[TARGET])}
    for t in TUNED_TARGETS
}


def table(target=None) -> dict[str, dict[str, GemmConfig]]:
    """``target``'s tables (None, the CPU backends and untuned targets: gfx950's)."""
    return table_for(TABLES, target)


# -- selection -------------------------------------------------------------------------------------


def select(kind: str, *sizes, target=None):
    """The config of ``kind`` for a problem's sizes in ``target``'s table (see the module doc)."""
    if kind == "gemm":
        m, _n, _k, _fa, _fb = sizes
        return table(target)["gemm"]["decode" if m <= GEMM_DECODE_MAX_M else "large"]
    if kind == "grouped":
        m_per_group, _n, _k, _fa, _fb = sizes
        return _grouped(m_per_group, target)
    if kind == "quant":
        return _quant(*sizes, target)
    if kind == "dequant":
        c = _quant(*sizes, target)
        return DequantConfig(R=c.R, NB=c.NB, num_warps=c.num_warps)
    raise ValueError(f"MX select: kind {kind!r} is not one of {', '.join(KINDS)}")


def _grouped(m_per_group: int, target) -> GemmConfig:
    """The grouped MX GEMM's tile by the rows a group has on average (MoE: tokens per expert),
    in the GEMM family's shape classes (decode <= 16 rows, small <= 64, large). Ragged K (the
    weight gradient) passes its M and takes the same classes: the model run on that form
    (``--wgrad``, at ``model.WGRAD_MODEL_SHAPE``) ranks the same small and large tiles first
    (its decode pick differs, but a weight gradient's M is a hidden size, never decode-like)."""
    cls = shape_class(m_per_group)
    # the MX model ships no medium tile (the dense bf16 one's 128x128): medium groups take large
    return table(target)["grouped"]["large" if cls == "medium" else cls]


def _lanes(target) -> int:
    """Lanes per wave / warp of the table's target (64 on the CDNA default)."""
    from flydsl_core.targets import get_target

    name = DEFAULT_TABLE if target is None else target_name(target)
    tg = get_target(name)
    return tg.warp_size if tg.is_gpu else 64


def _quant(m: int, k: int, target) -> QuantConfig:
    """2048 elements per program (64 blocks of one row, or several short rows), 8 per lane:
    16-byte bf16 loads, 8-byte fp8 stores (measured on gfx950: configs at 512 elements per
    program load 16 bytes but the same 2 per lane; see test_mx_compile.py). The warps follow the
    target's lanes per warp (4 waves of 64 on CDNA, 8 warps of 32 on sm90 and gfx1250), so each
    lane keeps 8 elements everywhere. The dequantizer takes the same tile (static gfx950
    figures, M=32, K=4096, 4 warps; test_mx_compile.py: 64-bit element loads for fp8, 32-bit
    for packed fp4, 128-bit stores, 38-45 VGPR, no scratch)."""
    nb = _pow2_at_most(k // 32, 64)
    rows = _pow2_at_most(max(1, 2048 // (nb * 32)), 16) if m > 1 else 1
    per_warp = 8 * _lanes(target)
    warps = max(1, min(2048 // per_warp, rows * nb * 32 // per_warp))
    return QuantConfig(R=rows, NB=nb, num_warps=warps)


def m_choice(kind: str, *sizes, target=None) -> MChoice:
    """The GEMMs' tile over M (``choice.MChoice``) for fixed other sizes: ``"gemm"`` ``(n, k,
    a_format, b_format)``, bound at ``GEMM_DECODE_MAX_M``; ``"grouped"`` ``(n, k, groups,
    a_format, b_format)``, ``groups`` the group count of a ragged-M problem (0: M is not split
    among groups), bound at the decode and small classes' tops (in rows per group: ``(top + 1)
    * G - 1``). The function API takes its tile from here."""
    if kind == "gemm":
        n, k, fa, fb = sizes

        def choose(m: int) -> Choice:
            return Choice(select("gemm", m, n, k, fa, fb, target=target))

        return MChoice(choose, lambda: (GEMM_DECODE_MAX_M,))
    if kind == "grouped":
        n, k, groups, fa, fb = sizes

        def choose_grouped(m: int) -> Choice:
            rows = max(1, m // groups) if groups else m
            return Choice(select("grouped", rows, n, k, fa, fb, target=target))

        def bounds():
            tops = (CLASS_BOUNDS["decode"], CLASS_BOUNDS["small"])  # medium takes large's tile
            return [(c + 1) * groups - 1 for c in tops] if groups else list(tops)

        return MChoice(choose_grouped, bounds)
    raise ValueError(f"MX m_choice: only the GEMMs' tiles depend on M, not {kind!r}")
