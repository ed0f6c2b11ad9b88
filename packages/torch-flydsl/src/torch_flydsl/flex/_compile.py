"""flex_attention under ``torch.compile(backend="flydsl")``: the HOP node -> ``flydsl::flex_attention``.

A compiled graph holds ``torch.ops.higher_order.flex_attention(q, k, v, score_graph,
block_mask_tuple, scale, kernel_options, score_buffers, mask_buffers)``, its score and mask
mods already FX graphs whose extra placeholders are the captured tensors (buffers).
``rewrite`` (run by the post-grad pass, ``inductor.FlyDSLPass``) translates both graphs with
``_fx.translate``, the buffers becoming mod tensor slots, and replaces the node with
``flydsl::flex_attention``, a custom op Inductor calls as an extern kernel: the FlyDSL
forward with the mods inlined, the LSE in base 2 as the HOP returns it (``-inf`` for rows
with no visible key, as torch's).

Forward only: the node's backward (``flex_attention_backward`` HOP, in the backward graph)
stays torch's; it reads only q, k, v, the output and the LSE, which ours give in its
conventions. A node whose ``max_scores`` output is read, or that the translation does not
take, stays torch's; the reason is counted under ``compile:flex_attention``.
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
    from flydsl_kernels.attention import BlockSparse, flash_attn_func

    from ._eager import _kernel_tensor, _mask_mod, _score_mod, _target

    score_prog, mask_prog = _programs(programs)
    sm = _score_mod(score_prog, None) if score_prog is not None else None
    mm = _mask_mod(mask_prog) if mask_prog is not None else None
    mt = tuple(_kernel_tensor(b.reshape(1) if b.dim() == 0 else b, q.device) for b in buffers)
    bs = None
    if kv_num_blocks is not None:
        bs = BlockSparse(
            kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, q_num_blocks,
            q_indices, full_q_num_blocks, full_q_indices, tuple(block_size),
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
        sp, _ = _fx.translate(sgm, _fx.SCORE_ARGS, slots, bufs[: len(sbufs)])
        score_prog = None if _is_identity(sp.prog) else sp.prog
        mask_prog = None
        if not empty:
            mp, _ = _fx.translate(mgm, _fx.MASK_ARGS, slots, bufs[len(sbufs) :])
            mask_prog = None if _noop_mask(mp.prog) else mp.prog
    except _fx.Unsupported as e:
        return f"mod: {e}"
    if empty:
        lists = [None] * _LISTS
    inputs = [q, k, v, *lists, sbufs + mbufs]
    block = [int(bq), int(bkv)] if not empty else [128, 128]
    return inputs, repr((score_prog, mask_prog)), float(scale), block


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


def rewrite(graph: fx.Graph, ctx) -> int:
    """Replace the eligible flex_attention HOP nodes of ``graph``; returns how many."""
    hop = torch.ops.higher_order.flex_attention
    n = 0
    st = _stat(STAT)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not hop:
            continue
        plan = _plan(graph, node, ctx)
        if isinstance(plan, str):
            st.fallback(plan)
            log.info("torch_flydsl: flex_attention node stays torch's (%s)", plan)
            continue
        inputs, programs, scale, block = plan

        def build(q, k, v, *rest, programs=programs, scale=scale, block=block):
            *lists, bufs = rest
            return torch.ops.flydsl.flex_attention(q, k, v, *lists, list(bufs), scale, programs,
                                                   block)  # fmt: skip

        splice_tuple(graph, node, build, inputs)
        st.hits += 1
        n += 1
    if n:
        graph.eliminate_dead_code()
    return n
