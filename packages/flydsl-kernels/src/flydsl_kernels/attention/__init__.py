"""The attention family: flash-attn's API (forward, backward, varlen, paged KV-cache decode) in
FlyDSL, with sinks, ALiBi, softcap, sliding windows and FlyDSL score / mask mods.

    from flydsl_kernels.attention import flash_attn_func, flash_attn_varlen_func
    from flydsl_kernels.attention import flash_attn_with_kvcache

Parts: ``plan`` (problem -> kernels, grids, constexprs, options), ``kernels`` (``forward``,
``decode``, ``backward``, ``common``), ``configs`` (``Config``, per-target tables ``TABLES``,
``select``, the schedule rules), ``model`` (config spaces and the static model that chose the
tables), ``api``, ``validate`` (the checks of the API's operands, numbers and index tensors),
``sparse`` (``BlockSparse``: torch's ``BlockMask`` lists, and their checks),
``reference``, ``mods``, ``mod_grads`` (the gradients of the tensors a score mod reads:
torch-flydsl's flex_attention backward), and the report cases (``cases``).
"""

from __future__ import annotations

from . import configs, mod_grads, model, mods, plan, reference, sparse, validate
from .api import (
    MAX_HEAD_DIM,
    SUPPORTED_DTYPES,
    BlockSparse,
    flash_attn_backward,
    flash_attn_func,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
)
from .cases import FAMILY, TOLERANCE
from .kernels import KERNELS
from .mods import MaskMod, ScoreMod

__all__ = [
    "FAMILY",
    "KERNELS",
    "MAX_HEAD_DIM",
    "SUPPORTED_DTYPES",
    "TOLERANCE",
    "BlockSparse",
    "MaskMod",
    "ScoreMod",
    "configs",
    "flash_attn_backward",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "mod_grads",
    "model",
    "mods",
    "plan",
    "reference",
    "sparse",
    "validate",
]
