"""A launch's options, and handing launches to another framework (``launch_sink``).

A launch's keyword arguments mix the kernel's parameters and the launch options
(``LAUNCH_OPTIONS``: the target and the compiler options); ``split_launch_options``
separates them as every launch does.

A framework that puts FlyDSL's generated source into its own program (torch-flydsl under
``torch.compile``: each launch becomes ``torch.library.wrap_triton(...)`` in an Inductor
graph) takes a FlyDSL API's launches over with ``with launch_sink(fn):``: every launch on the
thread calls ``fn(kernel, grid, args, kwargs)`` instead of compiling and running. In ``fn``,
``generated_launch(kernel, specs, target=, options=)`` gives what the launch would run,
generated and not compiled, for arguments specialized as ``specs`` (the bound arguments, or
``TensorSpec``s carrying only the facts the framework can prove for every value it will
pass): the source's function, the options a compile would use, and ``arguments(bound)``,
the function's arguments read from the launch's values as FlyDSL's own launcher reads them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LAUNCH_OPTIONS",
    "GeneratedLaunch",
    "current_sink",
    "generated_launch",
    "launch_sink",
    "split_launch_options",
]

#: kwargs of a launch that configure it rather than feed a parameter
LAUNCH_OPTIONS = ("target", "num_warps", "num_stages", "options")


def split_launch_options(kernel, kwargs: dict) -> tuple[dict, Any, dict]:
    """``(kwargs, target, options)``: a launch's keyword arguments without the launch options
    (a kernel parameter of the same name stays a parameter), its target (None: resolved at
    launch) and its compiler options (``options=`` merged with ``num_warps`` / ``num_stages``)."""
    kwargs = dict(kwargs)
    params = kernel.signature.parameters
    opts = {k: kwargs.pop(k) for k in LAUNCH_OPTIONS if k in kwargs and k not in params}
    target = opts.pop("target", None)
    options = dict(opts.pop("options", None) or {})
    options.update(opts)
    return kwargs, target, options


class _Sink(threading.local):
    # a class default, so that a thread that never set one reads None without the
    # AttributeError a getattr default costs (0.4 us of every launch here)
    fn = None


_SINK = _Sink()


def current_sink():
    """The function launches on this thread are handed to (``launch_sink``), or None."""
    return _SINK.fn


class launch_sink:
    """``with launch_sink(fn):`` launches on this thread call ``fn(kernel, grid, args, kwargs)``
    instead of compiling and running (``kwargs`` still holds the launch options). For callers
    that put a FlyDSL API's launches into another framework's graph (torch_flydsl under
    torch.compile);
    nested sinks restore the outer one on exit."""

    def __init__(self, fn):
        self.fn = fn
        self._prev = None

    def __enter__(self):
        self._prev = _SINK.fn
        _SINK.fn = self.fn
        return self

    def __exit__(self, *exc):
        _SINK.fn = self._prev


@dataclass(frozen=True)
class GeneratedLaunch:
    """What one launch runs, generated and not compiled (``generated_launch``)."""

    function: Any  # the generated source's function (a ``@triton.jit`` on the Triton backend)
    generated: Any  # the backend's description of the source (``GeneratedKernel``: parameters)
    target: str  # the canonical target name
    options: dict  # the options a compile would use (the backend's defaults filled in)
    runtime: tuple[str, ...]  # the kernel's run-time parameters, in order

    def arguments(self, bound: dict) -> tuple:
        """The function's arguments for a launch whose bound arguments are ``bound`` (names ->
        values: tensors and numbers, or a framework's stand-ins for them): the run-time
        values, and the sizes and strides the source takes as parameters."""
        from ..backends import get_backend

        values = tuple(bound[n] for n in self.runtime)
        return get_backend(self.target).source_arguments(self.generated, values)


def generated_launch(kernel, specs: dict, *, target, options: dict | None = None):
    """The ``GeneratedLaunch`` of ``kernel`` for arguments specialized as ``specs`` (parameter
    name -> a value, a ``TensorSpec`` or a number, as ``Kernel.compile`` takes them) on
    ``target``, whose backend must generate source (``Backend.generates_source``); ``options``
    are the launch's compiler options (``split_launch_options``)."""
    from ..backends import get_backend
    from ..targets import resolve_target

    tgt = resolve_target(target)
    function, generated = kernel.triton_function(target=tgt.name, **specs)
    runtime = tuple(kernel.specialize(kernel.bind((), specs)).runtime)
    opts = get_backend(tgt).compile_options(dict(options or {}))
    return GeneratedLaunch(function, generated, tgt.name, opts, runtime)
