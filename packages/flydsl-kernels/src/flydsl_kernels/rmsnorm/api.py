"""The RMSNorm function API over torch tensors: forward, backward, fused residual add.

Layouts: ``x`` (and ``residual``, ``grad_y``) must view as ``(M, N)`` rows
whose elements are contiguous (inner stride 1) with one row stride between
rows: ``t.view(M, N)`` must succeed and have ``stride(1) == 1``. That covers
contiguous tensors, slices of wider rows (``x[..., :N]`` of a fused buffer)
and broadcast rows (row stride 0). Anything else raises ``ValueError``
naming the layout, so a caller can fall back (e.g. to ATen, or call
``.contiguous()``). Outputs are always contiguous, as ATen's are.

dtypes: fp32, bf16, fp16 in; fp32 accumulation; outputs in the input dtype
(see each function for the weight's dtype). ``N`` from 0 (ATen's NaN rstd)
to any size; each distinct ``N`` (and row stride) compiles its own kernel,
since both are compile-time constants of the kernels (kernels.py says why).

``target``: a FlyDSL target name; None picks the device's target for GPU
tensors and ``cpu-reference`` for CPU tensors (``$FLYDSL_TARGET`` may name
``cpu-interpret`` instead). ``config`` overrides the shipped defaults (a
``configs.Config`` for the forward kernel), for tuning and tests.
"""

from __future__ import annotations

import math

import torch

from .. import supported
from .._target import table_target
from .._target import tensor_target as _target
from ..launch import run_all
from .kernels import MODE_ATEN, MODE_GEMMA, MODE_LLAMA
from .plan import plan_backward, plan_forward

SUPPORTED_DTYPES = supported.RMSNORM

_LAYOUT = (
    "FlyDSL RMSNorm supports rows with contiguous elements (inner stride 1) and a single "
    "row stride: t.view(M, N) must work and have stride(1) == 1"
)


# -- argument handling ------------------------------------------------------------------------------


def _check_dtype(t: torch.Tensor, what: str):
    if t.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"FlyDSL RMSNorm supports fp32, bf16 and fp16 {what}; got {t.dtype}")


def _normalized(x: torch.Tensor, normalized_shape) -> tuple[tuple[int, ...], int, int]:
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    ns = tuple(int(s) for s in normalized_shape)
    if not ns or len(ns) > x.dim() or tuple(x.shape[x.dim() - len(ns) :]) != ns:
        raise ValueError(
            f"normalized_shape {list(ns)} must be a non-empty suffix of the input's shape "
            f"{list(x.shape)}"
        )
    n = math.prod(ns)
    m = math.prod(x.shape[: x.dim() - len(ns)])
    return ns, n, m


def _rows(t: torch.Tensor, m: int, n: int, what: str) -> tuple[torch.Tensor, int]:
    """``t`` as ``(m, n)`` rows and its row stride, or a ValueError naming the layout."""
    try:
        t2 = t.view(m, n)
    except RuntimeError:
        raise ValueError(
            f"{what} of shape {list(t.shape)} and strides {list(t.stride())}: {_LAYOUT}"
        ) from None
    if n > 1 and t2.stride(1) != 1:
        raise ValueError(f"{what} has inner stride {t2.stride(1)}: {_LAYOUT}")
    stride = t2.stride(0) if m > 1 else n
    if stride < 0:
        raise ValueError(f"{what} has a negative row stride: {_LAYOUT}")
    return t2, stride


def _flat(t2: torch.Tensor, stride: int) -> torch.Tensor:
    """The 1-D view over every element of the rows ``t2`` (row ``i`` starts at ``i * stride``)."""
    m, n = t2.shape
    span = (m - 1) * stride + n if m and n else 0
    return torch.as_strided(t2, (span,), (1,))


def _weight(weight, ns, n, device, what="weight"):
    if weight is None:
        return None
    if tuple(weight.shape) != ns:
        raise ValueError(f"{what} has shape {list(weight.shape)}, expected {list(ns)}")
    _check_dtype(weight, what)
    if weight.device != device:
        raise ValueError(f"{what} is on {weight.device}, the input on {device}")
    return weight.reshape(n).contiguous()


def _forward(x, m, n, w, res, y, mode, eps, target, config, want_rstd):
    """Launch the forward kernel for ``x`` (validated); returns ``(rstd (m,), res_out)``."""
    x2, sx = _rows(x, m, n, "x")
    res2, sr = (None, 0) if res is None else _rows(res, m, n, "residual")
    rstd = torch.empty(m, dtype=torch.float32, device=x.device) if want_rstd else None
    res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if res is not None else None
    if m == 0:
        return rstd, res_out
    if n == 0:  # ATen: the mean of no elements is NaN
        if rstd is not None:
            rstd.fill_(float("nan"))
        return rstd, res_out
    fp = plan_forward(
        m,
        n,
        x.dtype,
        SX=sx,
        SR=sr,
        mode=mode,
        eps=eps,
        config=config,
        table=table_target(x, target),
    )
    launches = fp.launches(
        x=_flat(x2, sx),
        res=None if res2 is None else _flat(res2, sr),
        w=w,
        y=y.view(-1),
        res_out=None if res_out is None else res_out.view(-1),
        rstd=rstd,
    )
    run_all(launches, _target(x, target))
    return rstd, res_out


# -- forward ----------------------------------------------------------------------------------------


def rms_norm(
    x,
    normalized_shape,
    weight=None,
    eps=None,
    *,
    llama_numerics=False,
    gemma=False,
    target=None,
    config=None,
):
    """``aten::_fused_rms_norm(x, normalized_shape, weight, eps) -> (y, rstd)``.

    ``rstd = rsqrt(mean(x^2 over normalized_shape) + eps)`` in fp32, shaped
    ``x.shape[:-k] + (1,) * k`` for a k-dim ``normalized_shape``;
    ``y = (x * rstd) * weight`` computed in fp32 and returned in ``x.dtype``
    (any float ``weight`` dtype is accepted, as ATen does). ``eps=None`` is
    ATen's default, ``torch.finfo(torch.float32).eps``: ATen takes the
    epsilon of the accumulation type, fp32 for fp16/bf16/fp32 inputs (not
    the input dtype's, whatever the torch.nn.functional.rms_norm docs say).

    ``llama_numerics`` / ``gemma`` give ``y`` the numerics of transformers'
    RMSNorm modules, as ``fused_add_rms_norm`` documents them (LlamaRMSNorm:
    the normalized value rounded to ``x.dtype`` before the weight product,
    result dtype ``promote_types(weight.dtype, x.dtype)``; GemmaRMSNorm:
    ``(1 + weight)`` in fp32); ``rstd`` is the same in every mode.
    """
    if llama_numerics and gemma:
        raise ValueError("llama_numerics and gemma are exclusive")
    _check_dtype(x, "inputs")
    ns, n, m = _normalized(x, normalized_shape)
    w = _weight(weight, ns, n, x.device)
    eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
    mode = MODE_LLAMA if llama_numerics else MODE_GEMMA if gemma else MODE_ATEN
    out_dtype = x.dtype
    if llama_numerics and weight is not None:
        out_dtype = torch.promote_types(weight.dtype, x.dtype)
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    rstd, _ = _forward(x, m, n, w, None, y, mode, eps, target, config, True)
    lead = tuple(x.shape[: x.dim() - len(ns)])
    return y, rstd.view(lead + (1,) * len(ns))


def fused_add_rms_norm(
    x,
    residual,
    weight,
    eps=None,
    *,
    llama_numerics=False,
    gemma=False,
    target=None,
    config=None,
):
    """Residual add and RMSNorm over the last dim, as in LLM decoder layers: ``(y, new_residual)``.

    ``new_residual = x + residual`` in ``x.dtype`` (the rounded sum PyTorch's
    ``x + residual`` gives), and ``y`` normalizes that rounded value:

    * default: ``y = (h * rstd) * weight`` in fp32, returned in ``x.dtype``
      (``aten::_fused_rms_norm`` of ``h``);
    * ``llama_numerics``: transformers' LlamaRMSNorm exactly as written:
      ``weight * (h.float() * rsqrt(mean(h.float()^2) + eps)).to(x.dtype)``,
      the normalized value rounded to ``x.dtype`` *before* the weight
      product; the result dtype is ``torch.promote_types(weight.dtype,
      x.dtype)``, as that expression's is;
    * ``gemma``: transformers' GemmaRMSNorm: ``(h.float() * rstd) * (1 +
      weight.float())`` in fp32, cast to ``x.dtype`` at the end.

    ``residual`` must have ``x``'s shape and dtype; ``weight`` is ``(N,)`` or
    None; ``eps=None`` means ``torch.finfo(torch.float32).eps``.
    """
    if llama_numerics and gemma:
        raise ValueError("llama_numerics and gemma are exclusive")
    _check_dtype(x, "inputs")
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(
            f"residual ({list(residual.shape)}, {residual.dtype}) must match x "
            f"({list(x.shape)}, {x.dtype}) in shape, dtype and device"
        )
    if x.dim() == 0:
        raise ValueError("fused_add_rms_norm needs at least one dimension")
    ns, n, m = _normalized(x, x.shape[-1:])
    w = _weight(weight, ns, n, x.device)
    eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
    mode = MODE_LLAMA if llama_numerics else MODE_GEMMA if gemma else MODE_ATEN
    out_dtype = x.dtype
    if llama_numerics and weight is not None:
        out_dtype = torch.promote_types(weight.dtype, x.dtype)
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    _, h = _forward(x, m, n, w, residual, y, mode, eps, target, config, False)
    return y, h


# -- backward ---------------------------------------------------------------------------------------


def rms_norm_backward(
    grad_y,
    x,
    rstd,
    weight,
    deterministic=False,
    *,
    normalized_shape=None,
    output_mask=(True, True),
    target=None,
    config=None,
):
    """``aten::_fused_rms_norm_backward``: ``(dx, dweight)`` for ``rms_norm``'s ``(y, rstd)``.

    With ``xhat = x * rstd`` and ``gw = grad_y * weight`` (``grad_y`` without
    a weight), ``dx = (gw - xhat * sum(xhat * gw) / N) * rstd`` and ``dweight
    = sum over rows of grad_y * xhat``, in fp32; ``dx`` is returned in
    ``x.dtype`` and ``dweight`` in ``weight.dtype`` (the dtype autograd needs
    for the parameter's gradient; ATen's CPU/meta decomposition casts it to
    ``x.dtype``, identical when the dtypes agree).

    ``normalized_shape`` defaults to ``weight.shape``, or else the dims that
    ``rstd`` keeps as 1 (its trailing size-1 dims; the last dim if that is
    ambiguous). ``config`` overrides the shipped kernels: ``(bwd_rows,)`` or
    ``(bwd_rowdot, bwd_cols)`` configs, optionally followed by a ``dw_reduce``
    one. ``output_mask`` as ATen's: an unrequested output is None
    (and not computed); ``dweight`` is None without a weight. Empty inputs
    give zeros (ATen's rule).

    ``deterministic=True``: each program sums its rows' ``grad_y * xhat`` in
    fp32 registers and writes the partial to its own row of a ``(programs,
    N)`` buffer; ``rmsnorm_dw_reduce`` then sums the partials in a fixed
    order. No atomics: two runs give bitwise equal results. With
    ``deterministic=False`` the partials are atomically added into an fp32
    buffer instead (order of additions = arrival order).
    """
    _check_dtype(x, "inputs")
    _check_dtype(grad_y, "gradients")
    if grad_y.shape != x.shape:
        raise ValueError(f"grad_y has shape {list(grad_y.shape)}, x {list(x.shape)}")
    if normalized_shape is None:
        normalized_shape = tuple(weight.shape) if weight is not None else _ns_from_rstd(x, rstd)
    ns, n, m = _normalized(x, normalized_shape)
    w = _weight(weight, ns, n, x.device)
    want_dx, want_dw = bool(output_mask[0]), bool(output_mask[1]) and weight is not None
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if want_dx else None
    dw = None
    if m == 0 or n == 0:
        if dx is not None:
            dx.zero_()
        if want_dw:
            dw = torch.zeros(ns, dtype=weight.dtype, device=x.device)
        return dx, dw
    if rstd.numel() != m:
        raise ValueError(f"rstd has {rstd.numel()} elements, expected one per row ({m})")
    x2, sx = _rows(x, m, n, "x")
    g2, sg = _rows(grad_y, m, n, "grad_y")
    r = rstd.reshape(m).to(torch.float32).contiguous()
    tgt = _target(x, target)
    if not (want_dx or want_dw):
        return None, None
    fx, fg = _flat(x2, sx), _flat(g2, sg)
    bp = plan_backward(m, n, x.dtype, SG=sg, SX=sx, config=config, table=table_target(x, target))
    part = acc = None
    if want_dw and deterministic:
        part = torch.empty(bp.programs * n, dtype=torch.float32, device=x.device)
        dw = torch.empty(n, dtype=weight.dtype, device=x.device)
    elif want_dw:
        acc = torch.zeros(n, dtype=torch.float32, device=x.device)
    coef = None
    if want_dx and bp.kernels[0].kernel == "bwd_rowdot":
        coef = torch.empty(m, dtype=torch.float32, device=x.device)
    launches = bp.launches(
        g=fg,
        x=fx,
        rstd=r,
        w=w if want_dx else None,  # the weight only enters dx
        dx=None if dx is None else dx.view(-1),
        part=part,
        acc=acc,
        coef=coef,
        dw=dw,
    )
    run_all(launches, tgt)
    if want_dw:
        dw = (dw if deterministic else acc.to(weight.dtype)).view(ns)
    return dx, dw


def _ns_from_rstd(x, rstd) -> tuple[int, ...]:
    """The normalized dims of ``x`` from ``rstd``'s shape ``lead + (1,) * k``: its trailing 1s.

    A leading dim of size 1 is indistinguishable from a normalized one, and
    harmless: normalizing over it as well changes neither the rows nor N."""
    if rstd.dim() != x.dim():
        return tuple(x.shape[-1:])
    k = 0
    while k < x.dim() and rstd.shape[x.dim() - 1 - k] == 1:
        k += 1
    return tuple(x.shape[x.dim() - max(k, 1) :])
