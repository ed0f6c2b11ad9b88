"""Tunable configurations: a ``Config`` is one point, a ``ConfigSpace`` declares them all.

A config holds the kernel's constexpr parameters (tile sizes...) and the
backend options (``num_warps``, ``num_stages``, and AMD's ``waves_per_eu``,
``matrix_instr_nonkdim``, ``kpack``). Configs are frozen and hashable, so
they key caches, and round-trip through JSON for the tuning database.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..exc import FlyDSLError

#: launch options a config may set; everything else is a constexpr parameter
OPTION_NAMES = (
    "num_warps",
    "num_stages",
    "waves_per_eu",
    "matrix_instr_nonkdim",
    "kpack",
    "schedule_hint",
)


@dataclass(frozen=True)
class Config:
    params: tuple[tuple[str, Any], ...] = ()
    options: tuple[tuple[str, Any], ...] = ()

    @staticmethod
    def make(**values) -> Config:
        params = tuple(sorted((k, v) for k, v in values.items() if k not in OPTION_NAMES))
        options = tuple(sorted((k, v) for k, v in values.items() if k in OPTION_NAMES))
        return Config(params, options)

    def as_dict(self) -> dict[str, Any]:
        return {**dict(self.params), **dict(self.options)}

    def __getitem__(self, name: str):
        return self.as_dict()[name]

    def constexprs(self) -> dict[str, Any]:
        return dict(self.params)

    def launch_options(self) -> dict[str, Any]:
        return dict(self.options)

    def to_json(self) -> dict[str, Any]:
        return self.as_dict()

    @staticmethod
    def from_json(d: dict[str, Any]) -> Config:
        return Config.make(**d)

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(self.as_dict().items()))


class ConfigSpace:
    """The cartesian product of named choices, filtered by an optional constraint.

    ``ConfigSpace(BLOCK_M=[64, 128], num_warps=[4, 8], constraint=lambda c: ...)``
    """

    def __init__(self, constraint: Callable[[Config], bool] | None = None, **choices):
        if not choices:
            raise FlyDSLError("a config space needs at least one named choice")
        for name, vals in choices.items():
            if not isinstance(vals, (list, tuple)) or not vals:
                raise FlyDSLError(f"config choice {name!r} must be a non-empty list, got {vals!r}")
        self.choices = {k: tuple(v) for k, v in choices.items()}
        self.constraint = constraint

    def __iter__(self) -> Iterator[Config]:
        names = sorted(self.choices)
        for combo in itertools.product(*(self.choices[n] for n in names)):
            c = Config.make(**dict(zip(names, combo)))
            if self.constraint is None or self.constraint(c):
                yield c

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def default(self) -> Config:
        """The first choice of every axis (declare the safest value first)."""
        return Config.make(**{k: v[0] for k, v in self.choices.items()})
