"""Launch configs of the MX kernels and the rule that picks them.

No gfx950 timings exist yet: the GEMM tiles follow the shapes that map onto
the scaled MFMA (``v_mfma_scale_f32_16x16x128_f8f6f4`` needs K tiles of 128
elements) and keep the pipelined LDS footprint well under gfx950's 160 KiB;
the quantizer's tile is sized for 16-byte loads and a short register life.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

TARGET = "gfx950"

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


def select_gemm(m: int, n: int, k: int, a_format: str, b_format: str) -> GemmConfig:
    """Decode-like M (<= 32) gets a 32-row tile; larger M 64 x 128. BK 256 (128 bytes of fp4)."""
    if m <= 32:
        return GemmConfig(BM=32, BN=64, BK=256, STAGES=2, num_warps=4)
    return GemmConfig(BM=64, BN=128, BK=256, STAGES=2, num_warps=4)


def select_quant(m: int, k: int) -> QuantConfig:
    """2048 elements per program (64 blocks of one row, or several short rows), 8 per lane at
    4 warps: 16-byte bf16 loads, 8-byte fp8 stores (measured on gfx950: configs at 512 elements
    per program load 16 bytes but the same 2 per lane; see test_mx_compile.py)."""
    nb = _pow2_at_most(k // 32, 64)
    rows = _pow2_at_most(max(1, 2048 // (nb * 32)), 16) if m > 1 else 1
    warps = max(1, min(4, rows * nb * 32 // 512))
    return QuantConfig(R=rows, NB=nb, num_warps=warps)


def select_dequant(m: int, k: int) -> DequantConfig:
    """The quantizer's rule (2048 elements per program). Static gfx950 figures (M=32, K=4096,
    4 warps; test_mx_compile.py): 64-bit element loads for fp8 (32-bit for packed fp4),
    128-bit stores, 38-45 VGPR, no scratch."""
    c = select_quant(m, k)
    return DequantConfig(R=c.R, NB=c.NB, num_warps=c.num_warps)


_EPB = {"e4m3": 1, "e5m2": 1, "e2m1": 2}
_FP8 = {"e4m3": "fp8e4m3", "e5m2": "fp8e5m2"}


def gemm_compile_args(m: int, n: int, k: int, a_format: str, b_format: str, out_dtype="bf16"):
    """``(args, constexprs)`` for compiling the GEMM with contiguous operands of these shapes."""
    from flydsl_core import TensorSpec

    def elems(rows, fmt):
        return TensorSpec(_FP8.get(fmt, "uint8"), (rows, k // _EPB[fmt]))

    args = [
        elems(m, a_format),
        TensorSpec("uint8", (m, k // 32)),
        elems(n, b_format),
        TensorSpec("uint8", (n, k // 32)),
        None,  # bias
        TensorSpec(out_dtype, (m, n)),
        k,
    ]
    return args, {"FA": a_format, "FB": b_format}


def compile_gemm(m, n, k, a_format, b_format, cfg: GemmConfig | None = None, target=TARGET):
    from .kernels import mx_gemm_nt

    cfg = cfg or select_gemm(m, n, k, a_format, b_format)
    args, fixed = gemm_compile_args(m, n, k, a_format, b_format)
    return mx_gemm_nt.compile(
        *args, target=target, options=cfg.options(), **fixed, **cfg.constexprs()
    )


def compile_quant(m, k, elem, cfg: QuantConfig | None = None, in_dtype="bf16", target=TARGET):
    from flydsl_core import TensorSpec

    from .formats import elem_format
    from .kernels import mx_quantize
    from .quant import quant_constexprs

    fmt = elem_format(elem)
    cfg = cfg or select_quant(m, k)
    args = [
        TensorSpec(in_dtype, (m, k)),
        TensorSpec("uint8", (m, k // fmt.per_byte)),
        TensorSpec("uint8", (m, k // 32)),
    ]
    return mx_quantize.compile(
        *args,
        target=target,
        options=cfg.options(),
        K=k,
        **cfg.constexprs(),
        **quant_constexprs(fmt),
    )


def compile_dequant(m, k, elem, cfg: DequantConfig | None = None, out_dtype="bf16", target=TARGET):
    from flydsl_core import TensorSpec

    from .formats import elem_format
    from .kernels import mx_dequantize
    from .quant import dequant_constexprs

    fmt = elem_format(elem)
    cfg = cfg or select_dequant(m, k)
    args = [
        TensorSpec("uint8", (m, k // fmt.per_byte)),
        TensorSpec("uint8", (m, k // 32)),
        TensorSpec(out_dtype, (m, k)),
    ]
    return mx_dequantize.compile(
        *args, target=target, options=cfg.options(), **cfg.constexprs(), **dequant_constexprs(fmt)
    )
