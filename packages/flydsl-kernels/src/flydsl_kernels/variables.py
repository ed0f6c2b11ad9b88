"""flydsl-kernels' ``FLYDSL_*`` environment variables (``flydsl_core.settings.declare``).

Listed by ``flydsl settings`` through the ``flydsl.settings`` entry point (pyproject.toml),
which loads this module on its own: it imports nothing but ``flydsl_core.settings``.
"""

from __future__ import annotations

from flydsl_core.settings import Var, declare

VARIABLES = declare(
    "flydsl-kernels",
    Var(
        "FLYDSL_ATTN_FIT",
        "flag",
        "0: launch a traced attention mod's planned tile on a GPU as it is, without "
        "recompiling it with the static model's changes where it spills (attention/fit.py)",
        True,
    ),
)
