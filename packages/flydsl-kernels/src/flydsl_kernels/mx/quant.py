"""MX quantization over torch tensors: ``to_mx`` (a FlyDSL kernel) and ``from_mx``.

    q, s = to_mx(x, torch.float8_e4m3fn)      # q: (..., K) fp8,  s: (..., K/32) float8_e8m0fnu
    q, s = to_mx(x, torch.float4_e2m1fn_x2)   # q: (..., K/2) fp4x2, even element in the low nibble
    y = from_mx(q, s, torch.float8_e4m3fn)    # float32 by default; bf16 / fp16 too

Both run FlyDSL kernels (``mx_quantize`` / ``mx_dequantize``, integer bit
manipulation only). Semantics (scale choice, rounding, saturation, zeros, NaN /
Inf) are those of ``reference.to_mx`` / ``reference.from_mx``, bit for bit
(NaNs as NaN, their payload aside): see reference.py. ``x`` is any fp32 / bf16
/ fp16 tensor whose last dim is a multiple of 32.
"""

from __future__ import annotations

import math

import torch

from .._target import table_target
from .._target import tensor_target as _target
from .configs import DequantConfig, QuantConfig, select_dequant, select_quant
from .formats import (
    BLOCK,
    SCALE_DTYPE,
    check_block,
    dequant_constexprs,
    elem_bytes,
    elem_format,
    quant_constexprs,
    scale_bytes,
)
from .kernels import mx_dequantize, mx_quantize

SUPPORTED_INPUTS = (torch.float32, torch.bfloat16, torch.float16)
OUT_DTYPES = SUPPORTED_INPUTS


def to_mx(x: torch.Tensor, elem_dtype, block: int = BLOCK, *, target=None, config=None):
    """OCP MX quantization along the last dim: ``(q, scales)`` (see the module docstring)."""
    fmt = elem_format(elem_dtype)
    check_block(block)
    if x.dtype not in SUPPORTED_INPUTS:
        raise ValueError(f"to_mx supports fp32, bf16 and fp16 inputs; got {x.dtype}")
    if x.dim() == 0:
        raise ValueError("to_mx needs at least one dimension")
    k = x.shape[-1]
    if k % block:
        raise ValueError(f"to_mx needs the last dim ({k}) to be a multiple of the block {block}")
    lead = tuple(x.shape[:-1])
    x2 = x.reshape(math.prod(lead), k).contiguous()  # not -1: K may be 0
    m = x2.shape[0]
    q = torch.empty(m, k // fmt.per_byte, dtype=torch.uint8, device=x.device)
    s = torch.empty(m, k // block, dtype=torch.uint8, device=x.device)
    if m and k:
        cfg: QuantConfig = config or select_quant(m, k, table_target(x, target))
        grid = (-(-m // cfg.R), -(-(k // block) // cfg.NB))
        mx_quantize[grid](
            x2,
            q,
            s,
            K=k,
            **cfg.constexprs(),
            **quant_constexprs(fmt),
            target=_target(x, target),
            options=cfg.options(),
        )
    q = q.view(fmt.torch_dtype).reshape(*lead, k // fmt.per_byte)
    return q, s.view(SCALE_DTYPE).reshape(*lead, k // block)


def from_mx(
    q,
    scales,
    elem_dtype,
    block: int = BLOCK,
    out_dtype=torch.float32,
    *,
    target=None,
    config: DequantConfig | None = None,
):
    """Dequantize ``element * 2^(scale - 127)`` (0xFF scales give NaN), rounded once to
    ``out_dtype`` (fp32, bf16 or fp16): ``q`` ``(..., K / epb)`` as ``to_mx`` returns it,
    ``scales`` ``(..., K / 32)``; the result is ``(..., K)``."""
    fmt = elem_format(elem_dtype)
    check_block(block)
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"from_mx out_dtype must be fp32, bf16 or fp16; got {out_dtype}")
    u, sb = elem_bytes(q, fmt), scale_bytes(scales)
    if u.dim() == 0:
        raise ValueError("from_mx needs at least one dimension")
    k = u.shape[-1] * fmt.per_byte
    lead = tuple(u.shape[:-1])
    if tuple(sb.shape) != (*lead, k // block) or k % block:
        raise ValueError(
            f"scales of shape {list(sb.shape)} do not match elements of shape {list(u.shape)} "
            f"(expected {[*lead, k // block]}, K={k} a multiple of {block})"
        )
    rows = math.prod(lead)  # not -1: K may be 0
    u2 = u.reshape(rows, u.shape[-1]).contiguous()
    s2 = sb.reshape(rows, k // block).contiguous()
    m = u2.shape[0]
    y = torch.empty(m, k, dtype=out_dtype, device=u.device)
    if m and k:
        cfg = config or select_dequant(m, k, table_target(u, target))
        grid = (-(-m // cfg.R), -(-(k // block) // cfg.NB))
        mx_dequantize[grid](
            u2,
            s2,
            y,
            **cfg.constexprs(),
            **dequant_constexprs(fmt),
            target=_target(u, target),
            options=cfg.options(),
        )
    return y.reshape(*lead, k)
