"""Direct-to-LDS loads of matrix operands outside Triton's pipeliner (gfx950 TTGIR).

A tile loaded from global memory and staged through LDS for a matrix product reaches Triton
3.9's gfx950 TTGIR, at ``num_stages=1``, as an ``amdg.buffer_load`` into registers and a
``ttg.local_alloc`` of the loaded tensor: the lowering waits for each load, writes it to LDS
(``ds_write_b128``), and holds the tile in VGPRs in between. gfx950's buffer loads can write
LDS themselves (``buffer_load_dwordx4 ... lds``: 16 bytes a lane, the wave's 64 lanes to one
contiguous kilobyte), which Triton uses only inside its software pipeliner (``num_stages`` of
2 or more: ``amdg.buffer_load_to_local``), and the pipeliner's multi-buffered loop gave up the
attention forward's lazy rescale and cost more than it saved (gpt-oss's main loop 189 -> 240
instructions).

``direct_lds(text)`` rewrites each such load / alloc pair into the pipeliner's own ops: a
mutable ``local_alloc`` and ``amdg.buffer_load_to_local`` where the load was, with
``ttg.async_commit_group``; ``ttg.async_wait`` where the alloc was; the ``local_load``s of the
buffer take the wait's token. Where a matrix product of LDS tiles comes right before the load
in its block (the attention forward's Q K^T before V's load), the copy goes up over it, with
the pure ops that compute its offsets and mask, and the wait right after it (``_over_product``):
the copy then runs under the product's MFMAs. (Issued earlier still, as soon as its offsets are
known, V's copy needs its own LDS buffer and took more loop instructions: gfx950 fwd d256 173
-> 180 per trip, and gpt-oss's tile went from 3 waves to 2.)

LLVM's machine scheduler moves a wait and the barrier and LDS reads behind it as early as it
can: V's copy wait ended up right after the copy, above the Q K^T MFMAs, so V's global latency
stood uncovered on every trip (the register path had waited for V after K's reads and part of
those MFMAs). ``pin_waits`` puts an ``llvm.amdgcn.sched.barrier(0)`` before each wait that
directly follows a matrix product, so it stays behind the product's MFMAs; the reads after it
still overlap the softmax. gfx950's fwd d256 keeps its 173 instructions a trip, with 15 of
the 16 Q K^T MFMAs between V's copy and its wait, which had come right after the copy.

The LDS layout is a padded one (``#ttg.padded_shared``), the kind Triton's pipeliner gives
its gfx950 async copies: the wave's lanes must write contiguously, so rows are staggered by
padding at each kilobyte instead of by an XOR swizzle (with a swizzled layout Triton's
lowering permutes the global addresses across lanes with a ``ds_bpermute_b32`` per load,
which costs more than the write it saves). ``padded_layout`` orders the tile's rows so that
the rows a matrix operand's reads touch together start on different banks, following the rule
of Triton's ``composePaddedLayoutForAsyncCopyCDNA4`` (its pipeliner's choice for the same
read instructions). The load's offsets (and mask) go through a ``ttg.convert_layout`` to the
layout whose lanes write that order (``write_layout``), and Triton's own
``remove-layout-conversions`` (with canonicalization, CSE and loop-invariant motion) then
computes the offsets in that layout instead: ``rewrite_module`` keeps the result only where
none of the inserted conversions survives, so no LDS round trip is added.

LLVM's attribute inference gives up on a kernel that calls the LDS-load intrinsic. The kernel
then lacks ``"amdgpu-agpr-alloc"="0"`` (no AGPRs needed), and the register allocator splits
its budget between VGPRs and AGPRs (gfx950 llama forward: 228 VGPRs became 128 VGPRs and 85
AGPRs, with copies between them in the loop). It lacks the ``"amdgpu-no-..."`` marks of unused
implicit inputs too: the dispatch and queue pointers and the dispatch id took 6 of gfx950's 16
user SGPRs (8 kernel arguments preloaded instead of 14), and workgroup id z and work-item ids y
and z were enabled. ``llir_attributes`` puts back what inference gives the same kernel loading
through registers: the AGPR attribute where no inline assembly asks for an AGPR (the intrinsic
touches none), and each input mark whose users the module lacks (``_unused_inputs``; none
where it calls a function other than an intrinsic).

The rewrite is narrow: 16-bit (or 8-bit) 2-D tiles, a plain buffer load (no ``other``), one
use (the alloc, in the same block), every use of the buffer a ``local_load`` into an MFMA dot
operand, and a module for gfx950. Anything else stays as it was. Barriers and wait counts are
Triton's (its ``make_llir`` runs the async-wait count update and the LDS barrier analysis
after this stage).
"""

from __future__ import annotations

import logging
import re

from .llir import declared
from .ttgir_text import aliases, only_use_line, parse, rewrite_each, same_block, uses

#: the compile option (popped before Triton sees the options) that turns the rewrite on
DIRECT_LDS = "direct_lds"
#: the targets whose buffer loads write 16 bytes a lane to LDS (gfx942's write 4)
TARGETS = ("gfx950",)
WARP = 64
#: the bytes a lane's direct-to-LDS load writes
LANE_BYTES = 16

log = logging.getLogger(__name__)

_LOAD = re.compile(
    r"^(?P<ind> *)%(?P<x>[\w.]+) = amdg\.buffer_load %(?P<p>[\w.]+)\[%(?P<off>[\w.]+)\]"
    r"(?:, %(?P<mask>[\w.]+))?(?P<attrs> \{[^{}]*\})? : !tt\.ptr<(?P<t>\w+)> -> "
    r"tensor<(?P<r>\d+)x(?P<k>\d+)x(?P=t), (?P<lay>#[\w.]+)> (?P<loc>loc\([^\n]*\))$",
    re.M,
)
_BLOCKED = re.compile(
    r"^#ttg\.blocked<\{sizePerThread = \[(\d+), (\d+)\], threadsPerWarp = \[\d+, \d+\], "
    r"warpsPerCTA = \[\d+, \d+\], order = \[(\d), (\d)\]\}>$"
)
_SWZ_ORDER = re.compile(r"^#ttg\.swizzled_shared<\{[^}]*order = \[(\d), (\d)\]\}>$")
_MFMA_SHAPE = re.compile(r"^#ttg\.amd_mfma<\{.*instrShape = \[(\d+), (\d+), (\d+)\].*\}>$")
_BYTES = {"bf16": 2, "f16": 2, "i16": 2, "f8E4M3FN": 1, "f8E5M2": 1, "i8": 1}


def _log2(n: int) -> int:
    return n.bit_length() - 1


def padded_layout(shape, contig: int, op_idx: int, kwidth: int, nonk: int, elem_bytes: int):
    """``(interval, padding, bases)`` of the padded LDS layout for a ``shape`` tile whose
    dimension ``contig`` is contiguous, read as dot operand ``op_idx`` of an MFMA with
    ``nonk`` rows (16 or 32) and ``kwidth`` elements a lane; None where the rule has none.
    ``bases``: the tensor index of each power-of-two offset, in offset order."""
    if len(shape) != 2 or elem_bytes not in (1, 2) or nonk not in (16, 32):
        return None
    if kwidth not in (4, 8, 16) or op_idx not in (0, 1):
        return None
    kdim = 1 if op_idx == 0 else 0
    k_contig = contig == kdim
    contig_n, other_n = shape[contig], shape[1 - contig]
    kwidth_bytes = kwidth * elem_bytes
    vec = LANE_BYTES // elem_bytes
    b128 = k_contig and kwidth_bytes == 16  # ds_read_b128
    tr = not k_contig and kwidth_bytes >= 8  # ds_read_b64_tr
    banks = 64 if (b128 or tr) else 32
    bank_row = banks * 4 // elem_bytes
    if b128:
        pad = kwidth * 2 if nonk == 16 else kwidth
    elif tr:
        pad = 16 if nonk == 16 else 32
    else:
        pad = 8 // elem_bytes
    if contig_n < vec:
        return None
    wrap = min(contig_n, bank_row) // pad
    if wrap == 0:
        return None
    # rows staggered by the padding: enough rows to stagger, or a few conflicts tolerated
    # where the reads would conflict as much under a swizzle (2-way, not for ds_read_b128)
    required = WARP // (contig_n // vec) * wrap
    conflicts = 1 if other_n >= required else _log2(required // other_n) + 1
    if (b128 and conflicts > 1) or conflicts > 2:
        return None
    if conflicts > 1:
        wrap //= 1 << (conflicts - 1)
        if wrap == 0:
            return None
    best = False
    if other_n >= WARP // (contig_n // vec) * 16 and wrap < 16:
        best, wrap = True, 16
    interval = WARP * vec
    # offsets as (contig index, row): the row's elements, the rows one kilobyte shares
    # (strided by ``wrap``), then the rows below ``wrap``, then the rest
    bases = [(1 << i, 0) for i in range(_log2(contig_n))]
    row = _log2(wrap)
    while len(bases) < _log2(interval):
        bases.append((0, 1 << row))
        row += 1
    bases += [(0, 1 << i) for i in range(_log2(wrap))]
    bases += [(0, 1 << i) for i in range(row, _log2(other_n))]
    if len(bases) != _log2(contig_n) + _log2(other_n):
        return None
    if tr and nonk == 16 and kwidth_bytes == 16:
        # one ds_read_b64_tr reads 8 bytes: the rows at 8 and 16 bytes swap lane groups
        i8 = next((i for i, b in enumerate(bases) if b[1] == 8 // elem_bytes), None)
        i16 = next((i for i, b in enumerate(bases) if b[1] == 16 // elem_bytes), None)
        if i8 is None or i16 is None:
            return None
        bases[i8], bases[i16] = bases[i16], bases[i8]
    if b128 and nonk == 32 and best and shape[kdim] < 256 // elem_bytes:
        # every 16th row to the other half of the banks (narrow kWidth) or to the same bank
        # (a full 16-byte kWidth), so that the lane groups read different banks
        at = _log2(256 if kwidth == vec else 128)
        row16 = _log2(contig_n)
        if max(at, row16) >= len(bases):
            return None
        bases[at], bases[row16] = bases[row16], bases[at]
    # to tensor dimension order
    out = [[c, r] if contig == 0 else [r, c] for c, r in bases]
    return interval, pad, out


def write_layout(bases, elem_bytes: int, num_warps: int):
    """The register layout whose lanes write the padded layout's offsets in order:
    ``(register, lane, warp)`` bases (a lane's 16 bytes, the wave's 64 lanes, its warps,
    then the repeats), or None where the tile has fewer rows than the warps write."""
    nvec = _log2(LANE_BYTES // elem_bytes)
    nlane = _log2(WARP)
    nwarp = _log2(num_warps)
    if len(bases) < nvec + nlane + nwarp:
        return None
    reg = bases[:nvec] + bases[nvec + nlane + nwarp :]
    return reg, bases[nvec : nvec + nlane], bases[nvec + nlane : nvec + nlane + nwarp]


def _fmt(bases) -> str:
    return "[" + ", ".join(f"[{a}, {b}]" for a, b in bases) + "]"


def direct_lds(text: str) -> tuple[str, int]:
    """``text`` (a printed gfx950 TTGIR module) with every matching load / alloc pair turned
    into a direct-to-LDS copy (module docstring), and how many were."""
    head = re.search(r'ttg\.target = "hip:(\w+)"', text)
    warps = re.search(r'"ttg\.num-warps" = (\d+)', text)
    if head is None or head.group(1) not in TARGETS or warps is None:
        return text, 0
    num_warps = int(warps.group(1))
    layouts = aliases(text)
    new_aliases: dict[str, str] = {}
    text, count = rewrite_each(
        text, _LOAD, lambda t, m, n: _rewrite_one(t, m, layouts, new_aliases, num_warps, n)
    )
    if count:
        defs = "".join(f"{k} = {v}\n" for k, v in new_aliases.items())
        first = re.search(r"^#", text, re.M)
        at = first.start() if first else 0
        text = text[:at] + defs + text[at:]
    return text, count


def _rewrite_one(text, m, layouts, new_aliases, num_warps, n) -> str | None:
    ind, x, t, r, k, lay = (m.group(g) for g in ("ind", "x", "t", "r", "k", "lay"))
    elem = _BYTES.get(t)
    blocked = _BLOCKED.match(layouts.get(lay, lay))
    if elem is None or blocked is None:
        return None
    use = only_use_line(text, x)
    if use is None:
        return None
    a_start, a_end = use
    al = re.match(
        rf"^{ind}%(?P<a>[\w.]+) = ttg\.local_alloc %{re.escape(x)} : "
        rf"\(tensor<{r}x{k}x{t}, {re.escape(lay)}>\) -> "
        rf"!ttg\.memdesc<{r}x{k}x{t}, (?P<enc>#[\w.]+), #smem> (?P<loc>loc\([^\n]*\))$",
        text[a_start:a_end],
    )
    if al is None or not same_block(text, m.end(), a_start, len(ind)):
        return None
    a, enc = al.group("a"), al.group("enc")
    swz = _SWZ_ORDER.match(layouts.get(enc, enc))
    if swz is None:
        return None
    contig = int(swz.group(1))
    # the global load must be contiguous along the same dimension, a lane's 16 bytes at once
    spt = (int(blocked.group(1)), int(blocked.group(2)))
    if int(blocked.group(3)) != contig or spt[contig] * elem < LANE_BYTES:
        return None
    # every use of the buffer a local_load into one MFMA dot operand
    ld_re = re.compile(
        rf"ttg\.local_load %{re.escape(a)} : !ttg\.memdesc<{r}x{k}x{t}, {re.escape(enc)}, "
        rf"#smem> -> tensor<{r}x{k}x{t}, #ttg\.dot_op<\{{opIdx = (\d), parent = (#[\w.]+), "
        rf"kWidth = (\d+)\}}>>"
    )
    loads = ld_re.findall(text)
    a_uses = uses(text, a)
    if not loads or len(loads) != len(a_uses) or len(set(loads)) != 1:
        return None
    op_idx, parent, kwidth = int(loads[0][0]), loads[0][1], int(loads[0][2])
    mfma = _MFMA_SHAPE.match(layouts.get(parent, parent))
    if mfma is None:
        return None
    nonk = int(mfma.group(1 + op_idx))
    shape = (int(r), int(k))
    got = padded_layout(shape, contig, op_idx, kwidth, nonk, elem)
    if got is None:
        return None
    interval, pad, bases = got
    wl = write_layout(bases, elem, num_warps)
    if wl is None:
        return None
    reg, lane, warp = wl
    sh, lin = f"#fly_d2l_shared{n}", f"#fly_d2l_write{n}"
    new_aliases[sh] = (
        f"#ttg.padded_shared<[{interval}:+{pad}] {{offset = {_fmt(bases)}, block = []}}>"
    )
    new_aliases[lin] = (
        f"#ttg.linear<{{register = {_fmt(reg)}, lane = {_fmt(lane)}, "
        f"warp = {_fmt(warp)}, block = []}}>"
    )
    mem = f"!ttg.memdesc<{r}x{k}x{t}, {sh}, #smem, mutable>"
    loc = m.group("loc")
    off, mask = m.group("off"), m.group("mask")
    lines = [
        f"{ind}%{a} = ttg.local_alloc : () -> {mem} {al.group('loc')}",
        f"{ind}%{off}_d2l{n} = ttg.convert_layout %{off} : tensor<{r}x{k}xi32, {lay}> -> "
        f"tensor<{r}x{k}xi32, {lin}> {loc}",
    ]
    masked = ""
    if mask:
        lines.append(
            f"{ind}%{mask}_d2l{n} = ttg.convert_layout %{mask} : tensor<{r}x{k}xi1, {lay}> -> "
            f"tensor<{r}x{k}xi1, {lin}> {loc}"
        )
        masked = f" mask = %{mask}_d2l{n}"
    lines += [
        f"{ind}%{x}_d2l = amdg.buffer_load_to_local %{m.group('p')}[%{off}_d2l{n}]{masked} "
        f"into %{a}{m.group('attrs') or ''} : !tt.ptr<{t}>[tensor<{r}x{k}xi32, {lin}>]  -> "
        f"<{r}x{k}x{t}, {sh}, #smem, mutable> {loc}",
        f"{ind}%{x}_d2l_c = ttg.async_commit_group tokens %{x}_d2l {loc}",
    ]
    wait = f"{ind}%{x}_d2l_w = ttg.async_wait %{x}_d2l_c {{num = 0 : i32}} {al.group('loc')}"
    over = _over_product(text, m, a_end, ind, lines, wait)
    if over is not None:
        text = over
    else:  # edit back to front so that earlier offsets stay valid
        text = text[:a_start] + wait + text[a_end:]
        text = text[: m.start()] + "\n".join(lines) + text[m.end() :]
    old_mem = f"!ttg.memdesc<{r}x{k}x{t}, {enc}, #smem>"
    return re.sub(
        rf"ttg\.local_load %{re.escape(a)} : {re.escape(old_mem)}",
        f"ttg.local_load %{a} token %{x}_d2l_w : {mem}",
        text,
    )


_DEF = re.compile(r"^( *)%([\w.]+) = ([\w.]+)")
#: the single-line ops without side effects a copy's offsets and mask may be computed by, which
#: ``_over_product`` moves up with the copy
_PURE = re.compile(r"^(arith\.\w+|tt\.splat|tt\.broadcast|tt\.expand_dims|tt\.make_range)$")
_DOT = re.compile(r"^( *)%([\w.]+) = tt\.dot %([\w.]+), %([\w.]+),", re.M)


def _product_before(text: str, pos: int, ind: str) -> re.Match | None:
    """The ``tt.dot`` nearest before ``pos`` in the block of indentation ``ind``; None where
    the block opens first."""
    while pos > 0:
        start = text.rfind("\n", 0, pos - 1) + 1
        line = text[start:pos].rstrip("\n")
        depth = len(line) - len(line.lstrip(" "))
        if line.strip() and depth < len(ind):
            return None
        d = _DOT.match(line)
        if d is not None and d.group(1) == ind:
            return _DOT.match(text, start)
        pos = start
    return None


def _reads_lds(text: str, name: str, loop_at: int) -> bool:
    """Whether ``%name`` is a ``local_load``'s result or defined before the loop at
    ``loop_at``."""
    d = re.search(rf"^ *%{re.escape(name)} = ([\w.]+) ", text, re.M)
    return d is not None and (d.group(1) == "ttg.local_load" or d.start() < loop_at)


def _over_product(text, m, a_end, ind, lines, wait) -> str | None:
    """``text`` with the copy ``lines`` (for the load ``m``) before the matrix product that
    precedes the load in its block, after the pure ops (``_PURE``) that compute the load's
    offsets and mask there, which go up with it, and its ``wait`` right after the product (the
    alloc, which ends at ``a_end``, gone); None where no product of LDS tiles (its operands
    ``local_load``s, or defined before the loop) precedes it, or the offsets need another op."""
    dot = _product_before(text, m.start(), ind)
    if dot is None:
        return None
    loop_at = text.rfind("scf.for", 0, dot.start())
    if not all(_reads_lds(text, dot.group(g), loop_at) for g in (3, 4)):
        # a product of a register tile would wait for its own loads behind the copy: gfx950's
        # vmcnt counts the loads in order
        return None
    region = text[dot.start() : a_end].split("\n")
    load_i = text[dot.start() : m.start()].count("\n")
    need = {g for g in (m.group("off"), m.group("mask"), m.group("p")) if g}
    move = []
    for i in range(load_i - 1, 0, -1):
        d = _DEF.match(region[i])
        if d is None or d.group(2) not in need:
            continue
        if d.group(1) != ind or not _PURE.match(d.group(3)):
            return None
        move.insert(0, i)
        operands = region[i].split(" = ", 1)[1].split(" : ")[0]
        need |= set(re.findall(r"%([\w.]+)", operands))
    if dot.group(2) in need:
        return None
    rest = [ln for i, ln in enumerate(region[1:-1], 1) if i not in move and i != load_i]
    new = [region[i] for i in move] + lines + [region[0], wait] + rest
    return text[: dot.start()] + "\n".join(new) + text[a_end:]


_KERNEL = re.compile(r"^define amdgpu_kernel [^\n]*\) [\w ]*#(\d+) [^\n]*\{$", re.M)
_LDS_LOAD = re.compile(r"@llvm\.amdgcn\.(?:raw|struct)\.ptr\.buffer\.load\.(?:async\.)?lds\(")
#: an inline assembly constraint string naming an AGPR operand (``a``, ``=a``, ``{a0}``)
_AGPR_ASM = re.compile(r'asm [^"]*"(?:[^"\\]|\\.)*", "(?:[^"]*[,=&~])?\{?a[\d,}"]')
AGPR_ALLOC = '"amdgpu-agpr-alloc"="0"'


#: the implicit inputs LLVM's attribute inference marks unused (``"amdgpu-no-..."``), each with
#: what in the module would use it: intrinsics (by name prefix) or IR constructs. Inference
#: marks them on the same kernel loading through registers; a kernel without them has its
#: user SGPRs taken by the dispatch and queue pointers and the dispatch id (6 of gfx950's 16,
#: so 6 fewer kernel arguments preloaded), workgroup id z and work-item ids y and z enabled
_NO_INPUTS = {
    "amdgpu-no-dispatch-ptr": ("llvm.amdgcn.dispatch.ptr",),
    "amdgpu-no-queue-ptr": (
        "llvm.amdgcn.queue.ptr",
        "llvm.trap",
        "llvm.debugtrap",
        "llvm.amdgcn.is.shared",
        "llvm.amdgcn.is.private",
        " addrspacecast ",
    ),
    "amdgpu-no-dispatch-id": ("llvm.amdgcn.dispatch.id",),
    "amdgpu-no-lds-kernel-id": ("llvm.amdgcn.lds.kernel.id",),
    "amdgpu-no-workgroup-id-y": ("llvm.amdgcn.workgroup.id.y",),
    "amdgpu-no-workgroup-id-z": ("llvm.amdgcn.workgroup.id.z",),
    "amdgpu-no-workitem-id-y": ("llvm.amdgcn.workitem.id.y",),
    "amdgpu-no-workitem-id-z": ("llvm.amdgcn.workitem.id.z",),
    "amdgpu-no-cluster-id-x": ("llvm.amdgcn.cluster.id",),
    "amdgpu-no-cluster-id-y": ("llvm.amdgcn.cluster.id",),
    "amdgpu-no-cluster-id-z": ("llvm.amdgcn.cluster.id",),
    "amdgpu-no-flat-scratch-init": (" alloca ", " addrspacecast "),
    "amdgpu-no-wwm": ("llvm.amdgcn.set.inactive", "llvm.amdgcn.strict.", "llvm.amdgcn.wwm"),
}
#: the implicit-argument inputs: unused where the implicit argument pointer is
_IMPLICIT_ARGS = (
    "amdgpu-no-implicitarg-ptr",
    "amdgpu-no-completion-action",
    "amdgpu-no-default-queue",
    "amdgpu-no-heap-ptr",
    "amdgpu-no-hostcall-ptr",
    "amdgpu-no-multigrid-sync-arg",
)
#: a call of a function that is not an intrinsic (it may use any input)
_CALL = re.compile(r"\bcall [^@\n]*@(?!llvm\.)[\w.$]+\(")


def _unused_inputs(llir: str) -> list[str]:
    """The ``"amdgpu-no-..."`` attributes ``llir``'s kernel may carry: none where it calls a
    function that is not an intrinsic, else each whose users (``_NO_INPUTS``) it lacks."""
    body = "\n".join(ln for ln in llir.split("\n") if not ln.startswith("declare "))
    if _CALL.search(body):
        return []
    out = [a for a, users in _NO_INPUTS.items() if not any(u in body for u in users)]
    if "llvm.amdgcn.implicitarg.ptr" not in body:
        out += _IMPLICIT_ARGS
    return out


def llir_attributes(llir: str) -> str:
    """``llir`` with the attributes LLVM's inference leaves off a kernel that loads straight
    into LDS: ``"amdgpu-agpr-alloc"="0"``, where no inline assembly takes an AGPR operand, and
    the unused implicit inputs (``_unused_inputs``) (module docstring)."""
    k = _KERNEL.search(llir)
    if k is None or not _LDS_LOAD.search(llir):
        return llir
    group = re.compile(rf"^attributes #{k.group(1)} = \{{ ", re.M)
    g = group.search(llir)
    if g is None:
        return llir
    end = llir.find("}", g.end())
    have = llir[g.end() : end]
    add = [] if _AGPR_ASM.search(llir) or AGPR_ALLOC.split("=")[0] in have else [AGPR_ALLOC]
    add += [f'"{a}"' for a in _unused_inputs(llir) if f'"{a}"' not in have]
    if not add:
        return llir
    return llir[: g.end()] + " ".join(add) + " " + llir[g.end() :]


_WAIT = "@llvm.amdgcn.wait.asyncmark("
_SCHED_BARRIER = "declare void @llvm.amdgcn.sched.barrier(i32 immarg)"


def pin_waits(llir: str) -> str:
    """``llir`` with ``llvm.amdgcn.sched.barrier(0)`` (nothing scheduled across it) before each
    async copy wait whose nearest call before it is a matrix product's (the waits
    ``_over_product`` put right after one), so that LLVM keeps the wait behind the product's
    MFMAs (module docstring)."""
    out = []
    last_call = ""
    for line in llir.split("\n"):
        if _WAIT in line and "@llvm.amdgcn.mfma." in last_call:
            out.append("  call void @llvm.amdgcn.sched.barrier(i32 0)")
        if " call " in line:
            last_call = line
        out.append(line)
    if len(out) == llir.count("\n") + 1:
        return llir
    return declared("\n".join(out), _SCHED_BARRIER)


def llir_rewrite(llir: str) -> str:
    """The LLVM IR companions of a direct-to-LDS compile: ``pin_waits``, then
    ``llir_attributes``."""
    return llir_attributes(pin_waits(llir))


def _conversions(text: str) -> int:
    return len(re.findall(r"= ttg\.convert_layout ", text))


def rewrite_module(mod):
    """``mod`` (Triton's gfx950 TTGIR module) with ``direct_lds`` applied: printed, rewritten,
    parsed back in its context, with Triton's layout-conversion removal, canonicalization, CSE
    and loop-invariant motion run on it; ``mod`` itself where nothing matched, the result does
    not verify, or an inserted offset conversion survives (``stage_hook`` runs it after the
    TTGIR stage)."""
    from triton._C.libtriton import ir, passes

    text, n = direct_lds(str(mod))
    if n == 0:
        return mod
    try:
        new = parse(text, mod.context)
        pm = ir.pass_manager(mod.context)
        passes.ttgpuir.add_remove_layout_conversions(pm)
        passes.common.add_canonicalizer(pm)
        passes.common.add_cse(pm)
        passes.ttir.add_triton_licm(pm)
        pm.run(new, "direct_lds")
        if not new.verify():
            raise ValueError("the rewritten module does not verify")
        left = _conversions(str(new)) - _conversions(str(mod))
        if left > 0:
            raise ValueError(f"{left} offset layout conversion(s) left")
    except Exception as e:  # Triton's own staging stands
        log.warning("direct-to-LDS loads: TTGIR rewrite dropped (%s)", e)
        return mod
    log.debug("direct-to-LDS loads: %d tile(s) copied straight to LDS", n)
    return new
