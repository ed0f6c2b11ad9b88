"""Launching Triton-compiled kernels: on the GPU, or on the CPU through Triton's interpreter.

The host path is planned at compile time: ``signature.make_extractor`` turns the
generated kernel's parameter list into one compiled lambda that picks the
kernel's arguments (tensors, sizes, strides, scalars) out of the launch's
run-time arguments, so a launch is that lambda, a stream lookup and a call
of the compiled kernel's own launcher (``CompiledKernel.run``), the same
path Triton's ``kernel[grid](...)`` ends in.

``cpu-interpret`` runs the same generated source with Triton's interpreter.
Triton enables its interpreter per process (``TRITON_INTERPRET=1`` read when
``triton.language`` is imported and at ``@triton.jit`` decoration), which
would turn every kernel of the process into an interpreted one. Instead the
kernel is wrapped in ``triton.runtime.interpreter.InterpretedFunction``
directly, and for the duration of one launch ``interpret_scope()`` patches
``triton.language`` as the interpreter needs: Triton's own builtins through
its ``_patch_lang`` (and its restore), and every ``@triton.jit`` function of
``triton.language`` (``tl.sum``, ``tl.sort``, ...) with an interpreted twin.
Everything is restored when the launch returns, so GPU compiles in the same
process never see it; launches are serialized by a lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import types
from pathlib import Path

from ...exc import ArgumentError, TritonLaunchError
from .. import Executable
from .codegen import GeneratedKernel
from .signature import make_extractor

MAX_INT32 = 2**31 - 1


# -- GPU ----------------------------------------------------------------------------------------------


def _any_of(positions, expr: str):
    """``f(a) -> bool``: ``expr`` (with ``{}`` for a position) true for any of ``positions``."""
    body = " or ".join(expr.format(i) for i in positions) or "False"
    return eval(compile(f"lambda a: {body}", "<flydsl-triton-check>", "eval"), {})


class GpuLauncher:
    """Launches a ``TritonExecutable`` on the current GPU."""

    def __init__(self, exe):
        self.exe = exe
        gen: GeneratedKernel = exe.generated
        self.gen = gen
        self.extract = make_extractor(gen.params, gen.nargs)
        ranged = sorted({p.arg for p in gen.params if p.pointer_range_32})
        tensors = sorted({p.arg for p in gen.params if p.kind == "tensor"})
        # One expression each, not loops: `is_cpu` is a quarter of the cost of `device.type`.
        self.tensor_args = tensors
        self.on_cpu = _any_of(tensors, "a[{}].is_cpu")
        self.over_2gb = _any_of(ranged, f"a[{{}}].untyped_storage().nbytes() > {MAX_INT32}")
        self._bound = None  # (driver, get_device, get_stream) once the device is checked

    def _bind(self):
        from ...targets import detected_arch_to_target_name, device_arch

        target = self.exe.target
        arch = device_arch()
        if arch is None:
            raise TritonLaunchError(
                f"cannot launch kernel {self.exe.name!r} compiled for {target.name}: there is no GPU on this "
                "machine (torch.cuda.is_available() is False). The compiled stages are in .stages(); "
                "use target='cpu-interpret' or 'cpu-reference' to run on the CPU"
            )
        have = detected_arch_to_target_name(arch)
        if have != target.name:
            raise TritonLaunchError(
                f"cannot launch kernel {self.exe.name!r} compiled for {target.name} on this GPU, which "
                f"reports arch {arch!r} (target {have or 'unknown'}); compile for that target instead"
            )
        from triton import knobs
        from triton.runtime.driver import driver

        drv = driver.active
        self._bound = (drv.get_current_device, drv.get_current_stream, knobs.runtime)

    def __call__(self, grid, args):
        if self._bound is None:
            self._bind()
        g0, g1, g2 = grid
        kargs = self.extract(args)
        if g0 * g1 * g2 == 0:
            return
        try:
            on_cpu = self.on_cpu(args)
        except AttributeError:
            on_cpu = True
        if on_cpu:
            bad = [i for i in self.tensor_args if getattr(args[i], "is_cpu", True)]
            raise TritonLaunchError(
                f"kernel {self.exe.name!r} runs on the GPU; its arguments {bad} are not GPU tensors"
            )
        ck = self.exe.without_pointer_range() if self.over_2gb(args) else self.exe.compiled
        get_device, get_stream, rt = self._bound
        stream = get_stream(get_device())
        run = ck.run  # loads the binary on first use
        meta = (
            ck.launch_metadata(grid, stream, *kargs) if rt.launch_enter_hook is not None else None
        )
        run(
            g0,
            g1,
            g2,
            stream,
            ck.function,
            ck.packed_metadata,
            meta,
            rt.launch_enter_hook,
            rt.launch_exit_hook,
            *kargs,
        )


# -- the interpreter ----------------------------------------------------------------------------------

_interp_lock = threading.RLock()
_twins: dict[int, object] = {}


def _jit_functions():
    """``(owner, name, interpreted twin)`` for every @triton.jit function of triton.language."""
    import triton.language as tl
    import triton.language.core as tl_core
    import triton.language.math as tl_math
    import triton.language.standard as tl_std
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    out = []
    for owner in (tl, tl_core, tl_std, tl_math, tl.tensor):
        for name, val in list(vars(owner).items()):
            if isinstance(val, JITFunction):
                twin = _twins.get(id(val))
                if twin is None:
                    twin = _twins[id(val)] = (val, InterpretedFunction(val.fn))
                out.append((owner, name, twin[1]))
    return out


def _lang_anchor():
    """A function whose globals hold both ``triton.language`` and ``triton.language.core``.

    ``_patch_lang`` patches the triton.language modules it finds in a function's
    globals; with both, this scope covers (and restores) everything that the
    interpreter's own nested, never-restored patches can touch.
    """
    import triton.language as tl
    import triton.language.core as tl_core

    return types.FunctionType((lambda: None).__code__, {"tl": tl, "tl_core": tl_core})


def _fixed_binary_op(interpreter):
    """Triton 3.9's interpreter types a comparison's handle as its operands' dtype (say
    int32) although its data is bool, so a comparison splat to a tile (a scalar row
    mask and-ed with a column mask) becomes int32 and loads reject it as a mask.
    The result of a bool-valued op is int1."""
    builder = interpreter.interpreter_builder
    orig = type(builder).binary_op
    int1 = interpreter.tl.int1
    handle = interpreter.TensorHandle

    def binary_op(lhs, rhs, op):
        out = orig(builder, lhs, rhs, op)
        if out.data.dtype == bool and out.dtype != int1:
            out = handle(out.data, int1)
        return out

    return builder, binary_op


_GENERATED = "_flydsl_triton_src."
#: our combine functions -> (value reduction, index reduction) numpy equivalents. numpy's
#: max/min/argmax/argmin propagate NaN and take the first extreme index, as the combine
#: functions do; they only make the interpreter fast (it calls a combine function once
#: per element otherwise).
_FAST_REDUCE = {
    "_fly_max_nan": ("max", None),
    "_fly_min_nan": ("min", None),
    "_fly_max": ("max", None),
    "_fly_min": ("min", None),
    "_fly_prod": ("prod", None),
    "_fly_argmax": ("max", "argmax"),
    "_fly_argmin": ("min", "argmin"),
    "_fly_argmax_int": ("max", "argmax"),
    "_fly_argmin_int": ("min", "argmin"),
}
_FAST_SCAN = {
    "_fly_max_nan": "maximum",
    "_fly_max": "maximum",
    "_fly_min_nan": "minimum",
    "_fly_min": "minimum",
}


def _ours(combine_fn):
    fn = getattr(combine_fn, "fn", combine_fn)
    if getattr(fn, "__module__", "").startswith(_GENERATED):
        return fn.__name__
    return None


def _fast_reduce_scan(interpreter):
    """A replacement of the interpreter's ``_patch_reduce_scan`` with numpy fast paths."""
    import numpy as np

    orig = interpreter._patch_reduce_scan
    tl = interpreter.tl

    def patch(scope):
        orig(scope)
        slow_reduce, slow_scan = tl.reduce, tl.associative_scan

        def reduce(input, axis, combine_fn, keep_dims=False, **kwargs):
            fast = _FAST_REDUCE.get(_ours(combine_fn))
            if fast is None or axis is None:
                return slow_reduce(input, axis, combine_fn, keep_dims, **kwargs)
            ops = interpreter.ReduceOps(axis, combine_fn, keep_dims)
            val, idx = fast
            x = input[0] if isinstance(input, tuple) else input
            if val == "prod":
                return ops.to_tensor(np.prod(x.handle.data, axis=axis, keepdims=keep_dims), x.dtype)
            return ops.min_max(x, getattr(np, val), getattr(np, idx) if idx else None)

        def scan(input, axis, combine_fn, reverse=False, **kwargs):
            fast = _FAST_SCAN.get(_ours(combine_fn))
            if fast is None or isinstance(input, tuple):
                return slow_scan(input, axis, combine_fn, reverse, **kwargs)
            data = input.handle.data
            if reverse:
                data = np.flip(data, axis)
            out = getattr(np, fast).accumulate(data, axis=axis)
            if reverse:
                out = np.flip(out, axis)
            ops = interpreter.ScanOps(axis, combine_fn, reverse)
            return ops.to_tensor(np.ascontiguousarray(out), input.dtype)

        for owner in (tl, tl.core):
            scope.set_attr(owner, "reduce", reduce)
            scope.set_attr(owner, "associative_scan", scan)

    return patch


@contextlib.contextmanager
def interpret_scope():
    """Make ``triton.language`` interpretable for the duration of the block, then restore it."""
    from triton.runtime import interpreter

    with _interp_lock:
        twins = _jit_functions()
        scope = interpreter._LangPatchScope()
        scope.set_attr(interpreter, "_patch_reduce_scan", _fast_reduce_scan(interpreter))
        inner = interpreter._patch_lang(_lang_anchor())
        scope._changes[:0] = inner._changes  # restored after (and before) our own changes
        try:
            for owner, name, twin in twins:
                scope.set_attr(owner, name, twin)
            builder, binary_op = _fixed_binary_op(interpreter)
            scope.set_attr(builder, "binary_op", binary_op)
            # Triton's interpreter widens every int32 add / sub / mul to int64 to check it for
            # overflow, then discards the check (device_assert is a no-op without debug): a
            # third of an integer-heavy kernel's interpreted time. FlyDSL integers wrap.
            scope.set_attr(
                builder, "options", dataclasses.replace(builder.options, sanitize_overflow=False)
            )
            yield
        finally:
            scope.restore()


class InterpretedExecutable(Executable):
    """The generated source run by Triton's interpreter on CPU tensors (target ``cpu-interpret``)."""

    def __init__(self, gen: GeneratedKernel, path: Path, module):
        from triton.runtime.interpreter import InterpretedFunction

        self.generated = gen
        self.name = gen.name
        self.source = gen.source
        self.source_path = path
        from triton.runtime.jit import JITFunction

        self.jit_function = getattr(module, gen.name)
        self.kernel = InterpretedFunction(self.jit_function.fn)
        # Helpers the kernel calls directly must be interpreted too. The module holds
        # interpreter-only source (its own file), so rebinding its globals is private to it.
        for name, val in list(vars(module).items()):
            if isinstance(val, JITFunction) and name != gen.name:
                setattr(module, name, InterpretedFunction(val.fn))
        self.extract = make_extractor(gen.params, gen.nargs)
        self.compiled = None
        self.report = None

    def stages(self) -> dict[str, str]:
        return {"triton": self.source}

    def launch(self, grid, args):
        kargs = self.extract(args)
        for p in self.generated.params:
            if p.kind == "tensor" and not hasattr(args[p.arg], "data_ptr"):
                raise ArgumentError(f"{self.name}: argument {p.arg} must be a tensor")
        if grid[0] * grid[1] * grid[2] == 0:
            return
        from triton.runtime.errors import InterpreterError

        with interpret_scope():
            try:
                self.kernel[tuple(grid)](*kargs)
            except InterpreterError as e:
                raise TritonLaunchError(
                    f"Triton's interpreter failed running kernel {self.name!r}: {e}\n"
                    f"    generated source: {self.source_path}"
                ) from e

    def __repr__(self) -> str:
        return f"<InterpretedExecutable {self.name} (cpu-interpret)>"
