"""The GEMM family: dense GEMM (``aten::mm`` / ``addmm`` / ``bmm`` / ``F.linear`` with fused
epilogues) and grouped GEMM (``torch._grouped_mm``).

    from flydsl_kernels.gemm import gemm, grouped_mm

    y = gemm(x, w.t(), bias=b, activation="silu")           # F.linear + SiLU, NT layout
    y = gemm(a, b, alpha=0.5, beta=1.0, c=c)                 # addmm
    y = grouped_mm(tokens, experts_w, offs)                  # MoE forward, ragged M
    h = swiglu(x, w_gate.t(), w_up.t())                       # silu(x @ Wg^T) * (x @ Wu^T)

Kernels (kernels.py): one dense kernel for every layout (unit strides are
compile-time facts), with grouped pid ordering, an XCD remap and split-K
(fp32 partials + a fixed-order reduce); one persistent grouped kernel for
all four ``_grouped_mm`` forms; one fused SwiGLU kernel (two GEMMs sharing
the A operand, ``silu(gate) * up`` in registers). configs.py holds the shipped tiles and the
selection rules; model.py the config spaces and the static model that chose the tiles
(untimed: no gfx950 here).

Parts (the layout every family shares; docs/architecture.md): ``kernels``, ``plan`` (a
problem -> the launches), ``configs`` (``Config``, per-target tables ``TABLES``, ``select``
and ``m_choice``), ``model`` (config spaces, the static model), ``api``, ``reference`` and the
report cases (``cases``).
"""

from __future__ import annotations

from . import configs, model, plan, reference
from .api import SUPPORTED_DTYPES, SUPPORTED_OUT_DTYPES, gemm, grouped_mm, swiglu
from .cases import FAMILY, TOLERANCE
from .kernels import KERNELS

__all__ = [
    "FAMILY",
    "KERNELS",
    "SUPPORTED_DTYPES",
    "SUPPORTED_OUT_DTYPES",
    "TOLERANCE",
    "configs",
    "gemm",
    "grouped_mm",
    "model",
    "plan",
    "reference",
    "swiglu",
]
