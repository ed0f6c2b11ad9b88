"""TopK plans: a problem goes in; the kernels, grids, arguments, constexprs and options come out.

``plan_topk`` turns a top-k problem (M rows of N elements, k, the dtype, largest / sorted,
the kernel choice ``configs.Config`` of ``configs.select``) into a ``TopkPlan``: the workspaces
it needs (``workspaces()``) and ``launches(...)``, the pipeline of ``launch.Launch``es for
given operands; ``plan_router`` does the same for the fused MoE router. Operands are torch
tensors (the function API) or ``TensorSpec``s (the static model in ``model.py`` and the report
cases compile the same launches without data). Each kernel's call is written once, in the
``*_launch`` functions below.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flydsl_core import cdiv

from .._target import is_cpu_target
from ..launch import Launch
from .configs import KEY_BITS, SURVIVOR_TILE_MAX, Config, m_choice, next_pow2, select
from .kernels import KERNELS, RADIX, RADIX_BITS

SCORINGS = {"softmax": 0, "sigmoid": 1, "topk_softmax": 2}


def options(num_warps: int, target) -> dict:
    """The compiler options of a launch on ``target``: none on the CPU backends (they ignore
    warps: compiles are not keyed on them), else (None too: a GPU's) ``num_warps``."""
    if target is not None and is_cpu_target(target):
        return {}
    return {"num_warps": num_warps}


# -- one function per kernel: its grid, arguments and constexprs -------------------------------------


def small_launch(x, vals, idx, *, k, KP, BLOCK, CHUNKED, LARGEST, KEY_BITS, options) -> Launch:
    """``topk_small``: one program per row of ``x`` ``(M, N)``."""
    cx = dict(K=k, KP=KP, BLOCK=BLOCK, CHUNKED=CHUNKED, LARGEST=LARGEST, KEY_BITS=KEY_BITS)
    return Launch(KERNELS["small"], (x.shape[0],), (x, vals, idx), cx, options)


def sort_launch(x, vals, idx, *, k, KP, BLOCK, LARGEST, KEY_BITS, options) -> Launch:
    """``topk_sort``: one tile top-k per row."""
    cx = dict(K=k, KP=KP, BLOCK=BLOCK, LARGEST=LARGEST, KEY_BITS=KEY_BITS)
    return Launch(KERNELS["sort"], (x.shape[0],), (x, vals, idx), cx, options)


def radix_launch(x, vals, idx, wkey, widx, k, *, BLOCK, LARGEST, KEY_BITS, SORTED, options):
    """``topk_radix``: one program per row, every pass fused."""
    cx = dict(BLOCK=BLOCK, LARGEST=LARGEST, KEY_BITS=KEY_BITS, SORTED=SORTED)
    return Launch(KERNELS["radix"], (x.shape[0],), (x, vals, idx, wkey, widx, k), cx, options)


def hist_split_launch(x, hist, k, span, slices, *, PASS, BLOCK, LARGEST, KEY_BITS, options):
    """``radix_hist_split``: pass ``PASS``'s digit histogram, ``slices`` programs per row."""
    cx = dict(PASS=PASS, BLOCK=BLOCK, LARGEST=LARGEST, KEY_BITS=KEY_BITS)
    grid = (x.shape[0], slices)
    return Launch(KERNELS["radix_hist_split"], grid, (x, hist, k, span), cx, options)


def count_split_launch(x, hist, counts, k, span, slices, *, BLOCK, LARGEST, KEY_BITS, options):
    """``radix_count_split``: per-slice survivor counts (the deterministic compaction's)."""
    cx = dict(BLOCK=BLOCK, LARGEST=LARGEST, KEY_BITS=KEY_BITS)
    args = (x, hist, counts, k, span)
    return Launch(KERNELS["radix_count_split"], (x.shape[0], slices), args, cx, options)


def compact_split_launch(
    x,
    vals,
    idx,
    wkey,
    widx,
    hist,
    counts,
    k,
    span,
    slices,
    *,
    BLOCK,
    SP,
    LARGEST,
    KEY_BITS,
    SORTED,
    DETERMINISTIC,
    options,
):
    """``radix_compact_split``: the survivors of each slice."""
    cx = dict(
        BLOCK=BLOCK,
        SP=SP,
        LARGEST=LARGEST,
        KEY_BITS=KEY_BITS,
        SORTED=SORTED,
        DETERMINISTIC=DETERMINISTIC,
    )
    args = (x, vals, idx, wkey, widx, hist, counts, k, span, slices)
    return Launch(KERNELS["radix_compact_split"], (x.shape[0], slices), args, cx, options)


def sort_tile_launch(x, wkey, widx, vals, idx, k, *, KP, options) -> Launch:
    """``sort_tile``: each row's ``k`` survivors (keys in ``wkey``) sorted in one tile."""
    args = (x, wkey, widx, vals, idx, k)
    return Launch(KERNELS["sort_tile"], (x.shape[0],), args, {"KP": KP}, options)


def sort_runs_launch(ikey, iidx, okey, oidx, blocks, *, B, options) -> Launch:
    """``sort_runs``: sorted runs of ``B`` survivors, ``blocks`` programs per row."""
    grid = (ikey.shape[0], blocks)
    return Launch(KERNELS["sort_runs"], grid, (ikey, iidx, okey, oidx), {"B": B}, options)


def merge_pass_launch(
    x, ikey, iidx, okey, oidx, vals, idx, k, run, blocks, *, B, FINAL, options
) -> Launch:
    """``merge_pass``: runs of ``run`` merged pairwise (the last pass writes values / indices)."""
    args = (x, ikey, iidx, okey, oidx, vals, idx, k, run)
    return Launch(
        KERNELS["merge_pass"], (x.shape[0], blocks), args, {"B": B, "FINAL": FINAL}, options
    )


def router_launch(logits, bias, weights, ids, constexprs: dict, options) -> Launch:
    """``moe_router_kernel``: one program per token (row of ``logits``)."""
    grid = (logits.shape[0],)
    return Launch(KERNELS["router"], grid, (logits, bias, weights, ids), constexprs, options)


# -- top-k -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopkPlan:
    """The pipeline of one top-k problem (``config``: the kernel and config ``select`` chose)."""

    config: Config
    M: int
    N: int
    k: int
    key_bits: int
    largest: bool
    sorted: bool
    options: dict  # of the main kernels
    sort_options: dict  # of the survivor sort

    @property
    def sorter(self) -> str | None:
        """How radix survivors are sorted: "tile", "merge", or None (unsorted or k == 1)."""
        if self.config.kernel in ("small", "sort") or not self.sorted:
            return None
        return self.config.sorter or ("tile" if self.k <= SURVIVOR_TILE_MAX else "merge")

    def workspaces(self) -> dict[str, tuple[tuple, torch.dtype, bool]]:
        """``{name: (shape, dtype, zeroed)}`` of the buffers ``launches`` takes besides
        ``x``, ``vals`` and ``idx``."""
        m, k, p = self.M, self.k, self.config
        out = {}
        if self.sorter is not None:
            out.update(wkey=((m, k), torch.int32, False), widx=((m, k), torch.int32, False))
        if p.kernel == "radix_split":
            out["hist"] = ((m, self.key_bits // RADIX_BITS, RADIX), torch.int32, True)
            if p.deterministic:
                out["counts"] = ((m, p.slices(self.N)[0], 2), torch.int32, False)
            else:
                out["counts"] = ((m, 2), torch.int32, True)
        if self.sorter == "merge":
            out.update(okey=((m, k), torch.int32, False), oidx=((m, k), torch.int32, False))
        return out

    def launches(self, *, x, vals, idx, **ws) -> list[Launch]:
        """``x`` ``(M, N)`` rows (unit inner stride), ``vals`` / ``idx`` ``(M, k)`` outputs and
        the ``workspaces()``; the launches in order."""
        p, k, kb, lg = self.config, self.k, self.key_bits, bool(self.largest)
        opts = self.options
        if p.kernel in ("small", "sort"):  # one program per row, straight to the result
            tile = dict(k=k, KP=p.KP, BLOCK=p.BLOCK, LARGEST=lg, KEY_BITS=kb, options=opts)
            if p.kernel == "small":
                return [small_launch(x, vals, idx, CHUNKED=p.CHUNKED, **tile)]
            return [sort_launch(x, vals, idx, **tile)]
        # radix select: survivors to the result (unsorted) or to a workspace (then sorted)
        srt = self.sorter is not None
        wkey, widx = (ws["wkey"], ws["widx"]) if srt else (vals, idx)
        sel = dict(BLOCK=p.BLOCK, LARGEST=lg, KEY_BITS=kb, options=opts)
        if p.kernel == "radix":
            out = [radix_launch(x, vals, idx, wkey, widx, k, SORTED=srt, **sel)]
        elif p.kernel == "radix_split":
            s, span = p.slices(self.N)
            hist, counts = ws["hist"], ws["counts"]
            out = [
                hist_split_launch(x, hist, k, span, s, PASS=i, **sel)
                for i in range(kb // RADIX_BITS)
            ]
            if p.deterministic:
                out.append(count_split_launch(x, hist, counts, k, span, s, **sel))
            compact = compact_split_launch(
                x,
                vals,
                idx,
                wkey,
                widx,
                hist,
                counts,
                k,
                span,
                s,
                SP=next_pow2(s),
                SORTED=srt,
                DETERMINISTIC=p.deterministic,
                **sel,
            )
            out.append(compact)
        else:
            raise ValueError(f"unknown topk kernel {p.kernel!r}")
        if srt:
            out += self._sort(x, wkey, widx, vals, idx, ws)
        return out

    def _sort(self, x, wkey, widx, vals, idx, ws) -> list[Launch]:
        """Stable sort of each row's k survivors (keys descending) into vals / idx."""
        p, k, opts = self.config, self.k, self.sort_options
        if self.sorter == "tile":
            kp = max(p.SORT_KP, next_pow2(k))
            return [sort_tile_launch(x, wkey, widx, vals, idx, k, KP=kp, options=opts)]
        b = p.MERGE_B
        nb = cdiv(k, b)
        okey, oidx = ws["okey"], ws["oidx"]
        out = [sort_runs_launch(wkey, widx, okey, oidx, nb, B=b, options=opts)]
        src, dst = (okey, oidx), (wkey, widx)
        run = b
        while run < k:
            final = 2 * run >= k
            out.append(
                merge_pass_launch(
                    x, *src, *dst, vals, idx, k, run, nb, B=b, FINAL=final, options=opts
                )
            )
            src, dst = dst, src
            run *= 2
        return out


def plan_topk(
    M: int,
    N: int,
    k: int,
    dtype,
    *,
    largest: bool = True,
    sorted: bool = True,
    deterministic: bool = True,
    method: str | None = None,
    config: Config | None = None,
    target=None,
    table=None,
) -> TopkPlan:
    """The top-k of ``M`` rows of ``N`` elements of ``dtype``, ``1 <= k <= N``: ``config``
    (default ``configs.m_choice`` on ``table``'s table, with ``method``) names the kernel and
    its config; ``target`` is the launch's (the CPU backends take no warps)."""
    p = config
    if p is None:
        kw = dict(sorted=sorted, deterministic=deterministic, method=method, target=table)
        p = m_choice("topk", N, k, dtype, **kw).choose(M).config
    return TopkPlan(
        p,
        M,
        N,
        k,
        KEY_BITS[dtype],
        bool(largest),
        bool(sorted) and k > 1,
        options(p.num_warps, target),
        options(p.sort_warps, target),
    )


# -- the MoE router ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RouterPlan:
    config: Config
    constexprs: dict
    options: dict

    def launches(self, *, logits, bias, weights, ids) -> list[Launch]:
        """``logits`` ``(T, E)`` (unit inner stride), ``bias`` ``(E,)`` (any ``(E,)`` tensor
        without one: it is not read), ``weights`` fp32 and ``ids`` ``(T, top_k)``."""
        return [router_launch(logits, bias, weights, ids, self.constexprs, self.options)]


def plan_router(
    E: int,
    top_k: int,
    *,
    scoring: str = "softmax",
    renormalize: bool = False,
    has_bias: bool = False,
    n_group: int = 1,
    topk_group: int = 1,
    routed_scaling_factor: float = 1.0,
    target=None,
    table=None,
) -> RouterPlan:
    """The fused router over ``E`` experts (the arguments of ``api.moe_router``; ``has_bias``:
    whether there is a selection bias)."""
    block = next_pow2(E)
    cfg = select("router", E, target=table)
    cx = dict(
        TOPK=top_k,
        KP=next_pow2(top_k),
        BLOCK=block,
        SCORING=SCORINGS[scoring],
        HAS_BIAS=bool(has_bias),
        RENORM=bool(renormalize),
        NGROUP=int(n_group),
        TOPK_GROUP=int(topk_group) if n_group > 1 else 1,
        SCALE=float(routed_scaling_factor),
    )
    return RouterPlan(cfg, cx, options(cfg.num_warps, target))
