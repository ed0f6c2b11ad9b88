"""The reference a quantized (MX) route is checked against: the same quantization, in PyTorch.

torch-flydsl's MX experts route (``patch(model, mx_experts=True)``) quantizes the
experts' weights to MXFP4 and, per call, their activations to mxfp8 e4m3 (OCP MX,
one E8M0 scale per 32 elements along K), then runs the grouped MX GEMM with fp32
accumulation, the bias added in fp32 and one rounding to the model dtype: the op
``flydsl::hf_mx_grouped_mm`` (its documented contract). Compared with the
bf16 ``off`` arm, that mixes the format's own error with our kernels' error, and
the quantization amplifies any other difference (a last-bit change of an activation
moves it across an e4m3 rounding boundary now and then). So:

* ``reference_op()``: inside the block, that op computes the same contract with
  ``flydsl_kernels.mx.reference`` (the float64 specification of the format, an
  independent route from the kernels) instead of the kernels. Running an MX arm
  again inside it, the same module forwards or the same compiled graph, gives the
  arm's reference: the same quantization of the same inputs, so the arm's check
  tests the kernels.
* ``quantized_experts(model)``: the ``off`` model's experts on that reference
  (transformers' ``ExpertsInterface``), for the format's own error against ``off``
  (reported, not judged).
"""

from __future__ import annotations

import contextlib

import torch

OP_NAME = "hf_mx_grouped_mm"  # in torch_flydsl.library.NAMESPACE
NAME = "flydsl_models_mx_reference"  # the experts implementation
_FP4 = torch.float4_e2m1fn_x2
_FP8 = torch.float8_e4m3fn


def reference_mx_grouped_mm(a, b_q, b_scale, offs, bias):
    """``flydsl::hf_mx_grouped_mm``'s contract by the format's specification: ``a (S, K)``
    quantized to e4m3, times MXFP4 experts ``b_q (G, N, K/2)`` with their E8M0 scales by groups
    of rows (``offs``), fp32 accumulation, ``bias (G, N)`` in fp32, one rounding to ``a.dtype``."""
    from flydsl_kernels.mx import reference

    aq, sa = reference.to_mx(a.float().contiguous(), _FP8)
    return reference.mx_grouped_mm(
        aq, sa, b_q, b_scale, _FP8, _FP4, offs, bias=bias, out_dtype=a.dtype
    )


@contextlib.contextmanager
def reference_op():
    """``flydsl::hf_mx_grouped_mm`` computed by ``reference_mx_grouped_mm`` inside the
    block (a kernel registered over the op's for the CPU and CUDA keys; removed after)."""
    from torch_flydsl.library import NAMESPACE

    lib = torch.library.Library(NAMESPACE, "IMPL")
    try:
        for key in ("CPU", "CUDA"):
            lib.impl(OP_NAME, reference_mx_grouped_mm, key)
        yield
    finally:
        lib._destroy()


def _quantized_weight(module, which: int):
    """The experts' weight ``which`` (0: up, 1: down) as MXFP4 ``(q, scales)`` in NT layout
    (``(G, N, K)``), cached on the module for the block (the weights do not change)."""
    from flydsl_kernels.mx import reference

    cache = module.__dict__.setdefault("_flydsl_models_mx_ref", {})
    if which not in cache:
        w = (
            (module.gate_up_proj if module.has_gate else module.up_proj)
            if which == 0
            else module.down_proj
        )
        nt = (w.transpose(-2, -1) if module.is_transposed else w).detach().float().contiguous()
        cache[which] = reference.to_mx(nt, _FP4)
    return cache[which]


def _mx_linear(module, x, which: int, offs):
    bq, bs = _quantized_weight(module, which)
    bias = None
    if module.has_bias:
        bias = (
            (module.gate_up_proj_bias if module.has_gate else module.up_proj_bias)
            if which == 0
            else module.down_proj_bias
        )
    return reference_mx_grouped_mm(x, bq, bs, offs, bias)


@torch.no_grad()
def experts_forward(module, hidden_states, top_k_index, top_k_weights):
    """transformers' ``grouped_mm_experts_forward`` (the order of the route it checks: sort
    the (token, expert) pairs by expert, two grouped GEMMs around the gate, weight, sum),
    with the GEMMs on the quantize-dequantized operands."""
    num_top_k = top_k_index.size(-1)
    num_tokens, hidden_dim = hidden_states.shape
    sample_weights = top_k_weights.reshape(-1)
    expert_ids_g, perm = torch.sort(top_k_index.reshape(-1))
    x = hidden_states[perm // num_top_k]
    counts = torch.bincount(expert_ids_g, minlength=module.num_experts)[: module.num_experts]
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    proj = _mx_linear(module, x, 0, offs)
    proj = module._apply_gate(proj) if module.has_gate else module.act_fn(proj)
    proj = _mx_linear(module, proj, 1, offs)
    if getattr(module, "has_post_expert_norm", False):
        proj = module.post_expert_norm(proj)
    weighted = proj * sample_weights[perm].unsqueeze(-1)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    out = weighted[inv].view(num_tokens, num_top_k, hidden_dim).sum(dim=1)
    return out.to(hidden_states.dtype)


@contextlib.contextmanager
def quantized_experts(model):
    """The model's experts on ``experts_forward`` inside the block (transformers'
    ``set_experts_implementation``), restored after."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(NAME, experts_forward)
    cfg = model.config.get_text_config()
    before = getattr(cfg, "_experts_implementation", None)
    model.set_experts_implementation(NAME)
    try:
        yield
    finally:
        model.set_experts_implementation(before or "eager")
        for m in model.modules():
            m.__dict__.pop("_flydsl_models_mx_ref", None)
