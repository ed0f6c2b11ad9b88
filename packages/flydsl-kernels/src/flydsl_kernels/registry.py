"""What every kernel family declares, so the report and benchmarks can iterate them.

A family module (``flydsl_kernels.<family>``) exposes ``FAMILY``, a
``Family`` whose ``cases()`` yields ``ReportCase``s: one per shipped kernel
and default config, each able to

* ``config``: the shipped config, a dict or ``config(target) -> dict`` where each
  target has its own table (``_target.TUNED_TARGETS``);
* ``compile(target)``: compile its kernel with ``target``'s config for ``target``
  (no GPU needed) and return the ``CompiledKernel`` (the report reads its
  resource report);
* ``check(device, target=None)``: run the family's function API on fresh random
  inputs on ``device`` and return the largest error against the PyTorch
  reference, normalized so that <= 1 means within the stated tolerance. On a
  CPU device the kernels run with ``target``'s config (None: the default
  table), so every target's tiles are checked without its GPU; on a GPU the API
  picks the device's own table, as a user's call does;
* ``aten(device)``: optionally, a callable timing the ATen op on the same
  inputs, for speedups where a GPU is present; ``baseline(device)`` names
  what it times where that is not simply "the ATen op" (e.g. a fallback);
* ``flops`` / ``bytes``: the work of one ``run`` (floating-point operations,
  and the fewest bytes it must move through device memory), for achieved
  TFLOP/s and bandwidth against the device's peaks;
* ``emulated(target)``: why the target only emulates the op (e.g. no MX
  matrix instructions), or None where it runs natively.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ReportCase:
    family: str
    kernel: str  # the FlyDSL kernel's name
    shape: str  # human-readable problem shape, e.g. "4096x8192 bf16"
    # constexprs and launch options of the shipped default (per target: a function of it)
    config: dict[str, Any] | Callable[[str], dict[str, Any]]
    compile: Callable[[str], Any]  # target name -> CompiledKernel
    check: Callable[..., float]  # (device, target=None) -> normalized max error (<= 1 passes)
    run: Callable[[str], Callable[[], Any]] | None = None  # device -> a thunk launching ours
    aten: Callable[[str], Callable[[], Any]] | None = None  # device -> a thunk launching ATen's
    baseline: Callable[[str], str] | None = None  # device -> what aten(device) runs (a label)
    notes: str = ""
    flops: float | None = None  # floating-point operations of one run
    bytes: float | None = None  # the fewest bytes one run moves through device memory
    emulated: Callable[[str], str | None] | None = None  # target -> why it is emulated, or None

    def config_for(self, target: str) -> dict[str, Any]:
        """The shipped config of ``target``'s table."""
        return self.config(target) if callable(self.config) else self.config

    def emulation(self, target: str) -> str | None:
        return self.emulated(target) if self.emulated is not None else None


@dataclass
class Family:
    name: str
    cases: Callable[[], Iterator[ReportCase]]
    description: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)


def gen(device, seed: int):
    """A seeded generator on ``device``, for a case's inputs made where they are used: on a GPU
    the H200 run's report spent most of its time making full-shape inputs on the CPU (a 402M
    element expert weight, say) and copying them over. On the CPU the values are the same as
    ever; on a GPU they are the device generator's."""
    import torch

    return torch.Generator(device=device).manual_seed(seed)
