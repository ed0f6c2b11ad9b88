"""The MX function API over torch tensors: quantization, the block-scaled GEMM and its grouped form.

Each function validates its operands, then launches what ``plan.py`` plans for them.

**Quantization** (``to_mx`` / ``from_mx``).

    q, s = to_mx(x, torch.float8_e4m3fn)      # q: (..., K) fp8,  s: (..., K/32) float8_e8m0fnu
    q, s = to_mx(x, torch.float4_e2m1fn_x2)   # q: (..., K/2) fp4x2, even element in the low nibble
    y = from_mx(q, s, torch.float8_e4m3fn)    # float32 by default; bf16 / fp16 too

Both run FlyDSL kernels (``mx_quantize`` / ``mx_dequantize``, integer bit
manipulation only). Semantics (scale choice, rounding, saturation, zeros, NaN /
Inf) are those of ``reference.to_mx`` / ``reference.from_mx``, bit for bit
(NaNs as NaN, their payload aside): see reference.py. ``x`` is any fp32 / bf16
/ fp16 tensor whose last dim is a multiple of 32.

**The GEMM** (``mx_gemm``: a tiled kernel around ``fly.dot_scaled``).

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

**The grouped GEMM** (``mx_grouped_mm``: the MoE forward, ``torch._grouped_mm`` on MX operands).

    out = mx_grouped_mm(a_q, a_scale, w_q, w_scale, "e4m3", "e4m3", offs)   # (total_M, N)

Forms (``offs``: int32 cumulative group end offsets, ``G`` of them):

* 2-D x 3-D, ragged M (MoE forward): ``a_q (total_M, K)``, ``b_q (G, N, K)``
  -> ``(total_M, N)``; rows ``offs[g-1]:offs[g]`` use ``b[g]``. Rows past
  ``offs[-1]`` belong to no group and are left unwritten (``torch.empty``), as
  ``gemm.grouped_mm`` leaves them; the MoE routing makes ``offs[-1] == total_M``.
* 3-D x 3-D, batched: ``a_q (G, M, K)``, ``b_q (G, N, K)`` -> ``(G, M, N)``, no ``offs``.
* 2-D x 2-D, ragged K (weight gradient): ``a_q (M, K)``, ``b_q (N, K)`` -> ``(G, M, N)``;
  group ``g`` contracts K ``offs[g-1]:offs[g]`` (an empty group gives zeros).
  The MX blocks run along K, so every ``offs`` must be a multiple of 32: this
  is checked on the host (one sync on ``offs``, in this form only, with the
  other value rules) and a ``ValueError`` says which offset is not.

``offs`` follows torch's rule (``flydsl_kernels._offs``): non-negative,
non-decreasing, at most the ragged extent; a broken rule is a ``ValueError``
(a list or another dtype a ``TypeError``) where ``offs`` is on the CPU, and a
GPU ``offs`` is clamped in the kernel, so nothing outside the operands is read
or written.

The weights are in the NT layout (K contiguous), as ``to_mx`` of ``(G, N, K)``
weights gives; fp4 operands hold ``K / 2`` bytes per row (``float4_e2m1fn_x2``).
Scales are E8M0 (``float8_e8m0fnu`` or uint8), one per 32 elements along K:
``(..., rows, K/32)``. ``out = dequant(a) @ dequant(b[g]).T (+ bias[g])``
with fp32 accumulation, rounded once to ``out_dtype`` (bf16, fp16, fp32);
``bias`` is ``(G, N)``, one row per group.

Formats: ``e4m3`` / ``e5m2`` (mxfp8) and ``e2m1`` (mxfp4) on either side:
mxfp8 x mxfp8, mxfp4 x mxfp4, a8w4. Any M, N, group sizes (empty groups,
groups smaller than a tile); any K that is a multiple of 32. ``bias`` is for
the 2-D x 3-D and 3-D x 3-D forms.

One persistent launch covers every group (``kernels.mx_grouped_gemm_nt``);
``offs`` is read in-kernel, so there is no host sync on it (but for the
ragged-K validation above).
"""

from __future__ import annotations

import math

import torch

from .. import supported
from .._offs import check_offs
from .._target import table_target, tensor_target
from ..gemm.kernels import RAGGED_K, RAGGED_M, RAGGED_NONE
from .configs import DequantConfig, GemmConfig
from .formats import BLOCK, SCALE_DTYPE, check_block, elem_bytes, elem_format, scale_bytes
from .plan import plan_dequantize, plan_gemm, plan_grouped, plan_quantize

#: input dtypes of ``to_mx``
SUPPORTED_INPUTS = supported.MX_INPUTS
#: output dtypes of ``from_mx`` and the GEMMs
OUT_DTYPES = supported.MX_OUT


# -- quantization -----------------------------------------------------------------------------------


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
        launch = plan_quantize(x2, q, s, fmt, config=config, table=table_target(x, target))
        launch.run(tensor_target(x, target))
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
        launch = plan_dequantize(u2, s2, y, fmt, config=config, table=table_target(u, target))
        launch.run(tensor_target(u, target))
    return y.reshape(*lead, k)


# -- the GEMM ---------------------------------------------------------------------------------------


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
    launch = plan_gemm(a, sa, b, sb, bias, c, fa, fb, config=config, table=table_target(a, target))
    launch.run(tensor_target(a, target))
    return c


# -- the grouped GEMM -------------------------------------------------------------------------------

FORMS = (
    "2-D x 3-D (ragged M, with offs), 3-D x 3-D (batched, no offs) or 2-D x 2-D (ragged K, "
    "offs multiples of 32)"
)


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
    target=None,
    config: GemmConfig | None = None,
):
    """``torch._grouped_mm(dequant(a), dequant(b).mT, offs, bias, out_dtype)`` (module docstring)."""
    if (a_q.dim(), b_q.dim()) not in ((2, 3), (3, 3), (2, 2)):
        raise ValueError(
            f"mx_grouped_mm takes {FORMS}; got a_q {list(a_q.shape)} and b_q {list(b_q.shape)}"
        )
    fa, a, sa, fb, b, sb, k = operands(
        a_q, a_scale, b_q, b_scale, a_format, b_format, out_dtype, "mx_grouped_mm", (2, 3)
    )
    if a.device != b.device:
        raise ValueError(f"mx_grouped_mm: a_q is on {a.device}, b_q on {b.device}")
    n, m = b.shape[-2], a.shape[-2]
    if b.dim() == 2:
        ragged = RAGGED_K
        # the K offsets must sit on MX block boundaries: checked on the host, whatever the
        # device (the one form that syncs on offs), with the other value rules
        offs = check_offs(
            offs,
            groups=None,
            extent=k,
            dim="K",
            device=a.device,
            what="mx_grouped_mm",
            multiple=BLOCK,
            values=True,
        )
        G = offs.shape[0]
        a, sa, b, sb = a[None], sa[None], b[None], sb[None]
    elif a.dim() == 2:
        ragged, G = RAGGED_M, b.shape[0]
        offs = check_offs(
            offs, groups=G, extent=m, dim="row", device=a.device, what="mx_grouped_mm"
        )
        a, sa = a[None], sa[None]
    else:
        ragged, G = RAGGED_NONE, b.shape[0]
        if offs is not None:
            raise ValueError("mx_grouped_mm: 3-D x 3-D is a batched matmul and takes no offs")
        if a.shape[0] != G:
            raise ValueError(f"mx_grouped_mm: a_q has {a.shape[0]} groups, b_q {G}")
    want_a, want_b = (*a.shape[:2], k // BLOCK), (*b.shape[:2], k // BLOCK)
    if tuple(sa.shape) != want_a or tuple(sb.shape) != want_b:
        raise ValueError(
            f"mx_grouped_mm scales must be (..., rows, K/32): a {list(want_a)}, b {list(want_b)} "
            f"(a leading 1 for a 2-D operand); got {list(a_scale.shape)} and {list(b_scale.shape)}"
        )
    if bias is not None and ragged == RAGGED_K:
        raise ValueError(
            "mx_grouped_mm bias is for the 2-D x 3-D and 3-D x 3-D forms, not ragged K"
        )
    if bias is not None:
        if tuple(bias.shape) != (G, n) or not bias.is_floating_point():
            raise ValueError(
                f"mx_grouped_mm bias must be a float (G, N) = ({G}, {n}) tensor, "
                f"got {bias.dtype} {list(bias.shape)}"
            )
        bias = bias.contiguous()
    out = torch.empty((m, n) if ragged == RAGGED_M else (G, m, n), dtype=out_dtype, device=a.device)
    if out.numel() == 0 or G == 0:
        return out
    if k == 0:
        # no K: bias (or zero) rows; ragged M writes only the rows the groups cover, as the kernel
        return _no_k(out, bias, offs, ragged)
    tgt = tensor_target(a, target)
    launch = plan_grouped(
        a,
        sa,
        b,
        sb,
        out if out.dim() == 3 else out[None],
        offs,
        bias,
        fa,
        fb,
        ragged,
        config=config,
        target=tgt,
        table=table_target(a, target),
    )
    launch.run(tgt)
    return out


def _no_k(out, bias, offs, ragged):
    if bias is None:
        return out.zero_()
    if ragged == RAGGED_NONE:
        return out.copy_(bias.float()[:, None, :].expand_as(out))
    # each row's group: how many group ends lie at or before it
    rows = torch.arange(out.shape[0], device=out.device)
    g = torch.searchsorted(offs.long(), rows, right=True).clamp_(max=bias.shape[0] - 1)
    return out.copy_(bias.float()[g])
