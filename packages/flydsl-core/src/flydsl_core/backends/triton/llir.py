"""Rewrites of Triton's LLVM IR for AMD targets, between its ``llir`` and ``amdgcn`` stages.

``hoist_buffer_rsrc``: buffer descriptors at the kernel's entry. Triton builds a buffer load's descriptor
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

``buffer_soffset``: a based buffer load's scalar origin in the load's scalar offset (below).
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


#: a descriptor of any pointer (name, pointer, then stride, records' type and value, flags)
_RSRC_ANY = re.compile(
    r"^\s*(%[-\w.$]+) = (?:tail )?call ptr addrspace\(8\) "
    r"@llvm\.amdgcn\.make\.buffer\.rsrc\.p8\.p1\(ptr addrspace\(1\) (%[-\w.$]+), "
    r"i16 (-?\d+), (i32|i64) (-?\d+), i32 (-?\d+)\)(?:, !dbg !\d+)?\s*$"
)
_DEF = re.compile(r"^\s*(%[-\w.$]+) = (.*?)(?:, !dbg !\d+)?\s*$")
#: a buffer load through a descriptor with no scalar offset: prefix, descriptor, voffset
_LOAD0 = re.compile(
    r"(@llvm\.amdgcn\.raw\.ptr\.buffer\.load\.[\w.]+\(ptr addrspace\(8\) )"
    r"(%[-\w.$]+)(, i32 (?:%[-\w.$]+|-?\d+), )i32 0,"
)


def buffer_soffset(llir: str) -> str:
    """``llir`` with the loads of each buffer descriptor built from a kernel argument plus a
    32-bit element offset (``load_at``'s folded base: ``inttoptr(ptrtoint(arg) + (sext X <<
    k))``, Triton's form for ``(ptr.to(int64) + X.to(int64) * 2^k).to(ptr)``) reading through
    the argument's own descriptor, built once at the entry, with ``X << k`` as their scalar
    offset (``soffset``). Per KV tile the forward's paged decode then computes the page's
    32-bit byte offset once for K and V where it built two 64-bit bases and their descriptors
    (gfx950 decode d64 page256: ``s_ashr``, ``s_lshl_b64`` and three instructions per tensor
    and trip).

    Exact for a based load whose origin is an element of a tensor with buffer loads (Triton's
    ``tt.pointer_range = 32``: storage below 2 GiB, checked at launch): ``X << k`` is then the
    in-bounds byte offset below 2^31 it was as a 64-bit address, the hardware adds it to the
    base as the 64-bit add did, and whether or not a target's bounds check counts the scalar
    offset, an element in range stays in range (its whole byte offset is below 2^31 - 2, the
    records Triton gives) and a masked-off one (voffset 2^31) stays out of range with no 32-bit
    wrap. A descriptor with any other use (a store, a nonzero scalar offset) is left alone, as
    is text with more than one function definition."""
    lines = llir.split("\n")
    defines = [i for i, s in enumerate(lines) if s.startswith("define ")]
    if len(defines) != 1 or not lines[defines[0]].rstrip().endswith("{"):
        return llir
    d = defines[0]
    args = set(re.findall(r"%\d+" + _VALUE, lines[d]))
    defs = {}
    for s in lines[d + 1 :]:
        m = _DEF.match(s)
        if m:
            defs[m.group(1)] = m.group(2)

    def origin(p):
        """(argument, X, k) of a pointer ``inttoptr(ptrtoint(arg) + (ext X << k))``, or None."""
        m = re.fullmatch(r"inttoptr i64 (%[-\w.$]+) to ptr addrspace\(1\)", defs.get(p, ""))
        a = m and re.fullmatch(
            r"add (?:nuw |nsw )*i64 (%[-\w.$]+), (%[-\w.$]+)", defs.get(m.group(1), "")
        )
        if not a:
            return None
        for off, base in ((a.group(1), a.group(2)), (a.group(2), a.group(1))):
            b = re.fullmatch(r"ptrtoint ptr addrspace\(1\) (%\d+) to i64", defs.get(base, ""))
            sh = re.fullmatch(r"shl nsw i64 (%[-\w.$]+), ([0-3])", defs.get(off, ""))
            e = sh and re.fullmatch(
                r"(?:sext|zext nneg) i32 (%[-\w.$]+) to i64", defs.get(sh.group(1), "")
            )
            if b and b.group(1) in args and e:
                return b.group(1), e.group(1), sh.group(2)
        return None

    # descriptors to redirect: old name -> (shared descriptor's name, this one's soffset name)
    found = {}
    for i, s in enumerate(lines):
        m = _RSRC_ANY.match(s) if i > d else None
        o = m and origin(m.group(2))
        if o:
            found[m.group(1)] = (i, o, m.groups()[2:])
    text = "\n".join(lines)
    block, b = [], 0  # each line's basic block (a label starts one)
    for s in lines:
        b += bool(re.match(r"^[-\w.$]+:", s))
        block.append(b)
    for name in list(found):
        uses = len(re.findall(re.escape(name) + _VALUE, text)) - 1
        at = [i for i, s in enumerate(lines) for m in _LOAD0.finditer(s) if m.group(2) == name]
        # no load, a use other than a load with no scalar offset, or a descriptor LLVM moved out of
        # its loads' block (built once before their loop already; gfx950 decode d128 page16's
        # V head origin: one instruction more per trip as a scalar offset): left alone
        if not at or uses != len(at) or any(block[i] != block[found[name][0]] for i in at):
            del found[name]
    if not found:
        return llir
    shared: dict[tuple, str] = {}
    renamed: dict[str, tuple[str, str]] = {}
    after: dict[int, list[str]] = {}
    for k, (name, (i, (arg, x, sh), consts)) in enumerate(found.items()):
        key = (arg, *consts)
        new = shared.setdefault(key, f"%fly.soff.rsrc.{len(shared)}")
        so = f"%fly.soff.{k}"
        after[i] = [f"  {so} = shl i32 {x}, {sh}"]
        renamed[name] = (new, so)
    out = []
    for i, s in enumerate(lines):
        if i > d:
            s = _LOAD0.sub(
                lambda m: (
                    f"{m.group(1)}{renamed[m.group(2)][0]}{m.group(3)}i32 {renamed[m.group(2)][1]},"
                    if m.group(2) in renamed
                    else m.group(0)
                ),
                s,
            )
        out.append(s)
        out.extend(after.get(i, ()))
    out[d + 1 : d + 1] = [s for key, name in shared.items() for s in _build_pure(name, *key)]
    return "\n".join(out)


def _build_pure(name, p, stride, rtype, records, flags):
    """``_build``'s descriptor with its constant words from inline asm that reads and writes no
    memory (``memory(none)``), each naming its descriptor in a comment so that LLVM merges no
    two: a side-effecting asm call at the entry counted as a possible store before every
    load of the kernel, and LLVM read the block table with vector loads (their page offset then
    divergent: a waterfall loop per buffer load). gfx950 decode d64 page256: the V
    descriptor's two shared words copied every trip without them (268 -> 266)."""
    n = name[1:]
    if not (0 <= int(records) < 1 << 32):
        return [
            f"  {name} = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1("
            f"ptr addrspace(1) {p}, i16 {stride}, {rtype} {records}, i32 {flags})"
        ]
    pure = "nounwind memory(none)"
    lines = [
        f'  %{n}.records = call i32 asm "s_mov_b32 $0, {int(records):#x} ; {n}", "=s"() {pure}',
        f'  %{n}.flags = call i32 asm "s_mov_b32 $0, {int(flags) & 0xFFFFFFFF:#x} ; {n}", "=s"() {pure}',
    ]
    rec = f"%{n}.records"
    if rtype == "i64":
        lines.append(f"  %{n}.records64 = zext i32 %{n}.records to i64")
        rec = f"%{n}.records64"
    return [
        *lines,
        f"  {name} = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1("
        f"ptr addrspace(1) {p}, i16 {stride}, {rtype} {rec}, i32 %{n}.flags)",
    ]
