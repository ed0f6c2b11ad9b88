"""GEMM plans: a problem goes in; the kernels, grids, arguments, constexprs and options come out.

``plan_gemm`` takes a dense problem by its sizes (``M``, ``N``, ``K``, the batch, the epilogue,
the config and split-K; None: ``configs.select`` / ``configs.split_k`` on ``table``'s table)
and returns a ``GemmPlan`` whose ``launches(...)`` binds the operands: the dense kernel, or with
split-K the kernel into fp32 partials (``workspaces()``) and the fixed-order reduce.
``plan_swiglu`` returns the fused SwiGLU's launch and ``plan_grouped`` the persistent grouped
launch of given operands. Operands are torch
tensors (the function API, ``api.py``) or ``TensorSpec``s (the static model in ``model.py``,
the report cases and the compile tests compile the same launches without data), so each
kernel's call is written once, here. Sizes are combined with integer arithmetic only (and
``torch.sym_max`` / ``sym_min``), so the plans also run on the symbolic sizes of a captured call
(torch-flydsl's compile path) without guarding on them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flydsl_core import cdiv

from ..launch import Launch
from . import configs
from .configs import Config
from .kernels import BIAS_NONE, KERNELS, RAGGED_K, RAGGED_M, RAGGED_N, RAGGED_NONE

#: the split-K reduce kernel's tile (an elementwise pass over fp32 partials)
REDUCE_BM, REDUCE_BN = 32, 64


def target_xcds(target) -> int:
    """XCDs to remap the pid across: the launch target's XCD count (1 on the CPU backends)."""
    return configs.xcds(target)


def _options(cfg: Config, target, table) -> dict:
    """The config's options for the launch target (the table's target where the launch
    resolves the device's own): the MFMA options reach AMD compilers only."""
    return cfg.options(target if target is not None else table)


# -- dense -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmPlan:
    """The dense kernel(s) of one problem: ``gemm_kernel``, or with ``split_k > 1`` the kernel
    into fp32 partials and ``splitk_reduce_kernel``."""

    config: Config
    M: int
    N: int
    K: int
    batch: int
    split_k: int
    even_k: bool
    epilogue: dict  # HAS_ALPHA, BIAS (kernels.BIAS_*), ACT (kernels.ACTIVATIONS' code)
    xcds: int
    options: dict

    def workspaces(self) -> dict[str, tuple[tuple, torch.dtype]]:
        """``{name: (shape, dtype)}`` of the buffers ``launches`` takes besides the operands:
        the fp32 partials of split-K."""
        if self.split_k == 1:
            return {}
        return {"part": ((self.batch * self.split_k, self.M, self.N), torch.float32)}

    def launches(
        self, *, a, b, out, c=None, bias=None, residual=None, alpha=1.0, beta=0.0, part=None
    ) -> list[Launch]:
        """``a`` ``(batch, M, K)``, ``b`` ``(batch, K, N)`` (any strides; stride 0 broadcasts),
        ``out`` ``(batch, M, N)``; ``c`` / ``residual`` ``(batch, M, N)`` or None, ``bias``
        ``(N,)`` or ``(M,)`` (``epilogue["BIAS"]``) or None; ``part`` the split-K workspace."""
        cfg, s, M, N, K = self.config, self.split_k, self.M, self.N, self.K
        common = dict(
            BM=cfg.BM,
            BN=cfg.BN,
            BK=cfg.BK,
            GROUP_M=cfg.GROUP_M,
            XCDS=self.xcds,
            EVEN_K=self.even_k,
            SPLIT_K=s,
            STAGES=cfg.num_stages,
        )
        tiles = cdiv(M, cfg.BM) * cdiv(N, cfg.BN)
        if s == 1:
            args = (a, b, out, c, bias, residual, M, N, K, float(alpha), float(beta))
            cx = {**common, **self.epilogue}
            return [Launch(KERNELS["gemm"], (tiles, self.batch, 1), args, cx, self.options)]
        args = (a, b, part, None, None, None, M, N, K, 1.0, 0.0)
        cx = {**common, "HAS_ALPHA": False, "BIAS": BIAS_NONE, "ACT": 0}
        main = Launch(KERNELS["gemm"], (tiles, self.batch, s), args, cx, self.options)
        rt = cdiv(M, REDUCE_BM) * cdiv(N, REDUCE_BN)
        rargs = (part, out, c, bias, residual, M, N, float(alpha), float(beta))
        rcx = dict(BM=REDUCE_BM, BN=REDUCE_BN, SPLIT_K=s, **self.epilogue)
        return [main, Launch(KERNELS["splitk_reduce"], (rt, self.batch), rargs, rcx)]


def plan_gemm(
    M: int,
    N: int,
    K: int,
    batch: int = 1,
    *,
    alpha=1.0,
    bias_mode: int = BIAS_NONE,
    act: int = 0,
    config: Config | None = None,
    split_k: int | None = None,
    even_k: bool | None = None,
    target=None,
    table=None,
) -> GemmPlan:
    """The dense GEMM of ``batch`` ``(M, K) @ (K, N)`` products with the epilogue (``alpha``
    != 1, ``bias_mode`` a ``kernels.BIAS_*``, ``act`` an activation code): ``config`` /
    ``split_k`` None take ``table``'s selection and split-K rule; split-K is clamped to the K
    tiles. ``target`` is the launch's (its XCDs and compiler options); ``even_k`` None: K a
    multiple of the K tile."""
    if config is None:  # the function API's choice for M (a captured call passes both)
        cfg, s = configs.m_choice("dense", N, K, batch, table).choose(M)
    else:
        cfg, s = config, None
    if split_k is not None:
        s = split_k
    elif s is None:
        s = configs.split_k(cfg, M, N, K, batch, table)
    s = max(1, min(int(s), cdiv(K, cfg.BK))) if K else 1
    epi = dict(HAS_ALPHA=alpha != 1, BIAS=bias_mode, ACT=act)
    ek = K % cfg.BK == 0 if even_k is None else even_k
    return GemmPlan(
        cfg, M, N, K, batch, s, ek, epi, target_xcds(target), _options(cfg, target, table)
    )


def plan_swiglu(a, w_gate, w_up, out, *, config=None, even_k=None, target=None, table=None):
    """The fused SwiGLU's launch (``swiglu_kernel``): ``a`` ``(batch, M, K)``, ``w_gate`` /
    ``w_up`` ``(batch, K, N)`` (any strides; stride 0 broadcasts), ``out`` ``(batch, M, N)``.
    ``config`` None takes ``table``'s ``configs.select("swiglu", ...)``; ``target`` is the launch's
    (its XCDs and compiler options); ``even_k`` None: K a multiple of the K tile."""
    batch, M, K = a.shape
    N = w_gate.shape[-1]
    cfg = config or configs.m_choice("swiglu", N, K, batch, table).choose(M).config
    cx = dict(
        BM=cfg.BM,
        BN=cfg.BN,
        BK=cfg.BK,
        GROUP_M=cfg.GROUP_M,
        XCDS=target_xcds(target),
        EVEN_K=K % cfg.BK == 0 if even_k is None else even_k,
        STAGES=cfg.num_stages,
    )
    grid = (cdiv(M, cfg.BM) * cdiv(N, cfg.BN), batch, 1)
    args = (a, w_gate, w_up, out, M, N, K)
    return Launch(KERNELS["swiglu"], grid, args, cx, _options(cfg, target, table))


# -- grouped ---------------------------------------------------------------------------------------


def persistent_grid(ragged, G, M, N, BM, BN, target) -> tuple[int, int]:
    """``(programs, GB)`` of a persistent grouped launch (``kernels.group_schedule``).

    Programs: at most the tile count (an upper bound without reading
    ``offs``: every group may have a partial tail tile along the ragged
    dimension), at most a few per CU. ``GB``: the power of two >= ``G`` (>= 16)
    the kernel loads ``offs`` with.
    """
    tn = cdiv(N, BN) + (G if ragged == RAGGED_N else 0)
    tm = cdiv(M, BM) + (G if ragged == RAGGED_M else 0)
    tiles = tm * tn * (G if ragged in (RAGGED_NONE, RAGGED_K) else 1)
    # torch.sym_max / sym_min: plain max / min of ints, no guard on a symbolic size
    programs = torch.sym_max(1, torch.sym_min(tiles, configs.grouped_programs(target)))
    return programs, max(16, 1 << (G - 1).bit_length())


def plan_grouped(a, b, out, offs, bias, ragged, *, config=None, target=None, table=None):
    """The persistent grouped launch: ``a`` ``(1 or G, M, K)``, ``b`` ``(1 or G, K, N)`` (any
    strides), ``out`` ``(1 or G, M, N)``, ``offs`` the int32 group ends (None: batched, ``G``
    from ``a``), ``bias`` ``(G, N)`` or None, ``ragged`` a ``kernels.RAGGED_*`` form. ``config``
    None takes ``table``'s tile of the rows a group has on average (ragged M) or of M;
    ``target`` is the launch's (None: the table's sizes the grid)."""
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    G = offs.shape[0] if offs is not None else a.shape[0]
    cfg = config
    if cfg is None:  # (a captured call passes its config: no size is compared then)
        groups = G if ragged == RAGGED_M else 0  # the tile follows the rows per group
        cfg = configs.m_choice("grouped", N, K, groups, table).choose(M).config
    programs, gb = persistent_grid(ragged, G, M, N, cfg.BM, cfg.BN, target if target else table)
    cx = dict(
        BM=cfg.BM,
        BN=cfg.BN,
        BK=cfg.BK,
        GB=gb,
        RAGGED=ragged,
        EVEN_K=ragged != RAGGED_K and K % cfg.BK == 0,
        STAGES=cfg.num_stages,
        HAS_BIAS=bias is not None,
        XCDS=target_xcds(target),
        GROUP_M=cfg.GROUP_M,
    )
    args = (a, b, out, offs, bias, G, M, N, K)
    return Launch(KERNELS["grouped"], (programs,), args, cx, _options(cfg, target, table))
