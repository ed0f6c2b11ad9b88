"""What a compiled kernel uses: registers, scratch, LDS, occupancy and its instruction mix.

``report_from_triton(compiled_kernel)`` reads a ``triton.compile`` result;
``parse_amdgcn`` and ``parse_ptx`` read the assembly text directly. Both work
on a CPU-only machine, for code cross-compiled for any known target.

Where a figure comes from
-------------------------
AMDGCN (Triton's ``asm['amdgcn']``), in order of preference:

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

PTX (``asm['ptx']``) with the cubin (``asm['cubin']``):

* instruction mix from the PTX (virtual ISA: ``instruction_count`` counts PTX
  statements, not SASS);
* registers per thread (``vgpr``), stack frame (``scratch_bytes``), static
  shared memory and code size from the cubin's ELF (``.nv.info``
  ``EIATTR_REGCOUNT`` / ``EIATTR_FRAME_SIZE``, ``.nv.shared.<kernel>``,
  ``.text.<kernel>``), parsed here without any tool;
* spills: a zero stack frame proves there are none; otherwise (or without a
  cubin) Triton's bundled ``ptxas -v`` is run on the PTX for
  ``spill_store_bytes`` / ``spill_load_bytes`` (and registers).

A figure that cannot be known is ``None`` (never 0) and ``reasons[field]``
says why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import struct
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..targets import Target, get_target, target_for_triton

__all__ = [
    "ResourceReport",
    "amd_occupancy",
    "nvidia_occupancy",
    "parse_amdgcn",
    "parse_ptx",
    "report_from_triton",
]


@dataclass(frozen=True)
class ResourceReport:
    """Resource usage of one compiled kernel. ``to_dict()`` is JSON-serializable."""

    target: str
    backend: str
    kernel_name: str | None = None
    # registers (per lane / per thread)
    vgpr: int | None = None  # AMD: arch VGPRs; NVIDIA: registers per thread
    agpr: int | None = None  # AMD CDNA accumulation registers; None elsewhere
    vgpr_total: int | None = None  # AMD: unified VGPR+AGPR count that occupancy is computed from
    accum_offset: int | None = None  # AMD CDNA: first AGPR index in the unified file
    sgpr: int | None = None  # AMD: SGPRs including VCC/XNACK extras
    # memory beyond registers
    scratch_bytes: int | None = None  # AMD private segment per lane; NVIDIA stack frame per thread
    vgpr_spill_count: int | None = None
    sgpr_spill_count: int | None = None
    spill_store_bytes: int | None = None  # NVIDIA (ptxas -v)
    spill_load_bytes: int | None = None  # NVIDIA (ptxas -v)
    lds_bytes: int | None = None  # static + dynamic LDS / shared memory per workgroup
    lds_static_bytes: int | None = None
    # occupancy
    num_warps: int | None = None  # waves / warps per workgroup
    occupancy: int | None = None  # AMD: waves per SIMD; NVIDIA: active warps per SM
    occupancy_unit: str | None = None  # 'waves_per_simd' | 'warps_per_sm'
    occupancy_max: int | None = None  # the hardware maximum in the same unit
    occupancy_limits: dict[str, int] = field(default_factory=dict)  # each limit, same unit
    occupancy_limiter: str | None = None  # the limit(s) that bind, '+'-joined on ties
    compiler_occupancy: int | None = None  # AMD: LLVM's '; Occupancy:' (registers, static LDS)
    workgroups_per_cu: int | None = None  # resident workgroups per CU / blocks per SM (estimate)
    # code
    instruction_count: int = 0  # real instructions in the kernel body (PTX statements on NVIDIA)
    code_bytes: int | None = None
    matrix_ops: dict[str, int] = field(default_factory=dict)  # by exact mnemonic / PTX opcode
    global_loads: dict[str, int] = field(default_factory=dict)  # global/buffer/flat loads by name
    global_stores: dict[str, int] = field(default_factory=dict)
    load_widths_bits: dict[int, int] = field(default_factory=dict)  # bits per lane -> count
    store_widths_bits: dict[int, int] = field(default_factory=dict)
    direct_to_lds_loads: int = 0  # global->LDS without registers (AMD *_lds*, NVIDIA cp.async)
    # loops: a label and a later branch back to it; an outer loop's count includes its inner ones
    loop_instructions: list[int] = field(default_factory=list)  # per loop, in code order
    # the smallest loop holding a matrix op: a GEMM's K loop (also inside a persistent tile loop)
    matrix_loop_instructions: int | None = None
    # ds_read*/ds_load* (AMD); ld.shared, ldmatrix (NVIDIA)
    lds_reads: dict[str, int] = field(default_factory=dict)
    lds_writes: dict[str, int] = field(default_factory=dict)
    lds_read_widths_bits: dict[int, int] = field(default_factory=dict)
    lds_write_widths_bits: dict[int, int] = field(default_factory=dict)
    # provenance
    reasons: dict[str, str] = field(default_factory=dict)  # field -> why it is None
    warnings: tuple[str, ...] = ()

    __hash__ = None  # holds dicts

    @property
    def matrix_op_count(self) -> int:
        return sum(self.matrix_ops.values())

    @property
    def has_scratch(self) -> bool | None:
        return None if self.scratch_bytes is None else self.scratch_bytes > 0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["warnings"] = list(self.warnings)
        return d

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def _align(n: int, g: int) -> int:
    return -(-n // g) * g


def _hist(c: Counter) -> dict:
    return dict(sorted(c.items(), key=lambda kv: (str(type(kv[0])), kv[0])))


class _Loops:
    """Loops of an instruction stream: fed labels and instructions in order, a branch to an
    earlier label closes a loop spanning from that label to the branch."""

    def __init__(self):
        self.labels: dict[str, int] = {}
        self.n = 0
        self.matrix_at: list[int] = []
        self.spans: list[tuple[int, int]] = []

    def label(self, name: str):
        self.labels[name] = self.n

    def instruction(self, matrix: bool = False, branch_to: str | None = None):
        if matrix:
            self.matrix_at.append(self.n)
        self.n += 1
        start = self.labels.get(branch_to) if branch_to else None
        if start is not None:
            self.spans.append((start, self.n))

    def fields(self) -> dict:
        sizes = [b - a for a, b in self.spans]
        with_mma = [b - a for a, b in self.spans if any(a <= i < b for i in self.matrix_at)]
        return {
            "loop_instructions": sizes,
            "matrix_loop_instructions": min(with_mma) if with_mma else None,
        }


#: mnemonic prefixes of AMD matrix instructions (CDNA MFMA, RDNA / gfx1250 WMMA, sparse forms)
AMD_MATRIX_PREFIXES = ("v_mfma", "v_smfmac", "v_wmma", "v_swmmac")
_AMD_LABEL = re.compile(r"^\s*([.\w$]+):")
_AMD_BRANCH = re.compile(r"^s_(?:c?branch)\w*$")


class _Mix:
    """The instruction-mix counters both assembly parsers fill (AMDGCN and PTX)."""

    NAMES = (
        "matrix_ops",
        "global_loads",
        "global_stores",
        "load_widths_bits",
        "store_widths_bits",
        "lds_reads",
        "lds_writes",
        "lds_read_widths_bits",
        "lds_write_widths_bits",
    )

    def __init__(self):
        self.counters = tuple(Counter() for _ in self.NAMES)

    def fields(self) -> dict:
        """The ``ResourceReport`` fields, as sorted histograms."""
        return {n: _hist(c) for n, c in zip(self.NAMES, self.counters)}


def _limiter(limits: dict[str, int]) -> str | None:
    if not limits:
        return None
    lo = min(limits.values())
    return "+".join(k for k, v in limits.items() if v == lo)


# ---------------------------------------------------------------------------
# occupancy models
# ---------------------------------------------------------------------------


def amd_occupancy(
    target: Target,
    *,
    vgprs: int | None,
    sgprs: int | None = None,
    lds_bytes: int | None = None,
    num_warps: int | None = None,
) -> tuple[dict[str, int], int | None]:
    """Waves per SIMD allowed by each resource, and resident workgroups per CU.

    The register limit follows LLVM's ``getNumWavesPerEUWithNumVGPRs``:
    ``vgprs`` (the unified VGPR+AGPR count on CDNA) is rounded up to the
    allocation granule and divides the per-lane budget. SGPRs limit only
    before gfx10 (``sgprs_per_simd`` / count, LLVM ``getOccupancyWithNumSGPRs``).
    LDS: ``lds_bytes_per_cu // lds_bytes`` workgroups of ``num_warps`` waves
    spread over the CU's SIMDs.
    """
    rb = target.registers
    mx = rb.max_waves_per_simd
    if mx is None:
        return {}, None
    limits: dict[str, int] = {"max_waves": mx}
    if vgprs is not None and rb.vgprs_per_lane and rb.vgpr_alloc_granule:
        g = rb.vgpr_alloc_granule
        if vgprs < g:
            limits["vgpr"] = mx
        else:
            limits["vgpr"] = min(max(rb.vgprs_per_lane // _align(vgprs, g), 1), mx)
    if sgprs is not None and rb.sgprs_per_simd:
        limits["sgpr"] = min(rb.sgprs_per_simd // max(sgprs, 1), mx)
    simds = rb.simds_per_cu or 1
    lds_wgs = None
    if lds_bytes and num_warps and target.lds_bytes_per_cu:
        if target.lds_bytes_per_block is not None and lds_bytes > target.lds_bytes_per_block:
            lds_wgs = 0
            limits["lds"] = 0
        else:
            lds_wgs = target.lds_bytes_per_cu // lds_bytes
            limits["lds"] = min(max((lds_wgs * num_warps) // simds, 1 if lds_wgs else 0), mx)
    wgs = None
    if num_warps:
        reg_waves = min(v for k, v in limits.items() if k != "lds")
        if num_warps >= simds:
            wgs = reg_waves // -(-num_warps // simds)
        else:
            wgs = (reg_waves * simds) // num_warps
        if lds_wgs is not None:
            wgs = min(wgs, lds_wgs)
        if rb.max_workgroups_per_cu and num_warps > 1:
            wgs = min(wgs, rb.max_workgroups_per_cu)
    return limits, wgs


def nvidia_occupancy(
    target: Target,
    *,
    regs: int | None,
    smem_bytes: int | None = None,
    num_warps: int | None = None,
) -> tuple[dict[str, int], int | None]:
    """Active warps per SM allowed by each resource, and resident blocks per SM.

    Follows the CUDA Occupancy Calculator (``cuda_occupancy.h``): registers are
    allocated per warp in units of ``reg_alloc_unit`` from each of the SM's
    sub-partitions; shared memory per block adds the 1 KiB the system reserves
    per block (228 KiB per SM vs 227 KiB usable per block on sm90) and is
    allocated in 128-byte units.
    """
    rb = target.registers
    if not num_warps or rb.max_warps_per_sm is None:
        return {}, None
    blocks: dict[str, int] = {
        "max_warps": rb.max_warps_per_sm // num_warps,
        "max_blocks": rb.max_blocks_per_sm or rb.max_warps_per_sm,
    }
    if regs is not None and rb.regs_per_sm and rb.reg_alloc_unit:
        subparts = rb.schedulers_per_sm or 1
        per_warp = _align(max(regs, 1) * target.warp_size, rb.reg_alloc_unit)
        warps = (rb.regs_per_sm // subparts // per_warp) * subparts
        blocks["registers"] = warps // num_warps
    if smem_bytes is not None and target.lds_bytes_per_cu:
        if target.lds_bytes_per_block is not None and smem_bytes > target.lds_bytes_per_block:
            blocks["smem"] = 0
        elif smem_bytes > 0:
            reserved = target.lds_bytes_per_cu - (target.lds_bytes_per_block or 0)
            per_block = _align(smem_bytes + max(reserved, 0), 128)
            blocks["smem"] = target.lds_bytes_per_cu // per_block
    n = min(blocks.values())
    return {k: v * num_warps for k, v in blocks.items()}, n


# ---------------------------------------------------------------------------
# AMDGCN
# ---------------------------------------------------------------------------

_AMD_COMMENT = re.compile(r"^\s*;\s*([A-Za-z]\w*)\s*[:=]\s*(\d+)\b")
_AMD_SET = re.compile(
    r"^\s*\.set\s+\.?L?(?P<fn>[\w$.]+?)\.(?P<key>num_vgpr|num_agpr|numbered_sgpr|private_seg_size),\s*(?P<val>\d+)\s*$"
)
_AMD_HSA = re.compile(r"^\s*\.amdhsa_(\w+)\s+(-?\d+)\s*$")
_AMD_MD_LINE = re.compile(r"^(\s*)(-\s+)?\.(\w+):\s*(.*?)\s*$")
_AMD_MNEMONIC = re.compile(r"^[a-z][a-z0-9_]*$")
_WIDTH_TOKEN = re.compile(r"^(?:dwordx(\d)|dword|ubyte|sbyte|byte|ushort|sshort|short|[bui](\d+))$")


def _amd_width(tokens: list[str]) -> int | None:
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


def _amd_instructions(body: list[str], labels: bool = False):
    """(mnemonic, operands) of each real instruction: no directives, labels or comments
    (with ``labels``, a label is yielded as ``(None, name)``)."""
    for raw in body:
        line = raw.split(";", 1)[0].split("//", 1)[0].strip()
        if labels and (m := _AMD_LABEL.match(line)):
            yield None, m.group(1)
            continue
        if not line or line.startswith(".") or line.endswith(":"):
            continue
        mnem, _, ops = line.partition(" ")
        if _AMD_MNEMONIC.match(mnem):
            yield mnem, ops.strip()


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
        expect = _align(vgpr, 4) + agpr if agpr else vgpr
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
        num_warps = -(-flat // wave)
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
    loops = _Loops()
    n_instr = 0
    mix = _Mix()
    matrix, gl, gs, lw, sw, dr, dw, drw, dww = mix.counters
    direct = 0
    for mnem, ops in _amd_instructions(body, labels=True):
        if mnem is None:
            loops.label(ops)
            continue
        n_instr += 1
        parts = mnem.split("_")
        head = parts[0]
        is_matrix = mnem.startswith(AMD_MATRIX_PREFIXES)
        loops.instruction(
            is_matrix, ops.split(",")[-1].strip() if _AMD_BRANCH.match(mnem) else None
        )
        if is_matrix:
            matrix[mnem] += 1
        elif head in ("global", "buffer", "flat") and len(parts) > 1:
            kind = parts[1]
            if kind == "load":
                to_lds = (
                    "lds" in parts
                    or "async" in parts
                    or re.search(r"(^|[\s,])lds(\s|$)", ops) is not None
                )
                key = (
                    f"{mnem} lds"
                    if to_lds and "lds" not in parts and "async" not in parts
                    else mnem
                )
                gl[key] += 1
                direct += to_lds
                w = _amd_width(parts[2:])
                if w is not None:
                    lw[w] += 1
            elif kind == "store":
                gs[mnem] += 1
                w = _amd_width(parts[2:])
                if w is not None:
                    sw[w] += 1
        elif head == "tensor" and mnem.startswith("tensor_load_to_lds"):
            gl[mnem] += 1  # gfx1250 tensor data mover: width is in the descriptor
            direct += 1
        elif head == "ds" and len(parts) > 1:
            kind = parts[1]
            two = kind in ("read2", "write2", "read2st64", "write2st64") or (
                len(parts) > 2 and parts[2].startswith("2addr")
            )
            if kind.startswith("read") or kind == "load":
                dr[mnem] += 1
                w = _amd_width(parts[2:])
                if w is not None:
                    drw[w * (2 if two else 1)] += 1
            elif kind.startswith("write") or kind == "store":
                dw[mnem] += 1
                w = _amd_width(parts[2:])
                if w is not None:
                    dww[w * (2 if two else 1)] += 1

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
        occupancy_limiter=_limiter(limits) if occ is not None else None,
        compiler_occupancy=compiler_occ,
        workgroups_per_cu=wgs,
        instruction_count=n_instr,
        code_bytes=comments.get("codeLenInByte"),
        direct_to_lds_loads=direct,
        **mix.fields(),
        **loops.fields(),
        reasons={
            **reasons,
            "spill_store_bytes": "AMD reports spill counts, not bytes",
            "spill_load_bytes": "AMD reports spill counts, not bytes",
        },
        warnings=tuple(warnings),
    )


# ---------------------------------------------------------------------------
# cubin (ELF) attributes
# ---------------------------------------------------------------------------

_EIATTR_FRAME_SIZE = 0x11
_EIATTR_MIN_STACK_SIZE = 0x12
_EIATTR_MAX_STACK_SIZE = 0x23
_EIATTR_REGCOUNT = 0x2F
_EIFMT_SVAL = 0x04


def _cubin_attrs(cubin: bytes, kernel_name: str | None) -> dict[str, int]:
    """Registers, frame size, static shared memory and code size of a kernel in a cubin.

    Reads the ELF directly: the global ``.nv.info`` section holds
    ``EIATTR_REGCOUNT`` / ``EIATTR_FRAME_SIZE`` records (symbol index, value);
    ``.nv.shared.<kernel>`` and ``.text.<kernel>`` sizes give static shared
    memory and SASS bytes.
    """
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    secs = []
    for i in range(shnum):
        secs.append(struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize))

    def cstr(off: int) -> str:
        return cubin[off : cubin.index(b"\0", off)].decode("latin-1")

    str_off = secs[shstrndx][4]
    named = {cstr(str_off + s[0]): s for s in secs}
    # symbol table: index -> name
    syms: dict[int, str] = {}
    symtab = named.get(".symtab")
    if symtab is not None:
        _, _, _, _, off, size, link, _, _, ent = symtab
        strtab_off = secs[link][4]
        for k in range(size // (ent or 24)):
            (st_name,) = struct.unpack_from("<I", cubin, off + k * (ent or 24))
            syms[k] = cstr(strtab_off + st_name) if st_name else ""
    funcs = sorted(n[len(".text.") :] for n in named if n.startswith(".text."))
    name = kernel_name or (funcs[0] if funcs else None)
    out: dict[str, int] = {}
    info = named.get(".nv.info")
    if info is not None:
        off, size = info[4], info[5]
        p = off
        while p + 4 <= off + size:
            fmt, attr = cubin[p], cubin[p + 1]
            if fmt == _EIFMT_SVAL:
                (sz,) = struct.unpack_from("<H", cubin, p + 2)
                payload = cubin[p + 4 : p + 4 + sz]
                p += 4 + sz
                if sz == 8:
                    sym, val = struct.unpack("<II", payload)
                    if name is not None and syms.get(sym, name) != name:
                        continue
                    key = {
                        _EIATTR_REGCOUNT: "regs",
                        _EIATTR_FRAME_SIZE: "frame_size",
                        _EIATTR_MIN_STACK_SIZE: "min_stack_size",
                        _EIATTR_MAX_STACK_SIZE: "max_stack_size",
                    }.get(attr)
                    if key:
                        out[key] = val
            else:
                p += 4
    if name is not None:
        text = named.get(f".text.{name}")
        if text is not None:
            out["code_bytes"] = text[5]
        shared = named.get(f".nv.shared.{name}")
        out["static_shared"] = shared[5] if shared is not None else 0
    return out


# ---------------------------------------------------------------------------
# ptxas
# ---------------------------------------------------------------------------


def _ptxas_path(arch: int | str | None) -> str | None:
    try:
        from triton import knobs

        # Mirrors triton.backends.nvidia.compiler.get_ptxas: sm90+ use the
        # newer ptxas Triton ships as 'ptxas-blackwell'.
        tool = knobs.nvidia.ptxas_blackwell if int(arch or 0) >= 90 else knobs.nvidia.ptxas
        path = tool.path
    except Exception:
        return None
    return path if path and os.path.exists(path) else None


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_FRAME = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)


def _run_ptxas(ptx: str, arch: int | str | None, kernel_name: str | None) -> tuple[dict, str]:
    """``ptxas -v`` on the PTX: ({regs, frame_size, spill_stores, spill_loads}, error)."""
    path = _ptxas_path(arch)
    if path is None:
        return {}, "Triton's bundled ptxas was not found"
    m = re.search(r"^\s*\.target\s+(sm_\w+)", ptx, re.M)
    gpu = m.group(1) if m else f"sm_{arch}"
    with tempfile.TemporaryDirectory(prefix="flydsl-ptxas-") as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [path, "-v", "--regAllocOptLevel=2", f"--gpu-name={gpu}", src, "-o", src + ".o"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return {}, f"ptxas failed to run: {e}"
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        return {}, f"ptxas exited {proc.returncode}: {log.strip()[:300]}"
    # restrict to the kernel's block when several entries are compiled
    if kernel_name and f"'{kernel_name}'" in log:
        log = log[log.index(f"'{kernel_name}'") :]
    out: dict[str, int] = {}
    if m := _PTXAS_REGS.search(log):
        out["regs"] = int(m.group(1))
    if m := _PTXAS_FRAME.search(log):
        out["frame_size"], out["spill_stores"], out["spill_loads"] = map(int, m.groups())
    return out, ""


# ---------------------------------------------------------------------------
# PTX
# ---------------------------------------------------------------------------

_PTX_TYPE = re.compile(r"^(?:[bsuf](\d+)|bf16|f16x2|bf16x2|e4m3x2|e5m2x2)$")
_PTX_PRED = re.compile(r"^@!?%?\w+\s+")
_PTX_LABEL = re.compile(r"^[$\w]+:")


def _ptx_width(parts: list[str]) -> int | None:
    vec = 1
    bits = None
    for p in parts:
        if re.fullmatch(r"v(\d+)", p):
            vec = int(p[1:])
        m = _PTX_TYPE.match(p)
        if m:
            bits = int(m.group(1)) if m.group(1) else (16 if p == "bf16" else 32)
    return None if bits is None else vec * bits


def _ptx_statements(ptx: str, labels: bool = False):
    """(opcode, operands) of each statement in the body of the (first) .entry (with
    ``labels``, each label as ``(None, name)`` before the statement it marks)."""
    lines = ptx.splitlines()
    start = next((i for i, l in enumerate(lines) if ".entry" in l.split("//")[0]), None)
    if start is not None:
        open_ = next((i for i in range(start, len(lines)) if lines[i].rstrip() == "{"), None)
        if open_ is not None:
            # Count braces: inline-asm blocks open indented but may close in column 0.
            close, depth = len(lines), 0
            for i in range(open_ + 1, len(lines)):
                code = lines[i].split("//", 1)[0]
                depth += code.count("{") - code.count("}")
                if depth < 0:
                    close = i
                    break
            lines = lines[open_ + 1 : close]
    kept = []
    for l in lines:
        code = l.split("//", 1)[0].strip()
        # Line directives (.loc, .file, ...) carry no ';' terminator.
        if code.startswith(".") and not code.endswith(";"):
            continue
        kept.append(code)
    text = re.sub(r"/\*.*?\*/", "", "\n".join(kept), flags=re.S)
    for stmt in text.split(";"):
        s = stmt.strip().lstrip("{}").strip()
        while m := _PTX_LABEL.match(s):
            if labels:
                yield None, m.group(0)[:-1]
            s = _PTX_LABEL.sub("", s, count=1).strip()
        s = s.lstrip("{}").strip()
        if not s or s.startswith("."):
            continue
        s = _PTX_PRED.sub("", s)
        op, _, rest = s.partition(" ")
        op = op.strip()
        if op and re.match(r"^[a-z]", op):
            yield op, rest.replace("\n", " ").strip()


def parse_ptx(
    ptx_text: str,
    target: str | Target,
    cubin_bytes: bytes | None = None,
    *,
    num_warps: int | None = None,
    shared_bytes: int | None = None,
    kernel_name: str | None = None,
    run_ptxas: bool = True,
) -> ResourceReport:
    """Report the resources of a PTX kernel, with registers from its cubin or ``ptxas -v``.

    ``shared_bytes`` is the dynamic shared memory Triton launches with
    (``metadata.shared``); ``num_warps`` defaults to ``.reqntid``/``.maxntid``.
    """
    t = get_target(target)
    if t.backend != "cuda":
        raise ValueError(f"parse_ptx needs an NVIDIA target, got {t.name!r}")
    warnings: list[str] = []
    reasons: dict[str, str] = {
        "agpr": "no AGPRs on NVIDIA",
        "vgpr_total": "AMD-only figure",
        "accum_offset": "AMD-only figure",
        "sgpr": "no SGPRs on NVIDIA (uniform registers are not reported)",
        "vgpr_spill_count": "NVIDIA reports spill bytes (spill_store_bytes/spill_load_bytes)",
        "sgpr_spill_count": "NVIDIA reports spill bytes (spill_store_bytes/spill_load_bytes)",
        "compiler_occupancy": "ptxas does not report occupancy",
    }
    m = re.search(r"\.entry\s+([\w$]+)", ptx_text)
    name = kernel_name or (m.group(1) if m else None)
    if num_warps is None:
        m = re.search(r"^\s*\.(?:reqntid|maxntid)\s+([\d\s,]+)", ptx_text, re.M)
        if m:
            threads = math.prod(int(x) for x in m.group(1).replace(",", " ").split())
            num_warps = -(-threads // t.warp_size)
        else:
            reasons["num_warps"] = "no .reqntid/.maxntid and no num_warps given"

    regs = frame = static_shared = code_bytes = None
    spill_st = spill_ld = None
    if cubin_bytes:
        try:
            attrs = _cubin_attrs(cubin_bytes, name)
        except (ValueError, struct.error, IndexError) as e:
            attrs = {}
            warnings.append(f"cubin not readable: {e}")
        regs = attrs.get("regs")
        frame = attrs.get("frame_size")
        static_shared = attrs.get("static_shared")
        code_bytes = attrs.get("code_bytes")
        if frame == 0:
            # Spilled registers live in the stack frame: no frame, no spills.
            spill_st = spill_ld = 0
    if run_ptxas and (regs is None or spill_st is None):
        got, err = _run_ptxas(ptx_text, t.arch, name)
        if err:
            for f_ in ("vgpr", "scratch_bytes", "spill_store_bytes", "spill_load_bytes"):
                reasons.setdefault(f_, err)
        if regs is not None and "regs" in got and got["regs"] != regs:
            warnings.append(f"cubin has {regs} registers but ptxas -v says {got['regs']}")
        regs = regs if regs is not None else got.get("regs")
        frame = frame if frame is not None else got.get("frame_size")
        spill_st = got.get("spill_stores", spill_st)
        spill_ld = got.get("spill_loads", spill_ld)
    for f_, v in (
        ("vgpr", regs),
        ("scratch_bytes", frame),
        ("spill_store_bytes", spill_st),
        ("spill_load_bytes", spill_ld),
    ):
        if v is None:
            reasons.setdefault(
                f_, "no cubin given" + (" and ptxas not run" if not run_ptxas else "")
            )
        else:
            reasons.pop(f_, None)
    if code_bytes is None:
        reasons["code_bytes"] = "SASS size needs the cubin"

    if shared_bytes is None:
        lds = None
        reasons["lds_bytes"] = (
            "dynamic shared memory is not in the PTX; pass shared_bytes (Triton: metadata.shared)"
        )
    else:
        lds = (static_shared or 0) + shared_bytes
    if static_shared is None:
        reasons["lds_static_bytes"] = "static shared memory needs the cubin"

    limits, blocks = nvidia_occupancy(t, regs=regs, smem_bytes=lds, num_warps=num_warps)
    occ = min(limits.values()) if limits and "registers" in limits else None
    if occ is None:
        reasons["occupancy"] = "register count or num_warps unknown"
    elif lds is None:
        reasons["occupancy"] = "shared-memory limit not applied (dynamic shared memory unknown)"

    loops = _Loops()
    n_instr = 0
    mix = _Mix()
    matrix, gl, gs, lw, sw, dr, dw, drw, dww = mix.counters
    direct = 0
    for op, ops in _ptx_statements(ptx_text, labels=True):
        if op is None:
            loops.label(ops)
            continue
        n_instr += 1
        parts = op.split(".")
        head = parts[0]
        spaces = [p.split("::")[0] for p in parts[1:]]
        is_matrix = op.startswith(("wgmma.mma_async", "tcgen05.mma")) or head == "mma"
        loops.instruction(is_matrix, ops.strip() if head == "bra" else None)
        if is_matrix:
            matrix[op] += 1
        elif head == "ld" and "global" in spaces:
            gl[op] += 1
            if (w := _ptx_width(parts)) is not None:
                lw[w] += 1
        elif head == "st" and "global" in spaces:
            gs[op] += 1
            if (w := _ptx_width(parts)) is not None:
                sw[w] += 1
        elif head == "ld" and "shared" in spaces:
            dr[op] += 1
            if (w := _ptx_width(parts)) is not None:
                drw[w] += 1
        elif head == "st" and "shared" in spaces:
            dw[op] += 1
            if (w := _ptx_width(parts)) is not None:
                dww[w] += 1
        elif head in ("ldmatrix", "stmatrix"):
            n = next((int(p[1:]) for p in parts if re.fullmatch(r"x\d", p)), 1)
            (dr if head == "ldmatrix" else dw)[op] += 1
            (drw if head == "ldmatrix" else dww)[32 * n] += 1
        elif head == "cp" and len(parts) > 1 and parts[1] == "async" and "global" in spaces:
            if "shared" not in spaces:
                continue
            dst_shared = spaces.index("shared") < spaces.index("global")
            if dst_shared:
                gl[op] += 1
                direct += 1
                # cp.async [dst], [src], cp-size: bytes per thread
                args = [a.strip() for a in ops.split(",")]
                if "bulk" not in parts and len(args) >= 3:
                    with contextlib.suppress(ValueError):
                        lw[int(args[2], 0) * 8] += 1
            else:
                gs[op] += 1

    return ResourceReport(
        target=t.name,
        backend=t.backend,
        kernel_name=name,
        vgpr=regs,
        agpr=None,
        vgpr_total=None,
        accum_offset=None,
        sgpr=None,
        scratch_bytes=frame,
        vgpr_spill_count=None,
        sgpr_spill_count=None,
        spill_store_bytes=spill_st,
        spill_load_bytes=spill_ld,
        lds_bytes=lds,
        lds_static_bytes=static_shared,
        num_warps=num_warps,
        occupancy=occ,
        occupancy_unit="warps_per_sm",
        occupancy_max=t.registers.max_warps_per_sm,
        occupancy_limits=limits,
        occupancy_limiter=_limiter(limits) if occ is not None else None,
        compiler_occupancy=None,
        workgroups_per_cu=blocks,
        instruction_count=n_instr,
        code_bytes=code_bytes,
        direct_to_lds_loads=direct,
        **mix.fields(),
        **loops.fields(),
        reasons=reasons,
        warnings=tuple(warnings),
    )


# ---------------------------------------------------------------------------
# Triton
# ---------------------------------------------------------------------------


def report_from_triton(compiled_kernel: Any, target: str | Target | None = None) -> ResourceReport:
    """Report a ``triton.compile`` result (a ``CompiledKernel``).

    ``target`` defaults to the one the kernel was compiled for
    (``metadata.target``); a target that disagrees with it is an error.
    """
    md = compiled_kernel.metadata
    gt = getattr(md, "target", None)
    backend = getattr(gt, "backend", None)
    arch = getattr(gt, "arch", None)
    inferred = target_for_triton(backend, arch) if backend is not None else None
    if target is None:
        if inferred is None:
            raise ValueError(f"the kernel's target {gt!r} is not a known FlyDSL target")
        t = inferred
    else:
        t = get_target(target)
        if inferred is not None and inferred != t:
            raise ValueError(f"the kernel was compiled for {inferred.name}, not {t.name}")
    asm = compiled_kernel.asm
    num_warps = getattr(md, "num_warps", None)
    shared = getattr(md, "shared", None)
    name = getattr(md, "name", None)
    if t.backend == "hip":
        return parse_amdgcn(
            asm["amdgcn"], t, num_warps=num_warps, shared_bytes=shared, kernel_name=name
        )
    if t.backend == "cuda":
        return parse_ptx(
            asm["ptx"],
            t,
            asm.get("cubin"),
            num_warps=num_warps,
            shared_bytes=shared,
            kernel_name=name,
        )
    raise ValueError(f"{t.name} is a CPU target; there is no assembly to report on")
