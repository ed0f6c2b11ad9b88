"""``torch_flydsl.custom_op``: FlyDSL's ``torch.library.triton_op``.

A function that launches FlyDSL kernels as in eager code becomes a torch operator::

    @torch_flydsl.custom_op("mylib::scale_rows", mutates_args=())
    def scale_rows_op(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        scale_rows[(x.shape[0],)](x, out, BLOCK=64)
        return out

It returns torch's ``CustomOpDef`` (``register_fake``, ``register_autograd``,
``register_kernel``, ... work as for ``torch.library.triton_op``), and the body runs in
three ways, as ``triton_op``'s does:

* **eager** (real tensors): the body as written; each launch compiles and runs through
  FlyDSL's launcher (a CPU tensor on the target FlyDSL resolves for it: the reference
  backend unless ``FLYDSL_TARGET`` says otherwise);
* **fake** (FakeTensors: Dynamo, ``torch.export``, shape propagation): the body with its
  launches dropped, so the outputs' metadata comes from the body's own allocations. This is
  the default fake implementation; ``op.register_fake(fn)`` replaces it;
* **traced** (AOTAutograd's functionalization under ``torch.compile`` and AOTInductor): the
  body with every launch turned into ``torch.library.wrap_triton(<the @triton.jit FlyDSL
  generates>)[grid](...)`` (``torch_flydsl.graph_launch.launch``, the same path as the ``flydsl::``
  GEMM ops), so Inductor compiles, schedules and packages the kernels as its own user Triton
  kernels. CPU tensors stay one opaque node that Inductor calls as an extern kernel (it
  generates C++ for CPU graphs and cannot launch Triton there), unless
  ``graph_launch.CPU_TRACE_TARGET`` traces them for Triton's interpreter (the tests). Under
  ``torch.export`` the op is kept as one node, as ``triton_op``'s is.

FlyDSL knows what each kernel writes (its FlyIR's stores and atomics), so every launch is
checked against ``mutates_args``: a kernel that writes an input the op does not declare
mutated raises ``RuntimeError`` naming the kernel, its parameter and the op's argument.
Eager calls are counted in ``torch_flydsl.stats()`` under the op's name.
"""

from __future__ import annotations

import inspect
import keyword
import threading
from collections.abc import Callable, Iterable

import torch

__all__ = ["custom_op"]

#: namespaces torch.library reserves for PyTorch itself
_RESERVED = frozenset({"prim", "prims", "aten", "at", "torch", "pytorch"})


def custom_op(
    name: str,
    fn: Callable | None = None,
    /,
    *,
    mutates_args: str | Iterable[str],
    schema: str | None = None,
):
    """Make ``fn`` (a function launching FlyDSL kernels) a torch operator ``name``.

    The arguments are ``torch.library.triton_op``'s: ``name`` is ``"namespace::name"``,
    ``mutates_args`` the names of the arguments the function writes (or ``"unknown"``), and
    ``schema`` an optional schema string (by default inferred from ``fn``'s annotations).
    Returns torch's ``CustomOpDef``. See the module docstring for what runs when.
    """

    def dec(fn: Callable) -> torch._library.custom_ops.CustomOpDef:
        _check_name(name)
        if not callable(fn):
            raise TypeError(
                f"torch_flydsl.custom_op({name!r}): expected a function, got {type(fn).__name__}"
            )
        mutated = _check_mutates(name, fn, mutates_args, schema)
        schema_str = schema if schema is not None else _infer(name, fn, mutates_args)
        spec = _OpSpec(name, fn, mutated)
        op = torch.library.custom_op(name, mutates_args=mutates_args, schema=schema_str)(spec.eager)
        op.register_fake(spec.fake)
        from torch._subclasses.functional_tensor import FunctionalTensorMode

        op.register_torch_dispatch(FunctionalTensorMode, spec.functional)
        from torch._library.triton import triton_ops_to_kernels

        triton_ops_to_kernels[name] = _CacheIdentity(name, fn)
        return op

    if fn is None:
        return dec
    return dec(fn)


# -- declaration checks -----------------------------------------------------------------------------


def _check_name(name) -> None:
    where = f"torch_flydsl.custom_op({name!r})"
    if not isinstance(name, str):
        raise TypeError(
            f'{where}: the name is a string "namespace::name", got {type(name).__name__}'
        )
    parts = name.split("::")
    if len(parts) != 2 or not all(parts):
        raise ValueError(
            f'{where}: expected a name of the form "namespace::name" (e.g. "mylib::scale_rows")'
        )
    ns, op = parts
    for what, part in (("namespace", ns), ("op name", op)):
        if not part.isidentifier() or keyword.iskeyword(part):
            raise ValueError(f"{where}: the {what} {part!r} is not a Python identifier")
    if ns in _RESERVED:
        raise ValueError(
            f"{where}: the namespace {ns!r} is reserved for PyTorch; use your project's name"
        )


def _check_mutates(name, fn, mutates_args, schema) -> frozenset[str] | None:
    """The declared mutated argument names (None: ``"unknown"``), checked against ``fn``."""
    where = f"torch_flydsl.custom_op({name!r})"
    if isinstance(mutates_args, str):
        if mutates_args != "unknown":
            raise ValueError(
                f"{where}: mutates_args={mutates_args!r}: give the names of the arguments the "
                'function writes as a tuple or set (e.g. ("out",)), () for none, or "unknown"'
            )
        return None
    try:
        names = frozenset(mutates_args)
    except TypeError:
        raise TypeError(
            f'{where}: mutates_args must be an iterable of argument names or "unknown", got '
            f"{type(mutates_args).__name__}"
        ) from None
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"{where}: mutates_args holds non-string entries {bad!r}")
    if schema is not None:
        return names  # torch checks them against the schema's alias annotations
    params = inspect.signature(fn).parameters
    missing = sorted(names - set(params))
    if missing:
        raise ValueError(
            f"{where}: mutates_args names {missing} but {fn.__name__} has no such parameter; "
            f"its parameters are {list(params)}"
        )
    for n in sorted(names):
        ann = params[n].annotation
        if isinstance(ann, str):
            ok = "Tensor" in ann
        else:
            ok = _is_tensor_annotation(ann)
        if not ok:
            raise ValueError(
                f"{where}: mutates_args names {n!r}, annotated {_ann_text(ann)}; only Tensor "
                "arguments (Tensor, Optional[Tensor], list[Tensor]) can be mutated"
            )
    return names


def _is_tensor_annotation(ann) -> bool:
    if ann is torch.Tensor:
        return True
    return any(_is_tensor_annotation(a) for a in getattr(ann, "__args__", ()) or ())


def _ann_text(ann) -> str:
    if ann is inspect.Parameter.empty:
        return "nothing"
    return getattr(ann, "__name__", None) or str(ann)


def _infer(name, fn, mutates_args) -> str:
    from torch.library import infer_schema

    try:
        return infer_schema(fn, mutates_args=mutates_args)
    except ValueError as e:
        raise ValueError(
            f"torch_flydsl.custom_op({name!r}): cannot infer the op's schema from the "
            f"annotations of {fn.__name__}: {e} Annotate every parameter and the return value "
            "with types torch.library supports, or pass schema=..."
        ) from None


def _identity():
    """The body of the kernels ``_CacheIdentity`` names: nothing to run."""


class _CacheIdentity:
    """Stands in torch's list of a ``triton_op``'s Triton kernels
    (``torch._library.triton.triton_ops_to_kernels``), whose sources AOTAutograd's cache puts
    in its key: the kernels FlyDSL generates are known only when traced, so the list is one
    ``@triton.jit`` function named after the fingerprint of the body, the FlyDSL kernels and
    helpers it reaches (``source_fingerprint``) and the compiler. Editing a kernel changes the
    key, so a cached compile holding the old kernel is not served. Built on first use: FlyDSL
    generates it (``generated_launch``, for Triton's interpreter: no GPU needed) from an empty
    kernel named after that fingerprint."""

    def __init__(self, name: str, fn: Callable):
        self.name, self.fn = name, fn
        self._jit = None

    def __iter__(self):
        if self._jit is None:
            self._jit = self._make()
        yield self._jit

    def _make(self):
        import hashlib

        from flydsl_core import generated_launch, kernel
        from flydsl_core.cache import compiler_fingerprint, source_fingerprint

        digest = hashlib.sha256(
            f"{self.name}|{compiler_fingerprint()}|{source_fingerprint(self.fn)}".encode()
        ).hexdigest()[:24]
        ident = kernel(_identity, name=f"flydsl_custom_op_{digest}")
        return generated_launch(ident, {}, target="cpu-interpret").function


# -- what runs ---------------------------------------------------------------------------------------


class _OpSpec:
    """The three ways the body runs (module docstring) and the mutation check they share."""

    def __init__(self, name: str, fn: Callable, mutated: frozenset[str] | None):
        self.name = name
        self.fn = fn
        self.mutated = mutated
        self.sig = inspect.signature(fn)
        self.params = tuple(self.sig.parameters)
        from .stats import get

        self.stats = get(name)

    # eager: real tensors ------------------------------------------------------------------------
    def eager(self, *args, **kwargs):
        from flydsl_core import launch_sink

        guard = _Writes(self, args, kwargs)
        with launch_sink(guard.eager_launch):
            out = self.fn(*args, **kwargs)
        self.stats.hits += 1
        return out

    # fake: FakeTensors ---------------------------------------------------------------------------
    def fake(self, *args, **kwargs):
        from flydsl_core import launch_sink

        guard = _Writes(self, args, kwargs)
        with launch_sink(guard.fake_launch):
            return self.fn(*args, **kwargs)

    # traced: AOTAutograd's functionalization ------------------------------------------------------
    def functional(self, mode, op, types, args, kwargs):
        from torch.export._trace import custom_triton_ops_decomposition_disabled

        if custom_triton_ops_decomposition_disabled():  # torch.export keeps the op (as triton_op)
            return mode.__torch_dispatch__(op, types, args, kwargs)
        from torch._subclasses import FakeTensor
        from torch._subclasses.functional_tensor import FunctionalTensor

        if any(t not in (torch.Tensor, FakeTensor, FunctionalTensor) for t in types):
            return NotImplemented
        device = _device_of(args, kwargs)
        from . import graph_launch

        if device is not None and device.type == "cpu" and not graph_launch.traces_cpu():
            # Inductor cannot launch Triton kernels in a CPU graph: one opaque node
            return mode.__torch_dispatch__(op, types, args, kwargs)
        from flydsl_core import launch_sink

        guard = _Writes(self, args, kwargs)
        with mode, launch_sink(guard.traced_launch):
            return self.fn(*args, **kwargs)


def _device_of(args, kwargs):
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor):
            return v.device
        if isinstance(v, (list, tuple)):
            for t in v:
                if isinstance(t, torch.Tensor):
                    return t.device
    return None


def _tensors(v):
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (list, tuple)):
        for t in v:
            if isinstance(t, torch.Tensor):
                yield t


def _storage(t):
    """The identity of ``t``'s storage (shared by its views; FakeTensors and functional
    tensors have one too), or None."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return None


# -- the mutation check -------------------------------------------------------------------------------

_CACHE_SIZE = 4096
_written: dict = {}  # (kernel, specialization key) -> written parameter names
_fast: dict = {}  # _launch_key -> ((parameter, position or keyword), ...)
_lock = threading.Lock()


def _remember(cache: dict, key, value):
    with _lock:
        if len(cache) >= _CACHE_SIZE:
            cache.clear()
        cache[key] = value
    return value


def written_params(kernel, spec) -> frozenset[str]:
    """The tensor parameters ``kernel`` stores to or updates atomically for ``spec``: the
    tensor operands of its FlyIR's memory-writing ops (as traced, before any pass)."""
    key = (kernel, spec.key)
    got = _written.get(key)
    if got is not None:
        return got
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():  # tracing may use torch (constants): outside the tracers
        fn = kernel.trace(spec)
    by_value = {p.value.id: p.name for p in fn.params if p.kind == "tensor"}
    out = {
        by_value[v.id]
        for o in fn.walk()
        if o.opdef.writes_memory
        for v in o.operands
        if v.id in by_value
    }
    return _remember(_written, key, frozenset(out))


_TENSOR = object()
_kernel_info: dict = {}  # kernel -> (parameter names, constexpr names, launch option names)


def _launch_key(kernel, args, kwargs):
    """What decides which parameters a launch writes: the kernel, where the tensors are, and
    the compile-time values (constexprs, None, bools); not sizes, strides or numbers (which
    change no store). None where a constexpr does not hash (the launch itself will say)."""
    info = _kernel_info.get(kernel)
    if info is None:
        from flydsl_core import LAUNCH_OPTIONS

        names = tuple(kernel.signature.parameters)
        info = (names, kernel.constexpr_params, frozenset(LAUNCH_OPTIONS) - set(names))
        _kernel_info[kernel] = info
    names, consts, options = info
    key = [kernel, len(args)]
    for n, v in zip(names, args):
        if isinstance(v, torch.Tensor):
            key.append(_TENSOR)
        elif v is None or v is True or v is False or n in consts:
            key.append(v)
        else:
            key.append(type(v))
    for k, v in kwargs.items():  # a call site passes its keywords in one order
        if k not in options:
            if isinstance(v, torch.Tensor):
                key.append((k, _TENSOR))
            elif v is None or v is True or v is False or k in consts:
                key.append((k, v))
            else:
                key.append((k, type(v)))
    key = tuple(key)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _kernel_kwargs(kernel, kwargs) -> dict:
    """A launch's keyword arguments without its launch options (target, compiler options)."""
    from flydsl_core import split_launch_options

    return split_launch_options(kernel, kwargs)[0]


class _Writes:
    """One call of the op: each launch's writes are checked against ``mutates_args``."""

    __slots__ = ("_protected", "args", "kwargs", "spec")

    def __init__(self, spec: _OpSpec, args, kwargs):
        self.spec = spec
        self.args, self.kwargs = args, kwargs
        self._protected = None  # storage id -> the op argument it belongs to (not mutated)

    def protected(self) -> dict:
        if self._protected is None:
            prot: dict = {}
            mutated = self.spec.mutated
            if mutated is not None:  # "unknown": every argument may be written
                items = (*zip(self.spec.params, self.args), *self.kwargs.items())
                for name, v in items:
                    if name not in mutated:
                        for t in _tensors(v):
                            s = _storage(t)
                            if s is not None:
                                prot.setdefault(s, name)
            self._protected = prot
        return self._protected

    def _written(self, kernel, args, kwargs, traced: bool):
        """``((parameter, value), ...)`` of the tensors this launch writes."""
        fk = None
        if not traced:  # cached by what decides the writes: no bind, no specialization
            fk = _launch_key(kernel, args, kwargs)
            hit = _fast.get(fk) if fk is not None else None
            if hit is not None:
                return [(n, args[w] if type(w) is int else kwargs[w]) for n, w in hit]
        bound = kernel.bind(args, _kernel_kwargs(kernel, kwargs))
        if traced:
            from .graph_launch import spec_value

            specs = {n: spec_value(v) for n, v in bound.items()}
            spec = kernel.specialize(kernel.bind((), specs))
        else:
            spec = kernel.specialize(bound)
        names = list(kernel.signature.parameters)
        where = []
        for n in sorted(written_params(kernel, spec)):
            i = names.index(n)
            if i < len(args):
                where.append((n, i))
            elif n in kwargs:
                where.append((n, n))
        if fk is not None:
            _remember(_fast, fk, tuple(where))
        return [(n, bound[n]) for n, _ in where]

    def check(self, kernel, args, kwargs, traced: bool) -> None:
        written = self._written(kernel, args, kwargs, traced)
        if not written:
            return
        prot = self.protected()
        for pname, t in written:
            s = _storage(t) if isinstance(t, torch.Tensor) else None
            arg = prot.get(s) if s is not None else None
            if arg is not None:
                raise RuntimeError(
                    f"torch_flydsl.custom_op({self.spec.name!r}): kernel {kernel.name} writes its "
                    f"parameter {pname!r}, which is (a view of) the op's argument {arg!r}, but "
                    f"mutates_args does not name {arg!r}. Add {arg!r} to mutates_args, or have "
                    "the kernel write a new tensor and return it"
                )

    def eager_launch(self, kernel, grid, args, kwargs):
        from flydsl_core import launch_sink

        self.check(kernel, args, kwargs, traced=False)
        with launch_sink(None):  # the launch itself: FlyDSL's launcher
            return kernel[grid](*args, **kwargs)

    def fake_launch(self, kernel, grid, args, kwargs):
        self.check(kernel, args, kwargs, traced=True)
        # nothing runs: the outputs are the body's own allocations

    def traced_launch(self, kernel, grid, args, kwargs):
        from . import graph_launch

        self.check(kernel, args, kwargs, traced=True)
        t = next((v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)), None)
        if t is None:
            raise RuntimeError(
                f"torch_flydsl.custom_op({self.spec.name!r}): kernel {kernel.name} was launched "
                "with no tensor argument; a traced launch takes its device from its tensors"
            )
        if callable(grid):  # a grid rule of the bound arguments, as the launcher takes it
            grid = grid(kernel.bind(args, _kernel_kwargs(kernel, kwargs)))
        # the traced device's target, whatever the body asked for (FlyDSL generates Triton
        # for it; the body's target is an eager choice)
        graph_launch.launch(kernel, grid, args, {**kwargs, "target": graph_launch.target_for(t)})
