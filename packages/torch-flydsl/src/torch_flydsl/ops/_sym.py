"""Size checks that work on ints and, without adding a guard, on symbolic sizes (the torch.compile
pass runs the spec predicates on FakeTensors): a symbolic fact counts only where the shape
environment proves it for every value."""

from __future__ import annotations


def static(v):
    """``v`` as an int when it is one or is fixed by the shape environment, else None."""
    if type(v) is int:
        return v
    if hasattr(v, "node"):
        return v.node.maybe_as_int()
    return int(v)


def hint(v) -> int:
    """An int for ``v``: itself, its fixed value, or the shape environment's example value."""
    s = static(v)
    if s is not None:
        return s
    return int(v.node.hint) if v.node.has_hint() else 1


def eq(x, y) -> bool:
    """``x == y`` for every value of the sizes involved."""
    if type(x) is int and type(y) is int:
        return x == y
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(x == y)


def known_zero(v) -> bool:
    """Provably zero (an empty extent)."""
    return eq(v, 0)


def shape_eq(a, b) -> bool:
    return len(a) == len(b) and all(eq(x, y) for x, y in zip(a, b))
