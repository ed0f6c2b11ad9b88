"""Route transformers models' own modules into FlyDSL kernels: ``patch(model)``.

transformers' RMSNorm modules compute by hand (``pow(2).mean()``, ``rsqrt``),
its MoE routers call ``softmax`` / ``topk`` and its experts ``grouped_mm``, so
the eager ATen overrides (``torch_flydsl.enable()``) reach almost nothing in
these models. ``patch`` routes each family explicitly and reversibly::

    from torch_flydsl.transformers import patch
    p = patch(model)          # RMSNorm (+ fused residual add), MoE router, experts
    p.replaced, p.not_routed  # what now runs FlyDSL, and what does not (with reasons)
    p.undo()                  # the model is exactly as before

Modules are recognized by their ``forward`` bodies (``_forms``), not their
names; every FlyDSL launch is a ``flydsl::hf_*`` custom op (``torch_flydsl.library.hf``),
so torch.compile treats it as one opaque node and torch.profiler names it.
Linear layers stay on ATen (``not_routed``). Attention is the model's ``attn_implementation``:
``register()`` (which ``patch`` calls) adds ``"flydsl"`` to transformers' ``AttentionInterface``
(``_attention``: ``flydsl::hf_attention``, FlyDSL's attention forward and backward, masks as
sdpa builds them, gpt-oss sinks) and ``ExpertsInterface``, so ``attn_implementation="flydsl"``
works; ``patch`` reports the attention modules as routed where the model uses it, else as not
routed with the call that routes them.
"""

from __future__ import annotations

from ._attention import NAME as ATTENTION_IMPLEMENTATION
from ._attention import attention_forward
from ._attention import register as register_attention
from ._checks import PROFILE_PREFIXES, STAT_KEYS
from ._experts import NAME as EXPERTS_IMPLEMENTATION
from ._experts import experts_forward
from ._experts import register as register_experts
from ._patch import ROUTES, NotRouted, Patch, Replacement, is_mxfp4, patch


def register() -> None:
    """Register ``"flydsl"`` as an attention (and mask) implementation and as an experts
    implementation in transformers' interfaces (global, idempotent)."""
    register_attention()
    register_experts()


__all__ = [
    "ATTENTION_IMPLEMENTATION",
    "EXPERTS_IMPLEMENTATION",
    "PROFILE_PREFIXES",
    "ROUTES",
    "STAT_KEYS",
    "NotRouted",
    "Patch",
    "Replacement",
    "attention_forward",
    "experts_forward",
    "is_mxfp4",
    "patch",
    "register",
    "register_attention",
    "register_experts",
]
