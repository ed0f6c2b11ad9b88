"""flex_attention under ``torch.compile(backend="flydsl")``: the HOP nodes -> ``flydsl::`` ops.

A compiled graph holds ``torch.ops.higher_order.flex_attention(q, k, v, score_graph,
block_mask_tuple, scale, kernel_options, score_buffers, mask_buffers)`` and, in a training
graph's backward, ``flex_attention_backward(q, k, v, out, lse, grad_out, grad_lse, fw_graph,
joint_graph, block_mask_tuple, ...)``; the mods are FX graphs whose extra placeholders are the
captured tensors (buffers). ``rewrite`` (run by the post-grad pass, ``inductor.FlyDSLPass``)
translates the score, mask and joint graphs with ``_fx.translate``, the buffers becoming mod
tensor slots, and replaces the nodes with ``flydsl::flex_attention`` /
``flydsl::flex_attention_backward``, custom ops Inductor calls as extern kernels. The LSE
between them is the HOP's: base 2, ``-inf`` for rows with no visible key, so either half
also pairs with torch's other half.

Stay torch's, with the reason counted under ``compile:flex_attention``: nodes whose
``max_scores`` is read, a backward with a gradient w.r.t. the LSE or one that gives captured
tensors gradients, and anything the translation does not take.
"""

from __future__ import annotations

import ast
import functools
import logging
import math
import operator

import torch
from torch import fx

from ..stats import get as _stat
from . import _fx

log = logging.getLogger("torch_flydsl")

STAT = "compile:flex_attention"
_DTYPES = (torch.bfloat16, torch.float16)
_EMPTY_BLOCK = 1 << 30  # torch's BLOCK_SIZE for "no block mask given" (_LARGE_SPARSE_BLOCK_SIZE)
_LISTS = 8  # kv_num_blocks, kv_indices, full_kv_*, q_*, full_q_* in the block-mask tuple


@functools.lru_cache(maxsize=256)
def _programs(text: str):
    return ast.literal_eval(text)


def _kernel_inputs(device, buffers, block_size, *blocks):
    """The ops' shared kernel inputs: the mods' captured tensors (0-d ones as 1-element) and,
    when a block mask came with the call, its eight index tensors as one ``BlockSparse``."""
    from flydsl_kernels.attention import BlockSparse

    from ._eager import _kernel_tensor

    mt = tuple(_kernel_tensor(b.reshape(1) if b.dim() == 0 else b, device) for b in buffers)
    bs = BlockSparse(*blocks, tuple(block_size)) if blocks[0] is not None else None
    return mt, bs


@torch.library.custom_op("flydsl::flex_attention", mutates_args=())
def flex_attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_num_blocks: torch.Tensor | None,
    kv_indices: torch.Tensor | None,
    full_kv_num_blocks: torch.Tensor | None,
    full_kv_indices: torch.Tensor | None,
    q_num_blocks: torch.Tensor | None,
    q_indices: torch.Tensor | None,
    full_q_num_blocks: torch.Tensor | None,
    full_q_indices: torch.Tensor | None,
    buffers: list[torch.Tensor],
    scale: float,
    programs: str,
    block_size: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """flex_attention's forward (q/k/v ``(B, H, S, D)``) on FlyDSL: ``(out, lse base 2)``."""
    from flydsl_kernels.attention import flash_attn_func

    from ._eager import _mask_mod, _score_mod, _target

    score_prog, mask_prog = _programs(programs)
    sm = _score_mod(score_prog, None) if score_prog is not None else None
    mm = _mask_mod(mask_prog) if mask_prog is not None else None
    mt, bs = _kernel_inputs(
        q.device, buffers, block_size, kv_num_blocks, kv_indices, full_kv_num_blocks,
        full_kv_indices, q_num_blocks, q_indices, full_q_num_blocks, full_q_indices,
    )  # fmt: skip
    out, lse, _ = flash_attn_func(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale,
        score_mod=sm, mask_mod=mm, mod_tensors=mt, block_sparse=bs, lse_log2=True,
        return_attn_probs=True, target=_target(q),
    )  # fmt: skip
    lse = torch.where(lse == math.inf, -math.inf, lse)
    return out.transpose(1, 2), lse


@flex_attention_op.register_fake
def _(q, k, v, *rest):
    B, H, Sq, _ = q.shape
    out = q.new_empty((B, Sq, H, v.shape[-1])).transpose(1, 2)
    return out, q.new_empty((B, H, Sq), dtype=torch.float32)


@torch.library.custom_op("flydsl::flex_attention_backward", mutates_args=())
def flex_attention_backward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    kv_num_blocks: torch.Tensor | None,
    kv_indices: torch.Tensor | None,
    full_kv_num_blocks: torch.Tensor | None,
    full_kv_indices: torch.Tensor | None,
    q_num_blocks: torch.Tensor | None,
    q_indices: torch.Tensor | None,
    full_q_num_blocks: torch.Tensor | None,
    full_q_indices: torch.Tensor | None,
    buffers: list[torch.Tensor],
    scale: float,
    programs: str,
    block_size: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """flex_attention's backward on FlyDSL from the forward's ``out`` and base-2 ``lse``:
    ``(dq, dk, dv)`` in the inputs' ``(B, H, S, D)`` shapes."""
    from flydsl_kernels.attention import flash_attn_backward

    from ._eager import _mask_mod, _score_mod, _target

    score_prog, joint, mask_prog = _programs(programs)
    sm = None
    if score_prog is not None:
        sm = _score_mod(score_prog, _fx.Program(joint[0], additive=joint[1]))
    mm = _mask_mod(mask_prog) if mask_prog is not None else None
    mt, bs = _kernel_inputs(
        q.device, buffers, block_size, kv_num_blocks, kv_indices, full_kv_num_blocks,
        full_kv_indices, q_num_blocks, q_indices, full_q_num_blocks, full_q_indices,
    )  # fmt: skip
    # base-2 LSE with -inf for empty rows -> the kernels' natural LSE with +inf there
    lse_n = torch.where(lse == -math.inf, math.inf, lse.float() * math.log(2.0))
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    dq, dk, dv = flash_attn_backward(
        t(grad_out), t(q), t(k), t(v), t(out), lse_n, softmax_scale=scale, score_mod=sm,
        mask_mod=mm, mod_tensors=mt, block_sparse=bs, target=_target(q),
    )  # fmt: skip
    return t(dq).contiguous(), t(dk).contiguous(), t(dv).contiguous()


@flex_attention_backward_op.register_fake
def _(q, k, v, *rest):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _val(n):
    return n.meta.get("val") if isinstance(n, fx.Node) else n


def _sub(graph, n):
    if not (isinstance(n, fx.Node) and n.op == "get_attr"):
        return None
    return getattr(graph.owning_module, n.target)


def _noop_mask(prog) -> bool:
    last = prog[-1]
    return len(prog) == 1 and last[0] == "copy" and last[2][0] == ("c", "b", "True")


def _plan(graph, node, ctx):
    """``(inputs, programs, scale, block_size)`` for the replacement, or a reason string."""
    q, k, v, score_g, bm, scale, _opts, sbufs, mbufs = [*node.args, (), ()][:9]
    qv, kv, vv = _val(q), _val(k), _val(v)
    if not all(isinstance(t, torch.Tensor) for t in (qv, kv, vv)):
        return "params"
    if not ctx.arch(qv):
        return "arch"
    if qv.dtype not in _DTYPES or not (qv.dtype == kv.dtype == vv.dtype):
        return "dtype"
    shapes = (*qv.shape, *kv.shape, *vv.shape)
    if not all(isinstance(s, int) for s in shapes):
        return "dynamic"
    B, H, Sq, D = qv.shape
    Bk, Hk, Sk, _ = kv.shape
    if Bk != B or not 0 < D <= 256 or not 0 < vv.shape[-1] <= 256 or H % Hk:
        return "params"
    if any(u.target is not operator.getitem for u in node.users):
        return "params"
    if any(u.args[1] == 2 and u.users for u in node.users):
        return "params: max_scores is read"
    return _mods(graph, Sq, Sk, score_g, bm, sbufs, mbufs, q, k, v, scale)


def _mods(graph, Sq, Sk, score_g, bm, sbufs, mbufs, q, k, v, scale, joint_g=None):
    """The translated mods and kernel inputs of a flex_attention (backward) node, or a reason."""
    bm = tuple(bm)
    sq_bm, sk_bm = bm[0], bm[1]
    lists = list(bm[2 : 2 + _LISTS])
    bq, bkv, mask_g = bm[-3], bm[-2], bm[-1]
    empty = bq == _EMPTY_BLOCK and bkv == _EMPTY_BLOCK
    if not empty:
        if (sq_bm, sk_bm) != (Sq, Sk):
            return "block_mask: its seq_lengths differ from the inputs'"
        if not (isinstance(bq, int) and isinstance(bkv, int)) or bq % 16 or bkv % 16:
            return f"block_mask: BLOCK_SIZE ({bq}, {bkv})"
    sbufs, mbufs = list(sbufs or ()), list(mbufs or ())
    if len(sbufs) + len(mbufs) > _fx.MAX_TENSORS:
        return f"mod: more than {_fx.MAX_TENSORS} captured tensors"
    slots = _fx.Slots()
    bufs = [(i, tuple(_val(b).shape)) for i, b in enumerate(sbufs + mbufs)]
    try:
        sgm, mgm = _sub(graph, score_g), _sub(graph, mask_g)
        if sgm is None or (not empty and mgm is None):
            return "mod: a mod that is not a graph"
        sp, _ = _fx.translate(sgm, _fx.SCORE_ARGS, slots, bufs[: len(sbufs)], upcast=True)
        score_prog = None if _is_identity(sp.prog) else sp.prog
        joint = None
        if joint_g is not None and score_prog is not None:
            jgm = _sub(graph, joint_g)
            if jgm is None:
                return "mod: a joint graph that is not a graph"
            jp, _ = _fx.translate(
                jgm, _fx.JOINT_ARGS, slots, bufs[: len(sbufs)], first=True, upcast=True
            )
            joint = (jp.prog, jp.additive)
        mask_prog = None
        if not empty:
            mp, _ = _fx.translate(mgm, _fx.MASK_ARGS, slots, bufs[len(sbufs) :], upcast=True)
            mask_prog = None if _noop_mask(mp.prog) else mp.prog
    except _fx.Unsupported as e:
        return f"mod: {e}"
    if empty:
        lists = [None] * _LISTS
    block = [int(bq), int(bkv)] if not empty else [128, 128]
    progs = (score_prog, mask_prog) if joint_g is None else (score_prog, joint, mask_prog)
    return lists, sbufs + mbufs, repr(progs), float(scale), block


def _is_identity(prog) -> bool:
    last = prog[-1]
    return len(prog) == 1 and last[0] == "copy" and last[2][0] == ("arg", "score")


def splice_tuple(graph: fx.Graph, anchor: fx.Node, fn, inputs) -> None:
    """Insert the trace of ``fn(*inputs)`` (a tuple) before ``anchor`` and point ``anchor``'s
    ``getitem`` users at its items."""

    from torch.utils import _pytree as pytree

    from ..inductor.graph_pass import _trace

    gm, nodes = _trace(fn, inputs, decompose=False)
    env: dict = dict(zip([p for p in gm.graph.nodes if p.op == "placeholder"], nodes))
    out = None
    with graph.inserting_before(anchor):
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                out = pytree.tree_map(lambda x: env[x] if isinstance(x, fx.Node) else x, n.args[0])
                continue
            env[n] = graph.node_copy(n, lambda x: env[x])
    for u in list(anchor.users):
        if u.target is operator.getitem and u.args[1] < len(out):
            u.replace_all_uses_with(out[u.args[1]])


def _plan_bwd(graph, node, ctx):
    """The backward node's ``(lists, buffers, programs, scale, block)``, or a reason."""
    (q, k, v, out, _lse, grad_out, grad_lse, fw_g, joint_g, bm, scale, _opts, sbufs,
     mbufs) = [*node.args, (), ()][:14]  # fmt: skip
    qv, kv, vv = _val(q), _val(k), _val(v)
    if not all(isinstance(t, torch.Tensor) for t in (qv, kv, vv, _val(out), _val(grad_out))):
        return "params"
    if grad_lse is not None:
        return "params: a gradient w.r.t. the LSE"
    if not ctx.arch(qv):
        return "arch"
    if qv.dtype not in _DTYPES or not (qv.dtype == kv.dtype == vv.dtype):
        return "dtype"
    if not all(isinstance(s, int) for s in (*qv.shape, *kv.shape, *vv.shape)):
        return "dynamic"
    B, H, Sq, D = qv.shape
    Bk, Hk, Sk, _ = kv.shape
    if Bk != B or not 0 < D <= 256 or not 0 < vv.shape[-1] <= 256 or H % Hk:
        return "params"
    for u in node.users:
        if u.target is not operator.getitem:
            return "params"
        if (u.args[1] == 3 and any(w.users for w in u.users)) or (u.args[1] == 3 and any(
                w.target is not operator.getitem for w in u.users)):  # fmt: skip
            return "grad: a captured tensor requires grad"
    return _mods(graph, Sq, Sk, fw_g, bm, sbufs, mbufs, q, k, v, scale, joint_g=joint_g)


def rewrite(graph: fx.Graph, ctx) -> int:
    """Replace the eligible flex_attention HOP nodes (forward and backward) of ``graph``;
    returns how many."""
    fwd = torch.ops.higher_order.flex_attention
    bwd = torch.ops.higher_order.flex_attention_backward
    n = 0
    st = _stat(STAT)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (fwd, bwd):
            continue
        is_bwd = node.target is bwd
        plan = (_plan_bwd if is_bwd else _plan)(graph, node, ctx)
        what = "flex_attention_backward" if is_bwd else "flex_attention"
        if isinstance(plan, str):
            st.fallback(plan)
            log.info("torch_flydsl: %s node stays torch's (%s)", what, plan)
            continue
        lists, bufs, programs, scale, block = plan
        if is_bwd:
            inputs = [*node.args[:4], node.args[4], node.args[5], *lists, bufs]

            def build(q, k, v, o, lse, do, *rest, programs=programs, scale=scale, block=block):
                *lists, bufs = rest
                return torch.ops.flydsl.flex_attention_backward(
                    q, k, v, o, lse, do, *lists, list(bufs), scale, programs, block
                )
        else:
            inputs = [*node.args[:3], *lists, bufs]

            def build(q, k, v, *rest, programs=programs, scale=scale, block=block):
                *lists, bufs = rest
                return torch.ops.flydsl.flex_attention(
                    q, k, v, *lists, list(bufs), scale, programs, block
                )

        splice_tuple(graph, node, build, inputs)
        st.hits += 1
        n += 1
    if n:
        graph.eliminate_dead_code()
    return n
