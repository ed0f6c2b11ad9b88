"""Backends: each turns verified FlyIR into something that runs, and can store it.

The protocol is explicit (``Backend``, ``Executable``): ``compile`` makes an
executable, ``serialize`` gives the files that rebuild it and ``deserialize``
rebuilds it from them with no compile (the disk cache and AOT bundles use
these two); ``stores`` says whether a compile is worth storing at all.
``generates_source`` declares the one optional capability: a backend that
writes source another compiler can take over (Triton's ``@triton.jit``) hands
it out with ``source_function`` and says how a launch's run-time values map
onto its parameters with ``source_arguments``; ``compile_options`` gives the
options a compile of a launch would use. The runtime calls only these; it
never probes a backend for optional methods or imports a particular
backend's modules.

Which backend serves a target is a fact of the target (``Target.compiler``
in the target registry, one kind per backend: ``reference`` or ``triton``);
``get_backend`` makes one instance per target, lazily, so importing
flydsl_core loads neither torch's heavy parts nor Triton. Backends never
import each other.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..exc import ArgumentError, CacheError, UnknownTargetError
from ..targets import Target, get_target, register_target, unregister_target

#: backend kind -> "module:Class" of the backend serving targets of that kind
KINDS: dict[str, str] = {
    "reference": "flydsl_core.backends.reference:ReferenceBackend",
    "triton": "flydsl_core.backends.triton:TritonBackend",
}
_factories: dict[str, Callable[[Target], Backend]] = {}
_instances: dict[str, Backend] = {}
_lock = threading.Lock()


class Executable(ABC):
    """One specialization compiled for one target: what a backend's ``compile`` returns."""

    #: the ``ResourceReport`` of the compiled code, where the backend has one
    report: Any = None

    @abstractmethod
    def launch(self, grid: tuple[int, int, int], args: tuple) -> None:
        """Run on ``grid`` with the kernel's run-time arguments, in order."""

    def stages(self) -> dict[str, str | bytes]:
        """The backend's stages after FlyIR (generated source, compiler IRs, binary)."""
        return {}

    def describe(self) -> dict[str, Any]:
        """Launch facts for manifests (warps, shared memory, symbol name, compile options)."""
        return {}


class Backend(ABC):
    """Compiles FlyIR for one target (``self.target``) and stores what it compiled."""

    def __init__(self, target: Target):
        self.target = target

    @property
    def name(self) -> str:
        return self.target.name

    @abstractmethod
    def compile(self, fn, spec, options: dict) -> Executable:
        """An executable of the verified, optimized FlyIR ``fn`` for ``spec`` and ``options``."""

    @property
    def stores(self) -> bool:
        """Whether compiles for this target go to the disk cache and AOT bundles (``serialize``
        and ``deserialize`` work). False where compiling is cheaper than storing."""
        return False

    def serialize(self, exe: Executable) -> dict[str, bytes]:
        """The files that rebuild ``exe`` with ``deserialize``."""
        raise CacheError(f"the {self.name} backend does not store executables")

    def deserialize(self, directory: Path) -> Executable:
        """The executable whose ``serialize`` files are in ``directory``; no compile."""
        raise CacheError(f"the {self.name} backend does not store executables")

    @property
    def generates_source(self) -> bool:
        """Whether ``source_function`` and ``source_arguments`` work: the backend writes source
        another compiler can take over (no compile of its own needed)."""
        return False

    def source_function(self, fn) -> tuple[Any, Any]:
        """``(function, generated)`` for the verified, optimized FlyIR ``fn``: the function
        object of the source this backend generates for it (imported, not compiled) and the
        backend's description of that source (its parameters). Only where
        ``generates_source``."""
        raise ArgumentError(
            f"{fn.name}: target {self.name} does not generate Triton; use a GPU target or "
            "cpu-interpret"
        )

    def source_arguments(self, generated, values: tuple) -> tuple:
        """The arguments of ``source_function``'s function for a launch whose run-time values
        (in the kernel's order) are ``values``: what this backend's own launcher passes
        (tensors, and the sizes and strides the generated source takes as parameters)."""
        raise ArgumentError(f"target {self.name} does not generate source")

    def compile_options(self, options: dict) -> dict:
        """The options a compile of a launch with ``options`` would use on this target (the
        given ones with the backend's defaults); an option the target does not take is an
        error where ``compile`` would raise one."""
        return dict(options)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} for {self.name}>"


def register_kind(kind: str, factory: Callable[[Target], Backend]) -> None:
    """Serve targets whose ``compiler`` is ``kind`` with ``factory(target)`` (a Backend)."""
    with _lock:
        _factories[kind] = factory
        for name in [n for n, b in _instances.items() if b.target.compiler == kind]:
            del _instances[name]


def unregister_kind(kind: str) -> None:
    with _lock:
        _factories.pop(kind, None)
        for name in [n for n, b in _instances.items() if b.target.compiler == kind]:
            del _instances[name]


def get_backend(target: str | Target) -> Backend:
    """The backend instance serving ``target`` (a name, an alias or a Target)."""
    t = get_target(target)
    inst = _instances.get(t.name)
    if inst is not None and inst.target is t:
        return inst
    with _lock:
        inst = _instances.get(t.name)
        if inst is None or inst.target is not t:
            factory = _factories.get(t.compiler)
            if factory is None:
                path = KINDS.get(t.compiler)
                if path is None:
                    raise UnknownTargetError(
                        f"no backend of kind {t.compiler!r} serves target {t.name!r}; kinds: "
                        f"{', '.join(sorted({*KINDS, *_factories}))}"
                    )
                mod, cls = path.split(":")
                factory = getattr(importlib.import_module(mod), cls)
            inst = _instances[t.name] = factory(t)
        return inst


@contextlib.contextmanager
def temporary(name: str, backend: Backend) -> Iterator[Target]:
    """Within the block, the new CPU target ``name`` is served by ``backend`` (an instance;
    its ``target`` is set). For tools and tests that record what the runtime hands a
    backend: ``with temporary("recorder", Recorder()): k[grid](..., target="recorder")``."""
    target = register_target(
        Target(name=name, backend="cpu", arch=None, warp_size=1, compiler=f"temporary:{name}")
    )
    backend.target = target
    register_kind(target.compiler, lambda t: backend)
    try:
        yield target
    finally:
        unregister_kind(target.compiler)
        unregister_target(name)


__all__ = [
    "KINDS",
    "Backend",
    "Executable",
    "get_backend",
    "register_kind",
    "temporary",
    "unregister_kind",
]
