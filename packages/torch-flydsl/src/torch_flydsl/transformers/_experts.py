"""The ``"flydsl"`` experts implementation of transformers' ``ExpertsInterface``.

transformers 5.x dispatches an experts module (a class decorated with
``use_experts_implementation``: Qwen3MoeExperts, GptOssExperts, ...) through
``ALL_EXPERTS_FUNCTIONS[config._experts_implementation]``. ``experts_forward``
is registered there as ``"flydsl"``; it is transformers' own
``grouped_mm_experts_forward`` (sort the (token, expert) pairs by expert,
``histc`` the group sizes, two grouped GEMMs around the gate, weight and sum)
with the grouped GEMMs replaced:

* bf16 / fp16 experts: ``flydsl::hf_grouped_mm`` (``flydsl_kernels.gemm.grouped_mm``),
  the per-expert bias fused into the GEMM (one rounding instead of
  transformers' two: GEMM to bf16, then ``add_`` in bf16);
* MXFP4 experts (``patch`` quantized the module's weights with ``to_mx`` into
  the ``flydsl_mx_*`` buffers): ``flydsl::hf_mx_grouped_mm``.

A module that cannot take the route (dtype, device, expert parallelism) runs
the implementation its config named before ``patch`` (``_flydsl_fallback``).
"""

from __future__ import annotations

import torch

from flydsl_kernels import supported

from ..eligibility import device_reason, target
from ..library import hf as _hf  # noqa: F401 - registers the flydsl::hf_* ops
from . import _checks

NAME = "flydsl"
#: the non-persistent buffers ``patch`` adds to an experts module for the MX route
MX_BUFFERS = ("flydsl_mx_gate_up_q", "flydsl_mx_gate_up_s", "flydsl_mx_down_q", "flydsl_mx_down_s")


def register() -> None:
    """Register ``"flydsl"`` in transformers' ``ExpertsInterface`` (global, idempotent)."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(NAME, experts_forward)


def fallback(module, hidden_states, top_k_index, top_k_weights):
    """The implementation the module's config named before ``patch`` (``eager``: the class's own)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    prev = getattr(module, "_flydsl_fallback", "eager")
    fn = ALL_EXPERTS_FUNCTIONS.get(prev) if prev not in (None, "eager", NAME) else None
    if fn is None:
        fn = type(module).forward.__wrapped__  # the class's own loop over experts
    return fn(module, hidden_states, top_k_index, top_k_weights)


def _weights(module):
    up = module.gate_up_proj if module.has_gate else module.up_proj
    return up, module.down_proj


def _biases(module):
    if not module.has_bias:
        return None, None
    up = module.gate_up_proj_bias if module.has_gate else module.up_proj_bias
    return up, module.down_proj_bias


def _reason(module, hidden_states, mx: bool) -> str | None:
    if getattr(module, "_is_expert_parallel", False):
        return "params"  # EP sentinels: transformers' own implementations handle them
    if mx:
        why = device_reason(hidden_states) or _checks.grad_reason(hidden_states, *_weights(module))
        if why:
            return why
        return "dtype" if hidden_states.dtype not in (torch.bfloat16, torch.float16) else None
    return _checks.why_not_experts(
        hidden_states, *_weights(module), *(b for b in _biases(module) if b is not None)
    )


def _linear(module, x, which: int, offs, mx: bool):
    """Grouped ``x @ W[g] (+ b[g])`` for the up (``which=0``) or down (1) projection."""
    bias = _biases(module)[which]
    if mx:
        q = getattr(module, MX_BUFFERS[2 * which])
        s = getattr(module, MX_BUFFERS[2 * which + 1])
        return torch.ops.flydsl.hf_mx_grouped_mm(x, q, s, offs, bias)
    w = _weights(module)[which]
    # transformers' layouts: (G, K, N) when is_transposed, else (G, N, K) (a K-contiguous view)
    b = w if module.is_transposed else w.transpose(-2, -1)
    return torch.ops.flydsl.hf_grouped_mm(x, b, offs, bias)


def experts_forward(module, hidden_states, top_k_index, top_k_weights):
    """transformers' ``grouped_mm_experts_forward`` with FlyDSL grouped GEMMs (module docstring)."""
    mx = hasattr(module, MX_BUFFERS[0])
    key = _checks.MX_EXPERTS if mx else _checks.EXPERTS
    why = _reason(module, hidden_states, mx)
    if why:
        _checks.count_fallback(key, why, 2)  # the two grouped GEMMs of the forward
        return fallback(module, hidden_states, top_k_index, top_k_weights)

    device = hidden_states.device
    num_top_k = top_k_index.size(-1)
    num_tokens = hidden_states.size(0)
    hidden_dim = hidden_states.size(-1)
    sample_weights = top_k_weights.reshape(-1)
    expert_ids = top_k_index.reshape(-1)
    expert_ids_g, perm = torch.sort(expert_ids)
    x = hidden_states[perm // num_top_k]
    sample_weights_g = sample_weights[perm]
    # histc as transformers does (bincount breaks CUDA graphs; CPU histc takes floats only)
    histc_input = expert_ids_g.float() if device.type in ("cpu", "mps") else expert_ids_g.int()
    counts = torch.histc(histc_input, bins=module.num_experts, min=0, max=module.num_experts - 1)
    offs = torch.cumsum(counts, dim=0, dtype=torch.int32)

    proj = _linear(module, x, 0, offs, mx)
    proj = module._apply_gate(proj) if module.has_gate else module.act_fn(proj)
    proj = _linear(module, proj, 1, offs, mx)
    if getattr(module, "has_post_expert_norm", False):
        proj = module.post_expert_norm(proj)
    weighted = proj * sample_weights_g.unsqueeze(-1)
    inv_perm = torch.empty_like(perm)
    inv_perm[perm] = torch.arange(perm.size(0), device=device)
    weighted = weighted[inv_perm]
    out = weighted.view(num_tokens, num_top_k, hidden_dim).sum(dim=1)
    return out.to(hidden_states.dtype)


def is_experts_module(module) -> bool:
    """An experts class decorated with transformers' ``use_experts_implementation``."""
    fwd = type(module).forward
    return (
        hasattr(fwd, "__wrapped__")
        and all(
            hasattr(module, a)
            for a in ("has_gate", "has_bias", "is_transposed", "num_experts", "config")
        )
        and hasattr(module, "down_proj")
    )


def quantize_mx(module) -> float:
    """Quantize the experts' weights to MXFP4 (``to_mx``, NT layout) into the ``MX_BUFFERS``.

    Returns the largest absolute difference between the weights and their
    MXFP4 values (0 when the weights already were MXFP4 values, as a
    gpt-oss checkpoint's are).
    """
    from flydsl_kernels.mx import from_mx, to_mx

    fp4 = torch.float4_e2m1fn_x2
    worst = 0.0
    for which, w in enumerate(_weights(module)):
        nt = (w.transpose(-2, -1) if module.is_transposed else w).detach().contiguous()
        tgt = target(nt)
        q, s = to_mx(nt, fp4, target=tgt)
        back = from_mx(q, s, fp4, out_dtype=torch.float32, target=tgt)
        worst = max(worst, float((back - nt.float()).abs().max()) if nt.numel() else 0.0)
        module.register_buffer(MX_BUFFERS[2 * which], q, persistent=False)
        module.register_buffer(MX_BUFFERS[2 * which + 1], s, persistent=False)
    return worst


def mx_reason(module) -> str | None:
    """Why the module's weights cannot take the MX route, or None."""
    up, down = _weights(module)
    for w in (up, down):
        if type(w) not in (torch.Tensor, torch.nn.Parameter):
            return "subclass"
        if w.dtype not in supported.MX_INPUTS or w.dim() != 3:
            return "dtype"
    k_up = up.shape[1] if module.is_transposed else up.shape[2]
    k_down = down.shape[1] if module.is_transposed else down.shape[2]
    if k_up % 32 or k_down % 32:
        return "params"  # MX blocks are 32 elements along K
    return None
