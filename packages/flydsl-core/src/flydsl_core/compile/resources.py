"""What a compiled kernel uses: the ``ResourceReport``, occupancy models and the instruction mix.

This module is ISA-neutral. The parsers that read a listing live with the
backend that produces it: ``backends/triton/amdgcn.py`` (``parse_amdgcn``)
and ``backends/triton/ptx.py`` (``parse_ptx``) read the registers, scratch
and LDS figures from their ISA's metadata and classify each instruction
(mnemonic -> kind and width, an ``Instr``); ``count_instructions`` is the one
loop that turns that stream into the report's instruction-mix and loop
fields; ``backends/triton/report.py`` (``report_from_triton``) picks the
parser for a ``triton.compile`` result. A figure that cannot be known is
``None`` (never 0) and ``reasons[field]`` says why.

This module imports neither torch nor triton.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..helpers import cdiv
from ..targets import Target

__all__ = [
    "Instr",
    "ResourceReport",
    "amd_occupancy",
    "count_instructions",
    "limiter",
    "nvidia_occupancy",
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
# the instruction mix
# ---------------------------------------------------------------------------


def align(n: int, g: int) -> int:
    return cdiv(n, g) * g


@dataclass(frozen=True)
class Instr:
    """One instruction as the counters see it (an ISA's classifier makes these).

    ``kind`` is ``matrix``, ``load`` / ``store`` (global memory), ``lds_read``
    / ``lds_write`` or None (counted, but in no histogram); ``name`` is the key
    it is counted under; ``bits`` the data moved per lane (or thread) where
    the mnemonic says; ``to_lds`` marks a global load into LDS without
    registers; ``branch_to`` the label a branch may jump to.
    """

    kind: str | None = None
    name: str = ""
    bits: int | None = None
    to_lds: bool = False
    branch_to: str | None = None


#: Instr.kind -> (the report's counter by name, its histogram by bits)
_KIND_FIELDS = {
    "matrix": ("matrix_ops", None),
    "load": ("global_loads", "load_widths_bits"),
    "store": ("global_stores", "store_widths_bits"),
    "lds_read": ("lds_reads", "lds_read_widths_bits"),
    "lds_write": ("lds_writes", "lds_write_widths_bits"),
}


def _hist(c: Counter) -> dict:
    return dict(sorted(c.items(), key=lambda kv: (str(type(kv[0])), kv[0])))


def count_instructions(stream: Iterable[str | Instr]) -> dict[str, Any]:
    """The instruction-mix and loop fields of a ``ResourceReport`` from a kernel body.

    ``stream`` gives, in code order, each label (a ``str``) and each instruction
    (an ``Instr``). A branch to an earlier label closes a loop spanning from
    that label to the branch; an outer loop's count includes its inner ones.
    """
    counters = {f: Counter() for pair in _KIND_FIELDS.values() for f in pair if f}
    labels: dict[str, int] = {}
    matrix_at: list[int] = []
    spans: list[tuple[int, int]] = []
    n = direct = 0
    for item in stream:
        if isinstance(item, str):
            labels[item] = n
            continue
        if item.kind == "matrix":
            matrix_at.append(n)
        n += 1
        if item.branch_to and item.branch_to in labels:
            spans.append((labels[item.branch_to], n))
        if item.kind is not None:
            names, widths = _KIND_FIELDS[item.kind]
            counters[names][item.name] += 1
            if widths and item.bits is not None:
                counters[widths][item.bits] += 1
        direct += item.to_lds
    with_matrix = [b - a for a, b in spans if any(a <= i < b for i in matrix_at)]
    return {
        "instruction_count": n,
        "direct_to_lds_loads": direct,
        **{name: _hist(c) for name, c in counters.items()},
        "loop_instructions": [b - a for a, b in spans],
        # the smallest loop holding a matrix op: a GEMM's K loop (also in a persistent loop)
        "matrix_loop_instructions": min(with_matrix) if with_matrix else None,
    }


# ---------------------------------------------------------------------------
# occupancy models
# ---------------------------------------------------------------------------


def limiter(limits: dict[str, int]) -> str | None:
    """The limit(s) that bind, '+'-joined on ties."""
    if not limits:
        return None
    lo = min(limits.values())
    return "+".join(k for k, v in limits.items() if v == lo)


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
            limits["vgpr"] = min(max(rb.vgprs_per_lane // align(vgprs, g), 1), mx)
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
            wgs = reg_waves // cdiv(num_warps, simds)
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
        per_warp = align(max(regs, 1) * target.warp_size, rb.reg_alloc_unit)
        warps = (rb.regs_per_sm // subparts // per_warp) * subparts
        blocks["registers"] = warps // num_warps
    if smem_bytes is not None and target.lds_bytes_per_cu:
        if target.lds_bytes_per_block is not None and smem_bytes > target.lds_bytes_per_block:
            blocks["smem"] = 0
        elif smem_bytes > 0:
            reserved = target.lds_bytes_per_cu - (target.lds_bytes_per_block or 0)
            per_block = align(smem_bytes + max(reserved, 0), 128)
            blocks["smem"] = target.lds_bytes_per_cu // per_block
    n = min(blocks.values())
    return {k: v * num_warps for k, v in blocks.items()}, n
