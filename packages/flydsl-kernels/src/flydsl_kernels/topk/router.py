"""Fused MoE router: expert scores, top-k selection and routing weights in one kernel.

``scoring`` names the model family's recipe (references in reference.py,
after transformers 5.24):

* ``"softmax"`` (Qwen3-MoE, Mixtral-style): softmax over all experts in fp32,
  top-k, ``renormalize`` = ``norm_topk_prob``.
* ``"sigmoid"`` (DeepSeek-V3): sigmoid scores; ``bias``
  (``e_score_correction_bias``) is added for the selection only, optionally
  group-limited (``n_group``, ``topk_group``: the best groups by the sum of
  their top-2 biased scores); weights are the unbiased scores of the chosen
  experts, renormalized when asked (``+ 1e-20``), times
  ``routed_scaling_factor``.
* ``"topk_softmax"`` (gpt-oss): top-k of the logits, then softmax over the
  chosen k.

Experts come in the order of the selection (best first; ties by expert id).
Softmax is monotone, so the kernel selects on the logits themselves, which
picks the same experts as selecting on the probabilities unless two distinct
logits round to the same fp32 probability.
"""

from __future__ import annotations

import torch

from .._target import table_target, tensor_target
from .api import _opts
from .configs import next_pow2, router_config
from .kernels import moe_router_kernel

SCORINGS = {"softmax": 0, "sigmoid": 1, "topk_softmax": 2}
MAX_EXPERTS = 4096


def moe_router(
    logits,
    top_k,
    *,
    scoring="softmax",
    renormalize=False,
    bias=None,
    n_group=1,
    topk_group=1,
    routed_scaling_factor=1.0,
    ids_dtype=torch.int64,
    target=None,
):
    """Route tokens: (weights fp32 [T, top_k], expert ids [T, top_k] of ``ids_dtype``).

    ``logits`` is [T, E] (fp32, bf16 or fp16), the gate's output. ``ids_dtype``
    is int64 (torch.topk's) or int32 (what fused-MoE kernels such as vLLM's take).
    """
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {tuple(SCORINGS)}, got {scoring!r}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be [tokens, experts], got shape {tuple(logits.shape)}")
    if logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"logits must be fp32, bf16 or fp16, got {logits.dtype}")
    if ids_dtype not in (torch.int64, torch.int32):
        raise TypeError(f"ids_dtype must be torch.int64 or torch.int32, got {ids_dtype}")
    t, e = logits.shape
    if not 1 <= e <= MAX_EXPERTS:
        raise ValueError(f"the router handles 1 to {MAX_EXPERTS} experts, got {e}")
    if not 1 <= top_k <= e:
        raise ValueError(f"top_k must be in [1, {e}], got {top_k}")
    if bias is not None:
        if scoring != "sigmoid":
            raise ValueError("a selection bias is part of the sigmoid (DeepSeek-V3) recipe only")
        if tuple(bias.shape) != (e,):
            raise ValueError(f"bias must have shape ({e},), got {tuple(bias.shape)}")
    if n_group > 1:
        if scoring != "sigmoid":
            raise ValueError("group-limited routing is part of the sigmoid recipe only")
        if e % n_group or e & (e - 1) or n_group & (n_group - 1):
            raise ValueError(
                f"group-limited routing needs power-of-two experts and groups, got E={e}, "
                f"n_group={n_group}"
            )
        if not 1 <= topk_group <= n_group or top_k > topk_group * (e // n_group):
            raise ValueError(
                f"topk_group={topk_group} groups of {e // n_group} cannot hold top_k={top_k}"
            )
    weights = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=ids_dtype, device=logits.device)
    if t == 0:
        return weights, ids
    lg = logits if logits.stride(1) == 1 else logits.contiguous()
    b = bias.contiguous() if bias is not None else lg[0]  # unread without HAS_BIAS
    block = next_pow2(e)
    cfg = router_config(block, table_target(logits, target))
    target = tensor_target(logits, target)
    moe_router_kernel[(t,)](
        lg,
        b,
        weights,
        ids,
        TOPK=top_k,
        KP=next_pow2(top_k),
        BLOCK=block,
        SCORING=SCORINGS[scoring],
        HAS_BIAS=bias is not None,
        RENORM=bool(renormalize),
        NGROUP=int(n_group),
        TOPK_GROUP=int(topk_group) if n_group > 1 else 1,
        SCALE=float(routed_scaling_factor),
        **_opts(cfg, target),
    )
    return weights, ids
