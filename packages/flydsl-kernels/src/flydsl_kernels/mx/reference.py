"""PyTorch references for the MX family, written from OCP Microscaling v1.0 (section 6.3).

Quantization of one block ``V`` of 32 values along the last dim:

* ``X = floor(log2(max|V|)) - emax_elem`` (emax: e4m3 8, e5m2 15, e2m1 2),
  clamped to the E8M0 range ``[-127, 127]``; the scale byte is ``X + 127``;
* each element is ``V_i / 2^X`` rounded to nearest-even in the element format
  and saturated to its largest finite value (448, 57344, 6); signs are kept,
  so a negative value that rounds to zero is ``-0``.

Choices where the spec leaves room (the kernels make the same ones):

* a block of zeros (or of values whose amax is below 2^-126, an fp32
  subnormal) takes the smallest scale, ``X = -127`` (byte 0x00);
* a block holding a NaN *or an Inf* gets the NaN scale 0xFF and all its
  elements are stored as +0: the spec decodes every element of a NaN-scale
  block as NaN whatever its bits, and no finite scale can represent an Inf
  (E4M3 and E2M1 have no Inf);
* inputs are converted to fp32 first (exact for fp16 / bf16).

This code computes in float64 with ``torch.frexp`` / ``torch.round`` (an
independent route from the kernels' integer bit manipulation).
"""

from __future__ import annotations

import math

import torch

from .formats import (
    BLOCK,
    E2M1_VALUES,
    SCALE_BIAS,
    SCALE_DTYPE,
    SCALE_NAN,
    check_block,
    elem_bytes,
    elem_format,
    scale_bytes,
)


def _floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2(a)) for a > 0 (float64 in, int64 out); exact, unlike log2()."""
    _, e = torch.frexp(a)
    return e.to(torch.int64) - 1


def _round_elem(v: torch.Tensor, fmt) -> torch.Tensor:
    """|v| (float64) rounded to nearest-even in ``fmt`` and saturated, as float64."""
    a = v.abs()
    e = torch.where(a > 0, _floor_log2(torch.where(a > 0, a, 1.0)), 0)
    e = torch.clamp(e, min=1 - fmt.bias)  # subnormals share the smallest normal's quantum
    quantum = torch.pow(2.0, (e - fmt.mbits).double())
    return torch.clamp(torch.round(a / quantum) * quantum, max=fmt.max_value)


def _encode(mag: torch.Tensor, negative: torch.Tensor, fmt) -> torch.Tensor:
    """Exact representable magnitudes -> element bits (uint8, one element per entry)."""
    if fmt.per_byte == 1:
        bits = mag.to(torch.float32).to(fmt.torch_dtype).view(torch.uint8).to(torch.int32)
    else:
        table = torch.tensor(E2M1_VALUES, dtype=torch.float64, device=mag.device)
        bits = torch.searchsorted(table, mag.contiguous()).to(torch.int32)
    return (bits | (negative.to(torch.int32) << fmt.sign_shift)).to(torch.uint8)


def to_mx(x: torch.Tensor, elem_dtype, block: int = BLOCK):
    """``(q, scales)``: q in the element's storage dtype (fp4 packed two per byte along
    the last dim, low nibble = even element), scales ``float8_e8m0fnu`` of shape
    ``x.shape[:-1] + (K / 32,)``."""
    fmt = elem_format(elem_dtype)
    check_block(block)
    k = x.shape[-1]
    if k % block:
        raise ValueError(f"to_mx needs the last dim ({k}) to be a multiple of the block {block}")
    lead = x.shape[:-1]
    xb = x.detach().to(torch.float32).reshape(math.prod(lead), k // block, block).double()
    amax = xb.abs().amax(-1)  # NaN propagates
    special = ~torch.isfinite(amax)
    fl = torch.where(amax > 0, _floor_log2(torch.where(amax > 0, amax, 1.0)), -1000)
    fl = torch.where(special, 0, fl)
    X = torch.clamp(fl - fmt.emax, -SCALE_BIAS, SCALE_BIAS)
    sbytes = torch.where(special, SCALE_NAN, X + SCALE_BIAS).to(torch.uint8)
    v = xb * torch.pow(2.0, (-X).double())[..., None]  # exact in float64
    mag = _round_elem(torch.where(special[..., None], 0.0, v), fmt)
    neg = torch.signbit(xb) & ~special[..., None]
    bits = _encode(mag, neg, fmt).reshape(*lead, k)
    if fmt.per_byte == 2:
        bits = bits.reshape(*lead, k // 2, 2)
        bits = (bits[..., 0] | (bits[..., 1] << 4)).contiguous()
    q = bits.view(fmt.torch_dtype)
    return q, sbytes.reshape(*lead, k // block).view(SCALE_DTYPE)


def decode_elems(q: torch.Tensor, elem_dtype) -> torch.Tensor:
    """MX elements as float64 values (fp4 unpacked along the last dim)."""
    fmt = elem_format(elem_dtype)
    u = elem_bytes(q, fmt)
    if fmt.per_byte == 1:
        return u.view(fmt.torch_dtype).to(torch.float64)
    nib = torch.stack([u & 0xF, u >> 4], dim=-1).reshape(*u.shape[:-1], u.shape[-1] * 2)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float64, device=q.device)  # q's: a GPU too
    mag = table[(nib & 7).long()]
    return torch.where(nib >= 8, -mag, mag)


def decode_scales(s: torch.Tensor) -> torch.Tensor:
    """E8M0 scales as float64 powers of two (0xFF -> NaN)."""
    e = scale_bytes(s).to(torch.int64)
    v = torch.pow(2.0, (e - SCALE_BIAS).double())
    return torch.where(e == SCALE_NAN, float("nan"), v)


def from_mx(q, scales, elem_dtype, block: int = BLOCK, out_dtype=torch.float32):
    """Dequantize: ``element * 2^(scale - 127)`` per block, in float64, then ``out_dtype``."""
    check_block(block)
    v = decode_elems(q, elem_dtype)
    s = decode_scales(scales)
    k = v.shape[-1]
    if s.shape != (*v.shape[:-1], k // block):
        raise ValueError(
            f"scales of shape {list(s.shape)} do not match elements of shape {list(v.shape)} "
            f"(expected {[*v.shape[:-1], k // block]})"
        )
    return (v * s.repeat_interleave(block, dim=-1)).to(out_dtype)


def mismatches(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Where two float tensors of one dtype and shape differ in their bits, NaNs aside: a NaN
    matches any NaN (payloads are not part of the semantics) and nothing else."""
    if got.dtype != want.dtype or got.shape != want.shape:
        raise ValueError(
            f"cannot compare {got.dtype}{list(got.shape)} with {want.dtype}{list(want.shape)}"
        )
    gn, wn = torch.isnan(got), torch.isnan(want)
    it = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    return (gn != wn) | ((got.view(it) != want.view(it)) & ~wn)


def mx_gemm(a_q, a_scale, b_q, b_scale, a_format, b_format, *, bias=None, out_dtype=torch.bfloat16):
    """``dequant(a) @ dequant(b).T (+ bias)``: a is [M, K], b is [N, K] (NT), fp32 matmul."""
    a = from_mx(a_q, a_scale, a_format, out_dtype=torch.float32)
    b = from_mx(b_q, b_scale, b_format, out_dtype=torch.float32)
    c = a @ b.T
    if bias is not None:
        c = c + bias.float()
    return c.to(out_dtype)


def mx_grouped_mm(
    a_q,
    a_scale,
    b_q,
    b_scale,
    a_format,
    b_format,
    offs=None,
    *,
    bias=None,
    out_dtype=torch.bfloat16,
):
    """``torch._grouped_mm`` on the dequantized operands: a ``(total_M, K)`` with ``offs`` or
    ``(G, M, K)``, b ``(G, N, K)`` (NT); one fp32 matmul per group (``gemm.reference``)."""
    from ..gemm import reference as gemm_reference

    a = from_mx(a_q, a_scale, a_format, out_dtype=torch.float32)
    b = from_mx(b_q, b_scale, b_format, out_dtype=torch.float32)
    return gemm_reference.grouped_mm(a, b.transpose(-1, -2), offs, bias, out_dtype)
