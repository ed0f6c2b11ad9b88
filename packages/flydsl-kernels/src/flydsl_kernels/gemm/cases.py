"""Report cases of the GEMM family (``FAMILY``): the dense GEMM's shape classes, the fused
SwiGLU and the grouped GEMM at model shapes.

Each case compiles its kernel through the plan (``model.compile_config`` builds
``plan.plan_gemm``'s launch, the SwiGLU case ``plan.plan_swiglu``'s, the grouped case
``plan.plan_grouped``'s, on ``TensorSpec`` operands), so the report shows what the API launches with the target's shipped config;
``check`` runs the function API on fresh random inputs against ``reference.py``.
"""

from __future__ import annotations

import torch

from .. import registry
from .._target import check_target as _check_target
from ..registry import gen
from . import configs, reference
from .api import gemm, grouped_mm, swiglu
from .kernels import KERNELS, RAGGED_M
from .model import compile_config, operand_specs
from .plan import plan_grouped, plan_swiglu

#: (rtol, atol) of the function API against the fp32 references, by output dtype
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (1e-2, 1e-2), torch.float16: (2e-3, 2e-3)}
#: the CPU check's shape cap (the reference backend runs one program per Python iteration)
_CHECK_MAX = 96


#: fp32's unit roundoff: the accumulation term of the checks' tolerance
_U32 = 2.0**-24
_F64 = torch.float64


def _err(out, ref, spread=None) -> float:
    """Max of ``|out - ref| / (atol + rtol |ref| + spread)`` against a float64 reference.

    ``spread`` is what an fp32 accumulation over K may add, ``sqrt(K) u (|A| @ |B|)`` (Higham
    and Mary's probabilistic bound, u = 2^-24; ``_spread``): at a GPU check's full K (4096 to
    14336) two fp32 sums in different orders differ by about ``u K / sqrt(2)``, several times
    the fixed atol of 1e-4 where an output is near 0 (the H200 run of 2026-12-04: 6 to 9x, and
    100x and more through SwiGLU's product). A wrong tile or a dropped K block is off by
    ``sqrt(BK)`` or more, far above it."""
    rtol, atol = TOLERANCE[out.dtype]
    out, ref = out.double(), ref.double()
    tol = atol + rtol * ref.abs() + (0 if spread is None else spread)
    return float(((out - ref).abs() / tol).max()) if out.numel() else 0.0


def _spread(abs_product, k: int):
    """``sqrt(K) u (|A| @ |B|)``, from ``|A| @ |B|`` (the reference on the operands' abs)."""
    return abs_product * (k**0.5 * _U32)


def _cpu(device) -> bool:
    return _check_target(device) is not None


def _nt(m, n, k, device, seed=0):
    g = gen(device, seed)
    a = torch.randn(m, k, generator=g, device=device).to(torch.bfloat16)
    w = torch.randn(n, k, generator=g, device=device).to(torch.bfloat16)
    return a, w.t()  # F.linear's weight: b = W^T, the NT layout


def _dense_case(cls, m, n, k, model):
    def cfg_of(target):
        # the class's tile of the target's table (the report names the class; select() may
        # trade large for medium on a GPU that a large grid would not fill)
        return configs.table(target)[cls]

    def compile_(target):
        return compile_config(cfg_of(target), m, n, k, target=target)

    def check(device, target=None):
        cfg = cfg_of(target)
        # small shapes on the CPU (not tile multiples, so masks are exercised); full on a GPU
        mm, nn, kk = (min(m, _CHECK_MAX), min(n, _CHECK_MAX) - 3, min(k, 4 * cfg.BK) + 8)
        if not _cpu(device):
            mm, nn, kk = m, n, k
        a, b = _nt(mm, nn, kk, "cpu" if _cpu(device) else device, seed=1)
        # on a GPU the API picks the device's own table, as a user's call does
        out = gemm(
            a,
            b,
            out_dtype=torch.float32,
            config=cfg if _cpu(device) else None,
            target=_check_target(device),
        )
        ref = reference.gemm(a, b, out_dtype=_F64, acc_dtype=_F64)
        absp = reference.gemm(a.abs(), b.abs(), out_dtype=_F64, acc_dtype=_F64)
        return _err(out, ref, _spread(absp, kk))

    def run(device):
        a, b = _nt(m, n, k, device)
        return lambda: gemm(a, b)

    def aten(device):
        a, b = _nt(m, n, k, device)
        return lambda: torch.mm(a, b)

    def config(target):
        cfg = cfg_of(target)
        return {**cfg.as_dict(target), "split_k": configs.split_k(cfg, m, n, k, target=target)}

    return registry.ReportCase(
        family="gemm",
        kernel=KERNELS["gemm"].name,
        shape=f"{m}x{n}x{k} bf16 NT",
        config=config,
        compile=compile_,
        check=check,
        run=run,
        aten=aten,
        notes=f"{model}; {cls} default from the static model (configs.py), untimed",
        flops=2.0 * m * n * k,
        bytes=2.0 * (m * k + n * k + m * n),
    )


def _swiglu_case(m, n, k, model):
    def cfg_of(target):
        return configs.select("swiglu", m, n, k, target=target)

    def compile_(target):
        from flydsl_core import TensorSpec

        a, b = operand_specs(m, n, k, "bf16")
        o = TensorSpec("bf16", (1, m, n))
        return plan_swiglu(a, b, b, o, config=cfg_of(target), target=target).compile(target)

    def inputs(device, mm, nn, kk, seed=0):
        g = gen(device, seed)
        a = torch.randn(mm, kk, generator=g, device=device).to(torch.bfloat16)
        wg = torch.randn(nn, kk, generator=g, device=device).to(torch.bfloat16)
        wu = torch.randn(nn, kk, generator=g, device=device).to(torch.bfloat16)
        return a, wg.t(), wu.t()

    def check(device, target=None):
        # on the CPU the tile of ``target``'s table (as the dense cases do); on a GPU the API
        # picks the device's own, as a user's call does
        config = None
        if _cpu(device):
            a, wg, wu = inputs("cpu", min(m, 19), 45, 136, seed=1)
            config = cfg_of(target)
        else:
            a, wg, wu = inputs(device, m, n, k, seed=1)
        out = swiglu(
            a, wg, wu, out_dtype=torch.float32, target=_check_target(device), config=config
        )
        # the spread of g and u through silu(g) * u: |silu'(g)| |u| s_g + |silu(g)| s_u
        g, u = (reference.gemm(a, w, out_dtype=_F64, acc_dtype=_F64) for w in (wg, wu))
        sg, su = (
            _spread(reference.gemm(a.abs(), w.abs(), out_dtype=_F64, acc_dtype=_F64), a.shape[1])
            for w in (wg, wu)
        )
        sig = torch.sigmoid(g)
        dsilu = (sig * (1 + g * (1 - sig))).abs()
        spread = dsilu * u.abs() * sg + (g * sig).abs() * su
        return _err(out, torch.nn.functional.silu(g) * u, spread)

    def run(device):
        a, wg, wu = inputs(device, m, n, k)
        return lambda: swiglu(a, wg, wu)

    def aten(device):
        a, wg, wu = inputs(device, m, n, k)
        return lambda: torch.nn.functional.silu(a @ wg) * (a @ wu)

    return registry.ReportCase(
        family="gemm",
        kernel=KERNELS["swiglu"].name,
        shape=f"{m}x{n}x{k} bf16 NT, gate+up",
        config=lambda target: cfg_of(target).as_dict(target),
        compile=compile_,
        check=check,
        run=run,
        aten=aten,
        notes=f"{model}; fused SwiGLU (A read once, two accumulators); static-model tile, untimed",
    )


def _grouped_case(tokens, experts, n, k, model):
    def cfg_of(target):
        return configs.select("grouped", max(1, tokens // experts), n, k, target=target)

    def inputs(device, t, e, nn, kk, seed=0):
        g = gen(device, seed)
        a = torch.randn(t, kk, generator=g, device=device).to(torch.bfloat16)
        w = torch.randn(e, nn, kk, generator=g, device=device).to(torch.bfloat16).transpose(1, 2)
        # ragged routing: expert sizes from a seeded multinomial, some empty
        counts = torch.bincount(torch.randint(0, e, (t,), generator=g, device=device), minlength=e)
        offs = counts.cumsum(0).to(torch.int32)
        return a, w, offs

    def compile_(target):
        from flydsl_core import TensorSpec

        # the API's operands: a (1, tokens, K), the experts' F.linear weights as (E, K, N) views
        a = TensorSpec("bf16", (1, tokens, k))
        b = TensorSpec("bf16", (experts, k, n), (k * n, 1, k))
        o = TensorSpec("bf16", (1, tokens, n))
        offs = TensorSpec("int32", (experts,))
        launch = plan_grouped(a, b, o, offs, None, RAGGED_M, config=cfg_of(target), target=target)
        return launch.compile(target)

    def check(device, target=None):
        if _cpu(device):
            a, w, offs = inputs("cpu", 64, 8, 72, 136, seed=1)
        else:
            a, w, offs = inputs(device, tokens, experts, n, k, seed=1)
        out = grouped_mm(
            a,
            w,
            offs,
            out_dtype=torch.float32,
            target=_check_target(device),
            config=cfg_of(target) if _cpu(device) else None,
        )
        ref = reference.grouped_mm(a, w, offs, out_dtype=_F64, acc_dtype=_F64)
        absp = reference.grouped_mm(a.abs(), w.abs(), offs, out_dtype=_F64, acc_dtype=_F64)
        return _err(out, ref, _spread(absp, a.shape[1]))

    def run(device):
        a, w, offs = inputs(device, tokens, experts, n, k)
        return lambda: grouped_mm(a, w, offs)

    def aten(device):
        a, w, offs = inputs(device, tokens, experts, n, k)
        return lambda: torch._grouped_mm(a, w, offs)

    return registry.ReportCase(
        family="gemm",
        kernel=KERNELS["grouped"].name,
        shape=f"{tokens} tokens x {experts} experts, N={n} K={k} bf16",
        config=lambda target: cfg_of(target).as_dict(target),
        compile=compile_,
        check=check,
        run=run,
        aten=aten,
        notes=f"{model}; persistent grouped GEMM, ragged M; static-model default, untimed",
        flops=2.0 * tokens * n * k,
        bytes=2.0 * (tokens * k + experts * n * k + tokens * n),
    )


#: model shapes from ../shared/reference/gfx950.md: (class, M, N, K, model)
DENSE_CASES = (
    ("decode", 16, 4096, 4096, "Llama-3.1-8B attn out, decode"),
    ("decode", 1, 14336, 4096, "Llama-3.1-8B gate/up, batch-1 decode"),
    ("small", 64, 4096, 14336, "Llama-3.1-8B down proj, small batch"),
    ("medium", 128, 6144, 4096, "Llama-3.1-8B fused QKV, prefill chunk"),
    ("large", 4096, 4096, 4096, "Llama-3.1-8B attn out, prefill"),
    ("large", 4096, 14336, 4096, "Llama-3.1-8B gate/up, prefill"),
)
#: the fused SwiGLU MLP: (M, N = intermediate size, K = hidden, model)
SWIGLU_CASES = (
    (16, 14336, 4096, "Llama-3.1-8B MLP gate+up, decode"),
    (4096, 14336, 4096, "Llama-3.1-8B MLP gate+up, prefill"),
)
#: (tokens x top-k routed rows, experts, N, K, model)
GROUPED_CASES = (
    (4096 * 8, 128, 768, 2048, "Qwen3-30B-A3B up proj (top-8 of 128)"),
    (4096 * 4, 128, 2880, 2880, "gpt-oss-120b expert (bf16 stand-in for MXFP4; top-4 of 128)"),
)


def _cases():
    for cls, m, n, k, model in DENSE_CASES:
        yield _dense_case(cls, m, n, k, model)
    for m, n, k, model in SWIGLU_CASES:
        yield _swiglu_case(m, n, k, model)
    for t, e, n, k, model in GROUPED_CASES:
        yield _grouped_case(t, e, n, k, model)


FAMILY = registry.Family(
    "gemm",
    _cases,
    description="dense GEMM (mm/addmm/bmm/linear + epilogue, split-K) and grouped GEMM",
    tags=("gemm", "compute-bound"),
)
