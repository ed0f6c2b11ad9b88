"""The ``"flydsl"`` attention implementation of transformers' ``AttentionInterface``.

    import torch_flydsl.transformers as tft
    tft.register()
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="flydsl")

``register()`` adds ``attention_forward`` to ``AttentionInterface`` and sdpa's mask builder to
``AttentionMaskInterface`` under the same name, so a model builds the masks it builds for
``"sdpa"``: a boolean ``(B, 1, Sq, Sk)`` mask (padding, sliding windows, packed sequences), or
None where sdpa relies on ``is_causal``. The call is the custom op ``flydsl::hf_attention``
(``torch_flydsl.library.hf``: one named node for torch.profiler and torch.compile, with
autograd through ``flydsl::hf_attention_backward``, so training takes the route too), which
runs ``flydsl_kernels.attention.flash_attn_func``: the mask, when there is one, as a FlyDSL
mask mod reading it (a mod tensor, ``mask[b, q_idx, kv_idx]``), else the kernel's causal flag;
GQA without ``repeat_kv``; gpt-oss's sinks (``s_aux``, differentiable) as the kernel's sinks;
Gemma's ``softcap``; ``scaling``. The KV cache needs nothing: transformers passes the cached
keys and a mask over them.

Which calls run FlyDSL is ``torch_flydsl.eligibility``'s rule, as for every route: the
implementation is an explicit request, so a CPU tensor runs FlyDSL's CPU backend with no
``torch_flydsl.enable()`` (which only installs the global ATen hooks), and a GPU one where its
arch is allowed. Where the kernels do not apply (fp32, dropout in training, head dims over
256, a float mask, a device FlyDSL does not run on) the call computes the same attention in
PyTorch (``_torch``, eager's math with the mask, sinks and softcap), counted as a fallback
under ``torch_flydsl.stats()["hf.attention"]`` with its reason. Rows with no visible key (left
padding) give 0 where eager averages every value: they are padding, no logit reads them.
"""

from __future__ import annotations

import torch

from flydsl_kernels import supported

from ..eligibility import PLAIN, device_reason
from ..library import hf as _hf  # registers flydsl::hf_attention
from ..stats import get as _stat

NAME = "flydsl"
STAT = _hf.ATTENTION
#: a torch-side choice, narrower than the kernel's ``supported.ATTENTION`` (which adds fp32 for
#: flex_attention): transformers' flash-attention implementations take bf16 / fp16 only
_DTYPES = (torch.bfloat16, torch.float16)
_MAX_D = supported.ATTENTION_MAX_HEAD_DIM


def register(name: str = NAME) -> None:
    """Register ``name`` (default ``"flydsl"``) in transformers' attention and mask interfaces
    (global, idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)


#: recent masks converted: id -> (mask, its version, int8 copy); a forward passes the same
#: one or two mask objects (full and sliding layers) to every layer
_CONVERTED: dict = {}


def _mask_tensor(mask, B, Sq, Sk):
    """``mask`` as the ``(B, Sq, Sk)`` int8 tensor the mask mod reads, converted once per mask
    object (the version counter catches in-place edits); under torch.compile, in the graph."""
    if torch.compiler.is_compiling():
        return mask[:, 0].expand(B, Sq, Sk).to(torch.int8).contiguous()
    hit = _CONVERTED.get(id(mask))
    if (
        hit is not None
        and hit[0] is mask
        and hit[1] == mask._version
        and hit[2].shape == (B, Sq, Sk)
    ):
        return hit[2]
    t = mask[:, 0].expand(B, Sq, Sk).to(torch.int8).contiguous()
    if len(_CONVERTED) >= 4:
        _CONVERTED.clear()
    _CONVERTED[id(mask)] = (mask, mask._version, t)
    return t


def _reason(module, query, key, value, mask, dropout) -> str | None:
    for t in (query, key, value):
        if type(t) not in PLAIN:
            return "subclass"
    r = device_reason(query)
    if r:
        return r
    if query.dtype not in _DTYPES or not (query.dtype == key.dtype == value.dtype):
        return "dtype"
    if dropout and module.training:
        return "params"  # attention dropout: the kernels have none
    if query.shape[-1] > _MAX_D or value.shape[-1] > _MAX_D or query.shape[1] % key.shape[1]:
        return "params"
    if mask is not None and (mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1):
        return "params"  # a float / per-head mask: not what sdpa_mask builds
    if query.numel() == 0 or key.shape[2] == 0:
        return "empty"
    return None


def _causal(module, is_causal, sq) -> bool:
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    return bool(causal) and sq > 1


def _torch(module, query, key, value, mask, scaling, dropout, softcap, sinks, is_causal):
    """Eager's attention in PyTorch (the fallback): fp32 softmax, sinks in the denominator;
    no mask means sdpa's ``is_causal`` (bottom-right aligned, as transformers' caches are)."""
    g = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(g, 1)
    v = value.repeat_interleave(g, 1)
    s = (query @ k.transpose(2, 3)).float() * scaling
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    sq, sk = s.shape[2], s.shape[3]
    if mask is None and _causal(module, is_causal, sq):
        i = torch.arange(sq, device=s.device)[:, None] + (sk - sq)
        mask = torch.arange(sk, device=s.device)[None, :] <= i
    if mask is not None:
        mask = mask[..., :sk]
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    if sinks is not None:
        sk = sinks.float().reshape(1, -1, 1, 1).expand(*s.shape[:3], 1)
        p = torch.cat([s, sk], -1).softmax(-1)[..., :-1]
    else:
        p = s.softmax(-1)
    p = torch.nn.functional.dropout(p, p=dropout, training=module.training)
    return (p.to(v.dtype) @ v).transpose(1, 2).contiguous()


def attention_forward(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    softcap: float | None = None,
    s_aux=None,
    **kwargs,
):
    """transformers' attention signature: q ``(B, H, Sq, D)``, k/v ``(B, Hk, Sk, D)``; returns
    ``(out (B, Sq, H, Dv), None)``."""
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    sinks = s_aux if s_aux is not None else kwargs.get("sinks")
    mask = attention_mask
    if mask is not None and mask.shape[-1] != key.shape[2]:
        mask = mask[..., : key.shape[2]]
    r = _reason(module, query, key, value, mask, dropout)
    if r is not None:
        _stat(STAT).fallback(r)
        out = _torch(module, query, key, value, mask, scale, dropout, softcap, sinks, is_causal)
        return out, None
    B, _, Sq, _ = query.shape
    mt = None if mask is None else _mask_tensor(mask, B, Sq, key.shape[2])
    causal = mask is None and _causal(module, is_causal, Sq)
    # the op counts its hits (and a kernel error, answered in PyTorch) in the stats
    out, _ = torch.ops.flydsl.hf_attention(
        query, key, value, mt, sinks, float(scale), causal, float(softcap or 0.0)
    )
    return out, None
