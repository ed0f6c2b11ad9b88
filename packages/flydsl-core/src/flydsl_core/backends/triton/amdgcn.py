"""AMDGCN listings (Triton's ``asm['amdgcn']``): resources and an instruction classifier.

``parse_amdgcn(text, target)`` reports a listing cross-compiled for any AMD
target, on any machine. Where a figure comes from, in order of preference:

* the ``.amdgpu_metadata`` YAML block: ``.vgpr_count`` (the unified
  VGPR+AGPR count on CDNA, so ``vgpr_total``), ``.agpr_count``,
  ``.sgpr_count``, ``.private_segment_fixed_size`` (``scratch_bytes``),
  ``.group_segment_fixed_size`` (static LDS), ``.vgpr_spill_count``,
  ``.sgpr_spill_count``, ``.max_flat_workgroup_size``;
* the ``.amdhsa_kernel`` descriptor: ``.amdhsa_next_free_vgpr``,
  ``.amdhsa_accum_offset``, ``.amdhsa_private_segment_fixed_size``;
* the ``; Kernel info:`` comments: ``; NumVgprs:`` (arch VGPRs, so ``vgpr``),
  ``; NumAgprs:``, ``; TotalNumVgprs:``, ``; ScratchSize:``, ``; Occupancy:``
  (``compiler_occupancy``), ``; codeLenInByte =``. Where metadata and comments
  both give a figure they are cross-checked and a mismatch goes to
  ``warnings``.

Triton allocates LDS dynamically (``group_segment_fixed_size`` is 0 and the
launcher passes ``metadata.shared``), so ``lds_bytes`` is the static segment
plus the ``shared_bytes`` the caller knows; LLVM's ``; Occupancy:`` sees only
the static part, which is why ``occupancy`` (all limits) can be below
``compiler_occupancy`` (registers only) for kernels with large LDS tiles.

The instruction mix: ``classify`` maps each mnemonic of the kernel body to an
``Instr`` (matrix op, global/buffer/flat load or store, LDS read or write,
with its width from the data-size token), and ``compile.resources.
count_instructions`` counts them.

The loops: ``loops`` is the one loop finder for AMDGCN (the report, the kernel
families' static models and their tests all read it). It builds the control-flow
graph of the body, finds the back edges by dominance (so a loop LLVM laid out with
its latch above its header is still one loop) and reports each natural loop with
the instructions a trip always runs: those of the blocks that dominate every latch.
A block a trip may skip (a lazy rescale behind a uniform branch) is counted
apart, as ``conditional``. ``matrix_loops`` keeps the innermost loops holding a
matrix instruction, each with its 32x32-equivalent matrix ops per trip
(``matrix_weight``).

It reads the text only: no tool, no GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...compile.resources import (
    Instr,
    ResourceReport,
    align,
    amd_occupancy,
    count_instructions,
    limiter,
)
from ...helpers import cdiv
from ...targets import Target, get_target

__all__ = [
    "AMD_MATRIX_PREFIXES",
    "Loop",
    "classify",
    "instructions",
    "loops",
    "main_matrix_loop",
    "matrix_loops",
    "matrix_weight",
    "parse_amdgcn",
]

#: mnemonic prefixes of AMD matrix instructions (CDNA MFMA, RDNA / gfx1250 WMMA, sparse forms)
AMD_MATRIX_PREFIXES = ("v_mfma", "v_smfmac", "v_wmma", "v_swmmac")
_AMD_LABEL = re.compile(r"^\s*([.\w$]+):")
_AMD_BRANCH = re.compile(r"^s_(?:c?branch)\w*$")
_AMD_COMMENT = re.compile(r"^\s*;\s*([A-Za-z]\w*)\s*[:=]\s*(\d+)\b")
_AMD_SET = re.compile(
    r"^\s*\.set\s+\.?L?(?P<fn>[\w$.]+?)\.(?P<key>num_vgpr|num_agpr|numbered_sgpr|private_seg_size),\s*(?P<val>\d+)\s*$"
)
_AMD_HSA = re.compile(r"^\s*\.amdhsa_(\w+)\s+(-?\d+)\s*$")
_AMD_MD_LINE = re.compile(r"^(\s*)(-\s+)?\.(\w+):\s*(.*?)\s*$")
_AMD_MNEMONIC = re.compile(r"^[a-z][a-z0-9_]*$")
_WIDTH_TOKEN = re.compile(r"^(?:dwordx(\d)|dword|ubyte|sbyte|byte|ushort|sshort|short|[bui](\d+))$")


def _width(tokens: list[str]) -> int | None:
    """Bits per lane from the data-size token of a memory mnemonic ('dwordx4' -> 128)."""
    for tok in tokens:
        m = _WIDTH_TOKEN.match(tok)
        if not m:
            continue
        if tok.startswith("dwordx"):
            return 32 * int(m.group(1))
        if tok == "dword":
            return 32
        if tok in ("ubyte", "sbyte", "byte"):
            return 8
        if tok in ("ushort", "sshort", "short"):
            return 16
        return int(m.group(2))
    for tok in tokens:  # buffer_load_format_xyzw and friends
        if tok in ("x", "xy", "xyz", "xyzw"):
            return (16 if "d16" in tokens else 32) * len(tok)
    return None


def _amd_metadata(text: str) -> list[dict[str, str]]:
    """Kernel-level entries of the ``.amdgpu_metadata`` block, one dict per kernel."""
    start = text.find(".amdgpu_metadata")
    if start < 0:
        return []
    end = text.find(".end_amdgpu_metadata", start)
    block = text[start : end if end > 0 else len(text)].splitlines()
    kernels: list[dict[str, str]] = []
    in_kernels = False
    kernel_indent = None
    for line in block:
        if re.match(r"^amdhsa\.kernels:", line):
            in_kernels = True
            continue
        if in_kernels and re.match(r"^\S", line):  # next top-level key
            in_kernels = False
        if not in_kernels:
            continue
        m = _AMD_MD_LINE.match(line)
        if not m:
            continue
        indent = len(m.group(1)) + len(m.group(2) or "")
        if m.group(2):  # '- .key:' starts a list item
            if kernel_indent is None or indent == kernel_indent:
                kernel_indent = indent
                kernels.append({})
            else:
                continue  # an item of .args
        if indent == kernel_indent and kernels:
            kernels[-1][m.group(3)] = m.group(4)
    return kernels


def _md_int(md: dict[str, str], key: str) -> int | None:
    v = md.get(key)
    if v is None:
        return None
    try:
        return int(v, 0)
    except ValueError:
        return None


def _amd_body(lines: list[str], name: str | None) -> list[str]:
    """The lines of the kernel's function body (label to ``.Lfunc_end``)."""
    if name:
        start = next(
            (i for i, l in enumerate(lines) if l.split(";")[0].strip() == f"{name}:"), None
        )
    else:
        start = None
    if start is None:
        for i, l in enumerate(lines):
            m = re.match(r"^\s*\.type\s+([\w$.]+),\s*@function", l)
            if m:
                nm = m.group(1)
                start = next(
                    (j for j in range(i, len(lines)) if lines[j].split(";")[0].strip() == f"{nm}:"),
                    None,
                )
                break
    if start is None:
        return lines
    end = next(
        (j for j in range(start + 1, len(lines)) if re.match(r"^\.Lfunc_end\d*:", lines[j])),
        len(lines),
    )
    return lines[start + 1 : end]


_AMD_IF = re.compile(r"^\.(ifc|ifnc|ifeqs|ifnes)\s+(.*?)\s*,\s*(.*?)\s*$")
_LOCAL_REF = re.compile(r"^(\d+)([fb])$")


def instructions(body: list[str]):
    """Each label (a ``str``) and real instruction (``(mnemonic, operands)``) of a body, in
    order: no directives or comments.

    Read as the assembler reads inline asm: ``.ifc`` / ``.ifnc`` (``.ifeqs`` / ``.ifnes``)
    string conditions with ``.else`` / ``.endif`` drop what they do not assemble (an asm block
    that tests each distinct register once, ``rules/elementwise.rescale_asm``; any other
    ``.if`` counts as assembled), and numeric local labels (``1:``, branches to ``1f`` /
    ``1b``) get names of their own, so a branch inside an asm block finds its target."""
    live: list[bool] = []  # one per open conditional: whether its current branch assembles
    seen: dict[str, int] = {}  # numeric label -> definitions so far

    def local(ref: str) -> str:
        m = _LOCAL_REF.match(ref)
        if not m:
            return ref
        n, k = m.group(1), seen.get(m.group(1), 0)
        return f".Llocal{n}_{k if m.group(2) == 'f' else k - 1}"

    for raw in body:
        line = raw.split(";", 1)[0].split("//", 1)[0].strip()
        if line.startswith(".if"):
            m = _AMD_IF.match(line)
            if m:
                same = m.group(2).strip('"') == m.group(3).strip('"')
                live.append(same if m.group(1) in ("ifc", "ifeqs") else not same)
            else:
                live.append(True)
            continue
        if line.startswith(".else") and live:
            live[-1] = not live[-1]
            continue
        if line.startswith(".endif"):
            if live:
                live.pop()
            continue
        if not all(live):
            continue
        if m := _AMD_LABEL.match(line):
            name = m.group(1)
            if name.isdigit():
                label = local(name + "f")
                seen[name] = seen.get(name, 0) + 1
                yield label
            else:
                yield name
            continue
        if not line or line.startswith(".") or line.endswith(":"):
            continue
        mnem, _, ops = line.partition(" ")
        if _AMD_MNEMONIC.match(mnem):
            ops = ops.strip()
            if _AMD_BRANCH.match(mnem) and ops:
                head, sep, target = ops.rpartition(",")
                ops = f"{head}{sep}{local(target.strip())}" if sep else local(ops)
            yield mnem, ops


def classify(mnem: str, ops: str) -> Instr:
    """What instruction ``mnem`` (with operand text ``ops``) is, for the counters."""
    parts = mnem.split("_")
    head = parts[0]
    branch_to = ops.split(",")[-1].strip() if _AMD_BRANCH.match(mnem) else None
    if mnem.startswith(AMD_MATRIX_PREFIXES):
        return Instr("matrix", mnem, branch_to=branch_to)
    if head in ("global", "buffer", "flat") and len(parts) > 1:
        if parts[1] == "load":
            # into LDS: buffer_load_dword ... lds (gfx9), *_load_lds_* and async loads
            named = "lds" in parts or "async" in parts
            to_lds = named or re.search(r"(^|[\s,])lds(\s|$)", ops) is not None
            key = f"{mnem} lds" if to_lds and not named else mnem
            return Instr("load", key, _width(parts[2:]), to_lds, branch_to)
        if parts[1] == "store":
            return Instr("store", mnem, _width(parts[2:]), branch_to=branch_to)
    elif head == "tensor" and mnem.startswith("tensor_load_to_lds"):
        # gfx1250 tensor data mover: the width is in the descriptor
        return Instr("load", mnem, None, True, branch_to)
    elif head == "ds" and len(parts) > 1:
        kind = parts[1]
        two = kind in ("read2", "write2", "read2st64", "write2st64") or (
            len(parts) > 2 and parts[2].startswith("2addr")
        )
        w = _width(parts[2:])
        bits = None if w is None else w * (2 if two else 1)
        if kind.startswith("read") or kind == "load":
            return Instr("lds_read", mnem, bits, branch_to=branch_to)
        if kind.startswith("write") or kind == "store":
            return Instr("lds_write", mnem, bits, branch_to=branch_to)
    return Instr(None, mnem, branch_to=branch_to)


# -- loops -------------------------------------------------------------------------------------------

_MATRIX_SHAPE = re.compile(r"_(\d+)x(\d+)x(\d+)")
#: a branch that never falls through, and the instructions that end a wave
_NO_FALLTHROUGH = ("s_branch", "s_setpc_b64", "s_endpgm")


#: the K of each CDNA ISA's fastest 32x32 MFMA per input type (gfx950 doubled the 16-bit and
#: 8-bit K: ``v_mfma_f32_32x32x16_bf16``, ``v_mfma_scale_f32_32x32x64_f8f6f4``); the older
#: forms it keeps (``32x32x8``, ``16x16x16``) do a half or a quarter of that work
_MFMA_K32 = {
    "gfx950": {"16b": 16, "8b": 64, "i8": 32, "f32": 2},
    "cdna3": {"16b": 8, "8b": 16, "i8": 16, "xf32": 4, "f32": 2},
}
_INPUT_TYPE = (
    ("xf32", "xf32"),
    ("f8f6f4", "8b"),
    ("fp8", "8b"),
    ("bf8", "8b"),
    ("i8", "i8"),
    ("bf16", "16b"),
    ("f16", "16b"),
    ("f32", "f32"),
)


def matrix_weight(mnem: str, arch: str | None = None) -> float:
    """A matrix instruction in 32x32-equivalents of ``arch``'s fastest MFMA of its input type.

    With a CDNA ``arch`` (gfx9*): by multiply-adds, ``m * n * k / (32 * 32 * K32)``, so on gfx950
    ``v_mfma_f32_16x16x32_bf16`` counts 1/2, the legacy ``v_mfma_f32_16x16x16_bf16`` 1/4 and
    ``v_mfma_f32_32x32x8_bf16`` 1/2 (on gfx942, where 32x32x8 is the fastest bf16 form, 1 and
    1/2 for ``16x16x16``). Otherwise (no arch, WMMA, an unknown input type) by output area: a
    32x32 tile 1, 16x16 1/2 (each ISA's 16x16 form does half the work of its 32x32 form of the
    same input type), any other shape its area against 32x32. 0 for what is not a matrix
    instruction."""
    if not mnem.startswith(AMD_MATRIX_PREFIXES):
        return 0.0
    m = _MATRIX_SHAPE.search(mnem)
    if not m:
        return 1.0
    mm, nn, kk = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if arch and arch.startswith("gfx9") and mnem.startswith("v_mfma"):
        ks = _MFMA_K32["gfx950" if arch == "gfx950" else "cdna3"]
        tail = mnem[m.end() :]
        kind = next((k for tok, k in _INPUT_TYPE if tok in tail), None)
        if kind in ks:
            return mm * nn * kk / (1024 * ks[kind])
    if (mm, nn) == (32, 32):
        return 1.0
    if (mm, nn) == (16, 16):
        return 0.5
    return mm * nn / 1024


@dataclass(frozen=True)
class Loop:
    """One natural loop of a kernel body.

    ``instructions``: every ``(mnemonic, operands)`` of the loop's blocks in code order (inner
    loops included); ``always``: how many of them every trip runs (the blocks that dominate each
    latch); ``conditional``: the rest (blocks a trip may skip, behind a branch inside the loop);
    ``matrix``: 32x32-equivalent matrix instructions every trip runs; ``inner``: whether the loop
    holds no other loop."""

    header: str
    instructions: tuple[tuple[str, str], ...]
    always: int
    matrix: float
    inner: bool
    blocks: frozenset = frozenset()  # the names of its basic blocks

    @property
    def conditional(self) -> int:
        return len(self.instructions) - self.always

    @property
    def per_matrix_op(self) -> float | None:
        """Instructions every trip runs per 32x32-equivalent matrix instruction."""
        return self.always / self.matrix if self.matrix else None

    def mnemonics(self) -> list[str]:
        return [m for m, _ in self.instructions]


def _blocks(body: list[str]):
    """The basic blocks of a body: ``(label or None, [(mnem, ops)], successor labels)``, in
    code order. A block ends at a label or after a branch; every block has a name."""
    blocks: list[list] = []  # [name, instrs, branch target or None, falls through]
    cur: list | None = None
    n = 0

    def start(name):
        nonlocal cur, n
        if name is None:
            name = f"<block{n}>"
            n += 1
        cur = [name, [], None, True]
        blocks.append(cur)

    for item in instructions(body):
        if isinstance(item, str):
            start(item)
            continue
        if cur is None:
            start(None)
        cur[1].append(item)
        mnem, ops = item
        if _AMD_BRANCH.match(mnem) or mnem in _NO_FALLTHROUGH:
            if _AMD_BRANCH.match(mnem):
                cur[2] = ops.split(",")[-1].strip() or None
            cur[3] = not mnem.startswith(_NO_FALLTHROUGH)
            cur = None
    names = [b[0] for b in blocks]
    out = []
    for i, (name, instrs, target, falls) in enumerate(blocks):
        succ = []
        if target is not None and target in names:
            succ.append(target)
        if falls and i + 1 < len(blocks):
            succ.append(names[i + 1])
        out.append((name, instrs, succ))
    return out


def _dominators(names: list[str], succ: dict[str, list[str]]) -> dict[str, set[str]]:
    """Each block reachable from the first one -> the blocks that dominate it (itself included)."""
    entry = names[0]
    reach, stack = {entry}, [entry]
    while stack:
        for s in succ[stack.pop()]:
            if s not in reach:
                reach.add(s)
                stack.append(s)
    order = [n for n in names if n in reach]
    preds: dict[str, list[str]] = {n: [] for n in order}
    for n in order:
        for s in succ[n]:
            preds[s].append(n)
    dom = {n: set(order) for n in order}
    dom[entry] = {entry}
    changed = True
    while changed:
        changed = False
        for n in order[1:]:
            ps = [dom[p] for p in preds[n]]
            new = set.intersection(*ps) | {n} if ps else {n}
            if new != dom[n]:
                dom[n], changed = new, True
    return dom


def loops(
    asm_or_body: str | list[str], kernel_name: str | None = None, arch: str | None = None
) -> list[Loop]:
    """The natural loops of a kernel (a whole listing, or a body's lines), ordered by where they
    end in the code (an inner loop before the loop around it); loops sharing a header are one
    loop. ``arch`` weighs the matrix instructions (``matrix_weight``)."""
    if isinstance(asm_or_body, str):
        body = _amd_body(asm_or_body.splitlines(), kernel_name)
    else:
        body = asm_or_body
    blocks = _blocks(body)
    if not blocks:
        return []
    names = [b[0] for b in blocks]
    code = {b[0]: b[1] for b in blocks}
    succ = {b[0]: b[2] for b in blocks}
    dom = _dominators(names, succ)
    preds: dict[str, list[str]] = {n: [] for n in names}
    for n in names:
        for s in succ[n]:
            preds[s].append(n)
    latches: dict[str, list[str]] = {}
    for n in names:
        for s in succ[n]:
            if n in dom and s in dom[n]:  # a back edge: its target dominates its source
                latches.setdefault(s, []).append(n)
    found = []
    for head, ls in latches.items():
        body_set, stack = {head}, [lt for lt in ls if lt != head]
        body_set.update(stack)
        while stack:
            for p in preds[stack.pop()]:
                if p not in body_set and p in dom:
                    body_set.add(p)
                    stack.append(p)
        every = [b for b in body_set if all(b in dom[lt] for lt in ls)]
        found.append((head, body_set, every))
    out = []
    where = {n: i for i, n in enumerate(names)}
    for head, body_set, every in sorted(
        found, key=lambda f: (max(where[b] for b in f[1]), len(f[1]))
    ):
        inner = not any(h != head and h in body_set for h, _, _ in found)
        instrs = tuple(i for n in names if n in body_set for i in code[n])
        always = [i for n in every for i in code[n]]
        out.append(
            Loop(
                header=head,
                instructions=instrs,
                always=len(always),
                matrix=sum(matrix_weight(m, arch) for m, _ in always),
                inner=inner,
                blocks=frozenset(body_set),
            )
        )
    return out


def matrix_loops(
    asm_or_body: str | list[str], kernel_name: str | None = None, arch: str | None = None
) -> list[Loop]:
    """The innermost loops holding a matrix instruction (no loop inside them holds one): a GEMM's
    K loop, an attention kernel's KV loops (masked and unmasked), in code order."""
    every = loops(asm_or_body, kernel_name, arch)
    mma = [lp for lp in every if any(m.startswith(AMD_MATRIX_PREFIXES) for m in lp.mnemonics())]
    return [lp for lp in mma if not any(o.blocks < lp.blocks for o in mma)]


def main_matrix_loop(
    asm_or_body: str | list[str], kernel_name: str | None = None, arch: str | None = None
) -> Loop | None:
    """The matrix loop with the fewest instructions per trip (``always``): a GEMM's K loop, an
    attention kernel's unmasked interior loop; None when no loop holds a matrix instruction."""
    ms = matrix_loops(asm_or_body, kernel_name, arch)
    return min(ms, key=lambda lp: lp.always, default=None)


def parse_amdgcn(
    asm_text: str,
    target: str | Target,
    *,
    num_warps: int | None = None,
    shared_bytes: int | None = None,
    kernel_name: str | None = None,
) -> ResourceReport:
    """Report the resources of an AMDGCN assembly listing (Triton's ``asm['amdgcn']``).

    ``shared_bytes`` is the dynamic LDS Triton launches the kernel with
    (``metadata.shared``); ``num_warps`` defaults to
    ``.max_flat_workgroup_size / wavefront_size`` from the metadata.
    """
    t = get_target(target)
    if t.backend != "hip":
        raise ValueError(f"parse_amdgcn needs an AMD target, got {t.name!r}")
    lines = asm_text.splitlines()
    warnings: list[str] = []
    reasons: dict[str, str] = {}

    kernels = _amd_metadata(asm_text)
    md: dict[str, str] = {}
    if kernels:
        md = next((k for k in kernels if k.get("name") == kernel_name), kernels[0])
        if len(kernels) > 1 and kernel_name is None:
            warnings.append(f"{len(kernels)} kernels in the listing; reporting the first")
    name = kernel_name or md.get("name")

    hsa: dict[str, int] = {}
    in_kd = False
    for line in lines:
        s = line.strip()
        if s.startswith(".amdhsa_kernel"):
            parts = s.split()
            in_kd = name is None or len(parts) < 2 or parts[1] == name
            if name is None and len(parts) > 1:
                name = parts[1]
            continue
        if s.startswith(".end_amdhsa_kernel"):
            if hsa:
                break
            in_kd = False
            continue
        if in_kd:
            m = _AMD_HSA.match(line)
            if m:
                hsa[m.group(1)] = int(m.group(2))

    comments: dict[str, int] = {}
    for line in lines:
        m = _AMD_COMMENT.match(line)
        if m and m.group(1) not in comments:
            comments[m.group(1)] = int(m.group(2))
    sets: dict[str, int] = {}
    for line in lines:
        m = _AMD_SET.match(line)
        if m and (name is None or m.group("fn") == name) and m.group("key") not in sets:
            sets[m.group("key")] = int(m.group("val"))

    def pick(field_name: str, *sources: tuple[str, int | None]) -> int | None:
        """The first known value; later sources are cross-checked against it."""
        known = [(src, v) for src, v in sources if v is not None]
        if not known:
            reasons[field_name] = "not in the listing (" + ", ".join(s for s, _ in sources) + ")"
            return None
        src0, v0 = known[0]
        for src, v in known[1:]:
            if v != v0:
                warnings.append(f"{field_name}: {src0}={v0} but {src}={v}")
        return v0

    if t.registers.max_agprs:
        agpr = pick(
            "agpr",
            (".agpr_count", _md_int(md, "agpr_count")),
            ("; NumAgprs", comments.get("NumAgprs")),
            (".set num_agpr", sets.get("num_agpr")),
        )
    else:
        agpr = None
        reasons["agpr"] = f"{t.name} has no AGPR file"
    vgpr_total = pick(
        "vgpr_total",
        (".vgpr_count", _md_int(md, "vgpr_count")),
        ("; TotalNumVgprs", comments.get("TotalNumVgprs")),
        ("; NumVGPRsForWavesPerEU", comments.get("NumVGPRsForWavesPerEU")),
    )
    if vgpr_total is None and "next_free_vgpr" in hsa:
        vgpr_total = hsa["next_free_vgpr"]
        reasons.pop("vgpr_total", None)
    accum_offset = hsa.get("accum_offset", comments.get("AccumOffset"))
    if accum_offset is None:
        reasons["accum_offset"] = "no .amdhsa_accum_offset (not a CDNA target)"
    vgpr = pick(
        "vgpr",
        ("; NumVgprs", comments.get("NumVgprs")),
        (".set num_vgpr", sets.get("num_vgpr")),
    )
    if vgpr is None and vgpr_total is not None and not agpr:
        vgpr = vgpr_total
        reasons.pop("vgpr", None)
    if vgpr is not None and vgpr_total is not None and agpr is not None:
        # CDNA: total = align(arch VGPRs, 4) + AGPRs when AGPRs are used.
        expect = align(vgpr, 4) + agpr if agpr else vgpr
        if expect != vgpr_total:
            warnings.append(f"vgpr_total={vgpr_total} but align(vgpr={vgpr},4)+agpr={expect}")
    sgpr = pick(
        "sgpr",
        (".sgpr_count", _md_int(md, "sgpr_count")),
        ("; TotalNumSgprs", comments.get("TotalNumSgprs")),
    )
    scratch = pick(
        "scratch_bytes",
        (".private_segment_fixed_size", _md_int(md, "private_segment_fixed_size")),
        (".amdhsa_private_segment_fixed_size", hsa.get("private_segment_fixed_size")),
        ("; ScratchSize", comments.get("ScratchSize")),
    )
    vspill = _md_int(md, "vgpr_spill_count")
    sspill = _md_int(md, "sgpr_spill_count")
    if vspill is None:
        reasons["vgpr_spill_count"] = "no .vgpr_spill_count in .amdgpu_metadata"
    if sspill is None:
        reasons["sgpr_spill_count"] = "no .sgpr_spill_count in .amdgpu_metadata"
    lds_static = pick(
        "lds_static_bytes",
        (".group_segment_fixed_size", _md_int(md, "group_segment_fixed_size")),
        (".amdhsa_group_segment_fixed_size", hsa.get("group_segment_fixed_size")),
        ("; LDSByteSize", comments.get("LDSByteSize")),
    )
    if shared_bytes is None:
        lds = None
        reasons["lds_bytes"] = (
            "dynamic LDS is not in the listing; pass shared_bytes (Triton: metadata.shared)"
        )
    else:
        lds = (lds_static or 0) + shared_bytes

    wave = _md_int(md, "wavefront_size") or t.warp_size
    if wave != t.warp_size:
        warnings.append(f"listing is wave{wave} but {t.name} is wave{t.warp_size}")
    flat = _md_int(md, "max_flat_workgroup_size")
    if num_warps is None and flat:
        num_warps = cdiv(flat, wave)
    elif num_warps is not None and flat and flat != num_warps * wave:
        warnings.append(f"num_warps={num_warps} but .max_flat_workgroup_size={flat}")
    if num_warps is None:
        reasons["num_warps"] = "no .max_flat_workgroup_size and no num_warps given"

    compiler_occ = comments.get("Occupancy")
    if compiler_occ is None:
        reasons["compiler_occupancy"] = "no '; Occupancy:' comment in the listing"
    occ_vgprs = vgpr_total if vgpr_total is not None else vgpr
    limits, wgs = amd_occupancy(
        t,
        vgprs=occ_vgprs,
        sgprs=comments.get("NumSGPRsForWavesPerEU", sgpr),
        lds_bytes=lds,
        num_warps=num_warps,
    )
    occ = min(limits.values()) if "vgpr" in limits else None
    if occ is None:
        reasons["occupancy"] = "VGPR count unknown"
    elif lds is None:
        reasons["occupancy"] = "LDS limit not applied (dynamic LDS unknown)"

    # -- instruction mix ---------------------------------------------------
    body = _amd_body(lines, name)
    mix = count_instructions(
        item if isinstance(item, str) else classify(*item) for item in instructions(body)
    )
    # the loops from the control-flow graph (``loops``), not from label-to-branch spans
    found = loops(body, arch=t.name)
    mix["loop_instructions"] = [len(lp.instructions) for lp in found]
    mloops = matrix_loops(body, arch=t.name)
    main = min(mloops, key=lambda lp: lp.always, default=None)
    mix["matrix_loop_instructions"] = main.always if main else None
    mix["matrix_loop_mfma"] = main.matrix if main else None
    mix["matrix_loops"] = [
        {"instructions": lp.always, "conditional": lp.conditional, "mfma": lp.matrix}
        for lp in mloops
    ]
    if main is None:
        reasons["matrix_loop_mfma"] = "no loop holds a matrix instruction"

    return ResourceReport(
        target=t.name,
        backend=t.backend,
        kernel_name=name,
        vgpr=vgpr,
        agpr=agpr,
        vgpr_total=vgpr_total,
        accum_offset=accum_offset,
        sgpr=sgpr,
        scratch_bytes=scratch,
        vgpr_spill_count=vspill,
        sgpr_spill_count=sspill,
        spill_store_bytes=None,
        spill_load_bytes=None,
        lds_bytes=lds,
        lds_static_bytes=lds_static,
        num_warps=num_warps,
        occupancy=occ,
        occupancy_unit="waves_per_simd",
        occupancy_max=t.registers.max_waves_per_simd,
        occupancy_limits=limits,
        occupancy_limiter=limiter(limits) if occ is not None else None,
        compiler_occupancy=compiler_occ,
        workgroups_per_cu=wgs,
        code_bytes=comments.get("codeLenInByte"),
        **mix,
        reasons={
            **reasons,
            "spill_store_bytes": "AMD reports spill counts, not bytes",
            "spill_load_bytes": "AMD reports spill counts, not bytes",
        },
        warnings=tuple(warnings),
    )
