"""``torch_flydsl.flex_attention``: torch's ``flex_attention`` on the FlyDSL attention kernels.

Each call either runs the kernels (``run``) with the mods translated (``mods``), forward and
backward through one autograd function (gradients to q, k, v, to captured tensors that require
grad, and through the LSE), or torch's own ``flex_attention`` with the reason counted under
``torch_flydsl.stats()["flex_attention"]`` and logged (INFO). Under dynamo tracing the call is
torch's, so a compiled graph holds torch's flex_attention HOP (no graph break), which
``backend="flydsl"`` rewrites (``compile.py``).

Checks, in order (each a fallback reason): ``subclass``, ``arch`` (the device must run
FlyDSL), ``dtype`` (bf16 / fp16 / fp32, one dtype), ``params`` (what torch itself refuses, so
torch raises its own error; ``max_scores``), ``empty``, then the mods (``mod: <why>``). Where
torch raises for the call (a BlockMask for other lengths, a sliced BlockMask's mask_mod, a
mask_mod that does not return a bool tensor, an index out of range, a bad block list), the same
error is raised here, before any launch.
"""

from __future__ import annotations

import logging

import torch

from flydsl_kernels import supported

from ..eligibility import PLAIN, device_reason
from ..stats import get as _stat
from . import mods, run
from .translate import Unsupported

log = logging.getLogger("torch_flydsl")

STAT = "flex_attention"
DTYPES = supported.ATTENTION
MAX_HEAD_DIM = supported.ATTENTION_MAX_HEAD_DIM


def _torch_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


def _torch_block_checks(bm, query, key):
    """torch's own refusals of a BlockMask for this call, raised as torch raises them."""
    from torch.nn.attention import flex_attention as fa

    if getattr(bm, "mask_mod", None) is getattr(fa, "_sliced_mask_mod_error", object()):
        raise RuntimeError("Cannot use mask_mod from a sliced BlockMask")
    bs = bm.BLOCK_SIZE
    if not (bs[0] == fa._LARGE_SPARSE_BLOCK_SIZE and bs[1] == fa._LARGE_SPARSE_BLOCK_SIZE):
        q_len, kv_len = query.size(-2), key.size(-2)
        bq, bkv = bm.shape[-2], bm.shape[-1]
        if q_len > bq or kv_len > bkv:
            raise RuntimeError(fa._BLOCK_MASK_TOO_SMALL_ERROR)
        if q_len < bq or kv_len < bkv:
            raise RuntimeError(fa._BLOCK_MASK_TOO_LARGE_ERROR)
    if query.device != bm.kv_num_blocks.device:
        raise RuntimeError(
            f"Expect q/k/v and block_mask to be on the same device but got {query.device} "
            f"and {bm.kv_num_blocks.device}."
        )


class Plan:
    """What a served call needs: the launchable, its kernel mods, the gradient sites."""

    __slots__ = ("grad_slots", "grad_tensors", "km", "km_fwd", "launch", "site_slots", "sites")


def plan_call(query, key, value, score_mod, block_mask, scale, enable_gqa, return_aux):
    """A ``Plan``, or a fallback reason (a string)."""
    for t in (query, key, value):
        if type(t) not in PLAIN:
            return "subclass"
    r = device_reason(query)  # torch_flydsl.eligibility: one rule for every path
    if r:
        return r
    if query.dtype not in DTYPES or not (query.dtype == key.dtype == value.dtype):
        return "dtype"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "params"
    B, H, Sq, D = query.shape
    Bk, Hk, Sk, _ = key.shape
    Dv = value.shape[3]
    if (
        value.shape[:3] != key.shape[:3]
        or key.shape[3] != D
        or not 0 < D <= MAX_HEAD_DIM
        or not 0 < Dv <= MAX_HEAD_DIM
        or Hk == 0
        or H % Hk
        or (Hk != H and not enable_gqa)
        or not (query.device == key.device == value.device)
        or not (
            Bk == B
            or (
                Bk == 1
                and B > 1
                and block_mask is not None
                and block_mask.kv_num_blocks.size(0) == B
            )
        )
    ):
        return "params"
    if return_aux is not None and getattr(return_aux, "max_scores", False):
        return "params: max_scores"
    if query.numel() == 0 or key.numel() == 0:
        return "empty"
    lists = bsize = None
    mask_mod = None
    if block_mask is not None:
        _torch_block_checks(block_mask, query, key)
        mask_mod = block_mask.mask_mod
        lists = (
            block_mask.kv_num_blocks,
            block_mask.kv_indices,
            block_mask.full_kv_num_blocks,
            block_mask.full_kv_indices,
        )
        bsize = block_mask.BLOCK_SIZE
    try:
        m = mods.capture(score_mod, mask_mod)
        sc = float(scale) if scale is not None else 1.0 / (D**0.5)
        L = run.prepare(m, m.tensors, lists, bsize, B, H, Sq, Sk, sc, query.device)
        p = Plan()
        p.launch = L
        grad = torch.is_grad_enabled()
        p.grad_slots = m.grad_slots() if grad else ()
        p.grad_tensors = tuple(L.tensors[s] for s in p.grad_slots)
        p.sites = m.sites(p.grad_slots)
        p.site_slots = tuple(L.score.instrs[i][2][0][1] for i in p.sites)
        need = grad and (any(t.requires_grad for t in (query, key, value)) or p.grad_slots)
        jp = mods.joint(L.score, p.sites) if (need and L.score is not None) else None
        deps = tuple(mods.site_deps(L.score, i) for i in p.sites)
        # the forward kernels take the mods without their gradient: one compile either way
        p.km_fwd = mods.kernel_mods(L.score, None, L.mask, L.layout)
        p.km = mods.kernel_mods(L.score, jp, L.mask, L.layout, p.sites, deps) if need else None
    except Unsupported as e:
        return f"mod: {e}"
    return p


class _Flex(torch.autograd.Function):
    """The forward and backward kernels, with gradients to q, k, v, the captured tensors that
    require grad and through the LSE."""

    @staticmethod
    def forward(ctx, plan, query, key, value, *grad_tensors):
        out, lse = run.forward(plan.launch, query, key, value, plan.km_fwd)
        ctx.plan = plan
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        query, key, value, out, lse = ctx.saved_tensors
        p = ctx.plan
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv, grads = run.backward(
            p.launch,
            query,
            key,
            value,
            out,
            lse,
            dout,
            dlse,
            p.km,
            p.grad_slots,
            p.sites,
            p.site_slots,
        )
        return (None, dq, dk, dv, *(grads.get(s) for s in p.grad_slots))


def flex_attention(
    query,
    key,
    value,
    score_mod=None,
    block_mask=None,
    scale=None,
    enable_gqa=False,
    return_lse=False,
    kernel_options=None,
    *,
    return_aux=None,
):
    """torch's ``flex_attention`` (same signature and results) on FlyDSL kernels where they
    apply, torch's otherwise (see the module doc). ``kernel_options`` tune torch's Triton
    kernels; ours ignore them (they pick their own configs)."""
    args = (query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse, kernel_options)
    if torch.compiler.is_compiling():
        return _torch_flex()(*args, return_aux=return_aux)
    if return_lse and return_aux is not None:
        return _torch_flex()(*args, return_aux=return_aux)  # torch's ValueError
    st = _stat(STAT)
    plan = plan_call(query, key, value, score_mod, block_mask, scale, enable_gqa, return_aux)
    if isinstance(plan, str):
        st.fallback(plan)
        log.info("torch_flydsl.flex_attention: torch's flex_attention (%s)", plan)
        return _torch_flex()(*args, return_aux=return_aux)
    try:
        out, lse = _Flex.apply(plan, query, key, value, *plan.grad_tensors)
    except Exception as e:
        log.warning(
            "torch_flydsl.flex_attention: the FlyDSL kernel raised %s: %s; using torch's",
            type(e).__name__,
            e,
        )
        st.fallback("error")
        return _torch_flex()(*args, return_aux=return_aux)
    st.hits += 1
    if return_aux is not None:
        from torch.nn.attention.flex_attention import AuxOutput

        return out, AuxOutput(lse=lse if return_aux.lse else None, max_scores=None)
    if return_lse:
        return out, lse
    return out
