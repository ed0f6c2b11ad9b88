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

``split_buffer_offsets``: a loop's buffer loads take the uniform part of their offsets as the
scalar offset (below).

``wait_tr_reads``: one wait for LDS before the matrix products that read transposed LDS reads
(below).
"""

from __future__ import annotations

import re
from collections import Counter

#: a buffer descriptor built from a pointer and constants: name, then its operands (pointer,
#: stride, records' type and value, flags); hoist_buffer_rsrc keeps those of a kernel argument
_RSRC = re.compile(
    r"^\s*(%[-\w.$]+) = (?:tail )?call ptr addrspace\(8\) "
    r"@llvm\.amdgcn\.make\.buffer\.rsrc\.p8\.p1\(ptr addrspace\(1\) (%[-\w.$]+), "
    r"i16 (-?\d+), (i32|i64) (-?\d+), i32 (-?\d+)\)(?:, !dbg !\d+)?\s*$"
)
_VALUE = r"(?![-\w.$])"  # a value name ends where no name character follows


def _one_definition(lines: list[str]) -> int | None:
    """The line of the text's one function definition (its body opened on that line), or None
    where there is none or more than one: every rewrite here reads a single kernel."""
    defines = [i for i, s in enumerate(lines) if s.startswith("define ")]
    if len(defines) != 1 or not lines[defines[0]].rstrip().endswith("{"):
        return None
    return defines[0]


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
    d = _one_definition(lines)
    if d is None:
        return llir
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


def _build(name, p, stride, rtype, records, flags, pure=False):
    """The lines that build descriptor ``name`` at the entry. Its two constant words come
    from their own ``s_mov_b32`` each (inline asm: opaque to LLVM, so never merged with
    another descriptor's): with the constants shared, the register allocator copied them
    into the second descriptor's register tuple on every trip of a loop that used both
    (gfx950 llama forward, V's: 2 ``s_mov_b32`` per trip).

    ``pure`` (``buffer_soffset``): the asm reads and writes no memory (``memory(none)``), each
    call naming its descriptor in a comment so that LLVM merges no two. A side-effecting asm
    call at the entry counted as a possible store before every load of the kernel, and LLVM
    read the block table with vector loads (their page offset then divergent: a waterfall
    loop per buffer load); gfx950 decode d64 page256 without the asm words: the V
    descriptor's two shared words copied every trip (268 -> 266)."""
    n = name[1:]
    if not (0 <= int(records) < 1 << 32):  # an i64 count past 32 bits stays a constant
        return [
            f"  {name} = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1("
            f"ptr addrspace(1) {p}, i16 {stride}, {rtype} {records}, i32 {flags})"
        ]

    def word(what, value):
        if pure:
            return (
                f'  %{n}.{what} = call i32 asm "s_mov_b32 $0, {value:#x} ; {n}", "=s"() '
                "nounwind memory(none)"
            )
        return f'  %{n}.{what} = call i32 asm sideeffect "s_mov_b32 $0, {value:#x}", "=s"()'

    words = [word("records", int(records)), word("flags", int(flags) & 0xFFFFFFFF)]
    rec = f"%{n}.records"
    if rtype == "i64":
        words.append(f"  %{n}.records64 = zext i32 %{n}.records to i64")
        rec = f"%{n}.records64"
    return [
        *words,
        f"  {name} = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1("
        f"ptr addrspace(1) {p}, i16 {stride}, {rtype} {rec}, i32 %{n}.flags)",
    ]


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
    d = _one_definition(lines)
    if d is None:
        return llir
    args = set(re.findall(r"%\d+" + _VALUE, lines[d]))
    defs = {}
    for s in lines[d + 1 :]:
        m = _DEF_LINE.match(s)
        if m:
            defs[m.group(1)] = _bare(m.group(2))

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
        m = _RSRC.match(s) if i > d else None
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
    out[d + 1 : d + 1] = [s for key, name in shared.items() for s in _build(name, *key, pure=True)]
    return "\n".join(out)


# -- buffer offsets split into their uniform and per-lane parts --------------------------------

_NAME = r"%[-\w.$]+"
_DEF_LINE = re.compile(rf"^\s*({_NAME}) = (.*)$")
_LABEL = re.compile(r"^([-\w.$]+):")
_LOAD = re.compile(
    rf"^(\s*{_NAME} = (?:tail )?call (?:<[^>]*>|\S+) @llvm\.amdgcn\.raw\.ptr\.buffer\.load\.\w+\("
    rf"ptr addrspace\(8\) {_NAME}, i32 )({_NAME}), i32 0(, i32 \d+\).*)$"
)
_RFL_CALL = "@llvm.amdgcn.readfirstlane.i32("
_RFL_DECL = "declare i32 @llvm.amdgcn.readfirstlane.i32(i32)"
#: a buffer load straight into LDS (gfx950's async copy: ``direct_lds``): the LDS address and
#: the bytes a lane writes come before the offsets, the instruction offset after them
_LOAD_LDS = re.compile(
    rf"^(\s*(?:tail )?call void @llvm\.amdgcn\.raw\.ptr\.buffer\.load\.(?:async\.)?lds\("
    rf"ptr addrspace\(8\) {_NAME}, ptr addrspace\(3\) [^,]+, i32 \d+, i32 )({_NAME}), i32 0"
    rf"(, i32 \d+, i32 \d+\).*)$"
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
    ``(u + v) << c == (u << c) + (v << c)`` in 32 bits. Precondition: both parts are the
    non-negative offsets they are in a tile load (index times stride summed per dimension,
    every index and stride non-negative, the tile's start on the scalar side and the lanes'
    rows and columns on the vector side), as ``soffset`` is unsigned and the range check
    reads ``voffset`` (gfx9's MUBUF: the SGPR offset is added after it); a negative constant
    moved to the scalar side is refused. A load masked by Triton's out-of-range
    offset (``select mask, offset, 0x80000000``) keeps that offset on the dropped lanes: with
    ``soffset`` a valid row's offset (below 2^31) the address stays past the buffer's records
    (0x7ffffffe) whether or not the range check counts ``soffset``. Only loads whose offset
    is ``(sum) << c`` in the load's block change, its terms split by a divergence analysis
    (values from the work-item id, loads and other calls are per-lane; see ``_UNIFORM_OPS``);
    a part this finds uniform that LLVM does not would be read through a readfirstlane loop
    (correct, slower). Text with more than one function definition comes back unchanged."""
    lines = llir.split("\n")
    d = _one_definition(lines)
    if d is None:
        return llir
    end = next((i for i in range(d + 1, len(lines)) if lines[i].startswith("}")), len(lines))
    args = set(re.findall(_NAME + _VALUE, lines[d].split("(", 1)[1]))
    defs: dict[str, tuple[int, str, str]] = {}  # name -> (line, text without metadata, block)
    block = "%entry"
    for i in range(d + 1, end):
        m = _LABEL.match(lines[i])
        if m:
            block = "%" + m.group(1)
            continue
        m = _DEF_LINE.match(lines[i])
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
        while _opcode(defs[v][1]) == "phi" and (m := _DEF_LINE.match(lines[i + 1])):
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
        m = _LOAD.match(lines[i]) or _LOAD_LDS.match(lines[i])
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
        if len(lanes) == 1:
            v = lanes[0]
            while v in defs and (am := _ADD.match(defs[v][1])) and _INT.match(am.group(2)):
                v, imm = am.group(1), imm + int(am.group(2))  # a constant: to the scalar side
        if imm < 0:
            # the scalar offset is unsigned: a negative constant on the scalar side could make
            # it wrap where the whole offset did not (left alone)
            continue
        ins = before.setdefault(i, [])
        if len(lanes) == 1:
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
        if m.re is _LOAD_LDS:
            # LLVM reads a scalar offset it finds divergent through a readfirstlane loop, and
            # found the LDS loads' one divergent in gfx950's forward's last KV loop (8 such
            # loops a trip); it is uniform by the analysis above, so lane 0's value is exact,
            # and readfirstlane tells LLVM so
            name = new("so")
            ins.append(f"  {name} = call i32 {_RFL_CALL}i32 {so})")
            so = name
        lines[i] = f"{m.group(1)}{vo}, i32 {so}{m.group(3)}"
    if not before:
        return llir
    out = []
    for i, s in enumerate(lines):
        out += before.get(i, [])
        out.append(s)
        out += after.get(i, [])
    text = "\n".join(out)
    return declared(text, _RFL_DECL) if _RFL_CALL in text else text


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


#: a matrix op's call: its result and its first two (matrix) operands
_MFMA_CALL = re.compile(
    rf"^\s*{_NAME} = (?:tail )?call [^@]*@llvm\.amdgcn\.mfma\.[\w.]+\(<\d+ x \w+> ({_NAME}), "
    rf"<\d+ x \w+> ({_NAME}),"
)
_TR_READ = re.compile(rf"^\s*({_NAME}) = (?:tail )?call [^@]*@llvm\.amdgcn\.ds\.read\.tr")
_SHUFFLE = re.compile(
    rf"^\s*({_NAME}) = shufflevector <\d+ x \w+> ({_NAME}), <\d+ x \w+> ({_NAME}),"
)
#: gfx9's ``s_waitcnt`` immediate for ``lgkmcnt(0)`` alone: vmcnt (bits 3:0 and 15:14) and
#: expcnt (6:4) at their maxima, which wait on nothing
LGKMCNT0_GFX9 = 0xC07F
_WAITCNT_DECL = "declare void @llvm.amdgcn.s.waitcnt(i32)"


def wait_tr_reads(llir: str) -> str:
    """``llir`` with an ``s_waitcnt lgkmcnt(0)`` (``llvm.amdgcn.s.waitcnt``) before the first
    matrix op that takes a transposed LDS read (``llvm.amdgcn.ds.read.tr*``, directly or
    through a ``shufflevector`` of two) issued since the last such wait; gfx9 targets only
    (another target's text comes back unchanged).

    gfx950's P @ V reads V with ``ds_read_b64_tr_b16``, two per MFMA operand, issued before the
    softmax that makes P; the MFMAs come after it. LLVM's wait insertion counts outstanding LDS
    reads, not time: in the order the scheduler leaves reads and MFMAs, it put one
    ``s_waitcnt lgkmcnt(n)`` before most of the 8 MFMAs (gpt-oss's window tile: 6 in the left
    and main loops, 5 in the right one) although every read had long returned. One wait for
    all of them, which the scheduler keeps after the reads (a wait is ordered with memory
    operations) and the wait insertion merges with its own: 2 per loop. A wait only ever
    delays, so the results are unchanged."""
    if not re.search(r'target triple = "amdgpu9\.|"target-cpu"="gfx9', llir):
        return llir
    lines = llir.split("\n")
    parts: dict[str, tuple[str, str]] = {}  # shufflevector -> its two inputs
    unwaited: set[str] = set()  # transposed reads issued since the last wait
    out = []
    for ln in lines:
        m = _MFMA_CALL.match(ln)
        if m and unwaited:
            srcs = set()
            for o in m.groups():
                srcs.update(parts.get(o, (o,)))
            if srcs & unwaited:
                out.append(f"  call void @llvm.amdgcn.s.waitcnt(i32 {LGKMCNT0_GFX9})")
                unwaited.clear()
        out.append(ln)
        if "@llvm.amdgcn.s.waitcnt(" in ln and not ln.lstrip().startswith("declare"):
            unwaited.clear()  # a wait already there (this rewrite's own, run twice)
        elif t := _TR_READ.match(ln):
            unwaited.add(t.group(1))
        elif sh := _SHUFFLE.match(ln):
            parts[sh.group(1)] = (sh.group(2), sh.group(3))
    if len(out) == len(lines):
        return llir
    return declared("\n".join(out), _WAITCNT_DECL)


def declared(text: str, decl: str) -> str:
    """``text`` (an LLVM IR module) with the declaration ``decl`` appended unless it is there:
    the rewrites that add calls of an intrinsic the module did not call yet."""
    return text if decl in text else text.rstrip("\n") + f"\n\n{decl}\n"
