"""``@kernel``: a Python function that traces into FlyIR, compiles and launches.

    @fly.kernel
    def add(x: fly.Tensor, y: fly.Tensor, out: fly.Tensor, BLOCK: fly.constexpr):
        i = fly.program_id(0)
        out.tile((BLOCK,), i).store(x.tile((BLOCK,), i).load() + y.tile((BLOCK,), i).load())

    add[(fly.cdiv(n, 1024),)](x, y, out, BLOCK=1024)

The launch path runs in one direction (each stage names its file):

1. key: the generated per-signature key function (``binder.py``) maps a call
   straight to a compiled kernel; a source guard (``cache/keys.py``) checks
   that the kernel's sources, and everything they read, are still what it
   was compiled from;
2. on a miss, bind and specialize the arguments (``spec.py``) and look the
   specialization up in memory, then in AOT bundles and the disk cache
   (``store.py``, through the backend's ``deserialize``);
3. only when nothing stored serves it: trace (``trace/``, ``language/``),
   run the pass pipeline (``passes/``), compile with the target's backend
   (``backends/``) and store the result.

A cache hit, in memory or on disk, never traces and never runs a pass.
Parameters annotated ``fly.constexpr`` (and bool or None arguments) are
compile-time values: Python code sees them as plain values.
"""

from __future__ import annotations

import functools
import inspect
import logging
import operator
import threading
from typing import Any

from ..exc import ArgumentError
from ..helpers import cdiv
from ..ir.core import Function
from ..trace.context import maybe_current
from ..trace.driver import trace_function
from .binder import make_key_fn
from .sink import LAUNCH_OPTIONS, current_sink, launch_sink, split_launch_options
from .spec import (
    ArgSpec,
    Tensor,
    constexpr,
    is_constexpr_annotation,
    is_tensor_annotation,
    is_tensor_like,
    spec_of,
    typed,
)

log = logging.getLogger(__name__)

#: ``LAUNCH_OPTIONS`` and ``launch_sink`` live in ``sink.py``, ``cdiv`` in ``helpers.py``; they
#: stay importable from here
__all__ = [
    "LAUNCH_OPTIONS",
    "CompiledKernel",
    "Kernel",
    "Tensor",
    "cdiv",
    "constexpr",
    "kernel",
    "launch_sink",
]


class Specialization:
    __slots__ = ("constexprs", "key", "runtime", "specs")

    def __init__(self, key: tuple, specs: dict[str, ArgSpec], constexprs: dict, runtime: list):
        self.key = key
        self.specs = specs
        self.constexprs = constexprs
        self.runtime = runtime  # names of run-time parameters, in order

    def __repr__(self) -> str:
        return f"Specialization({self.specs}, constexprs={self.constexprs})"


class CompiledKernel:
    """One specialization compiled for one target.

    ``ir`` is the FlyIR after the passes; for a kernel served from the disk
    cache or an AOT bundle it is traced only when asked for.
    """

    def __init__(self, kernel: Kernel, target: str, executable, spec, key=None, ir=None):
        self.kernel = kernel
        self.name = kernel.name
        self.target = target
        self.executable = executable
        self.spec = spec
        self.key = key  # the disk-cache / AOT key, for targets whose compiles are stored
        self._ir = ir

    @property
    def ir(self) -> Function:
        if self._ir is None:
            self._ir = self.kernel.lower(self.spec)
        return self._ir

    def stages(self) -> dict[str, Any]:
        """Every stage: FlyIR after passes, then the backend's (Triton source, TTIR, ..., binary)."""
        from ..ir.printer import print_function

        return {"flyir": print_function(self.ir), **self.executable.stages()}

    @property
    def report(self):
        return self.executable.report

    def __repr__(self) -> str:
        return f"<CompiledKernel {self.name} for {self.target}>"


def _stale() -> bool:
    return False


class Kernel:
    def __init__(
        self, fn, *, name: str | None = None, static_dims: dict | None = None, pipeline=None
    ):
        self.fn = fn
        self.__flydsl_fn__ = fn
        self.name = name or fn.__name__
        self.signature = inspect.signature(fn)
        self.static_dims = {k: tuple(v) for k, v in (static_dims or {}).items()}
        self.pipeline = pipeline
        hints = getattr(fn, "__annotations__", {})
        self.constexpr_params = {n for n, a in hints.items() if is_constexpr_annotation(a)}
        self.tensor_params = {n for n, a in hints.items() if is_tensor_annotation(a)}
        self._cache: dict[tuple, CompiledKernel] = {}
        self._fast: dict[tuple, tuple] = {}
        # The in-process caches hold compiles of these sources: ``_guard()`` is True while
        # the sources and everything they read are unchanged (armed at the first launch).
        self._fingerprint: str | None = None
        self._guard = _stale
        self._guard_lookups = 0
        self._constexpr_pos = frozenset(
            i for i, n in enumerate(self.signature.parameters) if n in self.constexpr_params
        )
        self._key_fn = make_key_fn(self)
        self._lock = threading.RLock()
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<flydsl kernel {self.name}>"

    def __call__(self, *args, **kwargs):
        where = maybe_current()
        if where is not None:
            raise ArgumentError(
                f"kernel {self.name} was called inside kernel {where.kernel_name}; a kernel "
                "cannot call or launch another kernel. Make the shared code a plain Python "
                "function and call that from both"
            )
        raise ArgumentError(
            f"kernel {self.name} is launched on a grid: {self.name}[grid](...), "
            "with grid a tuple of 1 to 3 ints"
        )

    # -- sources ----------------------------------------------------------------------
    def _refresh(self) -> None:
        """Re-arm the source guard; drop every in-process compile if the sources changed."""
        from ..cache.keys import guarded_fingerprint

        with self._lock:
            if self._guard():
                return
            fp, guard = guarded_fingerprint(self.fn)
            if fp != self._fingerprint:
                if self._fingerprint is not None:
                    log.info(
                        "kernel %s: its source or something it reads changed; compiling again",
                        self.name,
                    )
                self._cache.clear()
                self._fast.clear()
                self._fingerprint = fp
            self._guard = guard.check
            self._guard_lookups = guard.lookups

    def clear_cache(self) -> None:
        """Forget this kernel's in-process compiles (stored ones stay on disk)."""
        with self._lock:
            self._cache.clear()
            self._fast.clear()

    # -- binding ----------------------------------------------------------------------
    def bind(self, args, kwargs) -> dict[str, Any]:
        try:
            b = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise ArgumentError(f"{self.name}: {e}") from None
        b.apply_defaults()
        return dict(b.arguments)

    def specialize(self, bound: dict[str, Any]) -> Specialization:
        specs, consts, runtime = {}, {}, []
        for name, value in bound.items():
            if name in self.constexpr_params:
                consts[name] = value
                continue
            if name in self.tensor_params and not is_tensor_like(value):
                raise ArgumentError(
                    f"{self.name}: parameter {name!r} is a tensor (annotated fly.Tensor) but got "
                    f"{_described(value)}; pass a torch.Tensor (or a fly.TensorSpec to compile "
                    "ahead of time)"
                )
            s = spec_of(
                value,
                static_dims=self.static_dims.get(name, ()),
                name=f"{self.name}: parameter {name!r}",
            )
            if s.kind == "constexpr":
                consts[name] = s.value
            else:
                specs[name] = s
                runtime.append(name)
        key = (
            tuple(specs.items()),
            tuple(sorted(((k, typed(v)) for k, v in consts.items()), key=lambda kv: kv[0])),
        )
        try:
            hash(key)
        except TypeError:
            bad = [n for n, v in consts.items() if not _hashable(v)]
            raise ArgumentError(
                f"{self.name}: constexpr arguments must be hashable: {bad}"
            ) from None
        return Specialization(key, specs, consts, runtime)

    # -- tracing ----------------------------------------------------------------------
    def trace(self, spec: Specialization) -> Function:
        """The verified FlyIR of a specialization, before the passes (``trace/driver.py``)."""
        return trace_function(self.fn, self.name, self.signature, spec)

    def lower(self, spec: Specialization) -> Function:
        """The FlyIR of a specialization after the pass pipeline (traces it)."""
        from ..passes import run_pipeline

        return run_pipeline(self.trace(spec), self.pipeline)

    def ir(self, *args, **kwargs) -> Function:
        """The FlyIR of this kernel for these arguments, after the pass pipeline."""
        return self.lower(self.specialize(self.bind(args, kwargs)))

    # -- compile and launch ---------------------------------------------------------------
    def compile(self, *args, target=None, options=None, **kwargs) -> CompiledKernel:
        """Compile for ``target`` with tensors, ``TensorSpec``s or numbers as arguments."""
        _not_in_a_trace(self)
        spec = self.specialize(self.bind(args, kwargs))
        return self._compiled(spec, target, options or {})

    def _compiled(self, spec: Specialization, target, options: dict) -> CompiledKernel:
        """Memory, then stored executables (AOT bundle, disk); trace and compile on a miss."""
        from ..targets import resolve_target

        tgt = resolve_target(target)
        if not self._guard():
            self._refresh()
        ckey = (spec.key, tgt.name, tuple(sorted(options.items())))
        hit = self._cache.get(ckey)
        if hit is not None:
            return hit
        with self._lock:
            hit = self._cache.get(ckey)
            if hit is not None:
                return hit
            from ..backends import get_backend
            from . import store

            backend = get_backend(tgt)
            key = exe = ir = None
            if backend.stores:
                key = store.disk_key(self, self._fingerprint, spec, tgt.name, options)
                if key is not None:
                    exe = store.lookup(self.name, key, backend)
            if exe is None:
                ir = self.lower(spec)
                if backend.stores:
                    store.before_compile(self.name, tgt.name)
                exe = backend.compile(ir, spec, options)
                if key is not None:
                    store.store(self.name, key, backend, exe)
            ck = CompiledKernel(self, tgt.name, exe, spec, key=key, ir=ir)
            self._cache[ckey] = ck
            return ck

    def triton_function(self, *args, target=None, **kwargs):
        """``(jit_function, GeneratedKernel)``: the ``@triton.jit`` function this kernel generates
        for these arguments (tensors, ``TensorSpec``s or numbers, as ``compile``) and ``target``,
        without compiling it. Another compiler can then take the function over (torch's
        ``wrap_triton`` puts it in an Inductor graph); ``GeneratedKernel.params`` says which
        run-time argument, size or stride each Triton parameter is read from. Only targets
        whose backend ``generates_source`` (the Triton GPU targets and ``cpu-interpret``)."""
        from ..backends import get_backend
        from ..targets import resolve_target

        spec = self.specialize(self.bind(args, kwargs))
        tgt = resolve_target(target)
        if not self._guard():
            self._refresh()
        ckey = ("triton_function", spec.key, tgt.name)
        hit = self._cache.get(ckey)
        if hit is not None:
            return hit
        backend = get_backend(tgt)
        if not backend.generates_source:
            raise ArgumentError(
                f"{self.name}: target {tgt.name} does not generate Triton; use a GPU target or "
                "cpu-interpret"
            )
        with self._lock:
            out = backend.source_function(self.lower(spec))
            self._cache[ckey] = out
        return out

    def __getitem__(self, grid):
        return _Launcher(self, grid)

    def launch(self, grid, *args, **kwargs):
        """Launch on ``grid`` (ints, or a function of the bound arguments)."""
        return self._launch(grid, args, kwargs)

    def _launch(self, grid, args, kwargs):
        sink = current_sink()
        if sink is not None:  # another framework takes the launch over (sink.launch_sink)
            return sink(self, grid, args, kwargs)
        if not self._guard():
            self._refresh()
        # Fast path: a call shaped like an earlier one maps straight to its compiled kernel
        # and to a getter of its run-time arguments.
        try:
            fast = self._key_fn(*args, **kwargs)
            hit = self._fast.get(fast)
        except (TypeError, AttributeError):  # unusual arguments: the slow path explains them
            fast = hit = None
        if hit is None:
            hit = self._slow_bind(args, kwargs)
            if fast is not None:
                if len(self._fast) >= _FAST_CACHE_SIZE:
                    self._fast.clear()
                self._fast[fast] = hit
        ck, runtime = hit
        g3 = _GRIDS.get(grid) if type(grid) is tuple and _ints(grid) else None
        if g3 is None:
            g3 = _grid_of(self, grid, args, kwargs)
        ck.executable.launch(g3, runtime(args, kwargs))
        return ck

    def _slow_bind(self, args, kwargs):
        _not_in_a_trace(self)
        kwargs, target, options = split_launch_options(self, kwargs)
        bound = self.bind(args, kwargs)
        spec = self.specialize(bound)
        ck = self._compiled(spec, target, options)
        # Where each run-time argument sits in the call: a position or a keyword.
        names = list(self.signature.parameters)
        where = []
        for n in spec.runtime:
            i = names.index(n)
            if i < len(args):
                where.append(i)
            elif n in kwargs:
                where.append(n)
            else:
                raise ArgumentError(
                    f"{self.name}: run-time argument {n} must be passed explicitly, not defaulted"
                )
        return ck, _getter(tuple(where))


class _Launcher:
    __slots__ = ("grid", "kernel")

    def __init__(self, kernel: Kernel, grid):
        self.kernel = kernel
        self.grid = grid

    def __call__(self, *args, **kwargs):
        return self.kernel._launch(self.grid, args, kwargs)


_FAST_CACHE_SIZE = 4096

GRID_RULE = (
    "a launch grid is an int or a tuple of 1 to 3 non-negative ints (or a function of the "
    "bound arguments returning one)"
)


def _ints(g: tuple) -> bool:
    """All elements are exact ints (a cached grid must not match (4.0,) by equality)."""
    n = len(g)
    return (
        n != 0
        and type(g[0]) is int
        and (n == 1 or type(g[-1]) is int)
        and (n != 3 or type(g[1]) is int)
    )


def _grid(grid) -> tuple[int, int, int]:
    if isinstance(grid, (list, tuple)):
        items = tuple(grid)
    else:
        items = (grid,)
    try:
        if any(isinstance(g, bool) for g in items):
            raise TypeError
        dims = tuple(operator.index(g) for g in items)
    except TypeError:
        raise ArgumentError(f"{GRID_RULE}; got {grid!r}") from None
    if not 1 <= len(dims) <= 3 or any(g < 0 for g in dims):
        raise ArgumentError(f"{GRID_RULE}; got {grid!r}")
    return dims + (1,) * (3 - len(dims))


#: grids seen before (tuples of plain ints), normalized to 3-tuples: a launch's grid is a dict
#: lookup rather than a validation loop
_GRIDS: dict = {}


def _grid_of(kernel, grid, args, kwargs) -> tuple[int, int, int]:
    if callable(grid):
        bound = kernel.bind(args, {k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS})
        return _grid(grid(bound))
    g3 = _grid(grid)
    # only tuples of exact ints are stored: a tensor in a grid hashes by identity (the cache
    # would keep it alive and grow), a list does not hash; lookups check the element types
    # (_ints), since (4.0,) == (4,)
    if type(grid) is int:
        grid = (grid,)
    if type(grid) is tuple and _ints(grid) and len(_GRIDS) < _FAST_CACHE_SIZE:
        _GRIDS[grid] = g3
    return g3


def _not_in_a_trace(k: Kernel) -> None:
    where = maybe_current()
    if where is not None:
        raise ArgumentError(
            f"kernel {k.name} was launched inside kernel {where.kernel_name}; a kernel cannot "
            "launch another kernel. Make the shared code a plain Python function and call it "
            "from both, or launch the two kernels one after the other from the host"
        )


def _described(value) -> str:
    if value is None:
        return "None"
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


def _getter(where: tuple):
    """``f(args, kwargs)`` -> the run-time arguments at ``where`` (positions or keyword names)."""
    if where == tuple(range(len(where))):
        n = len(where)
        return lambda a, k: a[:n]
    parts = ", ".join(f"a[{w}]" if type(w) is int else f"k[{w!r}]" for w in where)
    return eval(f"lambda a, k: ({parts}{',' if len(where) == 1 else ''})", {})


def _hashable(v) -> bool:
    try:
        hash(v)
        return True
    except TypeError:
        return False


def kernel(fn=None, *, name: str | None = None, static_dims: dict | None = None, pipeline=None):
    """Make a FlyDSL kernel of a Python function (see the module docstring).

    ``static_dims={"x": (1,)}`` makes the listed sizes of tensor ``x`` part of
    the specialization key, so they become compile-time constants.
    ``pipeline`` replaces the default list of pass names.
    """
    if fn is None:
        return functools.partial(kernel, name=name, static_dims=static_dims, pipeline=pipeline)
    return Kernel(fn, name=name, static_dims=static_dims, pipeline=pipeline)
