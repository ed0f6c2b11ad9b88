"""RMSNorm plans: a problem goes in; the kernels, grids, arguments, constexprs and options come out.

``plan_forward`` / ``plan_backward`` take a problem by its sizes (rows ``M`` of ``N``
elements, the dtype, the row strides, the numerics ``mode``), the config (None: the shipped
one of ``table``'s table: ``configs.m_choice`` / ``select``) and return a plan whose ``launches(...)`` binds
the operands into ``launch.Launch``es. Operands are the kernels' (``kernels.py``): 1-D flat
views of each row operand's storage (``api._flat``), or ``TensorSpec``s to compile without
data (``model.model_launch``: what the static model, the compile tests and the report
compile). The function API, the static model (``model.py``) and ``cases`` all go through here,
so they launch the same kernels with the same arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

from flydsl_core import cdiv

from ..launch import Launch
from . import configs
from .configs import Config
from .kernels import KERNELS, MODE_ATEN

# -- forward ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForwardPlan:
    """The forward kernel of one problem: ``launches`` binds its operands."""

    config: Config
    M: int
    N: int
    SX: int  # x's row stride
    SR: int  # the residual's row stride (0: no residual)
    mode: int  # kernels.MODE_*
    eps: float
    nbytes: int  # bytes per element of x

    def launches(self, *, x, res, w, y, res_out, rstd) -> list[Launch]:
        """``x`` (and ``res``) flat row storage, ``w`` ``(N,)`` or None, ``y`` / ``res_out`` flat
        contiguous outputs (``res_out`` None without a residual), ``rstd`` ``(M,)`` fp32 or None."""
        cfg, n = self.config, self.N
        flat = (x, res, w, y, res_out, rstd)
        cx = {"N": n, "MODE": self.mode, **cfg.constexprs()}
        opts = cfg.options()
        kern = KERNELS[cfg.kernel]
        if cfg.kernel == "fwd_rows":
            args = (*flat, self.M, float(self.eps))
            grid = (cdiv(self.M, cfg.R),)
            return [Launch(kern, grid, args, {**cx, "SX": self.SX, "SR": self.SR}, opts)]
        if cfg.kernel == "fwd_row":
            stride, const = configs.row_stride_args(self.SX, self.SR, n, self.nbytes)
            return [
                Launch(kern, (self.M,), (*flat, stride, float(self.eps)), {**cx, **const}, opts)
            ]
        return [
            Launch(
                kern,
                (self.M,),
                (*flat, float(self.eps)),
                {**cx, "SX": self.SX, "SR": self.SR},
                opts,
            )
        ]


def plan_forward(
    M: int,
    N: int,
    dtype,
    *,
    SX: int | None = None,
    SR: int = 0,
    mode: int = MODE_ATEN,
    eps: float = 1e-6,
    config: Config | None = None,
    table=None,
) -> ForwardPlan:
    """The forward of ``M`` rows of ``N`` elements of ``dtype`` (row strides ``SX``, default
    ``N``, and ``SR``, 0 without a residual); ``config`` None takes ``table``'s shipped one."""
    cfg = config or configs.m_choice("fwd", N, dtype, table).choose(M).config
    sx = N if SX is None else SX
    return ForwardPlan(cfg, M, N, sx, SR, mode, float(eps), configs.elem_bytes(dtype))


# -- backward --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BackwardPlan:
    """The backward kernels of one problem: ``bwd_rows``, or ``bwd_rowdot`` + ``bwd_cols``,
    then (deterministic dweight) ``dw_reduce`` over ``programs`` fp32 partial rows."""

    kernels: tuple[Config, ...]  # (bwd_rows,) or (bwd_rowdot, bwd_cols)
    reduce: Config  # dw_reduce
    M: int
    N: int
    SG: int
    SX: int
    grid: tuple  # the main kernel's: (programs,) or (column blocks, programs)
    chunk: int  # rows per program

    @property
    def programs(self) -> int:
        """Programs along the rows: the partial dweight rows of the deterministic reduction."""
        return self.grid[-1]

    def launches(self, *, g, x, rstd, w, dx, part=None, acc=None, coef=None, dw=None):
        """``g`` / ``x`` flat row storage, ``rstd`` ``(M,)`` fp32, ``w`` the weight where it enters
        ``dx`` (else None), ``dx`` flat output or None; dweight either into ``part`` (``programs x
        N`` fp32, then reduced into ``dw``) or atomically into ``acc`` (``N`` fp32). ``coef``
        (``M`` fp32): the row dots of the split kernels, computed only where given (for ``dx``)."""
        rows = dict(M=self.M, N=self.N, SG=self.SG, SX=self.SX)
        out = []
        if self.kernels[0].kernel == "bwd_rows":
            out.append(
                bwd_rows_launch(
                    self.kernels[0],
                    self.grid,
                    self.chunk,
                    g=g,
                    x=x,
                    rstd=rstd,
                    w=w,
                    dx=dx,
                    part=part,
                    acc=acc,
                    **rows,
                )
            )
        else:
            if coef is not None:
                out.append(
                    bwd_rowdot_launch(self.kernels[0], g=g, x=x, rstd=rstd, w=w, coef=coef, **rows)
                )
            out.append(
                bwd_cols_launch(
                    self.kernels[1],
                    self.grid,
                    self.chunk,
                    g=g,
                    x=x,
                    rstd=rstd,
                    coef=coef,
                    w=w,
                    dx=dx,
                    part=part,
                    acc=acc,
                    **rows,
                )
            )
        if dw is not None and part is not None:
            out.append(dw_reduce_launch(self.reduce, part=part, dw=dw, P=self.programs, N=self.N))
        return out


def plan_backward(
    M: int,
    N: int,
    dtype,
    *,
    SG: int | None = None,
    SX: int | None = None,
    config=None,
    table=None,
) -> BackwardPlan:
    """The backward of ``M`` rows of ``N`` elements (row strides ``SG`` of ``grad_y``, ``SX`` of
    ``x``, default ``N``). ``config``: ``(bwd_rows,)`` or ``(bwd_rowdot, bwd_cols)`` configs,
    optionally followed by a ``dw_reduce`` one; None takes ``table``'s shipped ones. The grid
    has at most a few programs per CU (``configs.backward_programs`` / ``cols_programs``)."""
    cfgs = tuple(config) if config else configs.select("bwd", N, dtype, target=table)
    red = cfgs[-1]
    if red.kernel != "dw_reduce":
        red = configs.select("dw_reduce", N, dtype, target=table)
    kerns = cfgs[:-1] if cfgs[-1].kernel == "dw_reduce" else cfgs
    if kerns[0].kernel == "bwd_rows":
        p, chunk = configs.backward_programs(M, kerns[0].R, table)
        grid = (p,)
    else:
        nb, p, chunk = configs.cols_programs(M, N, kerns[1].BLOCK, table)
        grid = (nb, p)
    sg, sx = N if SG is None else SG, N if SX is None else SX
    return BackwardPlan(kerns, red, M, N, sg, sx, grid, chunk)


def bwd_rows_launch(
    cfg: Config, grid, chunk, *, g, x, rstd, w, dx, part, acc, M, N, SG, SX
) -> Launch:
    """``bwd_rows``: whole rows in registers, ``chunk`` rows per program."""
    args = (g, x, rstd, w, dx, part, acc, M, chunk)
    cx = {"N": N, "SG": SG, "SX": SX, **cfg.constexprs()}
    return Launch(KERNELS["bwd_rows"], grid, args, cx, cfg.options())


def bwd_rowdot_launch(cfg: Config, *, g, x, rstd, w, coef, M, N, SG, SX) -> Launch:
    """``bwd_rowdot``: each row's ``sum(xhat * grad_y * w) / N`` into ``coef``."""
    cx = {"N": N, "SG": SG, "SX": SX, **cfg.constexprs()}
    return Launch(KERNELS["bwd_rowdot"], (M,), (g, x, rstd, w, coef), cx, cfg.options())


def bwd_cols_launch(
    cfg: Config, grid, chunk, *, g, x, rstd, coef, w, dx, part, acc, M, N, SG, SX
) -> Launch:
    """``bwd_cols``: dx and the dweight partials on a (column blocks, row chunks) grid."""
    args = (g, x, rstd, coef, w, dx, part, acc, M, chunk)
    cx = {"N": N, "SG": SG, "SX": SX, **cfg.constexprs()}
    return Launch(KERNELS["bwd_cols"], grid, args, cx, cfg.options())


def dw_reduce_launch(cfg: Config, *, part, dw, P: int, N: int) -> Launch:
    """The fixed-order sum of ``P`` fp32 partial rows of ``N`` (``part``) into ``dw``."""
    return Launch(
        KERNELS["dw_reduce"],
        (cdiv(N, cfg.BLOCK),),
        (part, dw, P),
        {"N": N, **cfg.constexprs()},
        cfg.options(),
    )
