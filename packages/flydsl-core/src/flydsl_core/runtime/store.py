"""Where compiled GPU code comes from before it is compiled: AOT bundles, then the disk cache.

``lookup_or_compile`` is called by ``Kernel`` for GPU targets. The key
(``disk_key``) covers the compiler's own sources (inside ``make_key``), the
kernel's source and every function it calls, the specialization (facts and
constexprs), the pass pipeline, the target and the options; nothing ambient.
A hit rebuilds the executable from stored code objects with no JIT compile.
``on_compile`` hooks run before every real compile (tests use one that
fails, to prove a bundle or cache served the kernel).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

#: called as hook(kernel_name, target_name) before every real GPU compile
on_compile: list[Callable[[str, str], None]] = []
#: key -> directory holding a stored executable, from loaded AOT bundles
PRELOADED: dict[str, Path] = {}


def disk_key(kernel, spec, target: str, options: dict) -> str | None:
    from ..cache import make_key, source_fingerprint

    try:
        return str(
            make_key(
                kernel=kernel.name,
                source=source_fingerprint(kernel.fn),
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


def lookup_or_compile(kernel, ir, spec, backend, target: str, options: dict):
    from ..backends.triton.compiler import executable_files, load_executable
    from ..cache import DiskCache
    from ..targets import get_target

    tgt = get_target(target)
    key = disk_key(kernel, spec, target, options)
    if key is not None:
        where = PRELOADED.get(key)
        if where is not None:
            return load_executable(where, tgt), key
        cache = DiskCache.default()
        if cache.get(key) is not None:
            try:
                return load_executable(cache.path(key), tgt), key
            except Exception as e:  # an entry that verifies but does not load: rebuild it
                log.warning(
                    "stored kernel %s for %s did not load (%s); recompiling", kernel.name, target, e
                )
                cache.remove(key)
    for hook in on_compile:
        hook(kernel.name, target)
    exe = backend.compile(ir, spec, options)
    if key is not None:
        from ..exc import CacheError

        try:
            DiskCache.default().put(key, executable_files(exe))
        except CacheError as e:
            log.warning("compile cache not written: %s", e)
    return exe, key
