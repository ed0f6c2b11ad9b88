"""The kernel families as ``flydsl export`` groups (the ``flydsl_core.exports`` entry point).

One group per family (``FAMILIES``), one export case per report case (``cases.py``): its
launch is the one the case compiles, read by ``launch.recording()`` (the plan's own
``Launch``, with the line of the plan that built it, which gives the grid rule), so the
exported kernels are the report's kernels with each target's shipped config. Each group's
tuning tables come from ``tuning_table``: each family's ``configs.table(target)``.
"""

from __future__ import annotations

import functools
import importlib

from ._target import TUNED_TARGETS


def tuning_table(family: str, target: str) -> dict:
    """``family``'s shipped config tables for ``target`` (name -> entries): every family's
    ``configs.table(target)``, under the group names the export has always written."""
    configs = importlib.import_module(f"flydsl_kernels.{family}.configs")
    got = configs.table(target)
    if family in ("rmsnorm", "mx"):
        return got  # already named tables: rmsnorm's kinds, mx's "gemm" / "grouped"
    return {_TABLE_NAMES[family]: got}


#: the name each one-table family's table is exported under
_TABLE_NAMES = {"topk": "shipped", "gemm": "dense_and_grouped", "attention": "tiles"}


def _launches(case, target: str):
    from flydsl_core.export import ExportItem, grid_rule

    from .launch import recording

    with recording() as launches:
        case.compile(target)
    return [
        ExportItem(
            lc.kernel,
            tuple(lc.args),
            dict(lc.constexprs),
            dict(lc.options),
            tuple(lc.grid),
            grid_rule(*lc.origin) if hasattr(lc, "origin") else None,
        )
        for lc in launches
    ]


def _cases(family):
    from flydsl_core.export import ExportCase

    return [
        ExportCase(
            c.kernel,
            c.shape,
            functools.partial(_launches, c),
            config=c.config_for,
            notes=c.notes,
        )
        for c in family.cases()
    ]


def groups():
    """The export groups of every shipped family."""
    from flydsl_core.export import ExportGroup

    from . import families

    out = []
    for name, fam in families().items():
        out.append(
            ExportGroup(
                name,
                functools.partial(_cases, fam),
                tables=functools.partial(
                    lambda n: {t: tuning_table(n, t) for t in TUNED_TARGETS}, name
                ),
                description=fam.description or f"flydsl_kernels.{name}",
                provider="flydsl_kernels",
            )
        )
    return out
