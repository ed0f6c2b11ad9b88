"""TopK family: torch.topk and a fused MoE router, written in FlyDSL.

``topk(x, k, dim, largest, sorted, *, deterministic)`` follows torch.topk;
the kernels (``kernels.py``) and the rule choosing among them
(``configs.select``): ``topk_small`` (k <= 16, argmax rounds in registers),
``topk_sort`` (N <= 8192, one tile top-k), ``topk_radix`` (radix select,
one program per row) and ``radix_*_split`` (rows split over programs), with
``sort_tile`` / ``sort_runs`` + ``merge_pass`` sorting radix survivors.
``moe_router`` fuses scoring and selection for Qwen3-MoE, DeepSeek-V3 and
gpt-oss style routers.

Parts (the layout every family shares; docs/architecture.md): ``kernels``, ``plan`` (a
problem -> the launches), ``configs`` (the selection rule ``select`` and ``m_choice``, its
``Config``: the kernel and config chosen, and each target's table ``TABLES``), ``model`` (the
config spaces and the static model that chose the tables), ``api``, ``reference`` and the
report cases (``cases``: ``FAMILY``).
"""

from __future__ import annotations

from . import configs, kernels, model, plan, reference
from .api import moe_router, topk, topk_rows
from .cases import FAMILY
from .configs import Config, select
from .kernels import KERNELS

__all__ = [
    "FAMILY",
    "KERNELS",
    "Config",
    "configs",
    "kernels",
    "model",
    "moe_router",
    "plan",
    "reference",
    "select",
    "topk",
    "topk_rows",
]
