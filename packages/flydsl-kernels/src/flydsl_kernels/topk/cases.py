"""Report cases of the TopK family (``FAMILY``): each kernel of the pipelines ``configs.select``
picks at model shapes, and the fused MoE router of three models.

Cases compile through the plan (``plan.plan_topk`` / ``plan_router`` with ``TensorSpec``
operands), so the report shows what the API launches with the target's config; ``check``
runs the function API on fresh random inputs against ``reference.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch

from .._target import check_device, check_target
from ..registry import Family, ReportCase
from . import reference
from .api import moe_router, topk
from .configs import select
from .plan import SCORINGS, plan_router, plan_topk

#: published static figures of AMD's FlyDSL TopK kernels in torch 2.15, on gfx950
UPSTREAM = {
    "small": "upstream (AMD FlyDSL in torch 2.15) register kernel, k=8 N=4096 on gfx950: "
    "58 VGPR, 4143 instructions (fully unrolled)",
    "radix": "upstream radix kernel, k=256 N=32768 on gfx950: 97 VGPR, 27134 instructions, "
    "426 SGPR spills into VGPR lanes (one kernel; ours: topk_radix + sort_tile)",
}


def _inputs(m, n, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn((m, n), generator=g).to(dtype).to(check_device(device))


def _mismatch(x, k, largest=True, target=None) -> float:
    """0 when values, indices (tie rule) and the gather invariant are exact; else >= 2."""
    v, i = topk(x, k, largest=largest, deterministic=True, target=target)
    rv, ri = reference.topk_stable(x, k, -1, largest)
    g = x.gather(-1, i)
    same = (v == rv) | (v.isnan() & rv.isnan())
    bad = (~same).sum() + (i != ri).sum() + (~((g == v) | (g.isnan() & v.isnan()))).sum()
    return 2.0 * float(bad)


@functools.lru_cache(maxsize=64)
def _check_topk(m, n, k, device) -> float:
    """The check of a (m, n, k) problem; cases reporting stages of one pipeline share it."""
    # the reference backend runs programs one by one: few rows there (all of them on a GPU)
    cpu = check_target(device) is not None
    mm = m if not cpu else (8 if n <= 8192 else 2 if n <= 65536 else 1)
    t = check_target(device)
    return max(
        _mismatch(_inputs(mm, n, torch.float32, device, n + k), k, target=t),
        _mismatch(_inputs(mm, n, torch.float32, device, n - k), k, largest=False, target=t),
    )


def _compile_pipeline(m, n, k, dtype, target, stage):
    """Compile one stage of the pipeline ``select`` picks for (m, n, k): the report reads it.
    ``stage``: "main" (the selection kernel; the last histogram pass of a split radix) or
    "sort" (the survivor sort's final kernel)."""
    from flydsl_core import TensorSpec

    tp = plan_topk(m, n, k, dtype, target=target, table=target)
    ws = {name: TensorSpec(dt, shape) for name, (shape, dt, _) in tp.workspaces().items()}
    x, v, i = TensorSpec(dtype, (m, n)), TensorSpec(dtype, (m, k)), TensorSpec(torch.int64, (m, k))
    launches = tp.launches(x=x, vals=v, idx=i, **ws)
    if stage == "main":
        main = _MAIN_KERNEL[tp.config.kernel]
        return [lc for lc in launches if lc.name == main][-1].compile(target)
    return launches[-1].compile(target)


# (M, N, k, stage, upstream figure): M >= CUs as in the upstream regions, except the split
# case (few long rows); "sort" reports the survivor sort of a radix pipeline
_TOPK_CASES = (
    (256, 4096, 8, "main", "small"),
    (256, 1024, 2, "main", None),
    (256, 8192, 64, "main", None),  # moderate k: tile sort
    (256, 32768, 256, "main", "radix"),
    (256, 32768, 256, "sort", "radix"),
    (256, 16384, 64, "main", None),
    (256, 65536, 512, "main", None),
    (256, 262144, 1024, "main", None),
    (256, 262144, 1024, "sort", None),
    (4, 262144, 1024, "main", None),  # few rows: split over programs
)
_MAIN_KERNEL = {
    "small": "topk_small",
    "sort": "topk_sort",
    "radix": "topk_radix",
    "radix_split": "radix_hist_split",
}


def _topk_case(m, n, k, stage, up) -> ReportCase:
    dtype = torch.float32
    plan = select("topk", m, n, k, dtype)  # the kernels follow the shape; the target: warps
    name = _MAIN_KERNEL[plan.kernel]
    if stage == "sort":
        name = "sort_tile" if plan.sorter == "tile" else "merge_pass"

    def config(target):
        p = select("topk", m, n, k, dtype, target=target)
        if stage == "sort":
            return {"kernel": p.sorter, "num_warps": p.sort_warps, "KP": p.SORT_KP}
        return p.as_dict()

    def check(device, target=None, m=m, n=n, k=k):
        # the target's table differs from gfx950's only in warps, which the CPU backends ignore
        return _check_topk(m, n, k, device)

    def run(device):
        x = _inputs(m, n, dtype, device, 1)
        return lambda: topk(x, k)

    def aten(device):
        x = _inputs(m, n, dtype, device, 1)
        return lambda: torch.topk(x, k)

    return ReportCase(
        family="topk",
        kernel=name,
        shape=f"{m}x{n} fp32 k={k}",
        config=config,
        compile=lambda target: _compile_pipeline(m, n, k, dtype, target, stage),
        bytes=float(m * n * 4 + m * k * 12) if stage == "main" else None,
        check=check,
        run=run,
        aten=aten,
        notes=UPSTREAM.get(up, "") if up else "",
    )


_ROUTER_CASES = (  # (model, T, E, top_k, kwargs)
    ("Qwen3-30B-A3B", 4096, 128, 8, {"scoring": "softmax", "renormalize": True}),
    (
        "DeepSeek-V3",
        4096,
        256,
        8,
        {
            "scoring": "sigmoid",
            "renormalize": True,
            "n_group": 8,
            "topk_group": 4,
            "routed_scaling_factor": 2.5,
        },
    ),
    ("gpt-oss-120b", 4096, 128, 4, {"scoring": "topk_softmax"}),
)


def _router_case(model, t, e, top_k, kw) -> ReportCase:
    from flydsl_core import TensorSpec

    sc = SCORINGS[kw["scoring"]]
    dtype = torch.float32 if sc == 1 else torch.bfloat16
    ng = kw.get("n_group", 1)

    def plan_of(target):
        return plan_router(e, top_k, has_bias=sc == 1, target=target, table=target, **kw)

    cx = plan_of(None).constexprs

    def inputs(device, tt):
        g = torch.Generator().manual_seed(e + top_k)
        dev = check_device(device)
        logits = torch.randn(tt, e, generator=g).to(dtype).to(dev)
        bias = (torch.randn(e, generator=g) * 0.1).to(dev) if sc == 1 else None
        return logits, bias

    def compile_(target):
        # the bias operand is an fp32 (E,) tensor whichever the recipe (unread without one)
        args = (
            TensorSpec(dtype, (t, e)),
            TensorSpec(torch.float32, (e,)),
            TensorSpec(torch.float32, (t, top_k)),
            TensorSpec(torch.int64, (t, top_k)),
        )
        launch = plan_of(target).launches(
            logits=args[0], bias=args[1], weights=args[2], ids=args[3]
        )
        return launch[0].compile(target)

    def check(device, target=None):
        logits, bias = inputs(device, t if check_target(device) is None else 64)
        w, ids = moe_router(logits, top_k, bias=bias, target=check_target(device), **kw)
        if sc == 0:
            rw, rids = reference.qwen3_moe_router(logits, top_k, kw.get("renormalize", False))
            rw, rids = reference.in_kernel_order(rw, rids, logits.float())
        elif sc == 1:
            rw, rids = reference.deepseek_v3_router(
                logits, bias, top_k, ng, kw.get("topk_group", 1), True, cx["SCALE"]
            )
            rw, rids = reference.in_kernel_order(rw, rids, logits.sigmoid() + bias)
        else:
            sv, rids = reference.topk_stable(logits, top_k)
            rw = torch.softmax(sv.float(), 1)
        if not torch.equal(ids.long(), rids.long()):
            return float("inf")
        return float(((w - rw.float()).abs() / (1e-6 + 1e-5 * rw.float().abs())).max())

    def run(device):
        logits, bias = inputs(device, t)
        return lambda: moe_router(logits, top_k, bias=bias, **kw)

    return ReportCase(
        family="topk",
        kernel="moe_router_kernel",
        shape=f"{model}: {t}x{e} {str(dtype).removeprefix('torch.').replace('bfloat16', 'bf16').replace('float32', 'fp32')} top-{top_k}",
        config=lambda target: {**cx, "num_warps": plan_of(target).config.num_warps},
        bytes=float(t * e * (2 if dtype == torch.bfloat16 else 4) + t * top_k * 12),
        compile=compile_,
        check=check,
        run=run,
        notes="fused router (scores, selection, weights); no ATen single-op equivalent",
    )


def _cases() -> Iterator[ReportCase]:
    for c in _TOPK_CASES:
        yield _topk_case(*c)
    for c in _ROUTER_CASES:
        yield _router_case(*c)


FAMILY = Family(
    "topk",
    cases=_cases,
    description="torch.topk (small-k registers, tile sort, radix select) and a fused MoE router",
    tags=("selection", "moe"),
)
