"""Where a family's kernel runs for given tensors, and which target's tables configure it.

The CPU/GPU distinction is flydsl-core's one rule (``targets.is_cpu_target``), names and
aliases resolve through its one registry, and a GPU tensor's target is the target of *its*
device (``targets.resolve_target(device=)``, through the one arch probe), so the families
never probe devices themselves; the only target a family names is the one its shipped tables
were tuned for (``configs.TARGET``). The rules the function APIs share:

* ``tensor_target(t, target)``: the target a launch compiles for;
* ``table_target(t, target)``: the name of the target whose shipped config table picks the
  launch's config. Every family ships one table per GPU target it is tuned for
  (``TUNED_TARGETS``; gfx950 is the tuned default); the CPU backends and any other target use
  the default table. ``compiler_options(options, target)`` then drops the options a target's
  compiler does not know (AMD's ``matrix_instr_nonkdim`` / ``kpack`` / ``waves_per_eu`` never
  reach the NVIDIA compiler, and the CPU backends take only ``num_warps``).
"""

from __future__ import annotations

import torch

from flydsl_core import settings
from flydsl_core.targets import get_target, is_cpu_target, lookup_target, resolve_target

__all__ = [
    "AMD_ONLY_OPTIONS",
    "DEFAULT_TABLE",
    "TUNED_TARGETS",
    "check_device",
    "check_target",
    "compiler_options",
    "is_cpu_target",
    "lane_factor",
    "num_cus",
    "resident_warps",
    "table_for",
    "table_target",
    "target_name",
    "tensor_target",
]

#: the targets with a shipped table in every family (the first is the default table)
TUNED_TARGETS = ("gfx950", "gfx942", "gfx1250", "sm90")
DEFAULT_TABLE = TUNED_TARGETS[0]
#: options only AMD's Triton backend takes (``HIPOptions``), and the core's AMD-only rewrites
#: of Triton's TTGIR and LLVM IR (``flydsl_core.backends.triton.stage_hook``)
AMD_ONLY_OPTIONS = frozenset(
    {
        "matrix_instr_nonkdim",
        "kpack",
        "waves_per_eu",
        "schedule_hint",
        "llvm_fn_attrs",
        "hoist_rsrc",
        "share_transposed_operands",
        "buffer_soffset",
        "split_buffer_offsets",
        "wait_tr_reads",
        "direct_lds",
    }
)

#: device index -> the target name of that GPU (an arch never changes under a process, and
#: the probe reads device properties: too slow for every launch)
_DEVICE_TARGETS: dict[int, str] = {}


def _device_target(device: torch.device) -> str:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    name = _DEVICE_TARGETS.get(idx)
    if name is None:
        name = resolve_target(device=idx).name
        _DEVICE_TARGETS[idx] = name
    return name


def tensor_target(t: torch.Tensor, target):
    """The target for a launch on ``t``: the explicit one, else the resolved default for CPU
    tensors (a GPU default is replaced by ``cpu-reference``), else for GPU tensors the target
    of the tensor's own device (``$FLYDSL_TARGET`` first, as ``resolve_target`` orders it)."""
    if target is not None:
        return target
    if t.device.type == "cpu":
        tg = resolve_target()
        return tg.name if not tg.is_gpu else "cpu-reference"
    return _device_target(t.device)


def target_name(target) -> str:
    """The canonical name of a target given as a name, an alias or a ``Target``."""
    return get_target(target).name


def table_target(t: torch.Tensor | None, target=None) -> str:
    """The target whose tables configure a launch on ``t``: the explicit ``target``, else
    ``$FLYDSL_TARGET`` where it names a GPU, else the GPU ``t`` lives on (cached per device);
    a CPU tensor or a CPU target reads the default table."""
    if target is None and t is not None and t.device.type != "cpu":
        env = settings.get("FLYDSL_TARGET")
        if env is not None and not is_cpu_target(env):
            return target_name(env)
        return _device_target(t.device)
    if target is None or is_cpu_target(target):
        return DEFAULT_TABLE
    return target_name(target)


def table_for(tables: dict, target) -> object:
    """``tables[target]`` for a tuned target, else the default table (``tables[DEFAULT_TABLE]``).
    ``target`` may be None (the default), a name, an alias or a ``Target``."""
    if target is None:
        return tables[DEFAULT_TABLE]
    return tables.get(target_name(target), tables[DEFAULT_TABLE])


def compiler_options(options: dict, target) -> dict:
    """``options`` less what ``target``'s compiler does not take: the CPU backends get
    ``num_warps`` only (they key compiles on nothing else), NVIDIA targets no AMD-only option.
    ``target`` None means the device's own GPU, whose kind is known only at launch: the caller
    resolves it with ``table_target`` first."""
    if target is None:
        return dict(options)
    tg = get_target(target)
    if not tg.is_gpu:
        return {k: v for k, v in options.items() if k == "num_warps"}
    if tg.is_amd:
        return dict(options)
    return {k: v for k, v in options.items() if k not in AMD_ONLY_OPTIONS}


def _table_gpu(target):
    """The GPU target whose facts size a launch: the target's own, the default table's for
    None and the CPU backends."""
    if target is None or is_cpu_target(target):
        return get_target(DEFAULT_TABLE)
    return get_target(target)


def num_cus(target) -> int:
    """Compute units (AMD) / SMs (NVIDIA) of a target's table: grids and split-K are sized by
    them; the CPU backends and None use the default target's."""
    return _table_gpu(target).num_cus or get_target(DEFAULT_TABLE).num_cus


def buffer_ops(target) -> bool:
    """Whether a target's table is an AMD one with buffer loads (32-bit offsets from a
    descriptor): the CPU backends and None answer for the default table."""
    return bool(_table_gpu(target).has_buffer_ops)


def lane_factor(target) -> int:
    """How many of the target's warps make one 64-lane CDNA wave: 1 on gfx950 / gfx942, 2 on
    the wave32 targets (sm90, gfx1250). A table derived from gfx950's at equal elements per
    lane multiplies ``num_warps`` by it."""
    return max(1, 64 // _table_gpu(target).warp_size)


def resident_warps(target) -> int:
    """Warps (waves) the whole GPU keeps resident at full occupancy: CUs x SIMDs x waves per
    SIMD on AMD, SMs x warps per SM on NVIDIA (the default target's on the CPU backends)."""
    tg = _table_gpu(target)
    r = tg.registers
    per_cu = r.max_warps_per_sm if tg.is_nvidia else r.simds_per_cu * r.max_waves_per_simd
    return tg.num_cus * per_cu


def check_target(device: str) -> str | None:
    """The target a report check on ``device`` uses: a CPU target for ``cpu`` (the reference
    backend) or a CPU target's name, None (the device's own) for a GPU device."""
    t = lookup_target(device)
    return t.name if t is not None and not t.is_gpu else None


def check_device(device: str) -> str:
    """The torch device a report check on ``device`` puts its tensors on."""
    return "cpu" if check_target(device) is not None else device
