"""Types of FlyIR values.

Every computed value is a *tile*: a statically shaped block of one dtype.
A scalar is a tile of shape ``()``. Kernel tensor arguments have their own
type, ``TensorType``; their sizes and strides travel as separate scalar
parameters, so they can be specialized one by one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..dtypes import DType


@dataclass(frozen=True)
class TileType:
    dtype: DType
    shape: tuple[int, ...] = ()

    @property
    def is_scalar(self) -> bool:
        return self.shape == ()

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def with_dtype(self, dtype: DType) -> TileType:
        return TileType(dtype, self.shape)

    def with_shape(self, shape: tuple[int, ...]) -> TileType:
        return TileType(self.dtype, tuple(shape))

    def __str__(self) -> str:
        if not self.shape:
            return self.dtype.name
        return f"tile<{'x'.join(map(str, self.shape))}x{self.dtype.name}>"


@dataclass(frozen=True)
class TensorType:
    """A global-memory tensor argument: element dtype and rank."""

    dtype: DType
    rank: int

    def __str__(self) -> str:
        return f"tensor<{self.dtype.name}, rank={self.rank}>"


Type = TileType | TensorType
