"""Launch configs of the MX kernels and the rule that picks them.

No gfx950 timings exist yet: the GEMM tiles follow the shapes that map onto
the scaled MFMA (``v_mfma_scale_f32_16x16x128_f8f6f4`` needs K tiles of 128
elements) and keep the pipelined LDS footprint well under gfx950's 160 KiB;
the quantizer's tile is sized for 16-byte loads and a short register life.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

TARGET = "gfx950"


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


# -- the grouped MX GEMM (MoE forward) ------------------------------------------------------------


def select_grouped(m_per_group: int, n: int, k: int, a_format: str, b_format: str) -> GemmConfig:
    """The grouped MX GEMM's tile by the rows a group has on average (MoE: tokens per expert)."""
    return GROUPED_SHIPPED["decode" if m_per_group <= 32 else "prefill"]


GROUPED_SHIPPED = {
    "decode": GemmConfig(BM=32, BN=64, BK=256, STAGES=2, num_warps=4),
    "prefill": GemmConfig(BM=64, BN=128, BK=256, STAGES=2, num_warps=4),
}


def grouped_compile_args(tokens, experts, n, k, a_format, b_format, out_dtype="bf16"):
    """``(args, constexprs)`` to compile the ragged-M grouped MX GEMM (2-D a, 3-D weights)."""
    from flydsl_core import TensorSpec

    def elems(lead, rows, fmt):
        return TensorSpec(_FP8.get(fmt, "uint8"), (lead, rows, k // _EPB[fmt]))

    args = [
        elems(1, tokens, a_format),
        TensorSpec("uint8", (1, tokens, k // 32)),
        elems(experts, n, b_format),
        TensorSpec("uint8", (experts, n, k // 32)),
        TensorSpec(out_dtype, (1, tokens, n)),
        TensorSpec("int32", (experts,)),
        None,  # bias
        experts,
        tokens,
        n,
        k,
    ]
    gb = max(16, 1 << (experts - 1).bit_length())
    fixed = {"FA": a_format, "FB": b_format, "GB": gb, "RAGGED": 1, "HAS_BIAS": False}
    return args, fixed


def compile_grouped(
    tokens, experts, n, k, a_format, b_format, cfg: GemmConfig | None = None, target=TARGET
):
    from .kernels import mx_grouped_gemm_nt

    cfg = cfg or select_grouped(max(1, tokens // experts), n, k, a_format, b_format)
    args, fixed = grouped_compile_args(tokens, experts, n, k, a_format, b_format)
    return mx_grouped_gemm_nt.compile(
        *args, target=target, options=cfg.options(), **fixed, **cfg.constexprs()
    )
