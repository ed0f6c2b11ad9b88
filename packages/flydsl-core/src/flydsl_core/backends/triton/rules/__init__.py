"""The Triton lowering rules, one module per op family; importing this fills ``LOWERINGS``.

| module | ops |
|---|---|
| ``elementwise.py`` | leaves (constant, arange, program ids), arithmetic, math, casts, hints, where |
| ``tile.py`` | broadcast, reshape, permute, concat; reductions, scans, sort, top-k, histogram |
| ``matrix.py`` | dot, dot_scaled |
| ``memory.py`` | load, store, atomics, bounds masks |
| ``control.py`` | for, if, while (and the values they carry) |
"""

from . import control, elementwise, matrix, memory, tile

__all__ = ["control", "elementwise", "matrix", "memory", "tile"]
