"""Where a family's kernel runs for given tensors: the one rule the function APIs share."""

from __future__ import annotations

import torch


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
