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
  loops build from one kernel argument built once at the entry; the value ``"all"``: every
  descriptor of a kernel argument);
* ``buffer_soffset``: the LLVM IR through ``llir.buffer_soffset`` (a based buffer load's
  scalar origin in the load's scalar offset, the argument's descriptor built once);
* ``split_buffer_offsets``: the LLVM IR through ``llir.split_buffer_offsets`` (a loop's buffer
  loads take the uniform part of their offsets as the scalar offset);
* ``wait_tr_reads``: the LLVM IR through ``llir.wait_tr_reads`` (one LDS wait before the matrix
  products that read transposed LDS reads, gfx9);
* ``direct_lds``: the TTGIR through ``direct_lds.rewrite_module`` (a matrix operand's tile
  loaded straight into LDS by gfx950's buffer loads, outside Triton's pipeliner), after
  ``share_transposed_operands`` where both are asked for, and the LLVM IR through
  ``direct_lds.llir_rewrite`` (the copies' waits kept behind the products that cover them; the
  AGPR and unused-input attributes LLVM's inference leaves off such a kernel).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from pathlib import Path

from . import direct_lds
from .llir import buffer_soffset, hoist_buffer_rsrc, split_buffer_offsets, wait_tr_reads
from .shared_operands import SHARE_TRANSPOSED, rewrite_module

HOIST_RSRC = "hoist_rsrc"
BUFFER_SOFFSET = "buffer_soffset"
SPLIT_OFFSETS = "split_buffer_offsets"
WAIT_TR = "wait_tr_reads"
#: the compile options that name a rewrite (AMD targets only: ``compiler.triton_options``)
DIRECT_LDS = direct_lds.DIRECT_LDS
REWRITES = frozenset(
    {HOIST_RSRC, SHARE_TRANSPOSED, BUFFER_SOFFSET, SPLIT_OFFSETS, WAIT_TR, DIRECT_LDS}
)
#: the TTGIR rewrites in the order they run on Triton's ``ttgir`` stage
TTGIR_REWRITES = (
    (SHARE_TRANSPOSED, rewrite_module),
    (DIRECT_LDS, direct_lds.rewrite_module),
)
#: the values ``hoist_rsrc`` takes: True (descriptors built more than once) or ``"all"``
HOIST_VALUES = (True, "all")
#: the LLVM IR rewrites in the order they run on Triton's ``llir`` stage: each takes the text
#: and its option's value
LLIR_REWRITES = (
    (DIRECT_LDS, lambda text, value: direct_lds.llir_rewrite(text)),
    (BUFFER_SOFFSET, lambda text, value: buffer_soffset(text)),
    (HOIST_RSRC, lambda text, value: hoist_buffer_rsrc(text, value == "all")),
    (SPLIT_OFFSETS, lambda text, value: split_buffer_offsets(text)),
    (WAIT_TR, lambda text, value: wait_tr_reads(text)),
)

#: a part of Triton's cache key for a rewriting compile: changes with the rewrites' code
_KEY = hashlib.sha256(
    b"".join(
        (Path(__file__).parent / f).read_bytes()
        for f in ("llir.py", "shared_operands.py", "ttgir_text.py")
    )
).hexdigest()[:16]
#: the same for ``direct_lds``'s code, in the key of the compiles that ask for it only
_KEY_DIRECT_LDS = hashlib.sha256(
    (Path(__file__).parent / "direct_lds.py").read_bytes()
).hexdigest()[:16]
_state = threading.local()
_install_lock = threading.Lock()


def _active() -> dict:
    return getattr(_state, "rewrites", {})


def _hook(*args):
    """Triton's stage hook: the earlier hook's answer, plus, inside ``rewrites`` on this
    thread, a cache-key part (no arguments) or the rewrites wrapped around their stages
    (``(backend, stages, options, language, capability)``)."""
    prev = _hook.previous
    got = prev(*args) if prev is not None else (("", "") if not args else None)
    active = _active()
    if not active:
        return got
    if not args:
        key, digest = got
        names = "+".join(n if v is True else f"{n}={v}" for n, v in sorted(active.items()))
        part = f"-fly-{names}-{_KEY}"
        if DIRECT_LDS in active:
            part += f"-{_KEY_DIRECT_LDS}"
        return key + part, digest + part
    stages = args[1]
    module_rewrites = [rewrite for name, rewrite in TTGIR_REWRITES if name in active]
    if module_rewrites and "ttgir" in stages:
        make_ttgir = stages["ttgir"]

        def ttgir(src, metadata):
            mod = make_ttgir(src, metadata)
            for rewrite in module_rewrites:
                mod = rewrite(mod)
            return mod

        stages["ttgir"] = ttgir
    chosen = [(rewrite, active[name]) for name, rewrite in LLIR_REWRITES if name in active]
    if chosen and "llir" in stages:
        make_llir = stages["llir"]

        def llir(src, metadata):
            text = make_llir(src, metadata)
            for rewrite, value in chosen:
                text = rewrite(text, value)
            return text

        stages["llir"] = llir
    return got


_hook.previous = None


@contextlib.contextmanager
def rewrites(chosen):
    """Within it, ``triton.compile`` calls on this thread run the rewrites ``chosen`` (names of
    ``REWRITES``, or ``{name: value}``: ``hoist_rsrc`` one of ``HOIST_VALUES``, the others
    True); none: nothing is installed or changed."""
    chosen = dict(chosen) if isinstance(chosen, dict) else dict.fromkeys(chosen, True)
    unknown = set(chosen) - REWRITES
    if unknown:
        raise ValueError(f"unknown rewrites {sorted(unknown)}; known: {sorted(REWRITES)}")
    if HOIST_RSRC in chosen and chosen[HOIST_RSRC] not in HOIST_VALUES:
        raise ValueError(f"hoist_rsrc is True or 'all', got {chosen[HOIST_RSRC]!r}")
    if not chosen:
        yield
        return
    from triton import knobs

    with _install_lock:
        current = knobs.runtime.add_stages_inspection_hook
        if current is not _hook:
            _hook.previous = current
            knobs.runtime.add_stages_inspection_hook = _hook
    outer = _active()
    _state.rewrites = chosen
    try:
        yield
    finally:
        _state.rewrites = outer
