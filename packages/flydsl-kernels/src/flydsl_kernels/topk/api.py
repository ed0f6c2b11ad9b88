"""``topk``: torch.topk over torch tensors, computed by the FlyDSL kernels."""

from __future__ import annotations

import operator

import torch

from .._target import is_cpu_target, table_target, tensor_target
from . import kernels as K
from .configs import KEY_BITS, SURVIVOR_TILE_MAX, Plan, next_pow2, select

DTYPES = tuple(KEY_BITS)


def _opts(plan: Plan, target, num_warps=None) -> dict:
    opts = {"target": target}
    if not is_cpu_target(target):  # CPU backends ignore warps: don't key compiles on them
        opts["num_warps"] = num_warps or plan.num_warps
    return opts


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


def _i32(n, device):
    return torch.empty(n, dtype=torch.int32, device=device)


def _sort_survivors(x2, wkey, widx, vals, idx, k, plan: Plan, target):
    """Stable sort of each row's k survivors (keys descending) into vals / idx."""
    m = x2.shape[0]
    opts = _opts(plan, target, plan.sort_warps)
    sorter = plan.sorter or ("tile" if k <= SURVIVOR_TILE_MAX else "merge")
    if sorter == "tile":
        kp = max(plan.SORT_KP, next_pow2(k))
        K.sort_tile[(m,)](x2, wkey, widx, vals, idx, k, KP=kp, **opts)
        return
    b = plan.MERGE_B
    nb = -(-k // b)
    okey, oidx = _i32((m, k), x2.device), _i32((m, k), x2.device)
    K.sort_runs[(m, nb)](wkey, widx, okey, oidx, B=b, **opts)
    src, dst = (okey, oidx), (wkey, widx)
    run = b
    while run < k:
        final = 2 * run >= k
        K.merge_pass[(m, nb)](x2, *src, *dst, vals, idx, k, run, B=b, FINAL=final, **opts)
        src, dst = dst, src
        run *= 2


def topk_rows(x2, k, largest=True, sorted=True, *, plan: Plan | None = None, target=None):
    """Top-k of each row of the 2-D ``x2`` (rows of stride ``x2.stride(0)``, unit inner stride).

    Returns (values, int64 indices) of shape (M, k); ``plan`` (default
    ``configs.select``) names the kernel and its config.
    """
    m, n = x2.shape
    dev = x2.device
    kb = KEY_BITS[x2.dtype]
    plan = plan or select(
        m,
        n,
        k,
        x2.dtype,
        sorted=sorted,
        deterministic=torch.are_deterministic_algorithms_enabled(),
        target=table_target(x2, target),
    )
    target = tensor_target(x2, target)
    vals = torch.empty((m, k), dtype=x2.dtype, device=dev)
    idx = torch.empty((m, k), dtype=torch.int64, device=dev)
    lg = bool(largest)
    if plan.kernel in ("small", "sort"):  # one program per row, straight to the result
        small = plan.kernel == "small"
        kern, extra = (K.topk_small, {"CHUNKED": plan.CHUNKED}) if small else (K.topk_sort, {})
        kern[(m,)](
            x2,
            vals,
            idx,
            K=k,
            KP=plan.KP,
            BLOCK=plan.BLOCK,
            LARGEST=lg,
            KEY_BITS=kb,
            **extra,
            **_opts(plan, target),
        )
        return vals, idx
    # radix select: survivors to the result (unsorted) or to a workspace (then sorted)
    srt = bool(sorted) and k > 1
    wkey, widx = (_i32((m, k), dev), _i32((m, k), dev)) if srt else (vals, idx)
    if plan.kernel == "radix":
        K.topk_radix[(m,)](
            x2,
            vals,
            idx,
            wkey,
            widx,
            k,
            BLOCK=plan.BLOCK,
            LARGEST=lg,
            KEY_BITS=kb,
            SORTED=srt,
            **_opts(plan, target),
        )
    elif plan.kernel == "radix_split":
        s, span = plan.slices(n)
        npass = kb // K.RADIX_BITS
        hist = torch.zeros((m, npass, K.RADIX), dtype=torch.int32, device=dev)
        for p in range(npass):
            K.radix_hist_split[(m, s)](
                x2,
                hist,
                k,
                span,
                PASS=p,
                BLOCK=plan.BLOCK,
                LARGEST=lg,
                KEY_BITS=kb,
                **_opts(plan, target),
            )
        det = plan.deterministic
        if det:
            counts = _i32((m, s, 2), dev)
            K.radix_count_split[(m, s)](
                x2,
                hist,
                counts,
                k,
                span,
                BLOCK=plan.BLOCK,
                LARGEST=lg,
                KEY_BITS=kb,
                **_opts(plan, target),
            )
        else:
            counts = torch.zeros((m, 2), dtype=torch.int32, device=dev)
        sp = 1 << max(0, (s - 1).bit_length())
        K.radix_compact_split[(m, s)](
            x2,
            vals,
            idx,
            wkey,
            widx,
            hist,
            counts,
            k,
            span,
            s,
            BLOCK=plan.BLOCK,
            SP=sp,
            LARGEST=lg,
            KEY_BITS=kb,
            SORTED=srt,
            DETERMINISTIC=det,
            **_opts(plan, target),
        )
    else:
        raise ValueError(f"unknown topk kernel {plan.kernel!r}")
    if srt:
        _sort_survivors(x2, wkey, widx, vals, idx, k, plan, target)
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
        plan = select(
            x2.shape[0],
            n,
            k,
            x.dtype,
            sorted=sorted,
            deterministic=deterministic,
            method=method,
            target=table_target(x2, target),
        )
        v, i = topk_rows(x2, k, largest, sorted, plan=plan, target=target)
        v, i = v.reshape(out_shape), i.reshape(out_shape)
    return _result(v.movedim(-1, d).contiguous(), i.movedim(-1, d).contiguous())


def _result(values, indices):
    return torch.return_types.topk((values, indices))
