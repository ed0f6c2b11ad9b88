"""Launch configs of the MX kernels and the rule that picks them.

No gfx950 timings exist yet: the GEMM tiles follow the shapes that map onto
the scaled MFMA (``v_mfma_scale_f32_16x16x128_f8f6f4`` needs K tiles of 128
elements) and keep the pipelined LDS footprint well under gfx950's 160 KiB;
the quantizer's tile is sized for 16-byte loads and a short register life.

The grouped MX GEMM's defaults (``GROUPED_SHIPPED``) come from a static
model, untimed: every tile of ``grouped_space()`` is cross-compiled for
gfx950 (no GPU needed) and ranked from its code object's resource report as
the GEMM family's model does (``gemm.configs``: no spills / scratch, LDS
within 160 KiB, 2+ waves per SIMD; widest loads, then instructions of the
inner K loop per MAC, then occupancy). ``python -m flydsl_kernels.mx.configs``
reprints the ranking (``--wgrad``: the ragged-K form).
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

    from .formats import elem_format, quant_constexprs
    from .kernels import mx_quantize

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

    from .formats import dequant_constexprs, elem_format
    from .kernels import mx_dequantize

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


# -- the grouped MX GEMM (MoE forward) ------------------------------------------------------------


#: the model's shape: Qwen3-30B-A3B's expert gate+up projection (N = 2 x 768, K = 2048, 128
#: experts), 4096 tokens x top-8 (gfx950.md); the tile, not the shape, decides the code
GROUPED_MODEL_SHAPE = (4096 * 8, 128, 1536, 2048)


def grouped_space() -> list[GemmConfig]:
    """The grouped MX GEMM's candidate tiles: BK 128 / 256 (one or two K steps of the scaled
    MFMA per 32x32x64 or 16x16x128 op), at least one 16x16 MFMA tile per wave, at most 64K
    fp32 accumulators."""
    out = []
    for bm in (16, 32, 64, 128, 256):
        for bn in (64, 128, 256):
            for bk in (128, 256):
                for w in (4, 8):
                    if bm * bn > 65536 or bm * bn < 256 * w:
                        continue
                    out.append(GemmConfig(BM=bm, BN=bn, BK=bk, STAGES=2, num_warps=w))
    return out


#: the weight-gradient model shape: Qwen3-30B-A3B's gate_up dW, (M, experts, N, K) =
#: (hidden 2048, 128 experts, 1536, 32768 routed rows split into 128 K groups)
WGRAD_MODEL_SHAPE = (2048, 128, 1536, 4096 * 8)


def rank_grouped(candidates=None, target=TARGET, fmt=("e4m3", "e4m3"), ragged_k=False):
    """The static model over ``grouped_space()``: every candidate cross-compiled for ``target``
    at ``GROUPED_MODEL_SHAPE`` (``WGRAD_MODEL_SHAPE`` with ``ragged_k``; mxfp8), judged and
    ranked as the GEMM family's model does (``gemm.configs.rank``), the K loop being the
    persistent kernel's inner loop. Untimed."""
    from ..gemm.configs import rank

    shape = WGRAD_MODEL_SHAPE if ragged_k else GROUPED_MODEL_SHAPE

    def compile_fn(cfg, target):
        return compile_grouped(*shape, *fmt, cfg=cfg, target=target, ragged_k=ragged_k)

    return rank(
        grouped_space() if candidates is None else candidates,
        target,
        compile_fn=compile_fn,
    )


# generated by `python -m flydsl_kernels.mx.configs` (Triton 3.9, gfx950, mxfp8 x mxfp8 at
# GROUPED_MODEL_SHAPE; cross-compiled, untimed): the best survivor per shape class
# (gemm.configs.best_per_class). The figures the model saw (VGPR / AGPR, LDS bytes, inner K-loop
# instructions, scaled MFMAs per wave and K tile):
#   decode 16x256x128 8 warps: 107 / 0, 6144, 135, 4 x 16x16x128
#   small  64x256x128 4 warps: 218 / 0, 19184, 243, 16 x 32x32x64
#   large 256x128x128 8 warps: 128 / 85, 102384, 199, 16 x 32x32x64
GROUPED_SHIPPED: dict[str, GemmConfig] = {
    "decode": GemmConfig(BM=16, BN=256, BK=128, STAGES=2, num_warps=8),
    "small": GemmConfig(BM=64, BN=256, BK=128, STAGES=2, num_warps=4),
    "large": GemmConfig(BM=256, BN=128, BK=128, STAGES=2, num_warps=8),
}


def select_grouped(m_per_group: int, n: int, k: int, a_format: str, b_format: str) -> GemmConfig:
    """The grouped MX GEMM's tile by the rows a group has on average (MoE: tokens per expert),
    in the GEMM family's shape classes (decode <= 16 rows, small <= 64, large). Ragged K (the
    weight gradient) passes its M and takes the same classes: the model run on that form
    (``--wgrad``, at ``WGRAD_MODEL_SHAPE``) ranks the same small and large tiles first (its
    decode pick differs, but a weight gradient's M is a hidden size, never decode-like)."""
    from ..gemm.configs import shape_class

    cls = shape_class(m_per_group)
    # the MX model ships no medium tile (the dense bf16 one's 128x128): medium groups take large
    return GROUPED_SHIPPED["large" if cls == "medium" else cls]


def grouped_compile_args(
    tokens, experts, n, k, a_format, b_format, out_dtype="bf16", ragged_k=False
):
    """``(args, constexprs)`` to compile the grouped MX GEMM: ragged M (2-D a ``(tokens, k)``,
    3-D weights ``(experts, n, k)``), or with ``ragged_k`` the weight gradient (``a (tokens, k)``,
    ``b (n, k)``, ``experts`` K groups, out ``(experts, tokens, n)``)."""
    from flydsl_core import TensorSpec

    def elems(lead, rows, fmt):
        return TensorSpec(_FP8.get(fmt, "uint8"), (lead, rows, k // _EPB[fmt]))

    gb_ = 1 if ragged_k else experts
    args = [
        elems(1, tokens, a_format),
        TensorSpec("uint8", (1, tokens, k // 32)),
        elems(gb_, n, b_format),
        TensorSpec("uint8", (gb_, n, k // 32)),
        TensorSpec(out_dtype, (experts if ragged_k else 1, tokens, n)),
        TensorSpec("int32", (experts,)),
        None,  # bias
        experts,
        tokens,
        n,
        k,
    ]
    gb = max(16, 1 << (experts - 1).bit_length())
    fixed = {"FA": a_format, "FB": b_format, "GB": gb, "RAGGED": 2 if ragged_k else 1}
    return args, {**fixed, "HAS_BIAS": False, "XCDS": 8}  # gfx950's 8 XCDs


def compile_grouped(
    tokens, experts, n, k, a_format, b_format, cfg: GemmConfig | None = None, target=TARGET,
    ragged_k=False,
):  # fmt: skip
    from .kernels import mx_grouped_gemm_nt

    cfg = cfg or select_grouped(max(1, tokens // experts), n, k, a_format, b_format)
    args, fixed = grouped_compile_args(tokens, experts, n, k, a_format, b_format, ragged_k=ragged_k)
    return mx_grouped_gemm_nt.compile(
        *args, target=target, options=cfg.options(), **fixed, **cfg.constexprs()
    )


if __name__ == "__main__":  # pragma: no cover - a developer tool
    import sys

    from ..gemm.configs import best_per_class

    ranked = rank_grouped(ragged_k="--wgrad" in sys.argv)
    for cfg, fig, why in ranked:
        print(cfg, fig if fig else why)
    print("per class:", best_per_class(ranked))
