"""When a transformers route runs FlyDSL: ``why_not_*`` return a reason (``torch_flydsl.stats.
REASONS`` or ``autograd``) or None, decided before the route's ``flydsl::hf_*`` op is called
(``torch_flydsl.library.hf``). The routes are forward-only kernels, so a call that autograd
records (grad mode on and an input or weight requiring grad) takes the module's own forward.
Device and tensor-type eligibility is ``torch_flydsl.eligibility``'s, as on every path.
"""

from __future__ import annotations

import torch

from flydsl_kernels import supported

from ..eligibility import PLAIN, device_reason
from ..library.hf import (
    ADD_RMS_NORM,
    EXPERTS,
    MODES,
    MX_EXPERTS,
    PROFILE_PREFIXES,
    RMS_NORM,
    ROUTER,
    STAT_KEYS,
    router_reference,
)
from ..stats import get as _stat

__all__ = [
    "ADD_RMS_NORM",
    "EXPERTS",
    "MODES",
    "MX_EXPERTS",
    "PROFILE_PREFIXES",
    "RMS_NORM",
    "ROUTER",
    "STAT_KEYS",
    "count_fallback",
    "router_reference",
    "why_not_add_norm",
    "why_not_experts",
    "why_not_norm",
    "why_not_router",
]

_NORM_DTYPES = frozenset(supported.RMSNORM)
_ROUTER_DTYPES = frozenset(supported.TOPK)
_GEMM_DTYPES = frozenset(supported.GEMM)


def grad_reason(*ts) -> str | None:
    """``autograd`` when a backward may follow: the routes are forward-only kernels."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts):
        return "autograd"
    return None


def _norm_reason(x, weight) -> str | None:
    why = device_reason(x) or grad_reason(x, weight)
    if why:
        return why
    if x.dtype not in _NORM_DTYPES or (weight is not None and weight.dtype not in _NORM_DTYPES):
        return "dtype"
    if weight is not None and (
        type(weight) not in PLAIN
        or weight.device != x.device
        or tuple(weight.shape) != (x.shape[-1],)
    ):
        return "params" if type(weight) in PLAIN else "subclass"
    if x.dim() == 0 or x.numel() == 0:
        return "empty"
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        return "layout"
    return None


def why_not_norm(x, weight) -> str | None:
    """Why ``x`` (with ``weight``) cannot take the FlyDSL RMSNorm, or None."""
    return _norm_reason(x, weight)


def why_not_add_norm(x, residual, weight) -> str | None:
    why = _norm_reason(x, weight) or _norm_reason(residual, None)
    if why:
        return why
    if residual.shape != x.shape or residual.dtype != x.dtype:
        return "params"
    return None


def why_not_router(logits, top_k: int) -> str | None:
    why = device_reason(logits) or grad_reason(logits)
    if why:
        return why
    if logits.dtype not in _ROUTER_DTYPES:
        return "dtype"
    if logits.dim() != 2 or not 1 <= top_k <= logits.shape[1] or logits.shape[1] > 4096:
        return "params"
    if logits.shape[0] == 0:
        return "empty"
    return None


def why_not_experts(hidden, *weights) -> str | None:
    why = device_reason(hidden) or grad_reason(hidden, *weights)
    if why:
        return why
    for w in weights:
        if type(w) not in PLAIN:
            return "subclass"
        if w.dtype not in _GEMM_DTYPES or w.dtype != hidden.dtype:
            return "dtype"
        if w.device != hidden.device:
            return "params"
    if hidden.dtype not in _GEMM_DTYPES:
        return "dtype"
    if hidden.shape[0] == 0:
        return "empty"
    return None


def count_fallback(key: str, reason: str, n: int = 1) -> None:
    """Count ``n`` calls of a route that went to the PyTorch path, for ``reason``."""
    st = _stat(key)
    for _ in range(n):
        st.fallback(reason)
