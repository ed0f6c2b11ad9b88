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

It reads the text only: no tool, no GPU.
"""

from __future__ import annotations

import re

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

__all__ = ["AMD_MATRIX_PREFIXES", "classify", "instructions", "parse_amdgcn"]

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


def instructions(body: list[str]):
    """Each label (a ``str``) and real instruction (``(mnemonic, operands)``) of a body, in
    order: no directives or comments."""
    for raw in body:
        line = raw.split(";", 1)[0].split("//", 1)[0].strip()
        if m := _AMD_LABEL.match(line):
            yield m.group(1)
            continue
        if not line or line.startswith(".") or line.endswith(":"):
            continue
        mnem, _, ops = line.partition(" ")
        if _AMD_MNEMONIC.match(mnem):
            yield mnem, ops.strip()


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
    mix = count_instructions(
        item if isinstance(item, str) else classify(*item)
        for item in instructions(_amd_body(lines, name))
    )

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
