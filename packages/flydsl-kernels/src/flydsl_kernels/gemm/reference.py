"""PyTorch references for the GEMM family: fp32 matmul of the (16-bit) inputs, then one rounding.

``acc_dtype=torch.float64`` computes in float64 instead: the GPU checks' reference at full K,
where two fp32 accumulations in different orders differ by more than a fixed tolerance."""

from __future__ import annotations

import torch


def _activation(x, activation):
    if activation is None:
        return x
    if activation == "relu":
        return torch.relu(x)
    if activation in ("gelu", "gelu_erf"):
        return torch.nn.functional.gelu(x)
    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(x, approximate="tanh")
    if activation == "silu":
        return torch.nn.functional.silu(x)
    raise ValueError(f"unknown activation {activation!r}")


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
    acc_dtype=torch.float32,
):
    """``act(alpha * a @ b + beta * c + bias) + residual`` in ``acc_dtype`` (fp32), rounded to
    ``out_dtype``."""
    acc = torch.matmul(a.to(acc_dtype), b.to(acc_dtype))
    if alpha != 1:
        acc = acc * alpha
    if c is not None and beta != 0:
        acc = acc + beta * c.to(acc_dtype)
    if bias is not None:
        acc = acc + bias.to(acc_dtype)  # (N,) broadcasts over rows, (M, 1) over columns
    acc = _activation(acc, activation)
    if residual is not None:
        acc = acc + residual.to(acc_dtype)
    return acc.to(out_dtype or a.dtype)


def swiglu(a, w_gate, w_up, *, out_dtype=None, acc_dtype=torch.float32):
    """``silu(a @ w_gate) * (a @ w_up)`` in ``acc_dtype`` (fp32), rounded once to ``out_dtype``."""
    g = torch.matmul(a.to(acc_dtype), w_gate.to(acc_dtype))
    u = torch.matmul(a.to(acc_dtype), w_up.to(acc_dtype))
    return (torch.nn.functional.silu(g) * u).to(out_dtype or a.dtype)


def grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None, acc_dtype=torch.float32):
    """``torch._grouped_mm`` semantics, one ``torch.matmul`` per group in ``acc_dtype`` (fp32)."""
    odt = out_dtype or mat_a.dtype
    a, b = mat_a.to(acc_dtype), mat_b.to(acc_dtype)
    bounds = []
    if offs is not None:
        ends = [int(e) for e in offs.tolist()]
        bounds = list(zip([0, *ends[:-1]], ends))
    if a.dim() == 3 and b.dim() == 3:
        out = torch.matmul(a, b)
        if bias is not None:
            out = out + bias.to(acc_dtype)[:, None, :]
    elif a.dim() == 2 and b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[-1], device=a.device, dtype=acc_dtype)
        for g, (s, e) in enumerate(bounds):
            out[s:e] = a[s:e] @ b[g] + (0 if bias is None else bias.to(acc_dtype)[g])
    elif a.dim() == 2 and b.dim() == 2:
        out = torch.zeros(len(bounds), a.shape[0], b.shape[-1], device=a.device, dtype=acc_dtype)
        for g, (s, e) in enumerate(bounds):
            out[g] = a[:, s:e] @ b[s:e]
    else:
        out = torch.zeros(a.shape[1], b.shape[-1], device=a.device, dtype=acc_dtype)
        for g, (s, e) in enumerate(bounds):
            out[:, s:e] = a[g] @ b[:, s:e]
    return out.to(odt)
