"""MX plans: a problem goes in; the kernel, its grid, arguments, constexprs and options come out.

Each ``plan_*`` takes the operands of one kernel (torch tensors from the function API in
``api.py``, or ``TensorSpec``s from the static model in ``model.py``, which compiles the same
launches without data), the element formats and the config (None: the shipped one of
``table``'s table, ``configs.select``), and returns the ``launch.Launch``. The problem's
sizes are read from the operands' shapes, so each kernel's call is written once, here.
"""

from __future__ import annotations

from flydsl_core import cdiv

from ..gemm.kernels import RAGGED_M
from ..gemm.plan import persistent_grid, target_xcds
from ..launch import Launch
from . import configs
from .formats import BLOCK, dequant_constexprs, elem_format, quant_constexprs
from .kernels import KERNELS


def plan_quantize(x, q, s, elem, *, config=None, table=None) -> Launch:
    """``mx_quantize`` of ``x`` ``(M, K)`` into ``q`` ``(M, K / epb)`` bytes and ``s``
    ``(M, K / 32)`` scale bytes; one program per (``R`` rows, ``NB`` 32-blocks)."""
    m, k = x.shape
    cfg = config or configs.select("quant", m, k, target=table)
    grid = (cdiv(m, cfg.R), cdiv(k // BLOCK, cfg.NB))
    cx = {"K": k, **cfg.constexprs(), **quant_constexprs(elem_format(elem))}
    return Launch(KERNELS["quantize"], grid, (x, q, s), cx, cfg.options())


def plan_dequantize(q, s, y, elem, *, config=None, table=None) -> Launch:
    """``mx_dequantize`` of ``q`` ``(M, K / epb)`` bytes and ``s`` ``(M, K / 32)`` scale bytes
    into ``y`` ``(M, K)``; the quantizer's tiling."""
    m, k = y.shape
    cfg = config or configs.select("dequant", m, k, target=table)
    grid = (cdiv(m, cfg.R), cdiv(k // BLOCK, cfg.NB))
    cx = {**cfg.constexprs(), **dequant_constexprs(elem_format(elem))}
    return Launch(KERNELS["dequantize"], grid, (q, s, y), cx, cfg.options())


def plan_gemm(a, sa, b, sb, bias, c, a_format, b_format, *, config=None, table=None) -> Launch:
    """``mx_gemm_nt``: ``c`` ``(M, N)`` from ``a`` ``(M, K / epb)``, ``b`` ``(N, K / epb)`` (NT)
    and their ``(rows, K / 32)`` scale bytes; ``bias`` ``(N,)`` or None. One (BM, BN) tile per
    program."""
    fa, fb = elem_format(a_format), elem_format(b_format)
    m, n = c.shape
    k = a.shape[-1] * fa.per_byte
    cfg = config or configs.m_choice("gemm", n, k, fa.name, fb.name, target=table).choose(m).config
    grid = (cdiv(m, cfg.BM), cdiv(n, cfg.BN))
    cx = {"FA": fa.name, "FB": fb.name, **cfg.constexprs()}
    return Launch(KERNELS["gemm"], grid, (a, sa, b, sb, bias, c, k), cx, cfg.options())


def plan_grouped(
    a,
    sa,
    b,
    sb,
    out,
    offs,
    bias,
    a_format,
    b_format,
    ragged,
    *,
    config=None,
    target=None,
    table=None,
) -> Launch:
    """``mx_grouped_gemm_nt``, one persistent launch over every group: ``a`` ``(1 or G, M,
    K / epb)``, ``b`` ``(1 or G, N, K / epb)`` (NT), their scale bytes ``(..., rows, K / 32)``,
    ``out`` ``(1 or G, M, N)``, ``offs`` the int32 group ends (None: batched), ``bias``
    ``(G, N)`` or None; ``ragged`` a ``gemm.kernels.RAGGED_*`` form. ``config`` None takes the
    tile of the rows a group has on average (ragged M) or of M. ``target`` is the launch's
    (its XCDs and CUs size the grid; None: ``table``'s)."""
    fa, fb = elem_format(a_format), elem_format(b_format)
    m, n, k = a.shape[-2], b.shape[-2], a.shape[-1] * fa.per_byte
    G = offs.shape[0] if offs is not None else b.shape[0]
    cfg = config
    if cfg is None:  # (a captured call passes its config: no size is compared then)
        groups = G if ragged == RAGGED_M else 0  # the tile follows the rows per group
        choice = configs.m_choice("grouped", n, k, groups, fa.name, fb.name, target=table)
        cfg = choice.choose(m).config
    programs, gb = persistent_grid(ragged, G, m, n, cfg.BM, cfg.BN, target if target else table)
    cx = dict(
        FA=fa.name,
        FB=fb.name,
        GB=gb,
        RAGGED=ragged,
        HAS_BIAS=bias is not None,
        XCDS=target_xcds(target if target else table),
        **cfg.constexprs(),
    )
    args = (a, sa, b, sb, out, offs, bias, G, m, n, k)
    return Launch(KERNELS["grouped"], (programs,), args, cx, cfg.options())
