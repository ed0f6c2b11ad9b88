"""A traced mod's tile fitted to the registers of the target it runs on, at its first launch.

The tables' changes for traced score and mask mods (``configs.TRACED_TILES`` and the window and
page tables on top) were searched with three probe mods (``model.MOD_PROBES``: a table gather,
ALiBi's arithmetic, a document mask). A user's mod may hold more registers than any of them: a
softcap over a learned bias and an ALiBi slope, say, spilled SGPRs on gfx950's dK/dV d128 and
169 VGPRs (372 B of scratch) on gfx1250's dK/dV d192 with the plans' tiles. So before a traced
kernel of a GPU target first runs, ``traced_tile`` compiles the plan's tile (the compile the
launch makes anyway) and, where it falls short of the tables' bar (``model.shortfall``: spills,
scratch, fewer than the entry's waves per SIMD), runs the static model's mod search
(``model.mod_best``: the single changes, then pairs of the six nearest the bar) on the
caller's own kernel and takes the change that compiles clean with the fewest loop instructions
per useful MFMA (NVIDIA: the most warps per SM). The pick is kept per process; the candidates'
compiles sit in the compile cache, so a new process repeats the choice from the cache.

CPU backends (the reference, the Triton interpreter) report no registers: nothing to fit. A
tile the caller set (``config=``, ``dkdv_config=``, ``dq_config=``) is used as given, and
``FLYDSL_ATTN_FIT=0`` launches the plan's tile unchecked.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from flydsl_core import settings
from flydsl_core.targets import get_target

from .. import variables  # noqa: F401  (declares FLYDSL_ATTN_FIT)
from ..launch import is_recording
from . import configs

logger = logging.getLogger(__name__)

#: the tile ``traced_tile`` settled on, by ``(kind, target name, plan's tile, the launch's
#: signature)``: the compiled kernel's identity (``_signature``), not the problem's sizes (a
#: decode step's growing context is no new key; a new split count is); the oldest goes past
#: ``MAX_FITTED``
_FITTED: dict = {}
MAX_FITTED = 4096

#: combination sizes of the model's changes tried at a launch: singles, then pairs of the six
#: nearest the bar (the offline search's triples would add up to 20 compiles to a first call)
SIZES = (1, 2)


def _signature(launch) -> tuple:
    """What a launch's kernel compiles from: its constexprs (the mods among them), options and
    argument dtypes (an fp32 and a bf16 problem share a tile and constexprs)."""
    dtypes = tuple(str(getattr(a, "dtype", type(a).__name__)) for a in launch.args)
    return (*sorted(launch.constexprs.items()), *sorted(launch.options.items()), dtypes)


def fits(target) -> bool:
    """Whether a traced kernel for ``target`` (a name, an alias or a ``Target``) is fitted:
    a GPU target's, whose compiles report registers (not the CPU backends'), unless
    ``FLYDSL_ATTN_FIT=0`` or ``launch.recording()`` is on (it compiles nothing)."""
    gpu = get_target(target).backend in ("hip", "cuda")
    return gpu and not is_recording() and settings.get("FLYDSL_ATTN_FIT")


def traced_tile(kind: str, p, target, tile: configs.Config, launch, compile_with) -> configs.Config:
    """The tile a traced mod's ``kind`` kernel (``fwd``, ``decode``, ``bwd_dkdv``, ``bwd_dq``)
    runs with at problem ``p`` on ``target`` (one that ``fits``): the plan's ``tile``
    where it compiles clean, else it with the model's change (see the module doc); the plan's
    tile, with a warning, where no change compiles clean. ``compile_with(config)`` compiles
    the caller's kernel with ``config`` in place of the plan's tile; ``launch`` is the plan's
    (``launch.Launch``), whose kernel the pick is kept for."""
    name = get_target(target).name
    key = (kind, name, tile, _signature(launch))
    if key in _FITTED:
        return _FITTED[key]
    from . import model  # the static model's rules; imported at a traced kernel's first launch

    dcls = configs.dclass(p.head_dim, p.head_dim_v)
    compiles = []

    def compiled(_p, _spec, c):
        compiles.append(c)
        return compile_with(c)

    change = model.mod_best(
        kind, dcls, name, p.dtype == "fp32", [("traced", p, None, tile)], logger.debug,
        compile_with=compiled, sizes=SIZES,
    )  # fmt: skip
    if change is None:
        logger.warning(
            "flydsl attention: the traced mod's %s kernel spills or loses waves on %s with "
            "%s, and none of the %d tiles the model tried compiles clean; running it as planned",
            kind,
            name,
            tile.as_dict(),
            len(compiles) - 1,
        )
        out = tile
    elif not change:  # clean as planned
        out = tile
    else:
        out = replace(tile, notes={}, **change)
        logger.info(
            "flydsl attention: the traced mod's %s kernel on %s takes %s (the plan's tile "
            "fell short; %d compiles)",
            kind,
            name,
            change,
            len(compiles),
        )
    if len(_FITTED) >= MAX_FITTED:
        _FITTED.pop(next(iter(_FITTED)))
    _FITTED[key] = out
    return out
