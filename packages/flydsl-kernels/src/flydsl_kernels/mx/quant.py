"""MX quantization over torch tensors: ``to_mx`` (a FlyDSL kernel) and ``from_mx``.

    q, s = to_mx(x, torch.float8_e4m3fn)      # q: (..., K) fp8,  s: (..., K/32) float8_e8m0fnu
    q, s = to_mx(x, torch.float4_e2m1fn_x2)   # q: (..., K/2) fp4x2, even element in the low nibble
    y = from_mx(q, s, torch.float8_e4m3fn)    # float32 by default

Semantics (scale choice, rounding, saturation, zeros, NaN / Inf) are those of
``reference.to_mx``, bit for bit: see reference.py. ``x`` is any fp32 / bf16 /
fp16 tensor whose last dim is a multiple of 32.
"""

from __future__ import annotations

import torch

from . import reference
from .configs import QuantConfig, select_quant
from .formats import BLOCK, SCALE_DTYPE, check_block, elem_format
from .kernels import mx_quantize

SUPPORTED_INPUTS = (torch.float32, torch.bfloat16, torch.float16)


def _target(t: torch.Tensor, target):
    if target is not None:
        return target
    if t.device.type == "cpu":
        from flydsl_core.targets import resolve_target

        tg = resolve_target()
        return tg.name if not tg.is_gpu else "cpu-reference"
    return None


def quant_constexprs(fmt) -> dict:
    fmt = elem_format(fmt)
    return {
        "EMAX": fmt.emax,
        "MB": fmt.mbits,
        "BIAS": fmt.bias,
        "MAXB": fmt.max_bits,
        "PACK": fmt.per_byte,
    }


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
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    q = torch.empty(m, k // fmt.per_byte, dtype=torch.uint8, device=x.device)
    s = torch.empty(m, k // block, dtype=torch.uint8, device=x.device)
    if m and k:
        cfg: QuantConfig = config or select_quant(m, k)
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


def from_mx(q, scales, elem_dtype, block: int = BLOCK, out_dtype=torch.float32):
    """Dequantize ``element * 2^(scale - 127)`` (0xFF scales give NaN); PyTorch ops."""
    return reference.from_mx(q, scales, elem_dtype, block, out_dtype)
