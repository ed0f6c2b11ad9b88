"""The GEMM function API over torch tensors: dense ``gemm`` (batched, split-K), the fused
``swiglu`` and ``grouped_mm``; each launches its plan (``plan.py``).

Layouts: any strides. A transposed operand is a strided view (``w.t()``);
the launcher specializes unit strides to compile-time constants, so each
layout (NN / NT / TN / TT) compiles its own kernel with 128-bit loads along
its contiguous dimension (kernels.py). Outputs are contiguous.

dtypes: bf16 / fp16 operands (both the same), fp32 accumulation, outputs
bf16 / fp16 / fp32 (``out_dtype``, default the input dtype). Anything else
raises ``TypeError`` (dtypes) or ``ValueError`` (shapes), saying what is
supported, so callers can fall back to ATen.

``target``: a FlyDSL target name; None picks the device's target for GPU
tensors and ``cpu-reference`` for CPU tensors (``$FLYDSL_TARGET`` may name
``cpu-interpret``). ``config`` overrides the shipped default, ``split_k``
the split-K rule (``configs.split_k``).
"""

from __future__ import annotations

import torch

from .. import supported
from .._offs import check_offs
from .._target import table_target, tensor_target
from ..launch import run_all
from .kernels import (
    ACTIVATIONS,
    BIAS_COL,
    BIAS_NONE,
    BIAS_ROW,
    RAGGED_K,
    RAGGED_M,
    RAGGED_N,
    RAGGED_NONE,
)

# the launch geometry lives in plan.py; these names stay importable from here
from .plan import (  # noqa: F401
    REDUCE_BM,
    REDUCE_BN,
    persistent_grid,
    plan_gemm,
    plan_grouped,
    plan_swiglu,
    target_xcds,
)

SUPPORTED_DTYPES = supported.GEMM
SUPPORTED_OUT_DTYPES = supported.GEMM_OUT


def _check_operands(a, b, what="gemm"):
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"FlyDSL {what}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"FlyDSL {what} supports bf16 and fp16 operands; {name} is {t.dtype}")
    if a.dtype != b.dtype:
        raise TypeError(f"FlyDSL {what}: a and b must have one dtype, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"FlyDSL {what}: a is on {a.device}, b on {b.device}")


def _out_dtype(out_dtype, a):
    out_dtype = out_dtype or a.dtype
    if out_dtype not in SUPPORTED_OUT_DTYPES:
        raise TypeError(f"FlyDSL GEMM outputs bf16, fp16 or fp32, not {out_dtype}")
    return out_dtype


def _check_out(out, shape, dtype, device):
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"FlyDSL GEMM out must be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != device:
        raise ValueError(
            f"FlyDSL GEMM out must be a {dtype} tensor of shape {list(shape)} on {device}, "
            f"got {out.dtype} {list(out.shape)} on {out.device}"
        )
    return out


def _as3(t: torch.Tensor, batch: int, rows: int, cols: int, what: str) -> torch.Tensor:
    """``t`` broadcast to ``(batch, rows, cols)`` (a view: broadcast dims get stride 0)."""
    try:
        return torch.broadcast_to(t, (batch, rows, cols))
    except RuntimeError:
        raise ValueError(
            f"{what} of shape {list(t.shape)} does not broadcast to {[batch, rows, cols]}"
        ) from None


# -- dense ----------------------------------------------------------------------------------------


def gemm(
    a,
    b,
    *,
    bias=None,
    out_dtype=None,
    alpha=1.0,
    beta=0.0,
    c=None,
    activation=None,
    residual=None,
    target=None,
    config=None,
    split_k=None,
    out=None,
):
    """``act(alpha * (a @ b) + beta * c + bias) + residual``, fp32 accumulation.

    * ``a``: ``(M, K)`` or ``(B, M, K)``; ``b``: ``(K, N)`` or ``(B, K, N)`` (a 2-D
      operand broadcasts over the batch, as ``torch.matmul``);
    * ``bias``: ``(N,)`` (per column, ``F.linear``'s) or ``(M, 1)`` (per row);
    * ``c``: broadcastable to the output ``(M, N)`` / ``(B, M, N)`` (``addmm``);
    * ``activation``: None, ``"relu"``, ``"gelu"`` / ``"gelu_erf"``, ``"gelu_tanh"``, ``"silu"``;
    * ``residual``: added after the activation, the output's shape;
    * ``out``: where to write the result (the result's shape and ``out_dtype``; any strides).

    Host code is integer arithmetic on the shapes (no float ``ceil``, no ``min`` of sizes), so
    the function also runs on tensors with symbolic sizes when a graph capture takes the launches over
    (``flydsl_core.runtime.kernel.launch_sink``), given ``config`` and ``split_k``.
    """
    _check_operands(a, b)
    if a.dim() not in (2, 3) or b.dim() not in (2, 3):
        raise ValueError(
            f"FlyDSL gemm takes 2-D or 3-D operands (matmul or bmm), got {a.dim()}-D and {b.dim()}-D"
        )
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"gemm: a {list(a.shape)} @ b {list(b.shape)}: K differs")
    batched = a.dim() == 3 or b.dim() == 3
    batch = max(a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1)
    for t in (a, b):
        if t.dim() == 3 and t.shape[0] != batch:
            raise ValueError(f"gemm: batch sizes differ ({list(a.shape)} @ {list(b.shape)})")
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    act = activation
    if act not in ACTIVATIONS:
        raise ValueError(
            f"gemm activation {act!r} is not supported; use one of "
            f"{sorted(k for k in ACTIVATIONS if k)} or None"
        )
    odt = _out_dtype(out_dtype, a)
    if out is None:
        out = torch.empty((batch, M, N), dtype=odt, device=a.device)
        result = out if batched else out[0]
    else:
        result = _check_out(out, (batch, M, N) if batched else (M, N), odt, a.device)
        out = out if batched else out[None]
    if out.numel() == 0:
        return result
    a3, b3 = _as3(a, batch, M, K, "a"), _as3(b, batch, K, N, "b")
    bmode, bias_t = BIAS_NONE, None
    if bias is not None:
        if tuple(bias.shape) == (N,):
            bmode, bias_t = BIAS_COL, bias
        elif tuple(bias.shape) == (M, 1):
            bmode, bias_t = BIAS_ROW, bias.reshape(M)
        else:
            raise ValueError(
                f"gemm bias must be (N,) = ({N},) per column or (M, 1) = ({M}, 1) per row, "
                f"got {list(bias.shape)}"
            )
    c3 = None
    if c is not None and beta != 0:
        c3 = _as3(c, batch, M, N, "c")
    r3 = None
    if residual is not None:
        if tuple(residual.shape) != tuple(result.shape):
            raise ValueError(
                f"gemm residual must have the output's shape {list(result.shape)}, "
                f"got {list(residual.shape)}"
            )
        r3 = residual.reshape(batch, M, N) if batched else residual[None]
    tgt = tensor_target(a, target)
    gp = plan_gemm(
        M,
        N,
        K,
        batch,
        alpha=alpha,
        bias_mode=bmode,
        act=ACTIVATIONS[act],
        config=config,
        split_k=split_k,
        target=tgt,
        table=table_target(a, target),
    )
    ws = {
        name: torch.empty(shape, dtype=dt, device=a.device)
        for name, (shape, dt) in gp.workspaces().items()
    }
    launches = gp.launches(
        a=a3, b=b3, out=out, c=c3, bias=bias_t, residual=r3, alpha=alpha, beta=beta, **ws
    )
    run_all(launches, tgt)
    return result


def swiglu(a, w_gate, w_up, *, out_dtype=None, target=None, config=None, out=None):
    """``silu(a @ w_gate) * (a @ w_up)`` in one kernel that reads ``a`` once (``swiglu_kernel``).

    ``a``: ``(M, K)`` or ``(B, M, K)``; ``w_gate`` / ``w_up``: ``(K, N)`` or ``(B, K, N)``, any
    strides (``F.linear`` weights are ``W.t()``, the NT layout). fp32 accumulation, one
    rounding to ``out_dtype`` (default the input dtype). ``out``: where to write the result.
    """
    _check_operands(a, w_gate, "swiglu")
    _check_operands(a, w_up, "swiglu")
    if a.dim() not in (2, 3) or w_gate.dim() not in (2, 3) or w_up.dim() not in (2, 3):
        raise ValueError("FlyDSL swiglu takes 2-D or 3-D operands")
    if tuple(w_gate.shape) != tuple(w_up.shape):
        raise ValueError(
            f"swiglu: w_gate {list(w_gate.shape)} and w_up {list(w_up.shape)} must have one shape"
        )
    if a.shape[-1] != w_gate.shape[-2]:
        raise ValueError(f"swiglu: a {list(a.shape)} @ w {list(w_gate.shape)}: K differs")
    batched = a.dim() == 3 or w_gate.dim() == 3
    batch = max(a.shape[0] if a.dim() == 3 else 1, w_gate.shape[0] if w_gate.dim() == 3 else 1)
    M, K, N = a.shape[-2], a.shape[-1], w_gate.shape[-1]
    odt = _out_dtype(out_dtype, a)
    if out is None:
        out = torch.empty((batch, M, N), dtype=odt, device=a.device)
        result = out if batched else out[0]
    else:
        result = _check_out(out, (batch, M, N) if batched else (M, N), odt, a.device)
        out = out if batched else out[None]
    if out.numel() == 0:
        return result
    if K == 0:
        return result.zero_()  # silu(0) * 0
    a3 = _as3(a, batch, M, K, "a")
    g3, u3 = _as3(w_gate, batch, K, N, "w_gate"), _as3(w_up, batch, K, N, "w_up")
    tgt = tensor_target(a, target)
    launch = plan_swiglu(a3, g3, u3, out, config=config, target=tgt, table=table_target(a, target))
    launch.run(tgt)
    return result


# -- grouped ---------------------------------------------------------------------------------------


def grouped_mm(
    mat_a, mat_b, offs=None, bias=None, out_dtype=None, *, target=None, config=None, out=None
):
    """``torch._grouped_mm(mat_a, mat_b, offs, bias, out_dtype)`` in one persistent launch.

    Forms (``offs``: int32 cumulative group end offsets, ``G`` of them):

    * 2-D x 3-D ``(M, K) x (G, K, N) -> (M, N)``: rows ``offs[g-1]:offs[g]`` use
      ``mat_b[g]`` (MoE forward, ragged M);
    * 3-D x 3-D ``(G, M, K) x (G, K, N) -> (G, M, N)``: bmm, no ``offs``;
    * 2-D x 2-D ``(M, K) x (K, N) -> (G, M, N)``: group ``g`` contracts K
      ``offs[g-1]:offs[g]`` (weight gradient, ragged K);
    * 3-D x 2-D ``(G, M, K) x (K, N) -> (M, N)``: columns ``offs[g-1]:offs[g]``
      use ``mat_a[g]`` (ragged N).

    Empty groups produce nothing (ragged M / N) or zeros (ragged K). ``offs`` follows
    torch's rule (``_offs.py``): non-negative, non-decreasing, at most the ragged extent;
    rows / columns past ``offs[-1]`` are left unwritten. A broken rule is a ``ValueError``
    (a list or another dtype a ``TypeError``) where ``offs`` is on the CPU; a GPU ``offs`` is
    not read on the host, and the kernel clamps it, so nothing outside the operands is touched.
    ``bias``: ``(G, N)``, one row per group, for the 2-D x 3-D and 3-D x 3-D forms.
    ``out``: where to write the result (its shape and dtype; any strides).
    """
    _check_operands(mat_a, mat_b, "grouped_mm")
    da, db = mat_a.dim(), mat_b.dim()
    if da not in (2, 3) or db not in (2, 3):
        raise ValueError(f"grouped_mm takes 2-D or 3-D operands, got {da}-D and {db}-D")
    if mat_a.shape[-1] != mat_b.shape[-2]:
        raise ValueError(
            f"grouped_mm: contraction dims differ ({list(mat_a.shape)} x {list(mat_b.shape)})"
        )
    ragged = {(2, 3): RAGGED_M, (3, 3): RAGGED_NONE, (2, 2): RAGGED_K, (3, 2): RAGGED_N}[(da, db)]
    if ragged == RAGGED_NONE:
        if offs is not None:
            raise ValueError("grouped_mm: 3-D x 3-D is a plain batched matmul and takes no offs")
        if mat_a.shape[0] != mat_b.shape[0]:
            raise ValueError("grouped_mm: 3-D x 3-D batch sizes differ")
        G = mat_a.shape[0]
    else:
        groups = {RAGGED_M: mat_b.shape[0], RAGGED_N: mat_a.shape[0]}.get(ragged)
        dim, extent = {
            RAGGED_M: ("row", mat_a.shape[0]),
            RAGGED_N: ("column", mat_b.shape[1]),
            RAGGED_K: ("K", mat_a.shape[1]),
        }[ragged]
        offs = check_offs(
            offs, groups=groups, extent=extent, dim=dim, device=mat_a.device, what="grouped_mm"
        )
        G = offs.shape[0]
    M, N = mat_a.shape[-2], mat_b.shape[-1]
    odt = _out_dtype(out_dtype, mat_a)
    shape = {RAGGED_M: (M, N), RAGGED_NONE: (G, M, N), RAGGED_K: (G, M, N), RAGGED_N: (M, N)}
    if out is None:
        out = torch.empty(shape[ragged], dtype=odt, device=mat_a.device)
    else:
        _check_out(out, shape[ragged], odt, mat_a.device)
    if bias is not None and (ragged not in (RAGGED_M, RAGGED_NONE) or tuple(bias.shape) != (G, N)):
        raise ValueError(
            "grouped_mm bias is (G, N), for the 2-D x 3-D and 3-D x 3-D forms; got "
            f"{list(bias.shape)} for {da}-D x {db}-D"
        )
    if ragged == RAGGED_K and out.numel():
        out.zero_()  # empty groups (no K) are zero; the kernel's tiles cover every group anyway
    if out.numel() == 0 or G == 0:
        return out
    a3 = mat_a if da == 3 else mat_a[None]
    b3 = mat_b if db == 3 else mat_b[None]
    o3 = out if out.dim() == 3 else out[None]
    tgt = tensor_target(mat_a, target)
    launch = plan_grouped(
        a3,
        b3,
        o3,
        offs,
        bias,
        ragged,
        config=config,
        target=tgt,
        table=table_target(mat_a, target),
    )
    launch.run(tgt)
    return out
