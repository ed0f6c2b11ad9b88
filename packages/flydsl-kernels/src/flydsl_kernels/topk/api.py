"""The TopK function API over torch tensors: ``topk`` (torch.topk) and the fused ``moe_router``.

``moe_router``'s ``scoring`` names the model family's recipe (references in reference.py,
after transformers 5.24):

* ``"softmax"`` (Qwen3-MoE, Mixtral-style): softmax over all experts in fp32,
  top-k, ``renormalize`` = ``norm_topk_prob``.
* ``"sigmoid"`` (DeepSeek-V3): sigmoid scores; ``bias``
  (``e_score_correction_bias``) is added for the selection only, optionally
  group-limited (``n_group``, ``topk_group``: the best groups by the sum of
  their top-2 biased scores); weights are the unbiased scores of the chosen
  experts, renormalized when asked (``+ 1e-20``), times
  ``routed_scaling_factor``.
* ``"topk_softmax"`` (gpt-oss): top-k of the logits, then softmax over the
  chosen k.

Experts come in the order of the selection (best first; ties by expert id).
Softmax is monotone, so the kernel selects on the logits themselves, which
picks the same experts as selecting on the probabilities unless two distinct
logits round to the same fp32 probability.
"""

from __future__ import annotations

import operator

import torch

from .._target import table_target, tensor_target
from ..launch import run_all
from .configs import KEY_BITS, Config, m_choice
from .plan import SCORINGS, plan_router, plan_topk

DTYPES = tuple(KEY_BITS)
#: the most experts the router kernel holds in one tile
MAX_EXPERTS = 4096


def _int_arg(v, name: str) -> int:
    """torch's int argument rule: ints, numpy ints and integer 0-d tensors; not bools, floats."""
    if isinstance(v, torch.Tensor) and not v.dtype.is_floating_point and v.dtype != torch.bool:
        if v.numel() == 1:
            return int(v)
    elif not isinstance(v, bool):
        try:
            return operator.index(v)
        except TypeError:
            pass
    raise TypeError(f"topk(): argument '{name}' must be int, not {type(v).__name__}")


def _bool_arg(v, name: str) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"topk(): argument '{name}' must be bool, not {type(v).__name__}")
    return v


def topk_rows(x2, k, largest=True, sorted=True, *, config: Config | None = None, target=None):
    """Top-k of each row of the 2-D ``x2`` (rows of stride ``x2.stride(0)``, unit inner stride).

    Returns (values, int64 indices) of shape (M, k); ``config`` (default
    ``configs.m_choice``'s for M) names the kernel and its config."""
    m, n = x2.shape
    tgt = tensor_target(x2, target)
    tp = plan_topk(
        m,
        n,
        k,
        x2.dtype,
        largest=largest,
        sorted=sorted,
        deterministic=torch.are_deterministic_algorithms_enabled(),
        config=config,
        target=tgt,
        table=table_target(x2, target),
    )
    vals = torch.empty((m, k), dtype=x2.dtype, device=x2.device)
    idx = torch.empty((m, k), dtype=torch.int64, device=x2.device)
    ws = {
        name: (torch.zeros if zeroed else torch.empty)(shape, dtype=dt, device=x2.device)
        for name, (shape, dt, zeroed) in tp.workspaces().items()
    }
    run_all(tp.launches(x=x2, vals=vals, idx=idx, **ws), tgt)
    return vals, idx


def topk(
    x,
    k,
    dim=-1,
    largest=True,
    sorted=True,
    *,
    deterministic=None,
    target=None,
    method=None,
):
    """``torch.topk(x, k, dim, largest, sorted)`` -> ``torch.return_types.topk(values, indices)``.

    fp32, bf16 and fp16 (another dtype is a ``TypeError``); any ``dim``; NaN
    ranks above every number (as in torch); ``k`` from 0 to N. Arguments
    follow torch.topk's rules and errors: ``k`` and ``dim`` are ints (a float
    or bool is a ``TypeError``), ``largest`` and ``sorted`` bools, an out of
    range ``k`` is a ``RuntimeError`` and an out of range ``dim`` an
    ``IndexError``; a 0-d input gives 0-d results. ``deterministic`` (default
    ``torch.are_deterministic_algorithms_enabled()``): True gives bitwise
    reproducible results in the order values descending (ascending for
    ``largest=False``), ties by index ascending, for sorted and unsorted
    alike (unsorted radix results come in index order). False allows the
    split radix kernel's atomic compaction, whose survivor order and choice
    among elements tied at the threshold vary run to run; values and
    ``x.gather(dim, indices) == values`` are exact either way.

    ``target`` overrides the backend (CPU tensors default to the reference
    backend); ``method`` forces a kernel ("small", "sort", "radix",
    "radix_split") instead of the selection rule in ``configs.select``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"topk(): argument 'input' must be Tensor, not {type(x).__name__}")
    k, dim = _int_arg(k, "k"), _int_arg(dim, "dim")
    largest, sorted = _bool_arg(largest, "largest"), _bool_arg(sorted, "sorted")
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    if x.dtype not in DTYPES:
        raise TypeError(f"topk supports {', '.join(map(str, DTYPES))}, got {x.dtype}")
    nd = max(x.dim(), 1)  # a 0-d tensor has one dimension for dim's range, as in torch
    if not -nd <= dim < nd:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-nd}, {nd - 1}], but got {dim})"
        )
    if x.dim() == 0:
        if k not in (0, 1):
            raise RuntimeError(f"selected index k out of range (k={k} for a 0-d tensor)")
        # torch gives the element and index 0 for k = 0 as well
        return _result(x.clone(), torch.zeros((), dtype=torch.int64, device=x.device))
    d = dim % x.dim()
    n = x.shape[d]
    if not 0 <= k <= n:
        raise RuntimeError(f"selected index k out of range (k={k}, size {n} along dim {dim})")
    xt = x.movedim(d, -1)
    out_shape = (*xt.shape[:-1], k)
    if k == 0 or xt.numel() == 0:
        v = torch.empty(out_shape, dtype=x.dtype, device=x.device)
        i = torch.empty(out_shape, dtype=torch.int64, device=x.device)
    else:
        x2 = xt.reshape(-1, n)
        if x2.stride(1) != 1:
            x2 = x2.contiguous()
        kw = dict(sorted=sorted, deterministic=deterministic, method=method)
        choice = m_choice("topk", n, k, x.dtype, target=table_target(x2, target), **kw)
        cfg = choice.choose(x2.shape[0]).config
        v, i = topk_rows(x2, k, largest, sorted, config=cfg, target=target)
        v, i = v.reshape(out_shape), i.reshape(out_shape)
    return _result(v.movedim(-1, d).contiguous(), i.movedim(-1, d).contiguous())


def _result(values, indices):
    return torch.return_types.topk((values, indices))


# -- the MoE router --------------------------------------------------------------------------------


def moe_router(
    logits,
    top_k,
    *,
    scoring="softmax",
    renormalize=False,
    bias=None,
    n_group=1,
    topk_group=1,
    routed_scaling_factor=1.0,
    ids_dtype=torch.int64,
    target=None,
):
    """Route tokens: (weights fp32 [T, top_k], expert ids [T, top_k] of ``ids_dtype``).

    ``logits`` is [T, E] (fp32, bf16 or fp16), the gate's output. ``ids_dtype``
    is int64 (torch.topk's) or int32 (what fused-MoE kernels such as vLLM's take).
    """
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {tuple(SCORINGS)}, got {scoring!r}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be [tokens, experts], got shape {tuple(logits.shape)}")
    if logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"logits must be fp32, bf16 or fp16, got {logits.dtype}")
    if ids_dtype not in (torch.int64, torch.int32):
        raise TypeError(f"ids_dtype must be torch.int64 or torch.int32, got {ids_dtype}")
    t, e = logits.shape
    if not 1 <= e <= MAX_EXPERTS:
        raise ValueError(f"the router handles 1 to {MAX_EXPERTS} experts, got {e}")
    if not 1 <= top_k <= e:
        raise ValueError(f"top_k must be in [1, {e}], got {top_k}")
    if bias is not None:
        if scoring != "sigmoid":
            raise ValueError("a selection bias is part of the sigmoid (DeepSeek-V3) recipe only")
        if tuple(bias.shape) != (e,):
            raise ValueError(f"bias must have shape ({e},), got {tuple(bias.shape)}")
    if n_group > 1:
        if scoring != "sigmoid":
            raise ValueError("group-limited routing is part of the sigmoid recipe only")
        if e % n_group or e & (e - 1) or n_group & (n_group - 1):
            raise ValueError(
                f"group-limited routing needs power-of-two experts and groups, got E={e}, "
                f"n_group={n_group}"
            )
        if not 1 <= topk_group <= n_group or top_k > topk_group * (e // n_group):
            raise ValueError(
                f"topk_group={topk_group} groups of {e // n_group} cannot hold top_k={top_k}"
            )
    weights = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=ids_dtype, device=logits.device)
    if t == 0:
        return weights, ids
    lg = logits if logits.stride(1) == 1 else logits.contiguous()
    b = bias.contiguous() if bias is not None else lg[0]  # unread without HAS_BIAS
    tgt = tensor_target(logits, target)
    rp = plan_router(
        e,
        top_k,
        scoring=scoring,
        renormalize=renormalize,
        has_bias=bias is not None,
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=routed_scaling_factor,
        target=tgt,
        table=table_target(logits, target),
    )
    run_all(rp.launches(logits=lg, bias=b, weights=weights, ids=ids), tgt)
    return weights, ids
