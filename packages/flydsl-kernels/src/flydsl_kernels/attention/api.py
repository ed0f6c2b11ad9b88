"""The attention function API over torch tensors, with flash-attn's names and layouts.

    out = flash_attn_func(q, k, v, causal=True)                    # (B, S, H, D)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k)  # packed (total, H, D)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens,
                                  block_table=table)                # paged decode

Beyond flash-attn: ``sinks`` (gpt-oss: one learned logit per query head in the softmax
denominator, differentiable), ``lse_log2`` (the LSE in base 2), ``score_mod`` / ``mask_mod``
with ``mod_tensors`` (FlyDSL mods, see ``mods.py``), ``target`` (a FlyDSL target; None: the
device's, ``cpu-reference`` for CPU tensors), ``table`` (the target whose config table, CU
count and split rule plan the launch; None: the device's, gfx950's on the CPU backends, so
``target="cpu-interpret", table="sm90"`` runs sm90's plan on the interpreter) and ``config`` /
``num_splits`` overrides.

Supported: bf16 / fp16 q, k, v of one dtype (and fp32, beyond flash-attn: IEEE fp32 products,
for flex_attention's fp32 inputs), fp32 accumulation; head dims up to 256 (any, 192
for q/k with 128 for v included); ``nheads % nheads_k == 0`` (MHA, GQA, MQA); any strides.
Not supported, with an error saying so: dropout (``dropout_p != 0``), rotary embedding and
``cache_leftpad`` in ``flash_attn_with_kvcache``, page sizes that are not powers of two.

Differentiable (``torch.autograd``) as flash-attn's are: ``flash_attn_func`` and
``flash_attn_varlen_func`` (q, k, v, sinks). Both backward modes are deterministic (dK/dV
reduce the query heads of a group and the query blocks in a fixed order, dQ has its own
kernel: no atomics), so ``deterministic=True`` always holds.
"""

from __future__ import annotations

import torch

from .._target import table_target, target_name, tensor_target
from . import configs, fit, plan
from . import validate as V
from .sparse import BlockSparse, backward_lists, check_block_sparse
from .validate import MAX_HEAD_DIM, SUPPORTED_DTYPES

__all__ = [
    "MAX_HEAD_DIM",
    "SUPPORTED_DTYPES",
    "BlockSparse",
    "flash_attn_backward",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
]

_DNAME = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _problem(
    what,
    q,
    k,
    v,
    *,
    batch,
    sq,
    sk,
    causal,
    window_size,
    softcap,
    softmax_scale,
    score_mod,
    mask_mod,
    mod_tensors,
    alibi=None,
    sinks=None,
    varlen=False,
    seqused=False,
    page=0,
    batch_idx=False,
    lse_log2=False,
    decode=False,
    sparse=None,
):
    """Check the options every public function shares (window, softcap, scale, mods) and
    make the plan's ``Problem``; returns it and the mods' captured tensors."""
    window = V.window(window_size, sq, sk, what)
    softcap = V.softcap(softcap, what)
    scale = V.softmax_scale(softmax_scale, what)
    score_mod, mask_mod, mt = V.mods(score_mod, mask_mod, mod_tensors, q.device)
    p = plan.Problem(
        batch=batch,
        seqlen_q=sq,
        seqlen_k=sk,
        heads_q=q.shape[-2],
        heads_k=k.shape[-2],
        head_dim=q.shape[-1],
        head_dim_v=v.shape[-1],
        dtype=_DNAME[q.dtype],
        causal=bool(causal),
        window=window,
        softcap=softcap,
        alibi=alibi is not None,
        sinks=sinks is not None,
        varlen=varlen,
        seqused=seqused,
        page_size=page,
        batch_idx=batch_idx,
        lse=True,
        lse_log2=lse_log2,
        decode=decode,
        score_mod=score_mod,
        mask_mod=mask_mod,
        softmax_scale=scale,
        sparse=tuple(sparse.block_size) if sparse is not None else (0, 0),
        sparse_full=sparse is not None and sparse.full_kv_num_blocks is not None,
    )
    return p, mt


# -- forward and backward drivers (tensors in the kernels' 5-D / 4-D views) --------------------------


def _run(launch, tgt) -> None:
    """Run ``launch`` on ``tgt`` unless its grid is empty (no rows or no batch: nothing to do)."""
    if all(g != 0 for g in launch.grid):
        launch.run(tgt)


def _forward(
    p,
    tgt,
    q5,
    k4,
    v4,
    o5,
    lse4,
    *,
    table=None,
    sinks3=None,
    alibi3=None,
    cu_q=None,
    cu_k=None,
    seqused=None,
    block_table=None,
    batch_idx=None,
    mt=(),
    config=None,
    splits=None,
    persistent=None,
    sparse=None,
):
    fp = plan.plan_forward(p, tgt, table=table, config=config, splits=splits, persistent=persistent)
    o_part = lse_part = None
    if fp.splits > 1:
        s, bq, rows = fp.splits, q5.shape[0], q5.shape[1]
        o_part = torch.empty(
            (s, bq, rows, p.heads_k, p.group, p.head_dim_v), dtype=torch.float32, device=q5.device
        )
        lse_part = torch.empty(
            (s, bq, p.heads_k, p.group, rows), dtype=torch.float32, device=q5.device
        )
    if q5.is_meta:
        return fp
    operands = dict(
        q=q5,
        k=k4,
        v=v4,
        o=o5,
        lse=lse4,
        sinks=sinks3,
        alibi=alibi3,
        cu_q=cu_q,
        cu_k=cu_k,
        seqused_k=seqused,
        block_table=block_table,
        batch_idx=batch_idx,
        mod_tensors=mt,
        o_part=o_part,
        lse_part=lse_part,
        sq_rows=q5.shape[1],
        sparse=sparse.lists(p.batch, p.heads_q) if sparse is not None else (None,) * 4,
    )
    launches = fp.launches(**operands)
    if config is None and p.traced and fit.fits(tgt) and launches and all(launches[0].grid):
        # a traced mod's tile fitted to the target's registers (fit.traced_tile)
        planned = fp

        def build(c):
            return plan.retile_forward(planned, tgt, c, table).launches(**operands)[0].compile(tgt)

        cfg = fit.traced_tile(plan.forward_kind(p), p, tgt, fp.config, launches[0], build)
        if cfg != fp.config:
            fp = plan.retile_forward(planned, tgt, cfg, table)
            launches = fp.launches(**operands)
    for launch in launches:
        _run(launch, tgt)
    return fp


def _backward(
    p,
    tgt,
    q5,
    k4,
    v4,
    o5,
    do5,
    lse4,
    *,
    table=None,
    alibi3=None,
    cu_q=None,
    cu_k=None,
    mt=(),
    dkdv_config=None,
    dq_config=None,
    sparse=None,
    dlse4=None,
):
    bp = plan.plan_backward(p, tgt, table=table, dkdv_config=dkdv_config, dq_config=dq_config)
    dq = torch.empty(q5.shape, dtype=q5.dtype, device=q5.device)
    dk = torch.empty(k4.shape, dtype=k4.dtype, device=k4.device)
    dv = torch.empty(v4.shape, dtype=v4.dtype, device=v4.device)
    # the base-2 LSE and delta side by side (kernels.attn_bwd_preprocess_kernel)
    ld = torch.empty((*lse4.shape[:3], 2, lse4.shape[3]), dtype=torch.float32, device=q5.device)
    # no memset of dk / dv: every (batch, KV head, key block) program below the sequence's key
    # count stores its rows, zeros where no query reaches them (an empty query loop), which
    # covers every key of a dense or packed input (test_backward_writes_every_gradient_row)
    if q5.is_meta:
        return dq, dk, dv, ld[:, :, :, 1]
    operands = dict(
        q=q5,
        k=k4,
        v=v4,
        o=o5,
        do=do5,
        lse=lse4,
        ld=ld,
        dq=dq,
        dk=dk,
        dv=dv,
        alibi=alibi3,
        cu_q=cu_q,
        cu_k=cu_k,
        mod_tensors=mt,
        sq_rows=q5.shape[1],
        **backward_lists(sparse, p),
    )
    launches = bp.launches(**operands)
    if p.traced and fit.fits(tgt) and launches:
        # a traced mod's dK/dV and dQ tiles fitted to the target's registers (fit.traced_tile)
        planned = {"dkdv_config": bp.dkdv, "dq_config": bp.dq}
        tiles = dict(planned)
        for n, which, given in ((1, "dkdv", dkdv_config), (2, "dq", dq_config)):
            if given is not None or not all(launches[n].grid):
                continue
            key = f"{which}_config"

            def build(c, n=n, key=key):
                trial = plan.plan_backward(p, tgt, table=table, **{**tiles, key: c})
                return trial.launches(**operands)[n].compile(tgt)

            kind = f"bwd_{which}"
            tiles[key] = fit.traced_tile(kind, p, tgt, tiles[key], launches[n], build)
        if tiles != planned:
            bp = plan.plan_backward(p, tgt, table=table, **tiles)
            launches = bp.launches(**operands)
    for n, launch in enumerate(launches):
        _run(launch, tgt)
        if n == 0 and dlse4 is not None:
            # a gradient w.r.t. the LSE: d lse / d s_j = P_j, so dS = P * (dP - (delta - dlse))
            ld[:, :, :, 1] -= dlse4.float()
    return dq, dk, dv, ld[:, :, :, 1]


def _dsinks(sinks, lse, delta, lse_log2):
    """d loss / d sink_h = -sum_{b,i} P(sink)_{b,h,i} * delta_{b,h,i}, ``P(sink) = exp(sink -
    lse)`` (the sink's share of the softmax; its value is zero, so only the denominator)."""
    H = sinks.shape[0]
    lse_n = lse * torch.log(torch.tensor(2.0)) if lse_log2 else lse
    ps = torch.exp(sinks.float().reshape(1, H, 1) - lse_n.reshape(-1, H, lse.shape[-1]))
    return -(ps * delta.reshape(ps.shape)).sum((0, 2)).to(sinks.dtype)


class _Attention(torch.autograd.Function):
    """Forward + backward of the dense and varlen API (``ctx`` keeps the problem and views)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, alibi_slopes, mod_tensors, opts):
        p, tgt, views, kw = opts["problem"], opts["target"], opts["views"], opts["kw"]
        q5, k4, v4, o, o5, lse, lse4 = views(q, k, v)
        sinks3 = V.sinks(sinks, p.heads_q, p.heads_k, q.device)
        alibi3 = opts["alibi"](alibi_slopes)
        _forward(p, tgt, q5, k4, v4, o5, lse4, sinks3=sinks3, alibi3=alibi3, mt=mod_tensors, **kw)
        ctx.save_for_backward(q, k, v, o, lse, sinks, alibi_slopes, *mod_tensors)
        ctx.opts = opts
        ctx.n_mt = len(mod_tensors)
        ctx.mark_non_differentiable(lse)
        # no zero tensor for the LSE's gradient on every backward (it is non-differentiable):
        # one ATen fill a call that the backward never reads
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse, sinks, alibi_slopes, *mt = ctx.saved_tensors
        if do is None:  # unmaterialized: the output's gradient is zero
            do = torch.zeros_like(o)
        opts = ctx.opts
        p, tgt = opts["problem"], opts["target"]
        if p.page_size:
            raise NotImplementedError(
                "flash_attn_varlen_func with block_table (a paged KV cache) has no backward: "
                "the paged path is inference-only (as flash-attn's); for training pass the "
                "packed k and v (total_k, nheads_k, d) without block_table"
            )
        if p.score_mod is not None and not p.score_mod.differentiable:
            raise NotImplementedError(
                "the score_mod has no gradient: give ScoreMod(fn, grad=...) or additive=True"
            )
        q5, k4, v4, _, o5, _, lse4 = opts["views"](q, k, v, o=o, lse=lse)
        do5 = opts["out_view"](do)
        alibi3 = opts["alibi"](alibi_slopes)
        dq5, dk, dv, delta = _backward(
            p, tgt, q5, k4, v4, o5, do5, lse4, alibi3=alibi3, mt=tuple(mt), **opts["bkw"]
        )
        dq = dq5.reshape(q.shape)
        dk, dv = dk.reshape(k.shape), dv.reshape(v.shape)
        ds = None
        if sinks is not None and ctx.needs_input_grad[3]:
            ds = _dsinks(sinks, lse, delta, p.lse_log2)
        return dq, dk, dv, ds, None, None, None


def _table(q, target, table) -> str:
    """The target whose tables plan a launch on ``q``: ``table`` where given, else the
    device's (``_target.table_target``)."""
    return target_name(table) if table is not None else table_target(q, _meta(q, target))


def _meta(q, target):
    """Meta tensors (shape propagation) plan as on the CPU and launch nothing: no device is
    probed for them."""
    return "cpu-reference" if q.is_meta and target is None else target


# -- the public functions ---------------------------------------------------------------------------


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    sinks=None,
    lse_log2=False,
    score_mod=None,
    mask_mod=None,
    mod_tensors=(),
    block_sparse=None,
    target=None,
    table=None,
    config=None,
    num_splits=None,
    out=None,
):
    """flash-attn's ``flash_attn_func``: q ``(B, Sq, H, D)``, k/v ``(B, Sk, Hk, D / Dv)``.

    Returns ``out (B, Sq, H, Dv)``, or ``(out, lse (B, H, Sq) fp32, None)`` with
    ``return_attn_probs`` (flash-attn's triple; there are no dropout probabilities).
    ``block_sparse``: a ``BlockSparse`` or torch ``BlockMask``: only the listed KV blocks are
    visited, full blocks without the mask mod (flex_attention's meaning). ``out``: a
    preallocated output ``(B, Sq, H, Dv)`` of any strides (flex_attention's output layout).
    """
    what = "flash_attn_func"
    V.dropout(dropout_p)
    V.qkv(q, k, v, what, 4)
    B, Sq, H, _ = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    if k.shape[0] != B or v.shape[:2] != k.shape[:2]:
        raise ValueError(
            f"flash_attn_func: q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)} "
            "disagree on batch or seqlen_k"
        )
    splits = None if num_splits is None else V.integer(num_splits, "num_splits", what)
    bsp = check_block_sparse(block_sparse, B, H, Sq, Sk, q.device)
    # few queries per KV head (a decode step through SDPA): the group's heads share a tile,
    # as flash_attn_with_kvcache's do (flash-attn 3's pack_gqa), instead of a prefill tile of
    # one head's few rows
    decode = bsp is None and configs.packs_heads(Sq, H // max(Hk, 1))
    p, mt = _problem(
        what,
        q,
        k,
        v,
        batch=B,
        sq=Sq,
        sk=Sk,
        causal=causal,
        window_size=window_size,
        softcap=softcap,
        softmax_scale=softmax_scale,
        score_mod=score_mod,
        mask_mod=mask_mod,
        mod_tensors=mod_tensors,
        alibi=alibi_slopes,
        sinks=sinks,
        lse_log2=lse_log2,
        decode=decode,
        sparse=bsp,
    )
    G, Dv = H // Hk, v.shape[-1]
    fkw, bkw = V.config(config, what)
    if bsp is not None:
        fkw["sparse"], bkw["sparse"] = bsp, bsp

    if out is not None and (
        tuple(out.shape) != (B, Sq, H, Dv) or out.dtype != q.dtype or out.device != q.device
    ):
        raise ValueError(
            f"flash_attn_func: out must be ({B}, {Sq}, {H}, {Dv}) {q.dtype} on the inputs' "
            f"device, got {list(out.shape)} {out.dtype}"
        )

    def views(q, k, v, o=None, lse=None):
        if o is None:
            o = (
                out
                if out is not None
                else torch.empty((B, Sq, H, Dv), dtype=q.dtype, device=q.device)
            )
            lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
        return (
            q.unflatten(2, (Hk, G)),
            k,
            v,
            o,
            o.unflatten(2, (Hk, G)),
            lse,
            lse.view(B, Hk, G, Sq),
        )

    tbl = _table(q, target, table)
    opts = {
        "problem": p,
        "target": tensor_target(q, _meta(q, target)),
        "views": views,
        "out_view": lambda do: do.unflatten(2, (Hk, G)),
        "alibi": lambda a: V.alibi(a, B, H, Hk, q.device),
        "kw": {**fkw, "splits": splits, "table": tbl},
        "bkw": {**bkw, "table": tbl},
    }
    V.sinks(sinks, H, Hk, q.device)  # validate before any launch
    V.alibi(alibi_slopes, B, H, Hk, q.device)
    out, lse = _Attention.apply(q, k, v, sinks, alibi_slopes, mt, opts)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    *,
    sinks=None,
    lse_log2=False,
    score_mod=None,
    mask_mod=None,
    mod_tensors=(),
    target=None,
    table=None,
    config=None,
    num_splits=None,
):
    """flash-attn's ``flash_attn_varlen_func`` over packed tokens: q ``(total_q, H, D)``, k/v
    ``(total_k, Hk, D)`` (or a paged cache ``(pages, page_size, Hk, D)`` with
    ``block_table``), ``cu_seqlens_*`` int32 ``(batch + 1,)``. Returns ``out (total_q, H,
    Dv)``, or ``(out, lse (H, total_q), None)``. Sequences may be empty. q/k/v positions in the
    mods and masks count from each sequence's start.

    The offsets start at 0, never decrease and end at the packed token counts (a paged cache
    has no key total); ``max_seqlen_*`` is at least the longest sequence; with
    ``block_table``, every page a sequence reads is a page of the cache (``validate``). With
    a paged cache the forward is differentiable in form only: its backward raises, as
    flash-attn's does."""
    what = "flash_attn_varlen_func"
    V.dropout(dropout_p)
    paged = block_table is not None
    V.qkv(q, k if not paged else k[0], v if not paged else v[0], what, 3)
    for n, c in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        V.int32_tensor(c, n, what, (None,), q.device, "(batch + 1,)")
    if cu_seqlens_q.shape != cu_seqlens_k.shape or cu_seqlens_q.numel() < 1:
        raise ValueError(
            f"{what}: cu_seqlens_q and cu_seqlens_k must both have batch + 1 entries, got "
            f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}"
        )
    max_q = V.integer(max_seqlen_q, "max_seqlen_q", what)
    max_k = V.integer(max_seqlen_k, "max_seqlen_k", what)
    B = cu_seqlens_q.numel() - 1
    total_q, H, _ = q.shape
    Hk = k.shape[-2]
    page = V.paged_cache(k, v, block_table, B, q.device, what) if paged else 0
    if not paged and v.shape[0] != k.shape[0]:
        raise ValueError(f"{what}: k has {k.shape[0]} tokens, v {v.shape[0]}")
    splits = None if num_splits is None else V.integer(num_splits, "num_splits", what)
    fkw, bkw = V.config(config, what)
    V.sinks(sinks, H, Hk, q.device)
    V.alibi(alibi_slopes, B, H, Hk, q.device)
    V.varlen(
        cu_seqlens_q,
        cu_seqlens_k,
        max_q,
        max_k,
        total_q,
        None if paged else k.shape[0],
        what,
        block_table=block_table,
        page=page,
        pool=k.shape[0],
    )
    p, mt = _problem(
        what,
        q,
        k,
        v,
        batch=B,
        sq=max_q,
        sk=max_k,
        causal=causal,
        window_size=window_size,
        softcap=softcap,
        softmax_scale=softmax_scale,
        score_mod=score_mod,
        mask_mod=mask_mod,
        mod_tensors=mod_tensors,
        alibi=alibi_slopes,
        sinks=sinks,
        varlen=True,
        page=page,
        lse_log2=lse_log2,
    )
    G, Dv = H // Hk, v.shape[-1]

    def views(q, k, v, o=None, lse=None):
        if o is None:
            o = torch.empty((total_q, H, Dv), dtype=q.dtype, device=q.device)
            lse = torch.empty((H, total_q), dtype=torch.float32, device=q.device)
        kk = k if paged else k[None]
        vv = v if paged else v[None]
        return (
            q.unflatten(1, (Hk, G))[None],
            kk,
            vv,
            o,
            o.unflatten(1, (Hk, G))[None],
            lse,
            lse.view(1, Hk, G, total_q),
        )

    cu = {"cu_q": cu_seqlens_q, "cu_k": cu_seqlens_k}
    tbl = _table(q, target, table)
    opts = {
        "problem": p,
        "target": tensor_target(q, _meta(q, target)),
        "views": views,
        "out_view": lambda do: do.unflatten(1, (Hk, G))[None],
        "alibi": lambda a: V.alibi(a, B, H, Hk, q.device),
        "kw": {
            **fkw,
            **cu,
            "splits": splits,
            "block_table": block_table,
            "table": tbl,
        },
        "bkw": {**bkw, **cu, "table": tbl},
    }
    out, lse = _Attention.apply(q, k, v, sinks, alibi_slopes, mt, opts)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
    *,
    sinks=None,
    lse_log2=False,
    score_mod=None,
    mask_mod=None,
    mod_tensors=(),
    target=None,
    table=None,
    config=None,
):
    """flash-attn's ``flash_attn_with_kvcache`` (inference: not differentiable).

    q ``(B, Sq, H, D)``; the cache is dense ``(B_cache, Sk_max, Hk, D)`` or paged ``(pages,
    page_size, Hk, D)`` with ``block_table (B, max_pages)`` int32. ``k``/``v`` ``(B, Snew,
    Hk, D)``, when given, are written into the cache at ``cache_seqlens`` first (in place, as
    flash-attn does) and attended to. ``cache_seqlens``: an int or ``(B,)`` int32 (None: the
    whole cache), at least 0 and, with the new tokens, at most the cache's capacity
    (``Sk_max``, or ``max_pages * page_size``); ``cache_batch_idx`` (dense): ``(B,)`` int32
    rows of the cache. ``num_splits``: 0 picks split-KV by the rule in ``configs``. The query
    heads of a KV group share a tile when there are few queries (``configs.packs_heads``).
    ``config``: a ``Config`` or a dict whose ``fwd`` entry is one (the backward's are unused).
    """
    what = "flash_attn_with_kvcache"
    if rotary_cos is not None or rotary_sin is not None:
        raise NotImplementedError(
            f"{what}: rotary embedding is not implemented; apply it to q and k before the call "
            "(rotary_cos=rotary_sin=None)"
        )
    if cache_leftpad is not None:
        raise NotImplementedError(f"{what}: cache_leftpad is not implemented")
    V.qkv(q, k_cache, v_cache, what, 4)
    B, Sq, H, _ = q.shape
    Hk = k_cache.shape[2]
    paged = block_table is not None
    page = V.paged_cache(k_cache, v_cache, block_table, B, q.device, what) if paged else 0
    if paged and cache_batch_idx is not None:
        raise ValueError(f"{what}: cache_batch_idx applies to a dense cache only")
    if not paged and v_cache.shape[:2] != k_cache.shape[:2]:
        raise ValueError(
            f"{what}: k_cache {list(k_cache.shape)} and v_cache {list(v_cache.shape)} disagree "
            "on batch or seqlen"
        )
    sk_max = block_table.shape[1] * page if paged else k_cache.shape[1]
    if (k is None) != (v is None):
        raise ValueError(f"{what}: give both k and v, or neither")
    snew = 0
    if k is not None:
        V.qkv(q, k, v, f"{what} (k, v)", 4)
        if k.shape[:3] != (B, k.shape[1], Hk) or v.shape[:2] != k.shape[:2]:
            raise ValueError(
                f"{what}: new k/v must be (batch, seqlen_new, nheads_k, d) = ({B}, *, {Hk}, *), "
                f"got {list(k.shape)} and {list(v.shape)}"
            )
        if k.shape[-1] != k_cache.shape[-1] or v.shape[-1] != v_cache.shape[-1]:
            raise ValueError(f"{what}: new k/v must have the cache's head dims")
        snew = k.shape[1]
    seqlens, n_int = V.cache_seqlens(cache_seqlens, B, sk_max, snew, q.device, what)
    bidx = None
    if cache_batch_idx is not None:
        bidx = V.int32_tensor(cache_batch_idx, "cache_batch_idx", what, (B,), q.device, "(batch,)")
    elif not paged and k_cache.shape[0] < B:
        raise ValueError(
            f"{what}: k_cache has {k_cache.shape[0]} sequences for a batch of {B}; give "
            "cache_batch_idx to map the batch onto the cache's rows"
        )
    splits = V.integer(num_splits, "num_splits", what)
    fkw, _ = V.config(config, what, forward_only=True)
    sinks3 = V.sinks(sinks, H, Hk, q.device)
    alibi3 = V.alibi(alibi_slopes, B, H, Hk, q.device)
    # the launch target first: the index check runs where the attention kernels will (for
    # CPU tensors on a machine with a GPU, not the GPU's default target)
    tgt, tbl = tensor_target(q, _meta(q, target)), _table(q, target, table)
    V.kvcache(
        seqlens if n_int is None else n_int,
        snew,
        sk_max,
        what,
        block_table=block_table,
        page=page,
        pool=k_cache.shape[0],
        batch_idx=bidx,
        batch_cache=k_cache.shape[0],
        batch=B,
        target=tgt,
    )
    G, Dv = H // Hk, v_cache.shape[-1]
    decode = configs.packs_heads(Sq, G)
    p, mt = _problem(
        what,
        q,
        k_cache,
        v_cache,
        batch=B,
        sq=Sq,
        sk=sk_max,
        causal=causal,
        window_size=window_size,
        softcap=softcap,
        softmax_scale=softmax_scale,
        score_mod=score_mod,
        mask_mod=mask_mod,
        mod_tensors=mod_tensors,
        alibi=alibi_slopes,
        sinks=sinks,
        seqused=True,
        page=page,
        batch_idx=bidx is not None,
        lse_log2=lse_log2,
        decode=decode,
    )
    if snew and B and not q.is_meta:
        append = plan.append_launch(
            p,
            k_new=k,
            v_new=v,
            k_cache=k_cache,
            v_cache=v_cache,
            cache_seqlens=seqlens,
            block_table=block_table,
            batch_idx=bidx,
            snew=snew,
        )
        _run(append, tgt)
        seqlens = seqlens + snew
    o = torch.empty((B, Sq, H, Dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    with torch.no_grad():
        _forward(
            p,
            tgt,
            q.unflatten(2, (Hk, G)),
            k_cache,
            v_cache,
            o.unflatten(2, (Hk, G)),
            lse.view(B, Hk, G, Sq),
            sinks3=sinks3,
            alibi3=alibi3,
            seqused=seqlens,
            block_table=block_table,
            batch_idx=bidx,
            mt=mt,
            splits=splits or None,
            table=tbl,
            **fkw,
        )
    return (o, lse) if return_softmax_lse else o


def flash_attn_backward(
    dout,
    q,
    k,
    v,
    out,
    lse,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    *,
    score_mod=None,
    mask_mod=None,
    mod_tensors=(),
    block_sparse=None,
    target=None,
    table=None,
    dlse=None,
):
    """The gradients ``(dq, dk, dv)`` of ``flash_attn_func(q, k, v, ...)`` from its ``out``
    and natural-log ``lse (B, H, Sq)`` (flash-attn's ``_flash_attn_backward``, dense layout):
    for callers that keep the forward's results themselves (an ATen backward op) instead of
    using autograd. Same options and support as ``flash_attn_func`` (mods and block sparsity
    included; a score mod needs its gradient) without ALiBi or sinks; any strides. Rows with
    no visible key have ``lse = +inf`` (the forward's convention). ``dlse``: a gradient
    w.r.t. the LSE ``(B, H, Sq)``, folded into the backward's delta term."""
    what = "flash_attn_backward"
    V.qkv(q, k, v, what, 4)
    B, Sq, H, _ = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    Dv = v.shape[-1]
    if tuple(out.shape) != (B, Sq, H, Dv) or dout.shape != out.shape:
        raise ValueError(
            f"flash_attn_backward: out and dout must be (batch, seqlen_q, nheads, dv) = "
            f"({B}, {Sq}, {H}, {Dv}), got {list(out.shape)} and {list(dout.shape)}"
        )
    if lse.dtype != torch.float32 or tuple(lse.shape) != (B, H, Sq):
        raise ValueError(f"flash_attn_backward: lse must be fp32 ({B}, {H}, {Sq})")
    if dlse is not None and tuple(dlse.shape) != (B, H, Sq):
        raise ValueError(f"flash_attn_backward: dlse must be ({B}, {H}, {Sq})")
    bsp = check_block_sparse(block_sparse, B, H, Sq, Sk, q.device)
    p, mt = _problem(
        what,
        q,
        k,
        v,
        batch=B,
        sq=Sq,
        sk=Sk,
        causal=causal,
        window_size=window_size,
        softcap=softcap,
        softmax_scale=softmax_scale,
        score_mod=score_mod,
        mask_mod=mask_mod,
        mod_tensors=mod_tensors,
        sparse=bsp,
    )
    if p.score_mod is not None and not p.score_mod.differentiable:
        raise NotImplementedError(
            "the score_mod has no gradient: give ScoreMod(fn, grad=...) or additive=True"
        )
    G = H // Hk
    dq5, dk, dv, _ = _backward(
        p,
        tensor_target(q, _meta(q, target)),
        q.unflatten(2, (Hk, G)),
        k,
        v,
        out.unflatten(2, (Hk, G)),
        dout.to(q.dtype).unflatten(2, (Hk, G)),
        lse.contiguous().view(B, Hk, G, Sq),
        table=_table(q, target, table),
        mt=mt,
        sparse=bsp,
        dlse4=None if dlse is None else dlse.reshape(B, Hk, G, Sq),
    )
    return dq5.reshape(q.shape), dk, dv
