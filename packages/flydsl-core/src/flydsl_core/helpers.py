"""Host-side helpers of the public API (``flydsl_core.cdiv``): plain integer arithmetic.

They use ``//`` and negation only, so they also take the symbolic sizes of a call captured
into a torch graph (``SymInt``) without guarding on them.
"""

from __future__ import annotations

__all__ = ["cdiv"]


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers (``b > 0``): grids, tile counts, chunks."""
    return -(-a // b)
