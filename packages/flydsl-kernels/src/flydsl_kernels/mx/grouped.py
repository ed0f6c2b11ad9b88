"""The MX grouped GEMM over torch tensors (the MoE forward): ``torch._grouped_mm`` on MX operands.

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

import torch

from .._offs import check_offs
from .._target import table_target
from .._target import tensor_target as _target
from ..gemm.api import persistent_grid, target_xcds
from ..gemm.kernels import RAGGED_K, RAGGED_M, RAGGED_NONE
from .configs import GemmConfig, select_grouped
from .formats import BLOCK
from .gemm import operands
from .kernels import mx_grouped_gemm_nt

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
            offs, groups=None, extent=k, dim="K", device=a.device, what="mx_grouped_mm",
            multiple=BLOCK, values=True,
        )  # fmt: skip
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
    tgt = _target(a, target)
    table = table_target(a, target)
    cfg = config or select_grouped(
        max(1, m // G) if ragged == RAGGED_M else m, n, k, fa.name, fb.name, table
    )
    programs, gb = persistent_grid(ragged, G, m, n, cfg.BM, cfg.BN, tgt if tgt else table)
    mx_grouped_gemm_nt[(programs,)](
        a, sa, b, sb, out if out.dim() == 3 else out[None], offs, bias, G, m, n, k,
        FA=fa.name, FB=fb.name, GB=gb, RAGGED=ragged, HAS_BIAS=bias is not None,
        XCDS=target_xcds(tgt), **cfg.constexprs(), target=tgt, options=cfg.options(),
    )  # fmt: skip
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
