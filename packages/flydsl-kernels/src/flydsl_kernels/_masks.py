"""Trace-time mask helpers shared by the kernel families (plain Python, inlined on trace)."""

from __future__ import annotations


def and_masks(a, b):
    """``a & b`` where either may be None (no mask): a full block adds no mask op at all."""
    if a is None:
        return b
    if b is None:
        return a
    return a & b
