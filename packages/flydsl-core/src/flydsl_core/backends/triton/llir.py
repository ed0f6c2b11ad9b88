"""One rewrite of Triton's LLVM IR for AMD targets, between its ``llir`` and ``amdgcn`` stages.

Buffer descriptors at the kernel's entry. Triton builds a buffer load's descriptor
(``llvm.amdgcn.make.buffer.rsrc`` of a kernel argument and constants) next to the load, and
LLVM's LICM moves it into the preheader of the loop that holds the load: two sibling loops
over the same tensor (the attention forward's unmasked and masked KV loops) then get one
descriptor each, values LLVM cannot merge because neither preheader dominates the other.
Instruction selection splits each into 64-bit halves that the loop rebuilds into a 128-bit
register tuple, and where the first loop's tuple must be kept apart from the second loop's,
the register allocator left ``s_mov_b32`` copies in the loop: 4 per trip in gfx950's llama
forward main loop. A descriptor built more than once (same argument and constants) is built
once at the entry instead, shared by every load: 2 copies left (V's two constant words, whose
registers it shared with K's), 229 -> 227; with each moved descriptor's constant words from
its own ``s_mov_b32`` (``_build``) none, 224. One built once stays (moved, gfx950's dK/dV d128
loop took one instruction more).

The call has no memory effects and reads only its operands (an argument and constants), so
building it once at the entry, where those are defined, gives every use the same value; the
``s_mov_b32`` of a constant word writes that constant. Only such calls move; anything else
in the text is left as it is.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import Counter
from pathlib import Path

#: a descriptor from a kernel argument and constants: name, then its operands (pointer,
#: stride, records' type and value, flags)
_RSRC = re.compile(
    r"^\s*(%[-\w.$]+) = (?:tail )?call ptr addrspace\(8\) "
    r"@llvm\.amdgcn\.make\.buffer\.rsrc\.p8\.p1\(ptr addrspace\(1\) (%\d+), "
    r"i16 (-?\d+), (i32|i64) (-?\d+), i32 (-?\d+)\)(?:, !dbg !\d+)?\s*$"
)
_VALUE = r"(?![-\w.$])"  # a value name ends where no name character follows


def hoist_buffer_rsrc(llir: str) -> str:
    """``llir`` with every buffer descriptor of a kernel argument and constants that is built
    more than once built once, at the start of the kernel's entry block, and its uses renamed
    to that one. Text without such descriptors, or with more than one function definition,
    comes back unchanged."""
    lines = llir.split("\n")
    defines = [i for i, s in enumerate(lines) if s.startswith("define ")]
    if len(defines) != 1 or not lines[defines[0]].rstrip().endswith("{"):
        return llir
    d = defines[0]
    args = set(re.findall(r"%\d+" + _VALUE, lines[d]))
    found = [(i, _RSRC.match(s)) for i, s in enumerate(lines) if i > d]
    found = [(i, m) for i, m in found if m is not None and m.group(2) in args]
    # only descriptors built more than once move
    count = Counter(m.groups()[1:] for _, m in found)
    moved = {i: m for i, m in found if count[m.groups()[1:]] > 1}
    shared: dict[tuple[str, ...], str] = {}
    renamed: dict[str, str] = {}
    kept = []
    for i, s in enumerate(lines):
        m = moved.get(i)
        if m is None:
            kept.append(s)
            continue
        key = m.groups()[1:]
        renamed[m.group(1)] = shared.setdefault(key, f"%fly.rsrc.{len(shared)}")
    if not renamed:
        return llir
    text = "\n".join(kept)
    names = sorted(renamed, key=len, reverse=True)
    text = re.sub(
        "(" + "|".join(re.escape(n) for n in names) + ")" + _VALUE,
        lambda m: renamed[m.group(1)],
        text,
    )
    out = text.split("\n")
    entry = out.index(lines[d]) + 1
    out[entry:entry] = [s for key, name in shared.items() for s in _build(name, *key)]
    return "\n".join(out)


def _build(name, p, stride, rtype, records, flags):
    """The lines that build descriptor ``name`` at the entry. Its two constant words come
    from their own ``s_mov_b32`` each (inline asm: opaque to LLVM, so never merged with
    another descriptor's): with the constants shared, the register allocator copied them
    into the second descriptor's register tuple on every trip of a loop that used both
    (gfx950 llama forward, V's: 2 ``s_mov_b32`` per trip)."""
    n = name[1:]
    if not (0 <= int(records) < 1 << 32):  # an i64 count past 32 bits stays a constant
        return [
            f"  {name} = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1("
            f"ptr addrspace(1) {p}, i16 {stride}, {rtype} {records}, i32 {flags})"
        ]
    words = [
        f'  %{n}.records = call i32 asm sideeffect "s_mov_b32 $0, {int(records) & 0xFFFFFFFF:#x}", "=s"()',
        f'  %{n}.flags = call i32 asm sideeffect "s_mov_b32 $0, {int(flags) & 0xFFFFFFFF:#x}", "=s"()',
    ]
    rec = f"%{n}.records"
    if rtype == "i64":
        words.append(f"  %{n}.records64 = zext i32 %{n}.records to i64")
        rec = f"%{n}.records64"
    return [
        *words,
        f"  {name} = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1("
        f"ptr addrspace(1) {p}, i16 {stride}, {rtype} {rec}, i32 %{n}.flags)",
    ]


#: part of Triton's cache key for these compiles: changes with this module's text
_KEY = "flydsl-llir-" + hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
_state = threading.local()
_install_lock = threading.Lock()


def _hook(*args):
    """Triton's ``add_stages_inspection_hook``: called with no arguments for a cache-key part,
    and with ``(backend, stages, options, language, capability)`` to change the stages. Acts
    only for a compile this module started (``amd_llir_rewrites``) on this thread; otherwise it
    passes on to the hook that was installed before it, if any."""
    prev = _hook.previous
    if not getattr(_state, "on", False):
        return prev(*args) if prev is not None else (("", "") if not args else None)
    if prev is not None:
        got = prev(*args)
    else:
        got = ("", "") if not args else None
    if not args:
        key, digest = got
        return key + _KEY, digest + _KEY
    stages = args[1]
    make_llir = stages.get("llir")
    if make_llir is not None:
        stages["llir"] = lambda src, metadata: hoist_buffer_rsrc(make_llir(src, metadata))
    return got


_hook.previous = None


class amd_llir_rewrites:
    """Context manager: ``triton.compile`` calls on this thread inside it run
    ``hoist_buffer_rsrc`` on their LLVM IR (AMD targets, with the ``hoist_rsrc`` option:
    ``compiler.triton_compile`` decides). Opt-in per kernel config: it is not a win
    everywhere (gfx950's gpt-oss window forward took 164 -> 184 VGPRs, 3 -> 2 waves)."""

    def __enter__(self):
        from triton import knobs

        with _install_lock:
            current = knobs.runtime.add_stages_inspection_hook
            if current is not _hook:
                _hook.previous = current
                knobs.runtime.add_stages_inspection_hook = _hook
        _state.on = True
        return self

    def __exit__(self, *exc):
        _state.on = False
        return False
