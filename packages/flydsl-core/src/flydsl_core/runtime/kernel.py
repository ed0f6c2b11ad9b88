"""``@kernel``: a Python function that traces into FlyIR, compiles and launches.

    @fly.kernel
    def add(x: fly.Tensor, y: fly.Tensor, out: fly.Tensor, BLOCK: fly.constexpr):
        i = fly.program_id(0)
        out.tile((BLOCK,), i).store(x.tile((BLOCK,), i).load() + y.tile((BLOCK,), i).load())

    add[(fly.cdiv(n, 1024),)](x, y, out, BLOCK=1024)

A call binds its arguments, specializes them (runtime/spec.py), and looks
the specialization up in the kernel's in-process cache; on a miss it traces
the function, runs the pass pipeline and hands the IR to the target's
backend. Parameters annotated ``fly.constexpr`` (and bool or None
arguments) are compile-time values: Python code sees them as plain values.
"""

from __future__ import annotations

import functools
import inspect
import threading
from dataclasses import dataclass
from typing import Any

from .. import dtypes as dt
from ..exc import ArgumentError, ControlFlowError, TraceError
from ..ir.core import Block, Function, Param, Value
from ..ir.types import TensorType, TileType
from ..ir.verifier import verify
from ..language.tile import Tile
from ..language.views import TensorRef
from ..trace.context import TraceContext, tracing
from .spec import ArgSpec, spec_of


class constexpr:
    """Annotation: this parameter is a compile-time value."""


class Tensor:
    """Annotation: this parameter is a tensor."""


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


#: kwargs of a launch that configure it rather than feed a parameter
LAUNCH_OPTIONS = ("target", "num_warps", "num_stages", "options")


@dataclass
class Specialization:
    key: tuple
    specs: dict[str, ArgSpec]
    constexprs: dict[str, Any]
    runtime: list[str]  # names of run-time parameters, in order


@dataclass
class CompiledKernel:
    """One specialization compiled for one target."""

    name: str
    target: str
    ir: Function
    executable: Any
    spec: Specialization
    key: str | None = None  # the disk-cache / AOT key, for GPU targets

    def stages(self) -> dict[str, Any]:
        """Every stage: FlyIR after passes, then the backend's (Triton source, TTIR, ..., binary)."""
        from ..ir.printer import print_function

        out: dict[str, Any] = {"flyir": print_function(self.ir)}
        if hasattr(self.executable, "stages"):
            out.update(self.executable.stages())
        return out

    @property
    def report(self):
        return getattr(self.executable, "report", None)


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
        self.constexpr_params = {
            n
            for n, a in hints.items()
            if a is constexpr or a == "constexpr" or str(a).endswith("constexpr")
        }
        self._cache: dict[tuple, CompiledKernel] = {}
        self._fast: dict[tuple, tuple] = {}
        self._constexpr_pos = frozenset(
            i for i, n in enumerate(self.signature.parameters) if n in self.constexpr_params
        )
        from .binder import make_key_fn

        self._key_fn = make_key_fn(self)
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<flydsl kernel {self.name}>"

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
            s = spec_of(
                value, static_dims=self.static_dims.get(name, ()), name=f"{self.name}({name}=...)"
            )
            if s.kind == "constexpr":
                consts[name] = s.value
            else:
                specs[name] = s
                runtime.append(name)
        key = (
            tuple(specs.items()),
            tuple(sorted(((k, _typed(v)) for k, v in consts.items()), key=lambda kv: kv[0])),
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
        ctx = TraceContext(self.name)
        body = Block()
        ctx.push(body)
        params: list[Param] = []
        call: dict[str, Any] = {}
        for name in self.signature.parameters:
            if name in spec.constexprs:
                call[name] = spec.constexprs[name]
                params.append(
                    Param(name, "constexpr", None, facts={"value": spec.constexprs[name]})
                )
                continue
            s = spec.specs[name]
            if s.kind == "tensor":
                call[name] = _tensor_param(name, s, params)
            else:
                v = Value(TileType(s.dtype), name=name)
                params.append(Param(name, "scalar", v, facts=dict(s.facts)))
                call[name] = Tile(v)
        from ..trace.context import user_location

        with tracing(ctx):
            ret = self.fn(**call)
        if len(ctx.blocks) != 1:
            raise ControlFlowError(
                "a fly.range / fly.while_ loop or fly.if_ block was left early (break, continue or "
                "return inside it is not supported); use a condition with fly.where or fly.if_",
                loc=user_location(False),
            )
        if ret is not None:
            raise TraceError(
                f"kernel {self.name} returned {ret!r}; kernels write their results through stores"
            )
        fn = Function(self.name, params, body, dict(spec.constexprs))
        return verify(fn)

    def ir(self, *args, **kwargs) -> Function:
        """The FlyIR of this kernel for these arguments, after the pass pipeline."""
        from ..passes import run_pipeline

        spec = self.specialize(self.bind(args, kwargs))
        return run_pipeline(self.trace(spec), self.pipeline)

    # -- compile and launch ---------------------------------------------------------------
    def compile(self, *args, target=None, options=None, **kwargs) -> CompiledKernel:
        """Compile for ``target`` with tensors, ``TensorSpec``s or numbers as arguments."""
        spec = self.specialize(self.bind(args, kwargs))
        return self._compiled(spec, target, options or {})

    def _compiled(self, spec: Specialization, target, options: dict) -> CompiledKernel:
        from ..backends import get_backend, target_name

        tname = target_name(target)
        ckey = (spec.key, tname, tuple(sorted(options.items())))
        hit = self._cache.get(ckey)
        if hit is not None:
            return hit
        with self._lock:
            hit = self._cache.get(ckey)
            if hit is not None:
                return hit
            from ..passes import run_pipeline

            ir = run_pipeline(self.trace(spec), self.pipeline)
            backend = get_backend(tname)
            key = None
            if hasattr(backend, "target_name") and _is_gpu(tname):
                from .store import lookup_or_compile

                exe, key = lookup_or_compile(self, ir, spec, backend, tname, options)
            else:
                exe = backend.compile(ir, spec, options)
            ck = CompiledKernel(self.name, tname, ir, exe, spec, key=key)
            self._cache[ckey] = ck
            return ck

    def triton_function(self, *args, target=None, **kwargs):
        """``(jit_function, GeneratedKernel)``: the ``@triton.jit`` function this kernel generates
        for these arguments (tensors, ``TensorSpec``s or numbers, as ``compile``) and ``target``,
        without compiling it. Another compiler can then take the function over (torch's
        ``wrap_triton`` puts it in an Inductor graph); ``GeneratedKernel.params`` says which
        run-time argument, size or stride each Triton parameter is read from."""
        from ..backends import get_backend, target_name
        from ..passes import run_pipeline

        spec = self.specialize(self.bind(args, kwargs))
        tname = target_name(target)
        ckey = ("triton_function", spec.key, tname)
        hit = self._cache.get(ckey)
        if hit is not None:
            return hit
        backend = get_backend(tname)
        if not hasattr(backend, "generate"):
            raise ArgumentError(
                f"{self.name}: target {tname} does not generate Triton; use a GPU target or "
                "cpu-interpret"
            )
        from ..backends.triton.compiler import import_source, write_source

        with self._lock:
            gen = backend.generate(run_pipeline(self.trace(spec), self.pipeline))
            out = (getattr(import_source(write_source(gen)), gen.name), gen)
            self._cache[ckey] = out
        return out

    def __getitem__(self, grid):
        return _Launcher(self, grid)

    def launch(self, grid, *args, **kwargs):
        """Launch on ``grid`` (ints, or a function of the bound arguments)."""
        return self._launch(grid, args, kwargs)

    def _launch(self, grid, args, kwargs):
        sink = getattr(_SINK, "fn", None)
        if sink is not None:  # a tracing framework takes the launch over (launch_sink)
            return sink(self, grid, args, kwargs)
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
        g3 = _GRIDS.get(grid) if type(grid) is tuple or type(grid) is int else None
        if g3 is None:
            g3 = _grid_of(self, grid, args, kwargs)
        ck.executable.launch(g3, runtime(args, kwargs))
        return ck

    def _slow_bind(self, args, kwargs):
        kwargs = dict(kwargs)
        opts = {
            k: kwargs.pop(k)
            for k in LAUNCH_OPTIONS
            if k in kwargs and k not in self.signature.parameters
        }
        target = opts.pop("target", None)
        options = dict(opts.pop("options", None) or {})
        options.update(opts)
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


_SINK = threading.local()


class launch_sink:
    """``with launch_sink(fn):`` launches on this thread call ``fn(kernel, grid, args, kwargs)``
    instead of compiling and running (``kwargs`` still holds the launch options). For callers
    that trace a FlyDSL API into another framework's graph (torch_flydsl under torch.compile);
    nested sinks restore the outer one on exit."""

    def __init__(self, fn):
        self.fn = fn
        self._prev = None

    def __enter__(self):
        self._prev = getattr(_SINK, "fn", None)
        _SINK.fn = self.fn
        return self

    def __exit__(self, *exc):
        _SINK.fn = self._prev


class _Launcher:
    __slots__ = ("grid", "kernel")

    def __init__(self, kernel: Kernel, grid):
        self.kernel = kernel
        self.grid = grid

    def __call__(self, *args, **kwargs):
        return self.kernel._launch(self.grid, args, kwargs)


_FAST_CACHE_SIZE = 4096


def _is_gpu(name: str) -> bool:
    from ..targets import get_target

    return get_target(name).is_gpu


def _grid(grid) -> tuple[int, int, int]:
    if isinstance(grid, int):
        grid = (grid,)
    grid = tuple(int(g) for g in grid)
    if not 1 <= len(grid) <= 3 or any(g < 0 for g in grid):
        raise ArgumentError(f"a grid is 1 to 3 non-negative ints, got {grid}")
    return grid + (1,) * (3 - len(grid))


#: grids seen before (tuples or ints of plain ints), normalized to 3-tuples: a launch's grid is a
#: dict lookup rather than a validation loop
_GRIDS: dict = {}


def _grid_of(kernel, grid, args, kwargs) -> tuple[int, int, int]:
    if callable(grid):
        bound = kernel.bind(args, {k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS})
        return _grid(grid(bound))
    g3 = _grid(grid)
    # only tuples of exact ints are stored: a tensor in a grid hashes by identity (the cache
    # would keep it alive and grow), a list does not hash; equal numbers (4.0, np.int64(4))
    # may still find a stored entry, which holds the grid they normalize to anyway
    plain = all(type(g) is int for g in ((grid,) if type(grid) is int else grid))
    if plain and (type(grid) is int or type(grid) is tuple) and len(_GRIDS) < _FAST_CACHE_SIZE:
        _GRIDS[grid] = g3
    return g3


def _getter(where: tuple):
    """``f(args, kwargs)`` -> the run-time arguments at ``where`` (positions or keyword names)."""
    if where == tuple(range(len(where))):
        n = len(where)
        return lambda a, k: a[:n]
    parts = ", ".join(f"a[{w}]" if type(w) is int else f"k[{w!r}]" for w in where)
    return eval(f"lambda a, k: ({parts}{',' if len(where) == 1 else ''})", {})


def _typed(v):
    """A constexpr as part of a cache key. Equal values of different types (2, 2.0, True)
    or signs (0.0, -0.0) trace differently, so they must not share a compile."""
    if isinstance(v, tuple):
        return (tuple, tuple(_typed(x) for x in v))
    if isinstance(v, float):
        return (float, v, repr(v))
    return (type(v), v)


def _hashable(v) -> bool:
    try:
        hash(v)
        return True
    except TypeError:
        return False


def _tensor_param(name: str, s: ArgSpec, params: list[Param]) -> TensorRef:
    tv = Value(TensorType(s.dtype, s.rank), name=name)
    params.append(
        Param(name, "tensor", tv, facts={"aligned": s.aligned, "index_bits": s.index_bits})
    )
    idx = dt.int32 if s.index_bits == 32 else dt.int64
    sizes, strides = [], []
    for d in range(s.rank):
        v = Value(TileType(idx), name=f"{name}_size{d}")
        params.append(
            Param(f"{name}.size{d}", "shape", v, of=name, dim=d, facts=dict(s.size_facts[d]))
        )
        sizes.append(Tile(v))
    for d in range(s.rank):
        v = Value(TileType(idx), name=f"{name}_stride{d}")
        params.append(
            Param(f"{name}.stride{d}", "stride", v, of=name, dim=d, facts=dict(s.stride_facts[d]))
        )
        strides.append(Tile(v))
    known = tuple(dict(f).get("value") for f in s.stride_facts)
    return TensorRef(name, tv, s.dtype, tuple(sizes), tuple(strides), idx, static_strides=known)


def kernel(fn=None, *, name: str | None = None, static_dims: dict | None = None, pipeline=None):
    """Make a FlyDSL kernel of a Python function (see the module docstring).

    ``static_dims={"x": (1,)}`` makes the listed sizes of tensor ``x`` part of
    the specialization key, so they become compile-time constants.
    ``pipeline`` replaces the default list of pass names.
    """
    if fn is None:
        return functools.partial(kernel, name=name, static_dims=static_dims, pipeline=pipeline)
    return Kernel(fn, name=name, static_dims=static_dims, pipeline=pipeline)
