"""``sdpa``: ``F.scaled_dot_product_attention``'s fused kernels and their backwards on FlyDSL's FMHA.

On the GPU key: ``aten::_scaled_dot_product_flash_attention`` and
``aten::_scaled_dot_product_efficient_attention`` with their ``_backward`` ops (the flash and
memory-efficient SDPA backends; the math backend is left alone). On the CPU test key:
``aten::_scaled_dot_product_flash_attention_for_cpu`` and its backward (what SDPA runs on CPU),
so the same dispatch path is tested without a GPU. ``F.scaled_dot_product_attention`` reaches
``flydsl_kernels.attention.flash_attn_func`` / ``flash_attn_backward`` unchanged.

Opt-in (``enable(ops=["sdpa"])``; ``enable()`` alone leaves SDPA to ATen): there is no gate
table for attention yet. The forward and backward are interchangeable with ATen's: the outputs
have ATen's shapes, strides and dtypes (taken from the op's meta kernel), the LSE is the same
natural-log fp32, so a call whose forward ran here and whose backward falls back (or the other
way round) is still right. The backwards' gradients take the layout of the op's meta kernel too
(a copy only where the kernel's differs): the CPU and memory-efficient ones ``(B, S, H, D)``
order, the flash one its inputs' (torch's ``_meta_registrations``), which Inductor checks.

Predicate order: subclass, arch, dtype (bf16 / fp16, one dtype), params (dropout, debug mask,
attention bias or mask, causal with ``Sq != Sk``: SDPA's causal mask is top-left aligned,
flash-attn's bottom-right; head dims over 256; heads not a multiple of the KV heads), empty.
"""

from __future__ import annotations

import torch

from flydsl_kernels import supported

from ..eligibility import PLAIN
from ..spec import OpSpec, Overload
from ._kernels import kernel

#: a torch-side choice, narrower than the kernel's ``supported.ATTENTION`` (which adds fp32 for
#: flex_attention): SDPA's flash backend takes bf16 / fp16 only, and this override follows it
DTYPES = (torch.bfloat16, torch.float16)
_DTYPES = frozenset(DTYPES)
_MAX_D = supported.ATTENTION_MAX_HEAD_DIM


def _qkv_reason(b, q, k, v, dropout_p, is_causal) -> str | None:
    if type(q) not in PLAIN or type(k) not in PLAIN or type(v) not in PLAIN:
        return "subclass"
    if not b.arch(q):
        return "arch"
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return "dtype"
    if dropout_p or q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "params"
    B, H, Sq, D = q.shape
    Bk, Hk, Sk, Dk = k.shape
    if Bk != B or Dk != D or v.shape[:3] != k.shape[:3] or Hk == 0 or H % Hk:
        return "params"
    if D > _MAX_D or v.shape[3] > _MAX_D or (is_causal and Sq != Sk):
        return "params"
    if q.numel() == 0 or k.numel() == 0 or v.numel() == 0:
        return "empty"
    return None


def _shells(op, *args, **kw):
    """ATen's outputs for these arguments as meta tensors (shapes, strides, dtypes)."""
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    mkw = {n: (a.to("meta") if isinstance(a, torch.Tensor) else a) for n, a in kw.items()}
    return op(*meta, **mkw)


def _as(m, t):
    """``t`` in meta tensor ``m``'s layout: itself where the strides already agree, else a copy
    (ATen's backward layouts differ by op: the CPU and memory-efficient ones lay the gradients out
    ``(B, S, H, D)``, the flash one as its inputs; Inductor checks a compiled graph's strides
    against these meta kernels)."""
    if t.stride() == m.stride() or t.numel() <= 1:
        return t
    return _like(m, t, t)


def _like(m, t, src=None):
    """A tensor on ``t``'s device laid out as meta tensor ``m``, holding ``src`` if given."""
    if m is None:
        return None
    out = torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=t.device)
    if src is not None:
        out.copy_(src)
    elif out.numel():
        out.zero_()
    return out


def _forward(b, q, k, v, is_causal, scale):
    """``(out (B, H, Sq, Dv), lse (B, H, Sq))`` from the FlyDSL FMHA."""
    qkv = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    opts = {"softmax_scale": scale, "causal": is_causal, "target": b.target_of(q)}
    out, lse, _ = b.run(q, kernel("flash_attn_func"), *qkv, return_attn_probs=True, **opts)
    return out.transpose(1, 2), lse


def _backward(b, g, q, k, v, out, lse, is_causal, scale):
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    lse = lse[..., : q.shape[2]]
    args = (t(g), t(q), t(k), t(v), t(out), lse.float())
    opts = {"softmax_scale": scale, "causal": is_causal, "target": b.target_of(q)}
    dq, dk, dv = b.run(q, kernel("flash_attn_backward"), *args, **opts)
    return t(dq), t(dk), t(dv)


# -- CPU test key: _scaled_dot_product_flash_attention_for_cpu ---------------------------------

_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_CPU_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def cpu_reason(b, q, k, v, dropout_p, is_causal, attn_mask, scale) -> str | None:
    if attn_mask is not None:
        return "params"
    return _qkv_reason(b, q, k, v, dropout_p, is_causal)


def cpu_impl(b, q, k, v, dropout_p, is_causal, attn_mask, scale):
    mo, ml = _shells(_CPU, q, k, v, dropout_p, is_causal, scale=scale)
    out, lse = _forward(b, q, k, v, is_causal, scale)
    return _like(mo, q, out), _like(ml, q, lse)


def cpu_bwd_reason(b, g, q, k, v, out, lse, dropout_p, is_causal, attn_mask, scale):
    if attn_mask is not None or type(g) not in PLAIN or type(out) not in PLAIN:
        return "params" if attn_mask is not None else "subclass"
    return _qkv_reason(b, q, k, v, dropout_p, is_causal)


def cpu_bwd_impl(b, g, q, k, v, out, lse, dropout_p, is_causal, attn_mask, scale):
    m = _shells(_CPU_BWD, g, q, k, v, out, lse, dropout_p, is_causal, scale=scale)
    grads = _backward(b, g, q, k, v, out, lse, is_causal, scale)
    return tuple(_as(mi, gi) for mi, gi in zip(m, grads))


# -- GPU key: flash and memory-efficient SDPA --------------------------------------------------

_FLASH = torch.ops.aten._scaled_dot_product_flash_attention.default
_FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_backward.default
_EFF = torch.ops.aten._scaled_dot_product_efficient_attention.default
_EFF_BWD = torch.ops.aten._scaled_dot_product_efficient_attention_backward.default


def flash_reason(b, q, k, v, dropout_p, is_causal, return_debug_mask, scale) -> str | None:
    if return_debug_mask:
        return "params"
    return _qkv_reason(b, q, k, v, dropout_p, is_causal)


def flash_impl(b, q, k, v, dropout_p, is_causal, return_debug_mask, scale):
    m = _shells(_FLASH, q, k, v, dropout_p, is_causal, return_debug_mask, scale=scale)
    out, lse = _forward(b, q, k, v, is_causal, scale)
    return (
        _like(m[0], q, out),
        _like(m[1], q, lse),
        _like(m[2], q),
        _like(m[3], q),
        q.shape[2],
        k.shape[2],
        _like(m[6], q),
        _like(m[7], q),
        _like(m[8], q),
    )


def flash_bwd_reason(
    b, g, q, k, v, out, lse, cq, ck, mq, mk, dropout_p, is_causal, seed, offset, scale
):
    if type(g) not in PLAIN or type(out) not in PLAIN:
        return "subclass"
    return _qkv_reason(b, q, k, v, dropout_p, is_causal)


def flash_bwd_impl(
    b, g, q, k, v, out, lse, cq, ck, mq, mk, dropout_p, is_causal, seed, offset, scale
):
    m = _shells(
        _FLASH_BWD,
        g,
        q,
        k,
        v,
        out,
        lse,
        cq,
        ck,
        mq,
        mk,
        dropout_p,
        is_causal,
        seed,
        offset,
        scale=scale,
    )
    grads = _backward(b, g, q, k, v, out, lse, is_causal, scale)
    return tuple(_as(mi, gi) for mi, gi in zip(m, grads))


def eff_reason(b, q, k, v, attn_bias, compute_lse, dropout_p, is_causal, scale) -> str | None:
    if attn_bias is not None:
        return "params"
    return _qkv_reason(b, q, k, v, dropout_p, is_causal)


def eff_impl(b, q, k, v, attn_bias, compute_lse, dropout_p, is_causal, scale):
    m = _shells(_EFF, q, k, v, None, compute_lse, dropout_p, is_causal, scale=scale)
    out, lse = _forward(b, q, k, v, is_causal, scale)
    lse_out = _like(m[1], q)  # ATen pads the LSE's rows (to 32 on CUDA); ours fill the first Sq
    if lse_out.numel():
        lse_out[..., : q.shape[2]].copy_(lse)
    return _like(m[0], q, out), lse_out, _like(m[2], q), _like(m[3], q)


def eff_bwd_reason(
    b, g, q, k, v, attn_bias, out, lse, seed, offset, dropout_p, mask, is_causal, scale
):
    if attn_bias is not None and attn_bias.numel():
        return "params"
    if type(g) not in PLAIN or type(out) not in PLAIN:
        return "subclass"
    if lse.dim() != 3 or lse.shape[2] < q.shape[2]:
        return "params"  # no LSE kept (compute_log_sumexp=False)
    return _qkv_reason(b, q, k, v, dropout_p, is_causal)


def eff_bwd_impl(
    b, g, q, k, v, attn_bias, out, lse, seed, offset, dropout_p, mask, is_causal, scale
):
    m = _shells(
        _EFF_BWD,
        g,
        q,
        k,
        v,
        None,
        out,
        lse,
        seed,
        offset,
        dropout_p,
        mask,
        is_causal,
        scale=scale,
    )
    grads = _backward(b, g, q, k, v, out, lse, is_causal, scale)
    return (*(_as(mi, gi) for mi, gi in zip(m, grads)), None)


#: no gate table for attention; the key tensor is q (argument 1 of the backwards, after the
#: output gradient)
_FWD = {"dtypes": DTYPES}
_BWD = {"dtypes": DTYPES, "key": 1}

SPEC = OpSpec(
    name="sdpa",
    overloads=(
        Overload(
            "_scaled_dot_product_flash_attention_for_cpu",
            cpu_reason,
            cpu_impl,
            devices=("cpu",),
            **_FWD,
        ),
        Overload(
            "_scaled_dot_product_flash_attention_for_cpu_backward",
            cpu_bwd_reason,
            cpu_bwd_impl,
            devices=("cpu",),
            **_BWD,
        ),
        Overload(
            "_scaled_dot_product_flash_attention",
            flash_reason,
            flash_impl,
            devices=("cuda",),
            **_FWD,
        ),
        Overload(
            "_scaled_dot_product_flash_attention_backward",
            flash_bwd_reason,
            flash_bwd_impl,
            devices=("cuda",),
            **_BWD,
        ),
        Overload(
            "_scaled_dot_product_efficient_attention",
            eff_reason,
            eff_impl,
            devices=("cuda",),
            **_FWD,
        ),
        Overload(
            "_scaled_dot_product_efficient_attention_backward",
            eff_bwd_reason,
            eff_bwd_impl,
            devices=("cuda",),
            **_BWD,
        ),
    ),
    aliases=("scaled_dot_product_attention", "attention"),
    summary="F.scaled_dot_product_attention's flash / efficient kernels and backwards",
    default=(),
)
