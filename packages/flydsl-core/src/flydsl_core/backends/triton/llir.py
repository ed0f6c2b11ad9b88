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


# -- buffer offsets split into their uniform and per-lane parts --------------------------------

_NAME = r"%[-\w.$]+"
_DEF = re.compile(rf"^\s*({_NAME}) = (.*)$")
_LABEL = re.compile(r"^([-\w.$]+):")
_LOAD = re.compile(
    rf"^(\s*{_NAME} = (?:tail )?call (?:<[^>]*>|\S+) @llvm\.amdgcn\.raw\.ptr\.buffer\.load\.\w+\("
    rf"ptr addrspace\(8\) {_NAME}, i32 )({_NAME}), i32 0(, i32 \d+\).*)$"
)
_INT = re.compile(r"^-?\d+$")
_ADD = re.compile(rf"^(?:add(?: nuw| nsw)*|or disjoint) i32 ({_NAME}|-?\d+), ({_NAME}|-?\d+)$")
_SHL = re.compile(rf"^shl (?:nuw |nsw )*i32 ({_NAME}), (\d+)$")
_MUL = re.compile(rf"^mul (?:nuw |nsw )*i32 ({_NAME}), ({_NAME})$")
#: a masked load's offset: Triton's out-of-range offset on the lanes the mask drops
_MASKED = re.compile(rf"^select i1 ({_NAME}), i32 ({_NAME}), i32 (-2147483648)$")
#: integer operations whose result is uniform where every operand is
_UNIFORM_OPS = frozenset(
    [
        "add",
        "sub",
        "mul",
        "shl",
        "lshr",
        "ashr",
        "and",
        "or",
        "xor",
        "udiv",
        "sdiv",
        "urem",
        "srem",
        "icmp",
        "select",
        "zext",
        "sext",
        "trunc",
        "freeze",
        "phi",
    ]
)
#: calls whose result is uniform where every operand is
_UNIFORM_CALLS = re.compile(
    r"@llvm\.(?:amdgcn\.workgroup\.id\.[xyz]|amdgcn\.readfirstlane[.\w]*|[su]m(?:ax|in)\.i\d+)\("
)


def _bare(rhs: str) -> str:
    """An instruction's text without its trailing metadata (``, !dbg !12``)."""
    return re.sub(r",\s*!\S+ !\d+", "", rhs).strip()


def _operands(rhs: str) -> list[str]:
    rhs = _bare(rhs)
    if rhs.startswith("phi "):
        return re.findall(rf"\[\s*({_NAME}|[^,\]]+),\s*{_NAME}\s*\]", rhs)
    if "call" in rhs.split("(")[0]:
        rhs = rhs[rhs.index("(") :]
    return re.findall(_NAME + _VALUE, rhs)


def _opcode(rhs: str) -> str:
    w = rhs.removeprefix("tail ").split()
    return w[0] if w else ""


def split_buffer_offsets(llir: str) -> str:
    """``llir`` with each buffer load in a loop given the part of its offset that is the same
    on every lane as its scalar offset (``soffset``), and the lanes' own part alone as its
    vector offset (``voffset``).

    Triton passes a buffer load's whole byte offset as ``voffset`` with ``soffset = 0``: a
    loop that walks a tensor by a scalar step (dK/dV's query rows and their LSE and delta
    rows, the forward's keys) adds the step to every lane's offset and shifts the sum into
    bytes on each trip (a ``v_add_lshl_u32`` per load and trip). Split, the lanes' part is
    shifted once outside the loop, the uniform part on the scalar unit; a constant the lanes'
    part adds (a second 16-row block) goes to the scalar side too (as an immediate offset LLVM
    hoists it into a register of its own: one more VGPR across the loop).

    Exact: a raw buffer's address is its base plus ``voffset + soffset``, and
    ``(u + v) << c == (u << c) + (v << c)`` in 32 bits. A load masked by Triton's out-of-range
    offset (``select mask, offset, 0x80000000``) keeps that offset on the dropped lanes: with
    ``soffset`` a valid row's offset (below 2^31) the address stays past the buffer's records
    (0x7ffffffe) whether or not the range check counts ``soffset``. Only loads whose offset
    is ``(sum) << c`` in the load's block change, its terms split by a divergence analysis
    (values from the work-item id, loads and other calls are per-lane; see ``_UNIFORM_OPS``);
    a part this finds uniform that LLVM does not would be read through a readfirstlane loop
    (correct, slower). Text with more than one function definition comes back unchanged."""
    lines = llir.split("\n")
    defines = [i for i, s in enumerate(lines) if s.startswith("define ")]
    if len(defines) != 1 or not lines[defines[0]].rstrip().endswith("{"):
        return llir
    d = defines[0]
    end = next((i for i in range(d + 1, len(lines)) if lines[i].startswith("}")), len(lines))
    args = set(re.findall(_NAME + _VALUE, lines[d].split("(", 1)[1]))
    defs: dict[str, tuple[int, str, str]] = {}  # name -> (line, text without metadata, block)
    block = "%entry"
    for i in range(d + 1, end):
        m = _LABEL.match(lines[i])
        if m:
            block = "%" + m.group(1)
            continue
        m = _DEF.match(lines[i])
        if m:
            defs[m.group(1)] = (i, _bare(m.group(2)), block)
    uni = _uniform(defs, args, "\n".join(lines[d:end]))

    def uniform(v):
        return bool(_INT.match(v)) or v in args or v in uni

    def block_of(v):
        return defs[v][2] if v in defs else "%entry"

    def where(v):  # the line after which values derived from v go
        if v not in defs:
            return d
        i = defs[v][0]
        while _opcode(defs[v][1]) == "phi" and (m := _DEF.match(lines[i + 1])):
            if _opcode(m.group(2)) != "phi":
                break
            i += 1
        return i

    before: dict[int, list[str]] = {}
    after: dict[int, list[str]] = {}
    shifted: dict[tuple[str, int], str] = {}
    count = [0]

    def new(kind):
        count[0] += 1
        return f"%fly.{kind}.{count[0]}"

    def shl_at_def(v, c):  # v << c, computed once, where v is defined
        if (v, c) not in shifted:
            shifted[(v, c)] = name = new("sh")
            after.setdefault(where(v), []).append(f"  {name} = shl i32 {v}, {c}")
        return shifted[(v, c)]

    for i in range(d + 1, end):
        m = _LOAD.match(lines[i])
        if not m or m.group(2) not in defs:
            continue
        _, rhs, blk = defs[m.group(2)]
        masked = _MASKED.match(rhs)
        if masked:
            if block_of(masked.group(2)) != blk:
                continue
            rhs = defs[masked.group(2)][1]
        sm = _SHL.match(rhs)
        if not sm:
            continue
        c = int(sm.group(2))
        # the sum's terms: through its adds in the load's block and through any per-lane add
        leaves, todo = [], [sm.group(1)]
        while todo:
            v = todo.pop()
            am = _ADD.match(defs[v][1]) if v in defs else None
            if am and (block_of(v) == blk or not uniform(v)):
                todo += [am.group(1), am.group(2)]
            else:
                leaves.append(v)
        imm = sum(int(v) for v in leaves if _INT.match(v))
        terms = [v for v in leaves if not _INT.match(v) and uniform(v)]
        lanes = [v for v in leaves if not uniform(v)]
        if not lanes or not terms or any(block_of(v) == blk for v in lanes):
            continue
        ins = before.setdefault(i, [])
        if len(lanes) == 1:
            v = lanes[0]
            while v in defs and (am := _ADD.match(defs[v][1])) and _INT.match(am.group(2)):
                v, imm = am.group(1), imm + int(am.group(2))  # a constant: to the scalar side
            vo = shl_at_def(v, c)
        else:  # summed in the loop, where LLVM's LICM hoists it from
            vo = lanes[0]
            for w in lanes[1:]:
                name = new("ln")
                ins.append(f"  {name} = add i32 {vo}, {w}")
                vo = name
            name = new("sh")
            ins.append(f"  {name} = shl i32 {vo}, {c}")
            vo = name
        # the loop-invariant terms first, so that their sum is hoisted too
        so = None
        for u in sorted(terms, key=lambda u: block_of(u) == blk):
            mm = _MUL.match(defs[u][1]) if u in defs else None
            if block_of(u) != blk:
                t = shl_at_def(u, c)
            elif mm and block_of(mm.group(2)) != blk:  # a step times an invariant stride
                t = new("so")
                ins.append(f"  {t} = mul i32 {mm.group(1)}, {shl_at_def(mm.group(2), c)}")
            else:
                t = new("so")
                ins.append(f"  {t} = shl i32 {u}, {c}")
            if so is None:
                so = t
            else:
                name = new("so")
                ins.append(f"  {name} = add i32 {so}, {t}")
                so = name
        if imm:
            name = new("so")
            ins.append(f"  {name} = add i32 {so}, {imm << c}")
            so = name
        if masked:
            name = new("vo")
            ins.append(f"  {name} = select i1 {masked.group(1)}, i32 {vo}, i32 {masked.group(3)}")
            vo = name
        lines[i] = f"{m.group(1)}{vo}, i32 {so}{m.group(3)}"
    if not before:
        return llir
    out = []
    for i, s in enumerate(lines):
        out += before.get(i, [])
        out.append(s)
        out += after.get(i, [])
    return "\n".join(out)


def _uniform(defs, args, body: str) -> set[str]:
    """The values of ``defs`` that are the same on every lane: the largest set closed under
    ``_UNIFORM_OPS`` / ``_UNIFORM_CALLS`` over the arguments and constants. Phis only where
    every branch's condition is uniform (a phi after a divergent branch may differ by lane
    even where its incoming values do not)."""
    cand = {}
    for n, (_, rhs, _) in defs.items():
        op = _opcode(rhs)
        if op in _UNIFORM_OPS or (op == "call" and _UNIFORM_CALLS.search(rhs)):
            cand[n] = _operands(rhs)

    def closure(names):
        uni = set(names)
        changed = True
        while changed:
            changed = False
            for n in list(uni):
                if any(o.startswith("%") and o not in uni and o not in args for o in cand[n]):
                    uni.discard(n)
                    changed = True
        return uni

    uni = closure(cand)
    conds = re.findall(rf"^\s*br i1 ({_NAME}),", body, re.M)
    if any(c not in uni and c not in args for c in conds):
        uni = closure(n for n in cand if _opcode(defs[n][1]) != "phi")
    return uni
