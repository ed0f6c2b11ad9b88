"""What a spec's ``lower`` returns to the torch.compile pass.

``Call(op, build)``: the node becomes ``build(*node_args)``, a function of the ATen node's own
arguments (schema order) written in torch ops and ``torch.ops.flydsl.*``; the pass traces it on
the node's FakeTensors and splices the result in.

``Dense``: a dense GEMM (``mm``, ``addmm``, ``bmm``, ``baddbmm``; ``F.linear`` reaches the pass
as one of them after a ``permute`` of the weight). The pass may first extend it with the
epilogue chain that follows (bias, activation, residual, cast: ``inductor.epilogue``) and the
SwiGLU pattern, then builds one ``flydsl::gemm`` / ``flydsl::swiglu`` call. Its fields pick the
operands out of the node's arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Call:
    op: str
    build: Callable


@dataclass(frozen=True)
class Dense:
    a: int  # argument index of A: (M, K) or (B, M, K)
    b: int  # of B: (K, N) or (B, K, N)
    c: int | None = None  # of C (addmm's input), broadcast to the output
    alpha: float = 1.0
    beta: float = 0.0
    c_is_bias: bool = False  # C is an (N,) row added once (beta == 1): the kernel's bias
