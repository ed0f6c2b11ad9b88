"""Size checks that work on ints and on symbolic sizes (the torch.compile pass runs the spec
predicates on FakeTensors).

Three kinds of sizes:

* the rows (M, tokens; dynamic in serving) are never guarded on, so one graph serves every
  M: a fact about them counts only where the shape environment proves it for every value
  (``eq``, ``known_zero``);
* a dense GEMM's N and K may be symbolic too (``backed``): an attention matmul's KV length
  grows every decode step (eager attention: ``q @ k^T`` has it as N, ``p @ v`` as K). The
  kernels are generated without facts about such a size, and the config choice is evaluated
  on the symbolic size itself (``graph_launch.dense_ranges``), so the only guards are the
  conditions that choice tests (a range of the size: where split-K or the grid-fill rule
  changes, whether K is a multiple of the K tile), never its value;
* the sizes FlyDSL compiles the other kernels for (the grouped and MX GEMMs' N, K, the
  scales' K blocks, the group count) are model constants: ``fixed`` specializes a symbolic
  one to its value with a guard, as Dynamo does for weights (a different value then
  recompiles); None only where no value is known (an unbacked size)."""

from __future__ import annotations


def static(v):
    """``v`` as an int when it is one or is fixed by the shape environment, else None."""
    if type(v) is int:
        return v
    if hasattr(v, "node"):
        return v.node.maybe_as_int()
    return int(v)


def fixed(v):
    """``v`` as an int, specializing a backed symbolic size (a guard); None if unbacked."""
    s = static(v)
    if s is not None:
        return s
    if not v.node.has_hint():
        return None
    return int(v)  # guards on the value: N / K / groups are the model's constants


def backed(v) -> bool:
    """``v`` is an int or a symbolic size with an example value (not an unbacked one)."""
    return static(v) is not None or v.node.has_hint()


def hint(v) -> int:
    """An int for ``v``: itself, its fixed value, or the shape environment's example value."""
    s = static(v)
    if s is not None:
        return s
    return int(v.node.hint) if v.node.has_hint() else 1


def eq(x, y) -> bool:
    """``x == y`` for every value of the sizes involved; or, for two symbolic sizes that
    Dynamo gave separate symbols (``mark_dynamic`` / automatic dynamic inputs: an MX
    scale's rows and its operand's, two batch dims) and that are equal now, from now on,
    with a guard relating them (a call where they differ recompiles; ATen would reject
    it). A size is never guarded equal to a constant here: rows stay free."""
    if type(x) is int and type(y) is int:
        return x == y
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if statically_known_true(x == y):
        return True
    if type(x) is int or type(y) is int or not (x.node.has_hint() and y.node.has_hint()):
        return False
    if int(x.node.hint) != int(y.node.hint):
        return False
    return bool(x == y)  # the guard: Eq(x, y), which also unifies the two symbols


def known_zero(v) -> bool:
    """Provably zero (an empty extent)."""
    return eq(v, 0)


def shape_eq(a, b) -> bool:
    return len(a) == len(b) and all(eq(x, y) for x, y in zip(a, b))
