"""The MX element formats (OCP Microscaling v1.0) and their torch storage dtypes.

Storage: FP8 elements as ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` (one per
byte); FP4 E2M1 elements as ``torch.float4_e2m1fn_x2``, two per byte along the
last dim, the even element in the low nibble; E8M0 scales as
``torch.float8_e8m0fnu`` (uint8 tensors holding the same bytes are accepted).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: elements per shared scale: OCP MX v1.0 fixes k = 32 for its concrete formats
BLOCK = 32
SCALE_DTYPE = torch.float8_e8m0fnu
SCALE_NAN = 0xFF  # E8M0 NaN
SCALE_BIAS = 127


@dataclass(frozen=True)
class ElemFormat:
    name: str  # the dot_scaled format name: e4m3, e5m2, e2m1
    torch_dtype: torch.dtype  # storage dtype of the quantized tensor
    mbits: int  # explicit mantissa bits
    bias: int  # exponent bias
    emax: int  # exponent of the largest normal (the spec's emax_elem)
    max_bits: int  # magnitude bits of the largest finite value (saturation)
    max_value: float
    per_byte: int  # elements per stored byte

    @property
    def sign_shift(self) -> int:
        return 7 if self.per_byte == 1 else 3

    @property
    def has_inf(self) -> bool:
        """E5M2 encodes Inf (magnitude bits ``max_bits + 1``) and NaN above; E4M3 has only
        NaN (``0x7F``), E2M1 neither."""
        return self.name == "e5m2"


E4M3 = ElemFormat("e4m3", torch.float8_e4m3fn, 3, 7, 8, 0x7E, 448.0, 1)
E5M2 = ElemFormat("e5m2", torch.float8_e5m2, 2, 15, 15, 0x7B, 57344.0, 1)
E2M1 = ElemFormat("e2m1", torch.float4_e2m1fn_x2, 1, 1, 2, 0x7, 6.0, 2)

FORMATS = {
    torch.float8_e4m3fn: E4M3,
    torch.float8_e5m2: E5M2,
    torch.float4_e2m1fn_x2: E2M1,
    "e4m3": E4M3,
    "e5m2": E5M2,
    "e2m1": E2M1,
    "fp8": E4M3,
    "fp4": E2M1,
}

#: the eight E2M1 magnitudes, indexed by the 3 magnitude bits
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def elem_format(f) -> ElemFormat:
    if isinstance(f, ElemFormat):
        return f
    try:
        return FORMATS[f]
    except (KeyError, TypeError):
        raise ValueError(
            f"unsupported MX element format {f!r}; supported: torch.float8_e4m3fn ('e4m3'), "
            "torch.float8_e5m2 ('e5m2'), torch.float4_e2m1fn_x2 ('e2m1')"
        ) from None


def check_block(block: int):
    if block != BLOCK:
        raise ValueError(f"MX block size {block} is not supported; OCP MX v1.0 uses {BLOCK}")


def scale_bytes(s: torch.Tensor) -> torch.Tensor:
    """E8M0 scales as a uint8 view (accepts float8_e8m0fnu or uint8)."""
    if s.dtype == torch.uint8:
        return s
    if s.dtype == SCALE_DTYPE:
        return s.view(torch.uint8)
    raise ValueError(f"MX scales must be torch.float8_e8m0fnu or uint8, got {s.dtype}")


def elem_bytes(q: torch.Tensor, fmt: ElemFormat) -> torch.Tensor:
    """Quantized elements as a uint8 view (accepts the format's dtype or uint8)."""
    if q.dtype == torch.uint8:
        return q
    if q.dtype != fmt.torch_dtype:
        raise ValueError(
            f"MX {fmt.name} elements must be {fmt.torch_dtype} or uint8, got {q.dtype}"
        )
    return q.view(torch.uint8)


def _elem_constexprs(fmt, names) -> dict:
    fmt = elem_format(fmt)
    every = {
        "EMAX": fmt.emax,
        "MB": fmt.mbits,
        "BIAS": fmt.bias,
        "MAXB": fmt.max_bits,
        "PACK": fmt.per_byte,
        "INF": fmt.has_inf,
    }
    return {n: every[n] for n in names}


def quant_constexprs(fmt) -> dict:
    """The element-format constexprs of ``mx_quantize``."""
    return _elem_constexprs(fmt, ("EMAX", "MB", "BIAS", "MAXB", "PACK"))


def dequant_constexprs(fmt) -> dict:
    """The element-format constexprs of ``mx_dequantize``."""
    return _elem_constexprs(fmt, ("MB", "BIAS", "MAXB", "PACK", "INF"))
