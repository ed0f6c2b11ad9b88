"""FlyIR: the project's own tile-level SSA IR."""

from .core import Block, Function, Op, Param, Value, is_tensor, is_tile
from .ops import OPS, OpDef, infer, opdef
from .printer import print_function, value_numbers
from .types import TensorType, TileType
from .verifier import verify

__all__ = [
    "OPS",
    "Block",
    "Function",
    "Op",
    "OpDef",
    "Param",
    "TensorType",
    "TileType",
    "Value",
    "infer",
    "is_tensor",
    "is_tile",
    "opdef",
    "print_function",
    "value_numbers",
    "verify",
]
