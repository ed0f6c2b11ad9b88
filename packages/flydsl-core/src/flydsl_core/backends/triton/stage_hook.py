"""FlyDSL's own rewrites of Triton's intermediate code on AMD, through Triton's stage hook.

Triton holds one process-wide hook (``knobs.runtime.add_stages_inspection_hook``): it calls it
with no arguments for a part of the cache key, then (AMD's ``add_stages``) with the backend's
stage table, whose entries the hook may wrap. ``rewrites(names)`` installs ``_hook`` once
(chaining whatever hook was installed before it, which keeps working) and marks the calling
thread's compile with the rewrites it asks for; any other compile, another thread's (a
``torch.compile`` one, say) or a later one, goes through the earlier hook alone, under its
usual key. The rewrites, each a compile option of FlyDSL's own (``REWRITES``, never given to
Triton):

* ``share_transposed_operands``: the TTGIR through ``shared_operands.rewrite_module`` (a tile
  two matrix products read, one transposed, staged through LDS once);
* ``hoist_rsrc``: the LLVM IR through ``llir.hoist_buffer_rsrc`` (buffer descriptors several
  loops build from one kernel argument built once at the entry).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from pathlib import Path

from .llir import hoist_buffer_rsrc
from .shared_operands import SHARE_TRANSPOSED, rewrite_module

HOIST_RSRC = "hoist_rsrc"
#: the compile options that name a rewrite (AMD targets only: ``compiler.triton_options``)
REWRITES = frozenset({HOIST_RSRC, SHARE_TRANSPOSED})

#: a part of Triton's cache key for a rewriting compile: changes with the rewrites' code
_KEY = hashlib.sha256(
    b"".join((Path(__file__).parent / f).read_bytes() for f in ("llir.py", "shared_operands.py"))
).hexdigest()[:16]
_state = threading.local()
_install_lock = threading.Lock()


def _active() -> tuple[str, ...]:
    return getattr(_state, "names", ())


def _hook(*args):
    """Triton's stage hook: the earlier hook's answer, plus, inside ``rewrites`` on this
    thread, a cache-key part (no arguments) or the rewrites wrapped around their stages
    (``(backend, stages, options, language, capability)``)."""
    prev = _hook.previous
    got = prev(*args) if prev is not None else (("", "") if not args else None)
    names = _active()
    if not names:
        return got
    if not args:
        key, digest = got
        part = f"-fly-{'+'.join(names)}-{_KEY}"
        return key + part, digest + part
    stages = args[1]
    if SHARE_TRANSPOSED in names and "ttgir" in stages:
        make_ttgir = stages["ttgir"]
        stages["ttgir"] = lambda src, metadata: rewrite_module(make_ttgir(src, metadata))
    if HOIST_RSRC in names and "llir" in stages:
        make_llir = stages["llir"]
        stages["llir"] = lambda src, metadata: hoist_buffer_rsrc(make_llir(src, metadata))
    return got


_hook.previous = None


@contextlib.contextmanager
def rewrites(names):
    """Within it, ``triton.compile`` calls on this thread run the rewrites ``names`` (a subset
    of ``REWRITES``); none: nothing is installed or changed."""
    names = tuple(sorted(set(names)))
    unknown = set(names) - REWRITES
    if unknown:
        raise ValueError(f"unknown rewrites {sorted(unknown)}; known: {sorted(REWRITES)}")
    if not names:
        yield
        return
    from triton import knobs

    with _install_lock:
        current = knobs.runtime.add_stages_inspection_hook
        if current is not _hook:
            _hook.previous = current
            knobs.runtime.add_stages_inspection_hook = _hook
    outer = _active()
    _state.names = names
    try:
        yield
    finally:
        _state.names = outer
