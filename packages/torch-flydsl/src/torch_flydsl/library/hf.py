"""The ``flydsl::hf_*`` ops: the FlyDSL launches of the transformers routes
(``torch_flydsl.transformers``).

Each route's kernel call is one custom op with a fake (meta) implementation
(``torch_flydsl.custom_op`` for the RMSNorms, whose launches then trace into Inductor's graph
as Triton kernels; ``torch.library.custom_op`` for the others), for two reasons:

* torch.compile sees an opaque node with known output shapes instead of tracing into a FlyDSL
  launch, so patched models compile without graph breaks at the routes;
* the op's name (``flydsl::hf_rms_norm`` ...) is what torch.profiler records around the
  launch, on the CPU and on a GPU, so a profile tells FlyDSL time from ATen time by the
  namespace alone (``PROFILE_PREFIXES``).

The ops count their hits in ``torch_flydsl.stats`` (keys ``STAT_KEYS``) every time they run,
compiled or not. A kernel that raises inside an op is logged at warning, counted as an
``error`` fallback, and answered by the PyTorch formula of the same route, so a FlyDSL
exception never reaches the user. ``hf_grouped_mm`` is the experts route's form of
``flydsl::grouped_mm`` (2-D x 3-D with a per-group bias; same kernel and output shape rule,
``gemm.grouped_mm_meta``), kept as its own op for the route's opaque node, counters and error
formula.
"""

from __future__ import annotations

import torch

from ..custom_ops import custom_op
from ..eligibility import target
from ..stats import get as _stat
from .gemm import NAMESPACE, grouped_mm_meta

#: profiler event names that mark FlyDSL work: the ``flydsl::`` ops, and ``record_function``
#: ranges named ``flydsl::...`` (for launches outside them)
PROFILE_PREFIXES = ("flydsl::",)

#: stats keys of the routes (``torch_flydsl.stats()``)
RMS_NORM, ADD_RMS_NORM, ROUTER, EXPERTS, MX_EXPERTS = (
    "hf.rms_norm",
    "hf.add_rms_norm",
    "hf.moe_router",
    "hf.experts",
    "hf.mx_experts",
)
STAT_KEYS = (RMS_NORM, ADD_RMS_NORM, ROUTER, EXPERTS, MX_EXPERTS)

#: RMSNorm numerics (transformers' module forwards; see transformers/_forms.py)
MODE_ATEN, MODE_LLAMA, MODE_GEMMA = 0, 1, 2
MODES = {"aten": MODE_ATEN, "llama": MODE_LLAMA, "gemma": MODE_GEMMA}


def _failed(key: str, e: Exception) -> None:
    _stat(key).error(e, "the PyTorch formula")  # calls is derived: hits + fallbacks (stats.py)


def _hit(key: str) -> None:
    _stat(key).hits += 1


# -- RMSNorm ------------------------------------------------------------------------------------


def norm_reference(x, weight, eps: float, mode: int) -> torch.Tensor:
    """transformers' RMSNorm forwards, as written there (the error fallback)."""
    if mode == MODE_GEMMA:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        if weight is not None:
            out = out * (1.0 + weight.float())
        return out.type_as(x)
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if mode == MODE_LLAMA:
        h = h.to(x.dtype)
        return h if weight is None else weight * h
    return (h if weight is None else weight * h).to(x.dtype)


def _norm_dtype(x, weight, mode: int):
    if mode == MODE_LLAMA and weight is not None:
        return torch.promote_types(weight.dtype, x.dtype)
    return x.dtype


@custom_op(f"{NAMESPACE}::hf_rms_norm", mutates_args=())
def hf_rms_norm(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, mode: int
) -> torch.Tensor:
    """RMSNorm over the last dim with a transformers module's numerics (``mode``)."""
    from flydsl_kernels.rmsnorm import rms_norm

    try:
        y = rms_norm(
            x,
            (x.shape[-1],),
            weight,
            eps,
            llama_numerics=mode == MODE_LLAMA,
            gemma=mode == MODE_GEMMA,
            target=target(x),
        )[0]
    except Exception as e:
        _failed(RMS_NORM, e)
        return norm_reference(x, weight, eps, mode)
    _hit(RMS_NORM)
    return y


@hf_rms_norm.register_fake
def _(x, weight, eps, mode):
    return torch.empty(x.shape, dtype=_norm_dtype(x, weight, mode), device=x.device)


@custom_op(f"{NAMESPACE}::hf_add_rms_norm", mutates_args=())
def hf_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float, mode: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm(x + residual), x + residual)``: the decoder layer's residual add fused into the norm."""
    from flydsl_kernels.rmsnorm import fused_add_rms_norm

    try:
        y, h = fused_add_rms_norm(
            x,
            residual,
            weight,
            eps,
            llama_numerics=mode == MODE_LLAMA,
            gemma=mode == MODE_GEMMA,
            target=target(x),
        )
    except Exception as e:
        _failed(ADD_RMS_NORM, e)
        h = residual + x
        return norm_reference(h, weight, eps, mode), h
    _hit(ADD_RMS_NORM)
    return y, h


@hf_add_rms_norm.register_fake
def _(x, residual, weight, eps, mode):
    return (
        torch.empty(x.shape, dtype=_norm_dtype(x, weight, mode), device=x.device),
        torch.empty_like(x),
    )


# -- MoE router ---------------------------------------------------------------------------------


def router_reference(logits, top_k: int, scoring: str, renormalize: bool):
    """The transformers router formulas ``moe_router`` implements (the error fallback)."""
    if scoring == "topk_softmax":
        v, i = torch.topk(logits.float(), top_k, dim=-1)
        return torch.softmax(v, dim=-1), i
    p = torch.softmax(logits, dim=-1, dtype=torch.float32)
    v, i = torch.topk(p, top_k, dim=-1)
    if renormalize:
        v = v / v.sum(dim=-1, keepdim=True)
    return v, i


@torch.library.custom_op(f"{NAMESPACE}::hf_moe_router", mutates_args=())
def moe_router(
    logits: torch.Tensor, top_k: int, scoring: str, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights fp32 [T, k], expert ids int64 [T, k])`` by ``flydsl_kernels.topk.moe_router``."""
    from flydsl_kernels.topk import moe_router as kernel

    try:
        w, i = kernel(
            logits, top_k, scoring=scoring, renormalize=renormalize, target=target(logits)
        )
    except Exception as e:
        _failed(ROUTER, e)
        return router_reference(logits, top_k, scoring, renormalize)
    _hit(ROUTER)
    return w, i


@moe_router.register_fake
def _(logits, top_k, scoring, renormalize):
    t = logits.shape[0]
    return (
        logits.new_empty((t, top_k), dtype=torch.float32),
        logits.new_empty((t, top_k), dtype=torch.int64),
    )


# -- experts: grouped GEMMs ---------------------------------------------------------------------


def grouped_reference(a, b, offs, bias):
    """``torch._grouped_mm`` (2-D x 3-D, ragged M) plus a per-group bias (the error fallback)."""
    out = torch.zeros(a.shape[0], b.shape[-1], dtype=a.dtype, device=a.device)
    start = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            r = a[start:end].float() @ b[g].float()
            if bias is not None:
                r = r + bias[g].float()
            out[start:end] = r.to(a.dtype)
        start = end
    return out


@torch.library.custom_op(f"{NAMESPACE}::hf_grouped_mm", mutates_args=())
def grouped_mm(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``a (S, K) x b (G, K, N)`` by groups of rows (``offs``: int32 cumulative ends) + ``bias (G, N)``."""
    from flydsl_kernels.gemm import grouped_mm as kernel

    try:
        out = kernel(a, b, offs, bias, target=target(a))
    except Exception as e:
        _failed(EXPERTS, e)
        return grouped_reference(a, b, offs, bias)
    _hit(EXPERTS)
    return out


@grouped_mm.register_fake
def _(a, b, offs, bias):
    return grouped_mm_meta(a, b, offs, bias, None)


@torch.library.custom_op(f"{NAMESPACE}::hf_mx_grouped_mm", mutates_args=())
def mx_grouped_mm(
    a: torch.Tensor,
    b_q: torch.Tensor,
    b_scale: torch.Tensor,
    offs: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """``a (S, K)`` quantized to mxfp8 (e4m3) by ``to_mx``, times MXFP4 experts ``b_q (G, N, K/2)``.

    Two FlyDSL kernels: ``mx_quantize`` on the activations, then the grouped
    MX GEMM (a8w4, fp32 accumulation, one rounding to ``a.dtype``, bias fused).
    """
    from flydsl_kernels.mx import mx_grouped_mm as kernel
    from flydsl_kernels.mx import to_mx

    try:
        t = target(a)
        aq, sa = to_mx(a, torch.float8_e4m3fn, target=t)
        out = kernel(
            aq, sa, b_q, b_scale, "e4m3", "e2m1", offs, bias=bias, out_dtype=a.dtype, target=t
        )
    except Exception as e:
        _failed(MX_EXPERTS, e)
        from flydsl_kernels.mx import from_mx

        w = from_mx(b_q, b_scale, torch.float4_e2m1fn_x2, out_dtype=a.dtype, target=target(a))
        return grouped_reference(a, w.transpose(1, 2), offs, bias)
    _hit(MX_EXPERTS)
    return out


@mx_grouped_mm.register_fake
def _(a, b_q, b_scale, offs, bias):
    return a.new_empty((a.shape[0], b_q.shape[1]))
