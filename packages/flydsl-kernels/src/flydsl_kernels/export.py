"""The kernel families as ``flydsl export`` groups (the ``flydsl_core.exports`` entry point).

One group per family (``FAMILIES``), one export case per report case (``cases.py``): its
launch is the one the case compiles, read by ``launch.recording()`` (the plan's own
``Launch``, with the line of the plan that built it, which gives the grid rule), so the
exported kernels are the report's kernels with each target's shipped config. Each group's
tuning tables come from ``tuning_table``, the one place that knows each family's table
accessor.
"""

from __future__ import annotations

import functools

from ._target import TUNED_TARGETS


def tuning_table(family: str, target: str) -> dict:
    """``family``'s shipped config tables for ``target`` (name -> entries)."""
    if family == "rmsnorm":
        from .rmsnorm import configs

        return configs.tables(target)
    if family == "topk":
        from .topk import configs

        return {"shipped": {k: configs.shipped(k[0], k[1:], target) for k in configs.SHIPPED}}
    if family == "gemm":
        from .gemm import configs

        return {"dense_and_grouped": configs.shipped_table(target)}
    if family == "mx":
        from .mx import configs

        return {"gemm": configs.gemm_table(target), "grouped": configs.grouped_table(target)}
    if family == "attention":
        from .attention import configs

        return {"tiles": configs.table_for(target)}
    raise KeyError(f"no tuning table accessor for family {family!r}")


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
