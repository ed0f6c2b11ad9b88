"""What every kernel family declares, so the report and benchmarks can iterate them.

A family module (``flydsl_kernels.<family>``) exposes ``FAMILY``, a
``Family`` whose ``cases()`` yields ``ReportCase``s: one per shipped kernel
and default config, each able to

* ``compile(target)``: compile its kernel for a target (no GPU needed) and
  return the ``CompiledKernel`` (the report reads its resource report);
* ``check(device)``: run the family's function API on fresh random inputs on
  ``device`` and return the largest error against the PyTorch reference,
  normalized so that <= 1 means within the stated tolerance;
* ``aten(device)``: optionally, a callable timing the ATen op on the same
  inputs, for speedups where a GPU is present; ``baseline(device)`` names
  what it times where that is not simply "the ATen op" (e.g. a fallback).
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
    config: dict[str, Any]  # constexprs and launch options of the shipped default
    compile: Callable[[str], Any]  # target name -> CompiledKernel
    check: Callable[[str], float]  # device -> normalized max error (<= 1 passes)
    run: Callable[[str], Callable[[], Any]] | None = None  # device -> a thunk launching ours
    aten: Callable[[str], Callable[[], Any]] | None = None  # device -> a thunk launching ATen's
    baseline: Callable[[str], str] | None = None  # device -> what aten(device) runs (a label)
    notes: str = ""


@dataclass
class Family:
    name: str
    cases: Callable[[], Iterator[ReportCase]]
    description: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
