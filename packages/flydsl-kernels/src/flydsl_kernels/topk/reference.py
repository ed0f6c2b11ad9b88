"""PyTorch references for the TopK family.

* ``topk``: torch.topk itself (any tie order torch picks);
* ``topk_stable``: the deterministic order our kernels promise, from a stable
  sort: values descending (ascending for ``largest=False``), ties by index
  ascending, NaN above every number;
* MoE routers, written out after transformers 5.24's modeling code:
  ``qwen3_moe_router`` (Qwen3MoeTopKRouter.forward), ``deepseek_v3_router``
  (DeepseekV3TopkRouter.forward) and ``gpt_oss_router``
  (GptOssTopKRouter.forward). Each takes the router logits (the gate's
  linear output) instead of hidden states, and returns (weights, indices);
  Qwen3's weights are returned before transformers' final cast to the
  logits' dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def topk(x, k, dim=-1, largest=True, sorted=True):
    return torch.topk(x, k, dim=dim, largest=largest, sorted=sorted)


def topk_stable(x, k, dim=-1, largest=True):
    v, i = torch.sort(x, dim=dim, descending=largest, stable=True)
    return v.narrow(dim, 0, k), i.narrow(dim, 0, k)


def qwen3_moe_router(router_logits, top_k, norm_topk_prob):
    """Qwen3-MoE: softmax over all experts in fp32, top-k, optional renormalization."""
    router_probs = F.softmax(router_logits, dtype=torch.float, dim=-1)
    router_top_value, router_indices = torch.topk(router_probs, top_k, dim=-1)
    if norm_topk_prob:
        router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
    return router_top_value, router_indices


def deepseek_v3_router(
    router_logits,
    e_score_correction_bias,
    top_k,
    n_group=1,
    topk_group=1,
    norm_topk_prob=True,
    routed_scaling_factor=1.0,
):
    """DeepSeek-V3: sigmoid scores; the bias and group limit choose, unbiased scores weigh."""
    n_routed_experts = router_logits.shape[-1]
    scores = router_logits.float().sigmoid()
    scores_for_choice = scores.view(-1, n_routed_experts) + e_score_correction_bias.unsqueeze(0)
    group_scores = (
        scores_for_choice.view(-1, n_group, n_routed_experts // n_group)
        .topk(2, dim=-1)[0]
        .sum(dim=-1)
    )
    group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = (
        group_mask.unsqueeze(-1)
        .expand(-1, n_group, n_routed_experts // n_group)
        .reshape(-1, n_routed_experts)
    )
    scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), float("-inf"))
    topk_indices = torch.topk(scores_for_choice, k=top_k, dim=-1, sorted=False)[1]
    topk_weights = scores.gather(1, topk_indices)
    if norm_topk_prob:
        denominator = topk_weights.sum(dim=-1, keepdim=True) + 1e-20
        topk_weights /= denominator
    topk_weights = topk_weights * routed_scaling_factor
    return topk_weights, topk_indices


def gpt_oss_router(router_logits, top_k):
    """gpt-oss: top-k of the logits, then softmax over the selected (in the logits' dtype)."""
    router_top_value, router_indices = torch.topk(router_logits, top_k, dim=-1)
    router_scores = F.softmax(router_top_value, dim=1, dtype=router_top_value.dtype)
    return router_scores, router_indices


def in_kernel_order(weights, ids, key):
    """A router reference's (weights, ids) reordered as ``moe_router`` orders them.

    That is by ``key`` (the selection score) descending, ties by expert id:
    torch.topk orders tied values its own way, and ``sorted=False`` not at all.
    """
    order = torch.argsort(ids, dim=1)
    weights, ids = weights.gather(1, order), ids.gather(1, order)
    order = torch.sort(torch.gather(key, 1, ids), dim=1, descending=True, stable=True).indices
    return weights.gather(1, order), ids.gather(1, order)
