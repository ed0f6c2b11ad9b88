"""PyTorch references for the RMSNorm family (what the tests and the report compare against)."""

from __future__ import annotations

import torch


def rms_norm(x, normalized_shape, weight=None, eps=None):
    """``aten::_fused_rms_norm`` itself: the semantics ``api.rms_norm`` matches."""
    return torch.ops.aten._fused_rms_norm(x, list(normalized_shape), weight, eps)


def rms_norm_backward(grad_y, x, weight=None, eps=None, normalized_shape=None):
    """``(dx, dweight)`` by torch.autograd through ``torch.nn.functional.rms_norm``, in fp64.

    fp64 makes the reference's own rounding negligible next to the kernels' fp32.
    ``eps=None`` is ATen's fp32 epsilon, as in the forward.
    """
    ns = normalized_shape or (tuple(weight.shape) if weight is not None else x.shape[-1:])
    xd = x.detach().double().requires_grad_(True)
    wd = weight.detach().double().requires_grad_(True) if weight is not None else None
    e = torch.finfo(torch.float32).eps if eps is None else eps
    y = torch.nn.functional.rms_norm(xd, list(ns), wd, e)
    ins = [xd] if wd is None else [xd, wd]
    grads = torch.autograd.grad(y, ins, grad_y.double())
    return grads[0], (grads[1] if wd is not None else None)


def llama_rms_norm(h, weight, eps):
    """transformers' ``LlamaRMSNorm.forward``, as written there."""
    input_dtype = h.dtype
    hs = h.to(torch.float32)
    variance = hs.pow(2).mean(-1, keepdim=True)
    hs = hs * torch.rsqrt(variance + eps)
    out = hs.to(input_dtype)
    return out if weight is None else weight * out


def gemma_rms_norm(h, weight, eps):
    """transformers' ``GemmaRMSNorm.forward``: fp32 throughout, ``(1 + weight)``, cast at the end."""
    hf = h.float()
    out = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        out = out * (1.0 + weight.float())
    return out.type_as(h)


def fused_add_rms_norm(x, residual, weight, eps=None, *, llama_numerics=False, gemma=False):
    """``(y, x + residual)`` with ``y`` from the matching reference above."""
    e = torch.finfo(torch.float32).eps if eps is None else eps
    h = x + residual
    if llama_numerics:
        return llama_rms_norm(h, weight, e), h
    if gemma:
        return gemma_rms_norm(h, weight, e), h
    return rms_norm(h, h.shape[-1:], weight, e)[0], h
