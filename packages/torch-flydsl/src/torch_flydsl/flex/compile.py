"""flex_attention under ``torch.compile(backend="flydsl")``: the HOP nodes -> ``flydsl::`` ops.

A compiled graph holds ``torch.ops.higher_order.flex_attention(q, k, v, score_graph,
block_mask_tuple, scale, kernel_options, score_buffers, mask_buffers)`` and, in a training
graph's backward, ``flex_attention_backward(q, k, v, out, lse, grad_out, grad_lse, fw_graph,
joint_graph, block_mask_tuple, scale, kernel_options, score_buffers, mask_buffers)``. ``rewrite``
(run by the post-grad pass, ``inductor.FlyDSLPass``) translates the score and mask graphs into
``Program``s (``mods.from_graphs``: the buffers become the captured tensors' slots) and replaces
the nodes with ``flydsl::flex_attention`` / ``flydsl::flex_attention_backward``, custom ops
Inductor calls as extern kernels. Their arguments carry the programs in their text form
(``Program.text``), the one form a custom op argument can take; their bodies are the eager
call's (``run.prepare`` / ``forward`` / ``backward``), so BlockMask validation, re-blocking and
index checks happen at run time, before any launch. The backward derives its gradient programs
from the forward's score graph (``mods.joint``; the HOP's joint graph is not needed), and
computes the gradients of the score buffers that are read (learned biases) and through the LSE.
The LSE between the ops is the HOP's: base 2, ``-inf`` for rows with no visible key, so either
half also pairs with torch's other half.

Stay torch's, with the reason counted under ``compile:flex_attention``: nodes whose
``max_scores`` is read, symbolic shapes, and anything the translation does not take.
"""

from __future__ import annotations

import logging
import math
import operator

import torch
from torch import fx

from ..stats import get as _stat
from . import mods, run
from .call import DTYPES, MAX_HEAD_DIM
from .program import Program
from .translate import Unsupported

log = logging.getLogger("torch_flydsl")

STAT = "compile:flex_attention"
LN2 = math.log(2.0)


def _mods(score: str, mask: str, buffers) -> mods.Mods:
    return mods.Mods(
        Program.from_text(score) if score else None,
        Program.from_text(mask) if mask else None,
        tuple(b for b in buffers),
    )


def _launchable(q, k, m, lists, block_size, scale):
    B, H, Sq, _ = q.shape
    Sk = k.shape[2]
    try:
        return run.prepare(m, m.tensors, lists, tuple(block_size), B, H, Sq, Sk, scale, q.device)
    except Unsupported as e:
        raise RuntimeError(f"flydsl::flex_attention: {e}") from e


@torch.library.custom_op("flydsl::flex_attention", mutates_args=())
def flex_attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_num_blocks: torch.Tensor | None,
    kv_indices: torch.Tensor | None,
    full_kv_num_blocks: torch.Tensor | None,
    full_kv_indices: torch.Tensor | None,
    buffers: list[torch.Tensor],
    scale: float,
    score: str,
    mask: str,
    block_size: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """flex_attention's forward (q/k/v ``(B, H, S, D)``) on FlyDSL: ``(out, lse base 2)``."""
    m = _mods(score, mask, buffers)
    lists = (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)
    L = _launchable(q, k, m, lists, block_size, scale)
    km = mods.kernel_mods(L.score, None, L.mask, L.layout)
    out, lse = run.forward(L, q, k, v, km)
    return out, lse / LN2


@flex_attention_op.register_fake
def _(q, k, v, *rest):
    B, H, Sq, _ = q.shape
    shape = (B, H, Sq, v.shape[-1])
    out = q.new_empty_strided(shape, run.output_strides(shape, q.stride()))
    return out, q.new_empty((B, H, Sq), dtype=torch.float32)


@torch.library.custom_op("flydsl::flex_attention_backward", mutates_args=())
def flex_attention_backward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    grad_lse: torch.Tensor | None,
    kv_num_blocks: torch.Tensor | None,
    kv_indices: torch.Tensor | None,
    full_kv_num_blocks: torch.Tensor | None,
    full_kv_indices: torch.Tensor | None,
    buffers: list[torch.Tensor],
    scale: float,
    score: str,
    mask: str,
    block_size: list[int],
    grad_slots: list[int],
    grad: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """flex_attention's backward on FlyDSL from the forward's ``out`` and base-2 ``lse``:
    ``(dq, dk, dv, [gradient of buffer s for s in grad_slots])``. ``grad``: the gradient
    program (``mods.joint``), derived when the graph was rewritten (autograd does not run
    inside a custom op's body)."""
    m = _mods(score, mask, buffers)
    lists = (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)
    L = _launchable(q, k, m, lists, block_size, scale)
    slots = tuple(grad_slots)
    sites = m.sites(slots)
    jp = None
    if grad:
        jp = Program.from_text(grad)
        jp = Program(jp.inputs, jp.instrs, jp.outputs, L.score.tensors)
    deps = tuple(mods.site_deps(L.score, i) for i in sites)
    km = mods.kernel_mods(L.score, jp, L.mask, L.layout, sites, deps)
    site_slots = tuple(L.score.instrs[i][2][0][1] for i in sites)
    lse_n = lse.float() * LN2
    dlse = grad_lse.float() / LN2 if grad_lse is not None else None
    dq, dk, dv, grads = run.backward(
        L, q, k, v, out, lse_n, grad_out, dlse, km, slots, sites, site_slots
    )
    return (
        dq.contiguous(),
        dk.contiguous(),
        dv.contiguous(),
        [grads[s].contiguous() for s in slots],
    )


@flex_attention_backward_op.register_fake
def _(
    q, k, v, out, lse, grad_out, grad_lse, a, b, c, d, buffers, scale, score, mask, bs, slots, grad
):
    return (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        torch.empty_like(k, memory_format=torch.contiguous_format),
        torch.empty_like(v, memory_format=torch.contiguous_format),
        [torch.empty_like(buffers[s], memory_format=torch.contiguous_format) for s in slots],
    )


# -- the rewrite ----------------------------------------------------------------------------------


def _val(n):
    return n.meta.get("val") if isinstance(n, fx.Node) else n


def _sub(graph, n):
    if not (isinstance(n, fx.Node) and n.op == "get_attr"):
        return None
    return getattr(graph.owning_module, n.target)


def _metas(bufs):
    out = []
    for b in bufs:
        t = _val(b)
        if not isinstance(t, torch.Tensor) or not all(isinstance(s, int) for s in t.shape):
            raise Unsupported("a captured buffer of symbolic shape")
        out.append((tuple(t.shape), t.dtype))
    return out


def _common(graph, ctx, q, k, v, score_g, bm, sbufs, mbufs):
    """``(Mods, lists, block_size)`` of a node, or a reason."""
    qv, kv, vv = _val(q), _val(k), _val(v)
    if not all(isinstance(t, torch.Tensor) for t in (qv, kv, vv)):
        return "params"
    if not ctx.arch(qv):
        return "arch"
    if qv.dtype not in DTYPES or not (qv.dtype == kv.dtype == vv.dtype):
        return "dtype"
    if not all(isinstance(s, int) for s in (*qv.shape, *kv.shape, *vv.shape)):
        return "dynamic"
    B, H, _, D = qv.shape
    Bk, Hk, _, _ = kv.shape
    if (
        (Bk != B and Bk != 1)
        or not 0 < D <= MAX_HEAD_DIM
        or not 0 < vv.shape[-1] <= MAX_HEAD_DIM
        or Hk == 0
        or H % Hk
    ):
        return "params"
    bm = tuple(bm)
    bq, bkv, mask_g = bm[-3], bm[-2], bm[-1]
    if not (isinstance(bq, int) and isinstance(bkv, int)):
        return "dynamic"
    lists = list(bm[2:6])
    sgm, mgm = _sub(graph, score_g), _sub(graph, mask_g)
    if sgm is None or mgm is None:
        return "mod: a mod that is not a graph"
    try:
        m = mods.from_graphs(sgm, mgm, _metas(sbufs or ()), _metas(mbufs or ()))
        extra = 1 if (bq % 16 or bkv % 16) and bq != 1 << 30 else 0
        mods.layout((*m.metas, *((((1,), "int32"),) * extra)))
    except Unsupported as e:
        return f"mod: {e}"
    return m, lists, [int(bq), int(bkv)]


def _plan_fwd(graph, node, ctx):
    q, k, v, score_g, bm, scale, _opts, sbufs, mbufs = [*node.args, (), ()][:9]
    if any(u.target is not operator.getitem for u in node.users):
        return "params"
    if any(u.args[1] == 2 and u.users for u in node.users):
        return "params: max_scores is read"
    r = _common(graph, ctx, q, k, v, score_g, bm, sbufs, mbufs)
    if isinstance(r, str):
        return r
    m, lists, block = r
    inputs = [q, k, v, *lists, [*(sbufs or ()), *(mbufs or ())]]
    texts = (m.score.text() if m.score else "", m.mask.text() if m.mask else "")

    def build(q, k, v, *rest, texts=texts, scale=float(scale), block=block):
        *lists, bufs = rest
        return torch.ops.flydsl.flex_attention(q, k, v, *lists, list(bufs), scale, *texts, block)

    return build, inputs


def _plan_bwd(graph, node, ctx):
    args = [*node.args, (), ()][:14]  # the buffer lists are optional
    q, k, v, out, lse, grad_out, grad_lse, fw_g, _joint_g, bm, scale, _opts, sbufs, mbufs = args
    if not all(isinstance(_val(t), torch.Tensor) for t in (out, lse, grad_out)):
        return "params"
    ns = len(sbufs or ())
    slots = []
    for u in node.users:
        if u.target is not operator.getitem:
            return "params"
        if u.args[1] == 3:
            for w in u.users:
                if w.target is not operator.getitem:
                    return "params"
                if w.users:
                    slots.append(int(w.args[1]))
    slots = sorted(set(slots))
    if any(s >= ns for s in slots):
        return "params"
    r = _common(graph, ctx, q, k, v, fw_g, bm, sbufs, mbufs)
    if isinstance(r, str):
        return r
    m, lists, block = r
    try:
        sites = m.sites(slots)
        grad = mods.joint(m.score, sites).text() if m.score is not None else ""
        for i in sites:
            mods.site_deps(m.score, i)
    except Unsupported as e:
        return f"mod: {e}"
    inputs = [q, k, v, out, lse, grad_out, grad_lse, *lists, [*(sbufs or ()), *(mbufs or ())]]
    texts = (m.score.text() if m.score else "", m.mask.text() if m.mask else "")

    def build(
        q,
        k,
        v,
        o,
        lse,
        do,
        dlse,
        *rest,
        texts=texts,
        scale=float(scale),
        block=block,
        slots=tuple(slots),
        ns=ns,
        grad=grad,
    ):
        *lists, bufs = rest
        dq, dk, dv, grads = torch.ops.flydsl.flex_attention_backward(
            q,
            k,
            v,
            o,
            lse,
            do,
            dlse,
            *lists,
            list(bufs),
            scale,
            *texts,
            block,
            list(slots),
            grad,
        )
        per_buffer = [None] * ns
        for s, g in zip(slots, grads):
            per_buffer[s] = g
        return dq, dk, dv, tuple(per_buffer)

    return build, inputs


def rewrite(graph: fx.Graph, ctx, splice) -> int:
    """Replace the eligible flex_attention HOP nodes (forward and backward) of ``graph``;
    returns how many. ``splice``: the pass's ``inductor.graph_pass.splice`` (given by the pass,
    so this module does not import the package that imports it)."""
    fwd = torch.ops.higher_order.flex_attention
    bwd = torch.ops.higher_order.flex_attention_backward
    n = 0
    st = _stat(STAT)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (fwd, bwd):
            continue
        is_bwd = node.target is bwd
        plan = (_plan_bwd if is_bwd else _plan_fwd)(graph, node, ctx)
        what = "flex_attention_backward" if is_bwd else "flex_attention"
        if isinstance(plan, str):
            st.fallback(plan)
            log.info("torch_flydsl: %s node stays torch's (%s)", what, plan)
            continue
        build, inputs = plan
        splice(graph, node, build, inputs, decompose=False, tuple_out=True)
        st.hits += 1
        n += 1
    if n:
        graph.eliminate_dead_code()
    return n
