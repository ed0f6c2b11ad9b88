"""``MChoice``: a family's config rule over the rows ``M`` of a problem whose other sizes are fixed.

Each family whose config depends on ``M`` exports ``configs.m_choice(kind, ...)`` (the
problem's sizes but ``M``) returning an ``MChoice``. Its ``choose(M)`` is what the family's
function API launches for ``M`` (the config, and for the dense GEMM the split-K count), and
``bounds`` are the breakpoints of ``M``: the config is the same for every ``M`` of a range
``(bounds[i - 1], bounds[i]]`` (and above the last bound). A bound marks where a family's
rule may change, so two neighbouring ranges may hold the same config.

torch-flydsl's compiled graphs, which see a symbolic ``M``, hold one branch per range
(``ranges()``: each range's top, where its branch takes ``choose``), so a graph launches the
config the eager API would for every ``M``. The one exception is stated where it applies: the
dense GEMM's split-K count, a grid decision, follows ``M`` within a range in the eager API and
is taken at the range's top in a compiled graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["Choice", "MChoice"]


class Choice(NamedTuple):
    """What a family's API launches for one ``M``: the config, and the dense GEMM's split-K
    count (None where the kernel has no split)."""

    config: Any
    split_k: int | None = None


class MChoice:
    """``choose(M) -> Choice`` and the ``bounds`` of ``M`` where the config may change (see the
    module doc). ``bounds`` is computed on first use: the eager APIs only ``choose``."""

    __slots__ = ("_bounds", "_bounds_of", "choose")

    def __init__(self, choose: Callable[[int], Choice], bounds: Callable[[], tuple[int, ...]]):
        self.choose = choose
        self._bounds_of = bounds
        self._bounds: tuple[int, ...] | None = None

    @property
    def bounds(self) -> tuple[int, ...]:
        """The increasing breakpoints of ``M`` (each the top of a range, inclusive)."""
        if self._bounds is None:
            # int(): a bound computed from a traced symbolic size (torch-flydsl's compiled
            # graphs pass a symbolic N or K) is specialized to its value, a guard on the bound
            # alone; plain ints pass through
            self._bounds = tuple(sorted({int(b) for b in self._bounds_of()}))
        return self._bounds

    def ranges(self) -> list[tuple[int | None, int]]:
        """``[(top, M)]``: each range's inclusive top (None for the last, unbounded one) and the
        ``M`` whose choice it takes (its top; one past the last bound for the last range)."""
        b = self.bounds
        return [*((hi, hi) for hi in b), (None, b[-1] + 1 if b else 1)]

    def __iter__(self):
        """``choose, bounds = m_choice(...)``."""
        return iter((self.choose, self.bounds))

    def __repr__(self) -> str:
        return f"MChoice(bounds={self.bounds})"
