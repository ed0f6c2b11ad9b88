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

import re
from collections import Counter

#: a descriptor from a kernel argument and constants: name, then its operands (pointer,
#: stride, records' type and value, flags)
_RSRC = re.compile(
    r"^\s*(%[-\w.$]+) = (?:tail )?call ptr addrspace\(8\) "
    r"@llvm\.amdgcn\.make\.buffer\.rsrc\.p8\.p1\(ptr addrspace\(1\) (%\d+), "
    r"i16 (-?\d+), (i32|i64) (-?\d+), i32 (-?\d+)\)(?:, !dbg !\d+)?\s*$"
)
_VALUE = r"(?![-\w.$])"  # a value name ends where no name character follows


def hoist_buffer_rsrc(llir: str, every: bool = False) -> str:
    """``llir`` with every buffer descriptor of a kernel argument and constants that is built
    more than once (``every``: every one) built once, at the start of the kernel's entry block,
    and its uses renamed to that one. Text without such descriptors, or with more than one
    function definition, comes back unchanged.

    ``every`` (the option's ``"all"``): a descriptor built once moves too, its constant words
    then also from their own ``s_mov_b32``. Where a loop reads several tensors whose
    descriptors share those words (gfx950's dK/dV with Q and dO staged once: dO's and the
    LSE rows' descriptors), the register allocator copied them into each tuple every trip:
    llama dK/dV 150 -> 146 loop instructions per trip. Elsewhere it can cost (the forward's
    masked loop, decode page64: one more), so it is its own choice."""
    lines = llir.split("\n")
    defines = [i for i, s in enumerate(lines) if s.startswith("define ")]
    if len(defines) != 1 or not lines[defines[0]].rstrip().endswith("{"):
        return llir
    d = defines[0]
    args = set(re.findall(r"%\d+" + _VALUE, lines[d]))
    found = [(i, _RSRC.match(s)) for i, s in enumerate(lines) if i > d]
    found = [(i, m) for i, m in found if m is not None and m.group(2) in args]
    # only descriptors built more than once move, unless every one does
    count = Counter(m.groups()[1:] for _, m in found)
    moved = {i: m for i, m in found if every or count[m.groups()[1:]] > 1}
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
