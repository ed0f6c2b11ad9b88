"""The RMSNorm family: ``aten::_fused_rms_norm`` forward and backward, and residual add + RMSNorm.

    from flydsl_kernels.rmsnorm import rms_norm, rms_norm_backward, fused_add_rms_norm

    y, rstd = rms_norm(x, (N,), weight, eps)
    dx, dw = rms_norm_backward(grad_y, x, rstd, weight, deterministic=True)
    y, new_residual = fused_add_rms_norm(x, residual, weight, eps, llama_numerics=True)

Parts (the layout every family shares; docs/architecture.md): ``kernels`` (by row length:
several rows per program for short rows, one register-resident row per program for medium
rows, and a looped two-pass kernel for long rows; the backward has a register-resident kernel
and a two-kernel split for long rows, plus a fixed-order dweight reduction), ``plan`` (a
problem -> the launches), ``configs`` (the ``Config``, each target's shipped table
``TABLES``, ``select`` and ``m_choice``), ``model`` (the config spaces and the static model
that chose the tables, untimed), ``api``, ``reference`` and the report cases (``cases``).
"""

from __future__ import annotations

from . import configs, model, plan, reference
from .api import SUPPORTED_DTYPES, fused_add_rms_norm, rms_norm, rms_norm_backward
from .cases import FAMILY, TOLERANCE
from .kernels import KERNELS

__all__ = [
    "FAMILY",
    "KERNELS",
    "SUPPORTED_DTYPES",
    "TOLERANCE",
    "configs",
    "fused_add_rms_norm",
    "model",
    "plan",
    "reference",
    "rms_norm",
    "rms_norm_backward",
]
