"""The table of hardware targets flydsl-core knows, and name lookup.

Every figure carries a comment naming its source. "ref:" means a row of the
project's reference sheet ``shared/reference/gfx950.md`` (section, then the
``fact`` column); "LLVM:" means the AMDGPU backend's ``AMDGPUBaseInfo.cpp`` /
``AMDGPU.td``; "obs:" means it was checked against Triton 3.9's own output
when cross-compiling on the CPU (e.g. the ``; Occupancy:`` comment of the
AMDGCN it emits). Figures that are placeholders are listed in the target's
``unverified`` tuple, so code that depends on them can say so.

This module imports neither torch nor triton.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from ..exc import UnknownTargetError

#: the platform a target runs on: Triton's ``GPUTarget.backend`` name (``Target.backend`` keeps
#: Triton's field name); "Backend" names only the compiler protocol (``backends.Backend``)
Platform = Literal["hip", "cuda", "cpu"]

KiB = 1024


@dataclass(frozen=True)
class RegisterBudget:
    """Register-file limits that decide occupancy.

    AMD fields describe one SIMD ("EU" in LLVM): a wave's VGPRs (plus AGPRs on
    CDNA, which share one unified per-lane budget) are allocated in granules,
    and the waves resident on a SIMD share ``vgprs_per_lane``. NVIDIA fields
    describe one SM.
    """

    # --- AMD ---
    vgprs_per_lane: int | None = None  # unified VGPR(+AGPR) budget per lane of a SIMD
    max_arch_vgprs: int | None = None  # addressable arch VGPRs of one wave
    max_agprs: int | None = None  # addressable AGPRs of one wave (0: no AGPR file)
    vgpr_alloc_granule: int | None = None  # VGPRs are allocated in blocks of this many
    accum_offset_granule: int | None = None  # AGPRs start at arch VGPRs rounded up to this
    max_waves_per_simd: int | None = None
    simds_per_cu: int | None = None
    sgprs_per_simd: int | None = None  # None: SGPRs do not limit occupancy (gfx10+)
    max_sgprs_per_wave: int | None = None
    max_workgroups_per_cu: int | None = None  # barrier-resource limit on resident workgroups
    # --- NVIDIA ---
    regs_per_sm: int | None = None
    max_regs_per_thread: int | None = None
    reg_alloc_unit: int | None = None  # registers allocated per warp in units of this many
    schedulers_per_sm: int | None = None  # SM sub-partitions, each with regs_per_sm/4
    max_warps_per_sm: int | None = None
    max_blocks_per_sm: int | None = None


@dataclass(frozen=True)
class PeakRates:
    """Dense peak throughput and memory bandwidth of the whole device."""

    bf16_tflops: float | None = None
    fp8_tflops: float | None = None
    fp4_tflops: float | None = None  # MXFP4 where the hardware has it; None where it does not
    hbm_tb_s: float | None = None
    clock_ghz: float | None = None


@dataclass(frozen=True)
class Target:
    """One compilation target: an arch, its resources and its peak rates.

    Frozen and hashable, so it can key caches; ``to_json``/``from_json`` round
    trip it exactly.
    """

    name: str
    backend: Platform  # the platform (hip, cuda, cpu): Triton's GPUTarget field name
    arch: str | int | None  # what Triton's GPUTarget wants: 'gfx950', 90; None for CPU targets
    warp_size: int
    description: str = ""
    aliases: tuple[str, ...] = ()
    # the FlyDSL backend kind that compiles for it: "triton", "reference" (backends.KINDS) or
    # one a program registered with backends.register_kind
    compiler: str = "triton"
    num_cus: int | None = None  # CUs (AMD; WGPs on gfx1250) or SMs (NVIDIA)
    num_xcds: int | None = None  # accelerator complex dies; 1 for monolithic parts
    lds_bytes_per_cu: int | None = None  # LDS per CU (AMD) / shared memory per SM (NVIDIA)
    lds_bytes_per_block: int | None = None  # most one workgroup / thread block may use
    registers: RegisterBudget = field(default_factory=RegisterBudget)
    matrix_instructions: tuple[str, ...] = ()
    peak: PeakRates = field(default_factory=PeakRates)
    supports_native_mx: bool = False  # MX block-scaled matrix instructions in hardware
    # what the code generator may use (decided from these flags, never from the name):
    has_buffer_ops: bool = False  # AMD buffer loads/stores: 32-bit offsets from a descriptor
    eviction_hint_with_cache_modifier: bool = True  # a load may carry both hints at once
    # a one-instruction fp32 tanh (gfx1250's v_tanh_f32): fly.tanh lowers to the library's,
    # which compiles to it; elsewhere to the branch-free formula (rules/elementwise.tanh_helper)
    has_native_tanh: bool = False
    # wave64 CDNA: an inline-asm block may compare its operands into VCC and branch around its
    # own instructions (s_cbranch_vccz), a wave-uniform skip: fly.rescale's multiply
    # (rules/elementwise.rescale_asm). Off where the hardware does not interlock VALU results
    # (gfx1250's expert scheduling: the compiler's waits would not cover an asm block's)
    has_wave_skip_asm: bool = False
    unverified: tuple[str, ...] = ()  # names of fields holding placeholder figures

    @property
    def is_gpu(self) -> bool:
        return self.backend != "cpu"

    @property
    def is_amd(self) -> bool:
        return self.backend == "hip"

    @property
    def is_nvidia(self) -> bool:
        return self.backend == "cuda"

    def __str__(self) -> str:
        return self.name

    # -- serialization -------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["aliases"] = list(self.aliases)
        d["matrix_instructions"] = list(self.matrix_instructions)
        d["unverified"] = list(self.unverified)
        return d

    def to_json(self, **kwargs: Any) -> str:
        kwargs.setdefault("sort_keys", True)
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Target:
        known = {f.name for f in dataclasses.fields(cls)}
        extra = set(d) - known
        if extra:
            raise ValueError(f"unknown Target fields: {sorted(extra)}")
        kw = dict(d)
        kw["registers"] = RegisterBudget(**kw.get("registers", {}))
        kw["peak"] = PeakRates(**kw.get("peak", {}))
        for name in ("aliases", "matrix_instructions", "unverified"):
            kw[name] = tuple(kw.get(name, ()))
        return cls(**kw)

    @classmethod
    def from_json(cls, text: str) -> Target:
        return cls.from_dict(json.loads(text))

    # -- Triton ----------------------------------------------------------------

    def triton_target(self):
        """This target as ``triton.backends.compiler.GPUTarget`` (imports triton)."""
        if not self.is_gpu:
            raise UnknownTargetError(
                f"{self.name!r} is a CPU target and has no Triton GPUTarget; "
                f"GPU targets: {', '.join(t.name for t in _TARGETS if t.is_gpu)}"
            )
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------

# CDNA3/CDNA4 register model (gfx90a-class, shared by gfx942 and gfx950).
_CDNA_REGISTERS = RegisterBudget(
    # ref: gfx950 "VGPR file": 512 unified VGPR+AGPR per lane budget (same as gfx942);
    # LLVM getTotalNumVGPRs: FeatureGFX90AInsts -> 512.
    vgprs_per_lane=512,
    max_arch_vgprs=256,  # LLVM getAddressableNumArchVGPRs -> 256
    max_agprs=256,  # LLVM: 512 addressable unified minus 256 arch
    vgpr_alloc_granule=8,  # LLVM getVGPRAllocGranule: FeatureGFX90AInsts -> 8
    accum_offset_granule=4,  # LLVM/ISA: .amdhsa_accum_offset is a multiple of 4 VGPRs
    max_waves_per_simd=8,  # ref: gfx950 "VGPR file": up to 8 waves per SIMD; LLVM isGFX90A -> 8
    simds_per_cu=4,  # LLVM getEUsPerCU: pre-gfx10 CU has 4 SIMDs
    sgprs_per_simd=800,  # LLVM getTotalNumSGPRs: gfx8+ -> 800
    max_sgprs_per_wave=102,  # LLVM getAddressableNumSGPRs: gfx8/9 -> 102
    max_workgroups_per_cu=16,  # LLVM getMaxWorkGroupsPerCU: 16 barriers pre-gfx10
)

_GFX950 = Target(
    name="gfx950",
    backend="hip",
    arch="gfx950",
    warp_size=64,  # ref: gfx950 "wavefront": 64 lanes
    description="AMD Instinct MI355X / MI350X (CDNA4)",
    # Both parts have 256 CUs; the peak rates below are MI355X's (MI350X clocks
    # at 2.2 GHz, so its peaks are about 8% lower).
    aliases=("mi355x", "mi350x", "mi355", "mi350", "cdna4"),
    num_cus=256,  # ref: gfx950 "compute units": 256 (8 XCDs x 32 CUs)
    num_xcds=8,  # ref: gfx950 "compute units": 8 XCDs x 32 CUs
    lds_bytes_per_cu=160 * KiB,  # ref: gfx950 "LDS per CU": 160 KiB
    lds_bytes_per_block=160 * KiB,  # LLVM: FeatureAddressableLocalMemorySize163840 on gfx950
    registers=_CDNA_REGISTERS,
    # ref: gfx950 "native matrix instructions" (the first four); the f16 and
    # unscaled f8f6f4 forms are obs: Triton 3.9 emits them for fp16 / OCP fp8
    # tl.dot on gfx950 (matrix_instr_nonkdim 32 and 16).
    matrix_instructions=(
        "v_mfma_f32_32x32x16_bf16",
        "v_mfma_f32_16x16x32_bf16",
        "v_mfma_scale_f32_32x32x64_f8f6f4",
        "v_mfma_scale_f32_16x16x128_f8f6f4",
        "v_mfma_f32_32x32x16_f16",
        "v_mfma_f32_16x16x32_f16",
        "v_mfma_f32_32x32x64_f8f6f4",
        "v_mfma_f32_16x16x128_f8f6f4",
    ),
    peak=PeakRates(
        bf16_tflops=2500.0,  # ref: gfx950 "dense BF16": about 2.5 PFLOP/s (derived: half of FP8)
        fp8_tflops=5000.0,  # ref: gfx950 "dense FP8": about 5.0 PFLOP/s
        fp4_tflops=10000.0,  # ref: gfx950 "MXFP4 / MXFP6": about 10 PFLOP/s (MI350X: 9.2 PF)
        hbm_tb_s=8.0,  # ref: gfx950 "HBM": 288 GiB HBM3E, 8 TB/s
        clock_ghz=2.4,  # ref: gfx950 "peak clock": 2.4 GHz (MI355X), 2.2 GHz (MI350X)
    ),
    # ref: gfx950 "native matrix instructions": v_mfma_scale_f32_*_f8f6f4;
    # gfx942 has no block-scaled MFMA (obs: tl.dot_scaled upcasts to bf16 MFMA there).
    supports_native_mx=True,
    has_buffer_ops=True,  # obs: Triton 3.9 emits buffer_load_* given tt.pointer_range = 32
    has_wave_skip_asm=True,  # obs: Triton 3.9 assembles rescale_asm for it (compiled, not run)
)

_GFX942 = Target(
    name="gfx942",
    backend="hip",
    arch="gfx942",
    warp_size=64,  # ref: gfx950 "wavefront" row; gfx942 is wave64 like every CDNA part
    description="AMD Instinct MI300X (CDNA3)",
    # gfx942 parts with other figures are deliberately no aliases: MI300A has
    # 228 CUs, MI325X 6 TB/s HBM3E; the table's figures are MI300X's.
    aliases=("mi300x",),
    num_cus=304,  # ref: "gfx942 (MI300X): 304 CUs"
    num_xcds=8,  # AMD MI300X CDNA3 white paper: 8 XCDs x 38 CUs (not in the reference sheet)
    lds_bytes_per_cu=64 * KiB,  # ref: gfx950 "LDS per CU": (gfx942: 64 KiB)
    lds_bytes_per_block=64 * KiB,  # LLVM: FeatureAddressableLocalMemorySize65536 on gfx942
    registers=_CDNA_REGISTERS,  # ref: gfx950 "VGPR file": (same as gfx942)
    # obs: Triton 3.9 on gfx942 emits these for bf16 / fp16 / fp8e4b8 tl.dot
    # (nonkdim 32 and 16); OCP fp8 (fp8e4nv, fp8e5) is upcast to the f16 forms.
    matrix_instructions=(
        "v_mfma_f32_32x32x8_bf16",
        "v_mfma_f32_16x16x16_bf16",
        "v_mfma_f32_32x32x8_f16",
        "v_mfma_f32_16x16x16_f16",
        "v_mfma_f32_32x32x16_fp8_fp8",
        "v_mfma_f32_16x16x32_fp8_fp8",
    ),
    peak=PeakRates(
        bf16_tflops=1307.4,  # AMD MI300X product page, dense BF16 (not in the reference sheet)
        fp8_tflops=2614.9,  # AMD MI300X product page, dense FP8 (not in the reference sheet)
        fp4_tflops=None,  # no FP4 matrix instructions on CDNA3
        hbm_tb_s=5.3,  # ref: "gfx942 (MI300X): ... 5.3 TB/s"
        clock_ghz=2.1,  # AMD MI300X product page, peak engine clock (not in the reference sheet)
    ),
    supports_native_mx=False,
    has_buffer_ops=True,  # obs: Triton 3.9 emits buffer_load_* given tt.pointer_range = 32
    has_wave_skip_asm=True,  # obs: Triton 3.9 assembles rescale_asm for it (compiled, not run)
)

_GFX1250 = Target(
    name="gfx1250",
    backend="hip",
    arch="gfx1250",
    warp_size=32,  # ref: "gfx1250 (MI400-class): wave32"
    description="AMD gfx1250 (MI400-class; wave32, WMMA); device figures are placeholders",
    aliases=(),
    # PLACEHOLDER: no published CU count for a gfx1250 part in the reference
    # sheet; 256 mirrors gfx950 only so that grid heuristics have a number.
    # Counted in WGPs (Triton compiles gfx1250 in WGP mode: wgp_cu_mode='wgp').
    num_cus=256,
    num_xcds=None,  # unknown
    # LLVM AMDGPU.td: FeatureAddressableLocalMemorySize327680 for gfx1250 (320 KiB per WGP),
    # as relayed by a secondary summary of AMDGPU.td; not checked against hardware.
    lds_bytes_per_cu=320 * KiB,
    lds_bytes_per_block=320 * KiB,
    registers=RegisterBudget(
        # LLVM getTotalNumVGPRs: gfx10+ wave32 without 1.5x VGPRs -> 1024;
        # LLVM getVGPRAllocGranule: GFX10_3Insts wave32 -> 16;
        # LLVM getMaxWavesPerEU: GFX10_3Insts -> 16. obs: Triton 3.9's gfx1250
        # '; Occupancy:' comments fit exactly this model (10 VGPRs -> 16,
        # 72 -> 12, 212 -> 4 waves per SIMD).
        vgprs_per_lane=1024,
        max_arch_vgprs=1024,  # LLVM AMDGPU.td: Feature1024AddressableVGPRs (secondary summary)
        max_agprs=0,  # no AGPR file outside CDNA
        vgpr_alloc_granule=16,
        accum_offset_granule=None,
        max_waves_per_simd=16,
        simds_per_cu=4,  # LLVM getEUsPerCU: gfx10+ WGP mode -> 4 SIMDs
        sgprs_per_simd=None,  # LLVM getOccupancyWithNumSGPRs: gfx10+ -> SGPRs never limit
        max_sgprs_per_wave=106,  # LLVM getAddressableNumSGPRs: gfx10+ -> 106
        max_workgroups_per_cu=32,  # LLVM getMaxWorkGroupsPerCU: 32 barriers in WGP mode
    ),
    # ref: "Triton 3.9 emits v_wmma_f32_16x16x32_bf16"; obs: fp16 / OCP fp8 /
    # bf8 / tl.dot_scaled forms seen in Triton 3.9 gfx1250 output.
    matrix_instructions=(
        "v_wmma_f32_16x16x32_bf16",
        "v_wmma_f32_16x16x32_f16",
        "v_wmma_f32_16x16x128_fp8_fp8",
        "v_wmma_f32_16x16x128_bf8_bf8",
        "v_wmma_scale_f32_16x16x128_f8f6f4",
    ),
    peak=PeakRates(),  # unknown: no figures in the reference sheet
    # obs: Triton 3.9 lowers tl.dot_scaled (e4m3 with E8M0 scales) on gfx1250
    # to v_wmma_scale_f32_16x16x128_f8f6f4, a block-scaled instruction, so the
    # hardware has native MX; unverified on silicon.
    supports_native_mx=True,
    has_buffer_ops=True,  # obs: Triton 3.9 emits buffer_load_* given tt.pointer_range = 32
    has_native_tanh=True,  # obs: Triton 3.9 lowers libdevice's tanh to v_tanh_f32 on gfx1250
    unverified=(
        "num_cus",
        "num_xcds",
        "lds_bytes_per_cu",
        "lds_bytes_per_block",
        "peak",
        "supports_native_mx",
    ),
)

_SM90 = Target(
    name="sm90",
    backend="cuda",
    arch=90,
    warp_size=32,  # CUDA C Programming Guide: warp size 32 on every compute capability
    # H100 differs (3.35 TB/s HBM3 on SXM), so it is deliberately no alias:
    # its bandwidth-bound estimates would be off by 30%.
    description="NVIDIA H200 (Hopper, sm_90a)",
    aliases=("sm_90", "sm90a", "sm_90a", "hopper", "h200"),
    num_cus=132,  # ref: "NVIDIA H200 (sm_90): 132 SMs"
    num_xcds=1,  # monolithic die
    # CUDA C Programming Guide, compute capability 9.0 table (not in the reference
    # sheet): 228 KiB shared memory per SM, at most 227 KiB per thread block
    # (1 KiB per block is reserved by the system).
    lds_bytes_per_cu=228 * KiB,
    lds_bytes_per_block=227 * KiB,
    registers=RegisterBudget(
        # CUDA C Programming Guide, compute capability 9.0 table and the CUDA
        # Occupancy Calculator (not in the reference sheet):
        regs_per_sm=65536,
        max_regs_per_thread=255,
        reg_alloc_unit=256,  # per warp
        schedulers_per_sm=4,
        max_warps_per_sm=64,
        max_blocks_per_sm=32,
    ),
    # obs: Triton 3.9 sm90 PTX uses wgmma.mma_async (e.g.
    # wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16) for tl.dot with
    # num_warps a multiple of 4, mma.sync otherwise.
    matrix_instructions=("wgmma.mma_async", "mma.sync"),
    peak=PeakRates(
        bf16_tflops=990.0,  # ref: "about 990 TFLOP/s dense BF16 datasheet"
        fp8_tflops=1979.0,  # NVIDIA H200 datasheet, dense FP8 (not in the reference sheet)
        fp4_tflops=None,  # Hopper has no FP4 tensor cores
        hbm_tb_s=4.8,  # ref: "NVIDIA H200 (sm_90): ... 4.8 TB/s HBM3e"
        clock_ghz=1.98,  # NVIDIA H100/H200 SXM boost clock (not in the reference sheet)
    ),
    # Hopper's tensor cores have no block scales (obs: tl.dot_scaled upcasts to
    # bf16 wgmma on sm90); MX arrives with Blackwell (sm100).
    supports_native_mx=False,
    # ptxas takes no eviction priority next to a cache operator (both are hints)
    eviction_hint_with_cache_modifier=False,
)

_CPU_REFERENCE = Target(
    name="cpu-reference",
    backend="cpu",
    arch=None,
    warp_size=1,
    description="the PyTorch-on-CPU reference backend",
    aliases=("cpu", "reference", "ref", "cpu-ref"),
    compiler="reference",
)

_CPU_INTERPRET = Target(
    name="cpu-interpret",
    backend="cpu",
    arch=None,
    warp_size=1,
    description="Triton's interpreter (TRITON_INTERPRET=1) running on the CPU",
    aliases=("interpret", "interpreter", "cpu-interpreter", "triton-interpret"),
)

#: the shipped targets; ``register_target`` adds to the registry
SHIPPED: tuple[Target, ...] = (
    _GFX950,
    _GFX942,
    _GFX1250,
    _SM90,
    _CPU_REFERENCE,
    _CPU_INTERPRET,
)


def _norm(name: str) -> str:
    key = name.strip().lower().replace("_", "-")
    # ROCm reports feature suffixes ('gfx942:sramecc+:xnack-'); they do not
    # change the ISA family we compile for.
    return key.split(":", 1)[0]


_TARGETS: list[Target] = []
_BY_KEY: dict[str, Target] = {}


def register_target(target: Target) -> Target:
    """Add ``target`` (its name and aliases) to the registry; a name already taken is an error.

    For backends a program brings (``backends.register_kind``) and test backends; the
    shipped targets are registered at import.
    """
    keys = [_norm(k) for k in (target.name, *target.aliases)]
    taken = [k for k in keys if k in _BY_KEY]
    if taken or len(set(keys)) != len(keys):
        raise UnknownTargetError(f"target names already taken: {taken or keys}")
    _TARGETS.append(target)
    for k in keys:
        _BY_KEY[k] = target
    return target


def unregister_target(name: str) -> None:
    """Remove a target added with ``register_target`` (shipped targets stay)."""
    t = lookup_target(name)
    if t is None or t in SHIPPED:
        raise UnknownTargetError(f"{name!r} is not a registered (non-shipped) target")
    _TARGETS.remove(t)
    for k in [k for k, v in _BY_KEY.items() if v is t]:
        del _BY_KEY[k]


for _t in SHIPPED:
    register_target(_t)
del _t


def known_targets() -> tuple[str, ...]:
    """Canonical names of every known target, GPUs first."""
    return tuple(t.name for t in _TARGETS)


def all_targets() -> tuple[Target, ...]:
    return tuple(_TARGETS)


def _known_list() -> str:
    return ", ".join(known_targets())


def lookup_target(name: str) -> Target | None:
    """The target a name or alias denotes, or None."""
    # a canonical name as given first: every API call resolves its target several times
    return _BY_KEY.get(name) or _BY_KEY.get(_norm(name))


def get_target(name_or_target: str | Target) -> Target:
    """A ``Target`` from a canonical name, an alias or a Target (returned as is).

    Raises ``UnknownTargetError`` listing the known names.
    """
    if isinstance(name_or_target, Target):
        return name_or_target
    if not isinstance(name_or_target, str):
        raise UnknownTargetError(
            f"a target is a name or a Target, not {type(name_or_target).__name__}; "
            f"known targets: {_known_list()}"
        )
    t = lookup_target(name_or_target)
    if t is None:
        aliases = ", ".join(f"{a}->{t.name}" for t in _TARGETS for a in t.aliases)
        raise UnknownTargetError(
            f"unknown target {name_or_target!r}; known targets: {_known_list()} "
            f"(aliases: {aliases})"
        )
    return t


def is_cpu_target(target: str | Target) -> bool:
    """Whether ``target`` (a name, an alias or a Target) runs on the CPU: the one rule every
    package uses. An unknown name raises ``UnknownTargetError``."""
    return not get_target(target).is_gpu


def target_for_triton(backend: str, arch: str | int) -> Target | None:
    """The known target matching a Triton ``GPUTarget``'s backend and arch, or None."""
    for t in _TARGETS:
        if t.backend == backend and str(t.arch) == str(arch).split(":", 1)[0]:
            return t
    return None
