"""flex_attention on FlyDSL: ``torch_flydsl.flex_attention`` (eager, differentiable) and the
HOP rewrite under ``torch.compile(backend="flydsl")``.

    import torch_flydsl
    out = torch_flydsl.flex_attention(q, k, v, score_mod=alibi, block_mask=bm)

Same signature and results as ``torch.nn.attention.flex_attention.flex_attention``. Parts:
``translate`` (FX graphs -> ``program.Program``, the one representation of a mod), ``program``
(running a program on FlyDSL tiles or torch tensors), ``mods`` (captures, derived gradient
programs, kernel mod objects and their caches), ``bounds`` (index checks), ``blocks``
(BlockMask normalization), ``run`` (the kernels of a call), ``call`` (the eager entry point),
``compile`` (the HOP rewrite and its ``flydsl::`` ops).
"""

from __future__ import annotations

from .call import STAT, flex_attention
from .translate import Unsupported

__all__ = ["STAT", "Unsupported", "flex_attention"]
