"""Where a family's kernel runs for given tensors, and which target's tables configure it.

Two rules the function APIs share:

* ``tensor_target(t, target)``: the target a launch compiles for (None: the backend resolves
  the GPU's own arch at launch);
* ``table_target(t, target)``: the name of the target whose shipped config table picks the
  launch's config. Every family ships one table per GPU target it is tuned for
  (``TUNED_TARGETS``; gfx950 is the tuned default); the CPU backends and any other target use
  the default table. ``compiler_options(options, target)`` then drops the options a target's
  compiler does not know (AMD's ``matrix_instr_nonkdim`` / ``kpack`` / ``waves_per_eu`` never
  reach the NVIDIA compiler, and the CPU backends take only ``num_warps``).
"""

from __future__ import annotations

import os

import torch

#: the targets with a shipped table in every family (the first is the default table)
TUNED_TARGETS = ("gfx950", "gfx942", "gfx1250", "sm90")
DEFAULT_TABLE = TUNED_TARGETS[0]
#: options only AMD's Triton backend takes (``HIPOptions``)
AMD_ONLY_OPTIONS = frozenset({"matrix_instr_nonkdim", "kpack", "waves_per_eu", "schedule_hint"})
_CPU_NAMES = frozenset({"cpu", "cpu-reference", "cpu-interpret", "reference", "ref", "cpu-ref"})


def tensor_target(t: torch.Tensor, target):
    """``target`` if given; for CPU tensors the resolved target (``FLYDSL_TARGET`` may pick
    ``cpu-interpret``), falling back to the reference backend where it names a GPU; for GPU
    tensors None (the backend resolves the device's own arch)."""
    if target is not None:
        return target
    if t.device.type == "cpu":
        from flydsl_core.targets import resolve_target

        tg = resolve_target()
        return tg.name if not tg.is_gpu else "cpu-reference"
    return None


#: device index -> the target name of that GPU (an arch never changes under a process)
_DEVICE_TARGETS: dict[int, str] = {}


def _device_target(device: torch.device) -> str:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    name = _DEVICE_TARGETS.get(idx)
    if name is None:
        from flydsl_core.targets import resolve_target

        with torch.cuda.device(idx):
            name = resolve_target().name
        _DEVICE_TARGETS[idx] = name
    return name


def target_name(target) -> str:
    """The canonical name of a target given as a name, an alias or a ``Target``."""
    name = getattr(target, "name", target)
    if name in _CPU_NAMES:
        return "cpu-reference" if name != "cpu-interpret" else name
    from flydsl_core.targets import get_target

    return get_target(name).name


def table_target(t: torch.Tensor | None, target=None) -> str:
    """The target whose tables configure a launch on ``t``: the explicit ``target``, else
    ``$FLYDSL_TARGET`` where it names a GPU, else the GPU ``t`` lives on (cached per device);
    a CPU tensor or a CPU target reads the default table. Always one of ``TUNED_TARGETS`` or a
    GPU target name (whose family tables fall back to the default)."""
    if target is None and t is not None and t.device.type != "cpu":
        env = os.environ.get("FLYDSL_TARGET", "").strip()
        return target_name(env) if env and env not in _CPU_NAMES else _device_target(t.device)
    if target is None:
        return DEFAULT_TABLE
    name = target_name(target)
    return DEFAULT_TABLE if name in ("cpu-reference", "cpu-interpret") else name


def table_for(tables: dict, target) -> object:
    """``tables[target]`` for a tuned target, else the default table (``tables[DEFAULT_TABLE]``).
    ``target`` may be None (the default), a name, an alias or a ``Target``."""
    if target is None:
        return tables[DEFAULT_TABLE]
    name = target_name(target)
    return tables.get(name, tables[DEFAULT_TABLE])


def compiler_options(options: dict, target) -> dict:
    """``options`` less what ``target``'s compiler does not take: the CPU backends get
    ``num_warps`` only (they key compiles on nothing else), NVIDIA targets no AMD-only option.
    ``target`` None means the device's own GPU, whose kind is known only at launch: the caller
    resolves it with ``table_target`` first."""
    if target is None:
        return dict(options)
    name = getattr(target, "name", target)
    if name in _CPU_NAMES:
        return {k: v for k, v in options.items() if k == "num_warps"}
    from flydsl_core.targets import get_target

    if get_target(name).is_amd:
        return dict(options)
    return {k: v for k, v in options.items() if k not in AMD_ONLY_OPTIONS}


def num_cus(target) -> int:
    """Compute units (AMD) / SMs (NVIDIA) of a target's table: grids and split-K are sized by
    them; the CPU backends and None use the default target's."""
    from flydsl_core.targets import get_target

    name = DEFAULT_TABLE if target is None else target_name(target)
    if name in ("cpu-reference", "cpu-interpret"):
        name = DEFAULT_TABLE
    return get_target(name).num_cus or get_target(DEFAULT_TABLE).num_cus


def lane_factor(target) -> int:
    """How many of the target's warps make one 64-lane CDNA wave: 1 on gfx950 / gfx942, 2 on
    the wave32 targets (sm90, gfx1250). A table derived from gfx950's at equal elements per
    lane multiplies ``num_warps`` by it."""
    from flydsl_core.targets import get_target

    name = DEFAULT_TABLE if target is None else target_name(target)
    tg = get_target(name)
    return max(1, 64 // tg.warp_size) if tg.is_gpu else 1


def resident_warps(target) -> int:
    """Warps (waves) the whole GPU keeps resident at full occupancy: CUs x SIMDs x waves per
    SIMD on AMD, SMs x warps per SM on NVIDIA (the default target's on the CPU backends)."""
    from flydsl_core.targets import get_target

    name = DEFAULT_TABLE if target is None else target_name(target)
    tg = get_target(name)
    if not tg.is_gpu:
        tg = get_target(DEFAULT_TABLE)
    r = tg.registers
    per_cu = r.max_warps_per_sm if tg.is_nvidia else r.simds_per_cu * r.max_waves_per_simd
    return tg.num_cus * per_cu
