"""Stored executables: AOT bundles first, then the disk cache; and storing new compiles.

The launch path (``runtime/kernel.py``) calls ``lookup`` before it traces
anything and ``store`` after a real compile, for targets whose backend
``stores`` executables (the GPU targets). The key (``disk_key``) covers the
compiler's own sources (inside ``make_key``), the kernel's source and every
function it calls, the specialization (facts and constexprs), the pass
pipeline, the target and the options; nothing ambient. A hit rebuilds the
executable with the backend's ``deserialize``: no trace, no passes, no JIT
compile. ``on_compile`` hooks run before every real compile (tests use one
that fails, to prove a bundle or cache served the kernel).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ..exc import CacheError

log = logging.getLogger(__name__)

#: called as hook(kernel_name, target_name) before every real compile of a stored target
on_compile: list[Callable[[str, str], None]] = []
#: key -> directory holding a stored executable, from loaded AOT bundles
PRELOADED: dict[str, Path] = {}


def disk_key(kernel, fingerprint: str, spec, target: str, options: dict) -> str | None:
    """The content key of one compile, or None where a constexpr cannot be encoded."""
    from ..cache import make_key

    try:
        return str(
            make_key(
                kernel=kernel.name,
                source=fingerprint,
                specs=spec.specs,
                constexprs={k: (type(v).__name__, v) for k, v in spec.constexprs.items()},
                pipeline=list(kernel.pipeline) if kernel.pipeline else None,
                static_dims=kernel.static_dims,
                target=target,
                options=options,
            )
        )
    except TypeError as e:  # a constexpr the key cannot encode: compile, keep it in memory only
        log.debug("no disk key for %s: %s", kernel.name, e)
        return None


def lookup(name: str, key: str, backend):
    """The stored executable of ``key`` (an AOT bundle's, else the disk cache's), or None."""
    from ..cache import DiskCache

    where = PRELOADED.get(key)
    if where is not None:
        return backend.deserialize(where)
    cache = DiskCache.default()
    if cache.get(key) is None:
        return None
    try:
        return backend.deserialize(cache.path(key))
    except Exception as e:  # an entry that verifies but does not load: rebuild it
        try:
            cache.remove(key)
            done = "removed it; compiling again"
        except CacheError as gone:
            done = f"{gone.msg}; compiling again, the result is kept in memory only"
        log.warning(
            "stored kernel %s for %s did not load (%s: %s); %s",
            name,
            backend.name,
            type(e).__name__,
            e,
            done,
        )
        return None


def before_compile(name: str, target: str) -> None:
    for hook in on_compile:
        hook(name, target)


def store(name: str, key: str, backend, exe) -> None:
    """Put a fresh compile into the disk cache; a cache that cannot be written is a warning."""
    from ..cache import DiskCache

    try:
        DiskCache.default().put(key, backend.serialize(exe))
    except CacheError as e:
        log.warning("kernel %s for %s kept in memory only: %s", name, backend.name, e)
