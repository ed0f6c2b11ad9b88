"""The kernel side of a flex_attention call, shared by the eager call and the compiled ops.

``Launchable`` holds what the kernels need (the mod programs, the live captured tensors, the
normalized BlockMask, the scale); ``prepare`` builds it (block-mask normalization, re-blocked
mask program, index checks, kernel layout) and ``forward`` / ``backward`` run it:

* ``forward``: ``flash_attn_func`` with the mods, writing the output in torch's flex output
  layout (the query's stride order, last dimension contiguous: ``_permute_strides`` in
  ``torch/_higher_order_ops/flex_attention.py``); LSE natural, ``-inf`` for rows with no key.
* ``backward``: ``flash_attn_backward`` (the score mod's gradient program, the LSE's gradient
  folded into delta), and for captured tensors that require grad, each gradient site's grid
  (``flydsl_kernels.attention.mod_grads.site_grids``) scattered into the tensor through the
  site's index by ``segment_sum``: deterministic end to end.

Query and key/value batch sizes that broadcast (``Bkv == 1``) run with key/value expanded
(stride 0) and their gradients summed over the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import blocks as blk
from . import bounds, mods
from .program import INDEX_ARGS, Program, evaluate
from .translate import Unsupported


@dataclass(frozen=True)
class Launchable:
    score: Program | None
    mask: Program | None  # with the block-state lookup of a re-blocked BlockMask
    tensors: tuple  # live captured tensors by slot (the block state last when re-blocked)
    blocks: object  # blocks.Blocks or None
    scale: float
    layout: tuple
    target: object


def kernel_target(t):
    """The FlyDSL target of a launch on ``t`` (``torch_flydsl.eligibility.target``)."""
    from ..eligibility import target

    return target(t)


def output_strides(shape, query_strides):
    """torch's flex output strides: the query's fill order (ties: inner dimension first),
    the last dimension moved innermost if it is not."""
    n = len(shape)
    order = sorted(range(n), key=query_strides.__getitem__, reverse=True)
    fill = list(reversed(order))
    if fill[0] != n - 1:
        fill.remove(n - 1)
        fill = [n - 1, *fill]
    strides, cur = [0] * n, 1
    for d in fill:
        strides[d] = cur
        cur *= shape[d]
    return tuple(strides)


def prepare(m: mods.Mods, tensors, lists, block_size, B, H, Sq, Sk, scale, device) -> Launchable:
    """The launchable call: ``lists`` (``kv_num, kv_idx, full_num, full_idx``) and
    ``block_size`` of a BlockMask (or None), the live captured ``tensors`` by slot. Raises
    torch's errors for bad lists or indices, ``Unsupported`` otherwise."""
    mask = m.mask
    tensors = tuple(tensors)
    b = None
    if lists is not None and lists[0] is not None:
        b = blk.normalize(*lists, block_size, B, H, Sq, Sk)
    if b is not None and b.orig_state is not None:
        st = b.orig_state
        meta = (tuple(st.shape), "int32")
        mask = mods.with_block_state(mask, m.metas, meta, b.orig_block)
        tensors = (*tensors, st)
        score = m.score
        if score is not None:
            score = Program(score.inputs, score.instrs, score.outputs, mask.tensors)
    else:
        score = m.score
    metas = (score or mask).tensors if (score or mask) is not None else ()
    for t in tensors:
        if t.device != device:
            raise Unsupported(f"a captured tensor on {t.device}, the inputs are on {device}")
        if t.dtype == torch.int64 and t.numel():
            lo, hi = bounds.value_range(t)
            if lo < -(1 << 31) or hi >= 1 << 31:
                raise Unsupported("a captured int64 tensor with values beyond int32")
    extents = {"b": B, "h": H, "q_idx": Sq, "kv_idx": Sk}
    for p in (score, mask):
        if p is not None:
            bounds.check(p, extents, tensors)
    lay = mods.layout(metas)
    return Launchable(score, mask, tensors, b, float(scale), lay, None)


def _flash(q, k, v):
    """flex ``(B, H, S, D)`` -> flash-attn ``(B, S, H, D)`` views."""
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def forward(L: Launchable, query, key, value, km: mods.KernelMods):
    """``(out, lse)``: out in torch's flex layout, LSE natural (``-inf`` for empty rows)."""
    from flydsl_kernels.attention import flash_attn_func

    B, H, Sq, _ = query.shape
    Dv = value.shape[-1]
    if key.shape[0] != B:
        key, value = key.expand(B, *key.shape[1:]), value.expand(B, *value.shape[1:])
    shape = (B, H, Sq, Dv)
    out = torch.empty_strided(
        shape, output_strides(shape, query.stride()), dtype=query.dtype, device=query.device
    )
    q, k, v = _flash(query, key, value)
    mt = mods.pack(L.tensors, L.layout, query.device)
    _, lse, _ = flash_attn_func(
        q,
        k,
        v,
        softmax_scale=L.scale,
        score_mod=km.score_mod,
        mask_mod=km.mask_mod,
        mod_tensors=mt,
        block_sparse=L.blocks.sparse if L.blocks is not None else None,
        return_attn_probs=True,
        target=kernel_target(query),
        out=out.transpose(1, 2),
    )
    lse = torch.where(lse == math.inf, -math.inf, lse)
    return out, lse


def backward(
    L: Launchable,
    query,
    key,
    value,
    out,
    lse,
    dout,
    dlse,
    km: mods.KernelMods,
    grad_slots=(),
    sites=(),
    site_slots=(),
):
    """``(dq, dk, dv, {slot: grad})`` from the forward's ``out`` and natural ``lse``."""
    from flydsl_kernels.attention import flash_attn_backward
    from flydsl_kernels.attention.mod_grads import segment_sum, site_grids

    B, H, Sq, _ = query.shape
    Bk = key.shape[0]
    if Bk != B:
        key, value = key.expand(B, *key.shape[1:]), value.expand(B, *value.shape[1:])
    q, k, v = _flash(query, key, value)
    o = out.transpose(1, 2)
    do = dout.transpose(1, 2)
    lse_k = torch.where(lse == -math.inf, math.inf, lse).float().contiguous()  # kernels: +inf
    if dlse is not None:
        dlse = torch.where(lse == -math.inf, 0.0, dlse.float()).contiguous()
    mt = mods.pack(L.tensors, L.layout, query.device)
    sparse = L.blocks.sparse if L.blocks is not None else None
    # the attention gradients and the captured tensors' gradient sites see one problem
    problem = {
        "softmax_scale": L.scale,
        "score_mod": km.score_mod,
        "mask_mod": km.mask_mod,
        "mod_tensors": mt,
        "target": kernel_target(query),
        "dlse": dlse,
    }
    dq, dk, dv = flash_attn_backward(do, q, k, v, o, lse_k, block_sparse=sparse, **problem)
    dq, dk, dv = dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
    if Bk != B:
        dk, dv = dk.sum(0, keepdim=True), dv.sum(0, keepdim=True)
    grads: dict = {}
    if sites:
        state = None
        if L.blocks is not None:
            state = (L.blocks.state.to(torch.int32), L.blocks.block)
        grids = site_grids(do, q, k, v, o, lse_k, km.sites, block_state=state, **problem)
        extents = {"b": B, "h": H, "q_idx": Sq, "kv_idx": key.shape[2]}
        for site, slot, grid, gs in zip(sites, site_slots, grids, km.sites):
            t = L.tensors[slot]
            flat = _flat_index(L.score, site, gs.deps, extents, L.tensors, grid.shape)
            g = segment_sum(grid, flat, t.numel(), target=problem["target"]).reshape(t.shape)
            grads[slot] = g if slot not in grads else grads[slot] + g
        for slot in list(grads):
            grads[slot] = grads[slot].to(L.tensors[slot].dtype)
    for slot in grad_slots:
        if slot not in grads:
            grads[slot] = torch.zeros_like(L.tensors[slot])
    return dq, dk, dv, grads


def _flat_index(score: Program, site: int, deps, extents, tensors, shape):
    """The flat element index a site reads at every point of its dependent grid."""
    names = [n for n, d in zip(INDEX_ARGS, deps) if d]
    dev = tensors[0].device
    env = {}
    for k, name in enumerate(names):
        s = [1] * len(names)
        s[k] = extents[name]
        env[name] = torch.arange(extents[name], dtype=torch.int32, device=dev).reshape(s)
    slot = score.instrs[site][2][0][1]
    tshape = score.tensors[slot][0]
    flat = torch.zeros(shape, dtype=torch.int64, device=dev)
    stride = 1
    ops = score.instrs[site][2][1:]
    for o, n in reversed(list(zip(ops, tshape))):
        if o[0] == "c":
            from .program import const_value

            i = torch.tensor(int(const_value(o[1], o[2])), device=dev)
        elif o[0] == "arg":
            i = env[o[1]]
        else:
            (i,) = evaluate(score, env, tensors, upto=o[1])
        i = i.long()
        i = torch.where(i < 0, i + n, i)
        flat = flat + i.expand(shape) * stride
        stride *= n
    return flat
