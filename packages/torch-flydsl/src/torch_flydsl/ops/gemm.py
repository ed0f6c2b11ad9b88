"""``gemm``: dense GEMMs under torch.compile (``aten.mm``, ``addmm``, ``bmm``, ``baddbmm``).

Compile-only (no eager override of ``aten::mm``): the pass rewrites eligible nodes into
``flydsl::gemm`` (``library/gemm.py``) and extends them with the epilogue chain that follows and
the SwiGLU pattern (``inductor.epilogue``). ``F.linear`` reaches the post-grad graph as
``addmm`` / ``mm`` of a ``permute``d weight.

Predicate order: subclass, arch, dtype (bf16 / fp16, one dtype), params (2-D / 3-D as the
op's schema; shapes that multiply), dynamic (an unbacked N or K: no value to choose a config
by; M, the batch and backed N and K may be symbolic, an attention matmul's KV length among
them: ``_sym`` says how they are guarded), empty (a zero extent: ATen's), gate (op ``gemm`` at
(M, N, K), a symbolic size's example value, as the rows').
"""

from __future__ import annotations

import torch

from flydsl_kernels import supported

from ..spec import Calibration, OpSpec, Overload
from . import _sym
from ._calls import Dense
from ._kernels import kernel

DTYPES = supported.GEMM


def _operands(ctx, a, b, batched: bool) -> str | None:
    for t in (a, b):
        if not ctx.plain(t):
            return "subclass"
    arch = ctx.arch(a)
    if not arch:
        return "arch"
    if a.dtype not in DTYPES or b.dtype != a.dtype:
        return "dtype"
    nd = 3 if batched else 2
    if a.dim() != nd or b.dim() != nd or a.device != b.device:
        return "params"
    if not _sym.eq(a.shape[-1], b.shape[-2]) or (batched and not _sym.eq(a.shape[0], b.shape[0])):
        return "params"
    m, n, k = a.shape[-2], b.shape[-1], a.shape[-1]
    if not (_sym.backed(n) and _sym.backed(k)):
        return "dynamic"
    if any(_sym.known_zero(s) for s in (m, n, k)) or (batched and _sym.known_zero(a.shape[0])):
        return "empty"
    if not ctx.table.allows(arch, "gemm", a.dtype, _sym.hint(m), _sym.hint(n), _sym.hint(k)):
        return "gate"
    return None


def _c_reason(ctx, c, a, b, beta) -> str | None:
    if not ctx.plain(c):
        return "subclass"
    if c.device != a.device or not c.is_floating_point():
        return "params"
    if isinstance(beta, complex):
        return "params"
    out = (*a.shape[:-1], b.shape[-1])
    try:
        shape = torch.broadcast_shapes(tuple(c.shape), out)
    except RuntimeError:
        return "params"
    return None if _sym.shape_eq(shape, out) else "params"


def mm_reason(ctx, a, b):
    return _operands(ctx, a, b, False)


def addmm_reason(ctx, c, a, b, beta=1, alpha=1):
    r = _operands(ctx, a, b, False)
    return r or _c_reason(ctx, c, a, b, beta) or _scalars(alpha, beta)


def bmm_reason(ctx, a, b):
    return _operands(ctx, a, b, True)


def baddbmm_reason(ctx, c, a, b, beta=1, alpha=1):
    r = _operands(ctx, a, b, True)
    return r or _c_reason(ctx, c, a, b, beta) or _scalars(alpha, beta)


def _scalars(alpha, beta) -> str | None:
    for v in (alpha, beta):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v:
            return "params"
    return None


def _is_bias(c, b, beta) -> bool:
    """addmm's C is F.linear's bias: an (N,) row added once."""
    return beta == 1 and c.dim() == 1 and _sym.eq(c.shape[0], b.shape[-1])


# the 2-D and the batched forms lower alike: one dense kernel takes both


def mm_lower(ctx, a, b):
    """``mm`` and ``bmm``."""
    return Dense(0, 1)


def addmm_lower(ctx, c, a, b, beta=1, alpha=1):
    """``addmm`` and ``baddbmm``."""
    return Dense(1, 2, 0, float(alpha), float(beta), _is_bias(c, b, beta))


# -- calibration: M buckets (the config classes) at Llama-3.1-8B's N x K --------------------------

GEMM_M = [(1, 16), (17, 64), (65, 256), (257, 2048), (2049, 16384)]
#: N buckets, each timed at a Llama-3.1-8B width inside it (attn out 4096, gate/up 14336)
GEMM_N = [((1, 8191), 4096), ((8192, 1 << 20), 14336)]
GEMM_K = ((1, 1 << 20), 4096)


def _cases(dtypes, quick):
    for dt in dtypes:
        for n, _ in GEMM_N[:1] if quick else GEMM_N:
            for m in GEMM_M:
                yield dt, m, n, GEMM_K[0]


def _make(dt, m, n, k, device):
    m, k = m[0], GEMM_K[1]
    n = next(rep for rng, rep in GEMM_N if rng == n)
    a = torch.randn(m, k, device=device).to(dt)
    b = torch.randn(n, k, device=device).to(dt).t()
    return (lambda: kernel("gemm")(a, b)), (lambda: torch.mm(a, b))


_GATE = {"gate": "gemm", "dtypes": DTYPES}

SPEC = OpSpec(
    name="gemm",
    overloads=(
        Overload("mm", mm_reason, lower=mm_lower, eager=False, **_GATE),
        Overload("addmm", addmm_reason, lower=addmm_lower, eager=False, key=1, **_GATE),
        Overload("bmm", bmm_reason, lower=mm_lower, eager=False, **_GATE),
        Overload("baddbmm", baddbmm_reason, lower=addmm_lower, eager=False, key=1, **_GATE),
    ),
    calibration=(Calibration("gemm", _cases, _make, dtypes=("bfloat16", "float16")),),
    aliases=("mm", "linear", "bmm"),
    summary="mm / addmm / bmm / baddbmm / F.linear under torch.compile (+ epilogue, SwiGLU)",
)
