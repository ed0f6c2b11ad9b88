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
exception never reaches the user. ``hf_attention`` (the ``"flydsl"`` attention implementation,
``transformers._attention``) is differentiable: ``register_autograd`` with its backward as the
op ``hf_attention_backward`` (``flydsl_kernels.attention.flash_attn_backward``) and the sinks'
gradient in torch ops, so training and torch.compile's backward graphs keep both halves as
named, opaque nodes. ``hf_grouped_mm`` is the experts route's form of
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
RMS_NORM, ADD_RMS_NORM, ROUTER, EXPERTS, MX_EXPERTS, ATTENTION, ATTENTION_BACKWARD = (
    "hf.rms_norm",
    "hf.add_rms_norm",
    "hf.moe_router",
    "hf.experts",
    "hf.mx_experts",
    "hf.attention",
    "hf.attention_backward",
)
STAT_KEYS = (RMS_NORM, ADD_RMS_NORM, ROUTER, EXPERTS, MX_EXPERTS, ATTENTION, ATTENTION_BACKWARD)

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


# -- attention ----------------------------------------------------------------------------------


_MASK = None


def mask_mod():
    """The FlyDSL mask mod reading transformers' boolean mask as an int8 ``(B, Sq, Sk)`` mod
    tensor (``mask[b, q_idx, kv_idx]``); one object, so its kernels compile once."""
    global _MASK
    if _MASK is None:
        from flydsl_kernels.attention import MaskMod

        def hf_mask(b, h, q_idx, kv_idx, mask):
            return mask.gather(b, q_idx, kv_idx).load() != 0

        _MASK = MaskMod(hf_mask, name="hf_mask")
    return _MASK


def _attention_kw(mask, causal: bool) -> dict:
    """The kernels' masking arguments: the mask as the mask mod's tensor, else the causal flag
    (bottom-right aligned, as transformers' caches are)."""
    if mask is not None:
        return {"mask_mod": mask_mod(), "mod_tensors": (mask,)}
    return {"causal": causal}


def attention_reference(q, k, v, mask, sinks, scale: float, causal: bool, softcap: float):
    """``hf_attention``'s result in PyTorch (the error fallback): ``(out (B, Sq, H, Dv), lse
    (B, H, Sq) fp32)`` from ``q (B, H, Sq, D)``, ``k`` / ``v (B, Hk, Sk, D / Dv)``, the int8
    ``(B, Sq, Sk)`` mask or the causal flag, sinks in the softmax denominator, ``softcap``.
    Rows with no visible key give 0 and an LSE of +inf, the kernels' convention."""
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q.float() @ kk.float().transpose(2, 3)) * scale
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    sq, sk = s.shape[2], s.shape[3]
    if mask is not None:
        s = s.masked_fill(mask[:, None] == 0, float("-inf"))
    elif causal:
        i = torch.arange(sq, device=s.device)[:, None] + (sk - sq)
        s = s.masked_fill(torch.arange(sk, device=s.device)[None, :] > i, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.float().reshape(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)[..., :sk]  # no visible key: 0
    lse = lse.masked_fill(lse == float("-inf"), float("inf"))
    out = (p @ vv.float()).to(q.dtype).transpose(1, 2).contiguous()
    return out, lse


def _bshd(t):
    return t.transpose(1, 2)


@torch.library.custom_op(f"{NAMESPACE}::hf_attention", mutates_args=())
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    sinks: torch.Tensor | None,
    scale: float,
    causal: bool,
    softcap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' attention call on ``flydsl_kernels.attention.flash_attn_func``: ``q (B,
    H, Sq, D)``, ``k`` / ``v (B, Hk, Sk, D / Dv)`` (GQA without ``repeat_kv``), ``mask`` the
    int8 ``(B, Sq, Sk)`` visibility (else ``causal``), gpt-oss's ``sinks``, ``softcap``.
    Returns ``(out (B, Sq, H, Dv), lse (B, H, Sq) fp32)``: transformers' output layout, and
    the natural-log LSE the backward reads."""
    from flydsl_kernels.attention import flash_attn_func

    try:
        out, lse, _ = flash_attn_func(
            _bshd(q),
            _bshd(k),
            _bshd(v),
            softmax_scale=scale,
            softcap=softcap,
            sinks=sinks,
            return_attn_probs=True,
            target=target(q),
            **_attention_kw(mask, causal),
        )
    except Exception as e:
        _failed(ATTENTION, e)
        return attention_reference(q, k, v, mask, sinks, scale, causal, softcap)
    _hit(ATTENTION)
    return out.contiguous(), lse.contiguous()


@attention.register_fake
def _(q, k, v, mask, sinks, scale, causal, softcap):
    B, H, Sq, _ = q.shape
    return (
        q.new_empty((B, Sq, H, v.shape[-1])),
        q.new_empty((B, H, Sq), dtype=torch.float32),
    )


def _grads_like_inputs(q, k, v, dq, dk, dv):
    """The gradients as ``(B, H, S, D)`` views of ``(B, S, H, D)``-contiguous tensors: the
    kernels' layout, and the fake implementation's."""
    return tuple(
        _bshd(g.reshape(_bshd(t).shape).contiguous()) for t, g in ((q, dq), (k, dk), (v, dv))
    )


@torch.library.custom_op(f"{NAMESPACE}::hf_attention_backward", mutates_args=())
def attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    mask: torch.Tensor | None,
    sinks: torch.Tensor | None,
    scale: float,
    causal: bool,
    softcap: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of ``hf_attention`` (``flydsl_kernels.attention.flash_attn_backward``
    from its ``out`` and ``lse``; the LSE holds the sinks' share of the softmax, so the
    probabilities the backward rebuilds are the forward's). ``dout`` ``(B, Sq, H, Dv)``; the
    gradients ``(B, H, S, D)`` in the ``(B, S, H, D)`` order."""
    from flydsl_kernels.attention import flash_attn_backward

    try:
        dq, dk, dv = flash_attn_backward(
            dout,
            _bshd(q),
            _bshd(k),
            _bshd(v),
            out,
            lse,
            softmax_scale=scale,
            softcap=softcap,
            target=target(q),
            **_attention_kw(mask, causal),
        )
    except Exception as e:
        _failed(ATTENTION_BACKWARD, e)
        with torch.enable_grad():
            ins = [t.detach().requires_grad_() for t in (q, k, v)]
            o, _ = attention_reference(*ins, mask, sinks, scale, causal, softcap)
            grads = torch.autograd.grad(o, ins, dout)
        return _grads_like_inputs(q, k, v, *(_bshd(g) for g in grads))
    _hit(ATTENTION_BACKWARD)
    return _grads_like_inputs(q, k, v, dq, dk, dv)


@attention_backward.register_fake
def _(dout, q, k, v, out, lse, mask, sinks, scale, causal, softcap):
    return tuple(_bshd(_bshd(t).new_empty(_bshd(t).shape)) for t in (q, k, v))


def _attention_setup(ctx, inputs, output):
    q, k, v, mask, sinks, scale, causal, softcap = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, mask, sinks, out, lse)
    ctx.args = (scale, causal, softcap)
    ctx.mark_non_differentiable(lse)


def _attention_grad(ctx, dout, _dlse):
    q, k, v, mask, sinks, out, lse = ctx.saved_tensors
    scale, causal, softcap = ctx.args
    dq, dk, dv = torch.ops.flydsl.hf_attention_backward(
        dout, q, k, v, out, lse, mask, sinks, scale, causal, softcap
    )
    dsinks = None
    if sinks is not None and ctx.needs_input_grad[4]:
        # d loss / d sink_h = -sum over rows of P(sink) * delta, P(sink) = exp(sink_h - lse)
        # (the sink's share of the softmax) and delta = rowsum(dout * out)
        delta = (dout.float() * out.float()).sum(-1).transpose(1, 2)  # (B, H, Sq)
        p = torch.exp(sinks.float().reshape(1, -1, 1) - lse)
        dsinks = -(p * delta).sum((0, 2)).to(sinks.dtype)
    return dq, dk, dv, None, dsinks, None, None, None


attention.register_autograd(_attention_grad, setup_context=_attention_setup)
