"""flex_attention on FlyDSL: ``torch_flydsl.flex_attention`` (eager, differentiable).

    import torch_flydsl
    out = torch_flydsl.flex_attention(q, k, v, score_mod=alibi, block_mask=bm)

Same signature and results as ``torch.nn.attention.flex_attention.flex_attention``. Parts:
``_fx`` (mods -> FX graphs -> programs), ``_program`` (programs -> FlyDSL at kernel trace
time), ``_eager`` (the call: checks, kernels, fallback to torch's).
"""

from __future__ import annotations

from ._eager import STAT, flex_attention, translate_mods
from ._fx import Unsupported

__all__ = ["STAT", "Unsupported", "flex_attention", "translate_mods"]
