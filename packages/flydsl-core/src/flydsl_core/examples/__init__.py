"""Example kernels that prove the language, each with its PyTorch reference.

Every example module defines ``KERNEL`` (the ``@kernel``), ``run(*tensors,
target=...)`` that launches it and returns its output, ``reference(...)``
(the same computation in plain PyTorch), ``make_inputs(shape, dtype,
generator)`` and ``TOLERANCE`` (dtype -> (rtol, atol)). ``NAMES`` lists them
and ``load(name)`` imports one; tests, the CLI and the benchmarks iterate them.
"""

from __future__ import annotations

import importlib

NAMES = ("vector_add", "softmax", "matmul", "cumsum")


def load(name: str):
    if name not in NAMES:
        raise KeyError(f"unknown example {name!r}; examples: {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{name}")
