"""Where a family's kernel runs: the rules the function APIs and the report checks share.

The CPU/GPU distinction is flydsl-core's one rule (``targets.is_cpu_target``),
and a GPU tensor's target is the target of *its* device
(``targets.resolve_target(device=)``, through the one arch probe), so the
families never name targets or probe devices themselves.
"""

from __future__ import annotations

import torch

from flydsl_core.targets import is_cpu_target, lookup_target, resolve_target

__all__ = ["check_device", "check_target", "is_cpu_target", "kernel_options", "tensor_target"]


def tensor_target(t: torch.Tensor, target):
    """``target`` if given; for CPU tensors the resolved target (``FLYDSL_TARGET`` may pick
    ``cpu-interpret``), falling back to the reference backend where it names a GPU; for GPU
    tensors the target of the tensor's own device."""
    if target is not None:
        return target
    if t.device.type == "cpu":
        tg = resolve_target()
        return tg.name if not tg.is_gpu else "cpu-reference"
    return resolve_target(device=t.device.index).name


def kernel_options(target, gpu_options: dict, num_warps: int) -> dict:
    """Launch options: the GPU ones, or only ``num_warps`` on a CPU target (the AMD MFMA
    options mean nothing to the CPU backends)."""
    if target is not None and is_cpu_target(target):
        return {"num_warps": num_warps}
    return gpu_options


def check_target(device: str) -> str | None:
    """The target a report check on ``device`` uses: a CPU target for ``cpu`` (the reference
    backend) or a CPU target's name, None (the device's own) for a GPU device."""
    t = lookup_target(device)
    return t.name if t is not None and not t.is_gpu else None


def check_device(device: str) -> str:
    """The torch device a report check on ``device`` puts its tensors on."""
    return "cpu" if check_target(device) is not None else device
