"""The MX block-scaled GEMM over torch tensors (a FlyDSL tiled kernel around ``fly.dot_scaled``).

    c = mx_gemm(a_q, a_scale, b_q, b_scale, "e4m3", "e2m1", bias=None, out_dtype=torch.bfloat16)

* ``a_q`` is ``(M, K)`` fp8 or ``(M, K/2)`` fp4x2; ``b_q`` is the weight in
  the NT layout, ``(N, K)`` / ``(N, K/2)`` (K contiguous, as ``to_mx(w)``
  of an ``(N, K)`` weight gives); scales ``(M, K/32)`` and ``(N, K/32)``
  E8M0 (``float8_e8m0fnu`` or uint8). ``c = (a deq) @ (b deq).T (+ bias)``,
  shape ``(M, N)``.
* Formats: ``e4m3``, ``e5m2`` (mxfp8) and ``e2m1`` (mxfp4) on either side:
  mxfp8 x mxfp8, mxfp4 x mxfp4 and a8w4 (and the mirrored mixes).
* fp32 accumulation; ``out_dtype`` bf16, fp16 or fp32; ``bias`` is ``(N,)``
  of any float dtype, added in fp32 before the output rounding.
* Any M, N; any K that is a multiple of 32 (the MX block): a K that is not a
  multiple of the BK tile is masked (masked elements add exactly 0).
"""

from __future__ import annotations

import torch

from .._target import table_target
from .._target import tensor_target as _target
from .configs import GemmConfig, select_gemm
from .formats import BLOCK, elem_bytes, elem_format, scale_bytes
from .kernels import mx_gemm_nt

OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def operands(a_q, a_scale, b_q, b_scale, a_format, b_format, out_dtype, api, dims=(2,)):
    """Validate both MX operands of ``api``: ``(fa, a, sa, fb, b, sb, K)`` with the elements as
    dot_scaled wants them (fp8 as its own dtype, fp4 as uint8 bytes) and the scales as uint8,
    contiguous. ``dims``: the ranks ``a_q`` may have (b_q: ``api``'s own check)."""
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"{api} out_dtype must be bf16, fp16 or fp32; got {out_dtype}")
    out = []
    for q, s, name, what in ((a_q, a_scale, a_format, "a_q"), (b_q, b_scale, b_format, "b_q")):
        fmt = elem_format(name)
        t = elem_bytes(q, fmt)
        t = t.view(fmt.torch_dtype) if fmt.per_byte == 1 else t
        if what == "a_q" and t.dim() not in dims:
            want = " or ".join(f"{d}-D" for d in dims)
            raise ValueError(f"{api}: {what} must be {want}, got shape {list(q.shape)}")
        out += [fmt, t.contiguous(), scale_bytes(s).contiguous()]
    fa, a, _, fb, b, _ = out
    k, kb = a.shape[-1] * fa.per_byte, b.shape[-1] * fb.per_byte
    if kb != k:
        raise ValueError(f"{api}: a holds K={k} elements per row, b K={kb}")
    if k % BLOCK:
        raise ValueError(f"{api} needs K ({k}) to be a multiple of the MX block {BLOCK}")
    return (*out, k)


def mx_gemm(
    a_q,
    a_scale,
    b_q,
    b_scale,
    a_format,
    b_format,
    *,
    bias=None,
    out_dtype=torch.bfloat16,
    target=None,
    config: GemmConfig | None = None,
):
    """``(dequant(a) @ dequant(b).T + bias).to(out_dtype)`` (see the module docstring)."""
    fa, a, sa, fb, b, sb, k = operands(
        a_q, a_scale, b_q, b_scale, a_format, b_format, out_dtype, "mx_gemm"
    )
    if b.dim() != 2:
        raise ValueError(f"mx_gemm: b_q must be 2-D, got shape {list(b_q.shape)}")
    m, n = a.shape[0], b.shape[0]
    if tuple(sa.shape) != (m, k // BLOCK) or tuple(sb.shape) != (n, k // BLOCK):
        raise ValueError(
            f"mx_gemm scales must be (M, K/32)={(m, k // BLOCK)} and (N, K/32)={(n, k // BLOCK)}; "
            f"got {tuple(sa.shape)} and {tuple(sb.shape)}"
        )
    if bias is not None:
        if tuple(bias.shape) != (n,) or not bias.is_floating_point():
            raise ValueError(f"mx_gemm bias must be a float ({n},) tensor, got {bias.shape}")
        bias = bias.contiguous()
    c = torch.empty(m, n, dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    if k == 0:
        return c.zero_() if bias is None else c.copy_(bias.float().expand(m, n))
    tgt = _target(a, target)
    cfg = config or select_gemm(m, n, k, fa.name, fb.name, table_target(a, target))
    grid = (-(-m // cfg.BM), -(-n // cfg.BN))
    mx_gemm_nt[grid](
        a,
        sa,
        b,
        sb,
        bias,
        c,
        k,
        FA=fa.name,
        FB=fb.name,
        **cfg.constexprs(),
        target=tgt,
        options=cfg.options(),
    )
    return c
