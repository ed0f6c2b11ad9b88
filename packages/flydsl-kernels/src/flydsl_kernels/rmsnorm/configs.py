"""RMSNorm configs: the ``Config``, every target's shipped table (``TABLES``) and ``select``.

No GPU was available to time on: the gfx950 table was chosen by the static model in
``model.py`` (cross-compiled candidates ranked by their resource reports; ``flydsl-kernels model rmsnorm`` re-derives it), untimed. The model prefers the same block
sizes as upstream FlyDSL's measured gfx950 RMSNorm (256 threads per row below N = 12288, 512
up to 24576, 1024 above), which is some evidence for it, not proof: retune on hardware.

Kernels (``kernels.KERNELS`` keys), what ``select`` picks them by and where they apply, with
``BLOCK = next_pow2(N)``:

* ``select("fwd", ...)``:
  * ``fwd_rows``   BLOCK <= 1024: ``R`` rows per program as one (R, BLOCK) tile;
  * ``fwd_row``    1024 < BLOCK <= ROW_MAX_BLOCK[bytes]: one row per program in registers;
  * ``fwd_looped`` larger: one row per program, two passes over column blocks;
* ``select("bwd", ...)``:
  * ``bwd_rows``   BLOCK <= BWD_ROW_MAX_BLOCK[bytes]: whole rows in registers, R at a time;
  * ``bwd_rowdot`` + ``bwd_cols`` larger: a per-row dot product, then a
    (column blocks x row chunks) grid for dx and the dweight partials;
* ``select("dw_reduce", ...)``: the fixed-order dweight reduction of the partials.

Only the forward's config depends on the rows ``M`` (``m_choice("fwd", ...)``: the multi-row
kernel's ``R`` shrinks for short batches); the backward's grid does (``backward_programs``,
``cols_programs``), its config does not.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

from flydsl_core import cdiv

from .._target import TUNED_TARGETS, lane_factor, num_cus, resident_warps, table_target
from ..choice import Choice, MChoice

#: the GPU target the model ranked the shipped defaults for (the other tables derive from it)
TARGET = "gfx950"
#: the selection kinds (``select``'s first argument)
KINDS = ("fwd", "bwd", "dw_reduce")


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


#: element bytes by dtype object, filled by ``elem_bytes`` (a torch dtype's ``str`` is about a
#: microsecond, and every forward call asks three times)
_ELEM_BYTES: dict = {}


def elem_bytes(dtype) -> int:
    """2 for bf16/fp16, 4 for fp32 (a torch dtype, a FlyDSL dtype or its name)."""
    try:
        return _ELEM_BYTES[dtype]
    except (KeyError, TypeError):  # first sight, or an unhashable dtype object
        pass
    n = _elem_bytes(dtype)
    with contextlib.suppress(TypeError):  # an unhashable dtype object: not cached
        _ELEM_BYTES[dtype] = n
    return n


def _elem_bytes(dtype) -> int:
    name = str(dtype).removeprefix("torch.")
    if name in ("bfloat16", "float16", "bf16", "fp16", "half"):
        return 2
    if name in ("float32", "fp32", "float"):
        return 4
    raise ValueError(f"RMSNorm kernels support fp32, bf16 and fp16, got {dtype}")


@dataclass(frozen=True)
class Config:
    """One point of a kernel's config space: its tile constexprs and ``num_warps``."""

    kernel: str  # a key of kernels.KERNELS
    BLOCK: int
    R: int = 1  # rows per tile (fwd_rows, bwd_rows) or partial rows per step (dw_reduce: RB)
    num_warps: int = 4
    notes: dict = field(default_factory=dict, compare=False, hash=False)

    def constexprs(self) -> dict:
        d = {"BLOCK": self.BLOCK}
        if self.kernel in ("fwd_rows", "bwd_rows"):
            d["R"] = self.R
        elif self.kernel == "dw_reduce":
            d["RB"] = self.R
        return d

    def options(self) -> dict:
        return {"num_warps": self.num_warps}

    def as_dict(self) -> dict:
        return {"kernel": self.kernel, **self.constexprs(), "num_warps": self.num_warps}


# -- compile arguments -----------------------------------------------------------------------------


def row_stride_args(sx: int, sr: int, n: int, nbytes: int):
    """``(s, {SX, SR, SY})`` for ``rmsnorm_fwd_row``, whose outputs have row stride ``n``.

    For 16-bit rows with ``n % 16 == 0`` the output stride goes in at run time
    as ``s`` (its constexpr 0), and so does each input stride equal to it; any
    other stride stays a constant, which alone proves 16-byte rows for ``N % 8
    == 0`` (see the kernel's docstring). fp32 rows keep constants: there the
    run-time stride cost registers (N = 2048, 1 warp: 75 VGPRs instead of 61)."""
    rt = nbytes == 2 and n % 16 == 0
    const = {"SX": 0 if rt and sx == n else sx, "SR": 0 if rt and sr == n else sr}
    return n, {**const, "SY": 0 if rt else n}


# -- the shipped gfx950 table (the static model's picks; see model.py) -----------------------------
# Keys: (element bytes, BLOCK). Each entry notes the report figures the model saw.

#: largest BLOCK the one-row forward kernel keeps in registers (beyond: fwd_looped)
ROW_MAX_BLOCK = {2: 32768, 4: 16384}
#: largest BLOCK the register-resident backward handles (beyond: bwd_rowdot + bwd_cols)
BWD_ROW_MAX_BLOCK = {2: 16384, 4: 8192}
#: the multi-row forward kernel handles BLOCK up to this
ROWS_MAX_BLOCK = 1024

# generated by `flydsl-kernels model rmsnorm` (Triton 3.9, gfx950); notes = the
# figures the model saw (VGPR, instructions, waves per SIMD)
_FWD: dict[tuple[int, int], Config] = {
    (2, 1): Config("fwd_rows", 1, 64, 1, notes={"vgpr": 6, "instr": 38, "occ": 8}),
    (2, 2): Config("fwd_rows", 2, 64, 1, notes={"vgpr": 7, "instr": 48, "occ": 8}),
    (2, 4): Config("fwd_rows", 4, 64, 1, notes={"vgpr": 11, "instr": 57, "occ": 8}),
    (2, 8): Config("fwd_rows", 8, 64, 1, notes={"vgpr": 19, "instr": 74, "occ": 8}),
    (2, 16): Config("fwd_rows", 16, 64, 1, notes={"vgpr": 34, "instr": 143, "occ": 8}),
    (2, 32): Config("fwd_rows", 32, 64, 1, notes={"vgpr": 56, "instr": 222, "occ": 8}),
    (2, 64): Config("fwd_rows", 64, 32, 1, notes={"vgpr": 58, "instr": 223, "occ": 8}),
    (2, 128): Config("fwd_rows", 128, 16, 1, notes={"vgpr": 57, "instr": 228, "occ": 8}),
    (2, 256): Config("fwd_rows", 256, 8, 1, notes={"vgpr": 58, "instr": 264, "occ": 8}),
    (2, 512): Config("fwd_rows", 512, 4, 1, notes={"vgpr": 56, "instr": 241, "occ": 8}),
    (2, 1024): Config("fwd_rows", 1024, 2, 1, notes={"vgpr": 56, "instr": 225, "occ": 8}),
    (2, 2048): Config("fwd_row", 2048, 1, 1, notes={"vgpr": 58, "instr": 221, "occ": 8}),
    (2, 4096): Config("fwd_row", 4096, 1, 2, notes={"vgpr": 58, "instr": 237, "occ": 8}),
    (2, 8192): Config("fwd_row", 8192, 1, 4, notes={"vgpr": 58, "instr": 239, "occ": 8}),
    (2, 16384): Config("fwd_row", 16384, 1, 8, notes={"vgpr": 58, "instr": 242, "occ": 8}),
    (2, 32768): Config("fwd_row", 32768, 1, 16, notes={"vgpr": 58, "instr": 243, "occ": 8}),
    (4, 1): Config("fwd_rows", 1, 64, 1, notes={"vgpr": 4, "instr": 33, "occ": 8}),
    (4, 2): Config("fwd_rows", 2, 64, 1, notes={"vgpr": 7, "instr": 42, "occ": 8}),
    (4, 4): Config("fwd_rows", 4, 64, 1, notes={"vgpr": 10, "instr": 46, "occ": 8}),
    (4, 8): Config("fwd_rows", 8, 64, 1, notes={"vgpr": 24, "instr": 95, "occ": 8}),
    (4, 16): Config("fwd_rows", 16, 64, 1, notes={"vgpr": 37, "instr": 137, "occ": 8}),
    (4, 32): Config("fwd_rows", 32, 64, 1, notes={"vgpr": 60, "instr": 232, "occ": 8}),
    (4, 64): Config("fwd_rows", 64, 32, 1, notes={"vgpr": 61, "instr": 247, "occ": 8}),
    (4, 128): Config("fwd_rows", 128, 16, 1, notes={"vgpr": 62, "instr": 289, "occ": 8}),
    (4, 256): Config("fwd_rows", 256, 8, 1, notes={"vgpr": 59, "instr": 274, "occ": 8}),
    (4, 512): Config("fwd_rows", 512, 4, 1, notes={"vgpr": 64, "instr": 211, "occ": 8}),
    (4, 1024): Config("fwd_rows", 1024, 4, 2, notes={"vgpr": 60, "instr": 232, "occ": 8}),
    (4, 2048): Config("fwd_row", 2048, 1, 1, notes={"vgpr": 61, "instr": 177, "occ": 8}),
    (4, 4096): Config("fwd_row", 4096, 1, 2, notes={"vgpr": 62, "instr": 189, "occ": 8}),
    (4, 8192): Config("fwd_row", 8192, 1, 4, notes={"vgpr": 62, "instr": 191, "occ": 8}),
    (4, 16384): Config("fwd_row", 16384, 1, 8, notes={"vgpr": 62, "instr": 195, "occ": 8}),
}

_FWD_LOOPED: dict[int, Config] = {
    2: Config("fwd_looped", 8192, 1, 8, notes={"vgpr": 44, "instr": 310, "occ": 8}),
    4: Config("fwd_looped", 8192, 1, 16, notes={"vgpr": 64, "instr": 383, "occ": 8}),
}

_BWD: dict[tuple[int, int], Config] = {
    (2, 1): Config("bwd_rows", 1, 64, 1, notes={"vgpr": 13, "instr": 86, "occ": 8}),
    (2, 2): Config("bwd_rows", 2, 64, 1, notes={"vgpr": 20, "instr": 113, "occ": 8}),
    (2, 4): Config("bwd_rows", 4, 64, 1, notes={"vgpr": 33, "instr": 153, "occ": 8}),
    (2, 8): Config("bwd_rows", 8, 64, 1, notes={"vgpr": 59, "instr": 234, "occ": 8}),
    (2, 16): Config("bwd_rows", 16, 32, 1, notes={"vgpr": 65, "instr": 284, "occ": 7}),
    (2, 32): Config("bwd_rows", 32, 16, 1, notes={"vgpr": 64, "instr": 272, "occ": 8}),
    (2, 64): Config("bwd_rows", 64, 8, 1, notes={"vgpr": 64, "instr": 248, "occ": 8}),
    (2, 128): Config("bwd_rows", 128, 4, 1, notes={"vgpr": 63, "instr": 197, "occ": 8}),
    (2, 256): Config("bwd_rows", 256, 2, 1, notes={"vgpr": 61, "instr": 219, "occ": 8}),
    (2, 512): Config("bwd_rows", 512, 1, 1, notes={"vgpr": 50, "instr": 180, "occ": 8}),
    (2, 1024): Config("bwd_rows", 1024, 1, 2, notes={"vgpr": 52, "instr": 180, "occ": 8}),
    (2, 2048): Config("bwd_rows", 2048, 1, 4, notes={"vgpr": 52, "instr": 183, "occ": 8}),
    (2, 4096): Config("bwd_rows", 4096, 1, 8, notes={"vgpr": 52, "instr": 187, "occ": 8}),
    (2, 8192): Config("bwd_rows", 8192, 1, 16, notes={"vgpr": 52, "instr": 188, "occ": 8}),
    (2, 16384): Config("bwd_rows", 16384, 1, 16, notes={"vgpr": 96, "instr": 277, "occ": 5}),
    (4, 1): Config("bwd_rows", 1, 64, 1, notes={"vgpr": 11, "instr": 77, "occ": 8}),
    (4, 2): Config("bwd_rows", 2, 64, 1, notes={"vgpr": 21, "instr": 109, "occ": 8}),
    (4, 4): Config("bwd_rows", 4, 64, 1, notes={"vgpr": 33, "instr": 138, "occ": 8}),
    (4, 8): Config("bwd_rows", 8, 64, 1, notes={"vgpr": 55, "instr": 205, "occ": 8}),
    (4, 16): Config("bwd_rows", 16, 32, 1, notes={"vgpr": 54, "instr": 190, "occ": 8}),
    (4, 32): Config("bwd_rows", 32, 32, 1, notes={"vgpr": 61, "instr": 255, "occ": 8}),
    (4, 64): Config("bwd_rows", 64, 16, 1, notes={"vgpr": 63, "instr": 222, "occ": 8}),
    (4, 128): Config("bwd_rows", 128, 4, 1, notes={"vgpr": 52, "instr": 213, "occ": 8}),
    (4, 256): Config("bwd_rows", 256, 2, 1, notes={"vgpr": 42, "instr": 127, "occ": 8}),
    (4, 512): Config("bwd_rows", 512, 1, 1, notes={"vgpr": 50, "instr": 128, "occ": 8}),
    (4, 1024): Config("bwd_rows", 1024, 1, 2, notes={"vgpr": 52, "instr": 149, "occ": 8}),
    (4, 2048): Config("bwd_rows", 2048, 1, 4, notes={"vgpr": 52, "instr": 151, "occ": 8}),
    (4, 4096): Config("bwd_rows", 4096, 1, 8, notes={"vgpr": 52, "instr": 155, "occ": 8}),
    (4, 8192): Config("bwd_rows", 8192, 1, 16, notes={"vgpr": 52, "instr": 158, "occ": 8}),
}

_BWD_ROWDOT: dict[int, Config] = {
    2: Config("bwd_rowdot", 8192, 1, 8, notes={"vgpr": 56, "instr": 179, "occ": 8}),
    4: Config("bwd_rowdot", 8192, 1, 8, notes={"vgpr": 63, "instr": 187, "occ": 8}),
}

_BWD_COLS: dict[int, Config] = {
    2: Config("bwd_cols", 1024, 1, 2, notes={"vgpr": 46, "instr": 155, "occ": 8}),
    4: Config("bwd_cols", 1024, 1, 1, notes={"vgpr": 62, "instr": 183, "occ": 8}),
}

_DW_REDUCE: dict[int, Config] = {
    2: Config("dw_reduce", 64, 32, 1, notes={"vgpr": 57, "instr": 119, "occ": 8}),
    4: Config("dw_reduce", 64, 32, 1, notes={"vgpr": 57, "instr": 119, "occ": 8}),
}

_GFX950: dict[str, dict] = {
    "fwd": _FWD,
    "fwd_looped": _FWD_LOOPED,
    "bwd": _BWD,
    "bwd_rowdot": _BWD_ROWDOT,
    "bwd_cols": _BWD_COLS,
    "dw_reduce": _DW_REDUCE,
}


# -- the other targets' tables ---------------------------------------------------------------------
# gfx942 has gfx950's wave64 and register file (512 unified VGPRs per lane, 8 waves per SIMD), so
# it ships gfx950's table (not re-ranked there; its report compiles every RMSNorm case clean with
# it); sm90 and gfx1250 run warps of 32 lanes, so their table is gfx950's at equal
# elements per lane: num_warps x 2 (``_target.lane_factor``), at most 32 warps (1024 threads).
# The model re-run on sm90 at sampled buckets (``model.rank(kernel, N, bf16, target="sm90",
# candidates=...)``, Triton 3.9, cross-compiled, untimed) ranks the derived entry first at each;
# ``EVIDENCE`` holds what it saw, (num_warps, registers, warps per SM, PTX statements), best
# first, no candidate with a stack frame. One entry is adjusted (``ADJUSTED``): at (bf16, 8192)
# the derived 8 warps spill 4 bytes in the fused-residual variant at N = 5120 (40 registers,
# 8 B stack), so sm90 takes the model's second, 16 warps (36 registers; the residual variant
# 32, no stack): an entry must compile clean for every variant it serves.
EVIDENCE: dict[str, dict] = {
    "sm90": {
        "fwd_row N=8192 bf16": [
            (8, 59, 32, 332),
            (16, 36, 48, 190),
            (32, 24, 64, 116),
            (4, 100, 16, 618),
        ],
        "fwd_row N=4096 bf16": [
            (4, 58, 32, 328),
            (8, 32, 64, 186),
            (16, 24, 64, 116),
            (2, 98, 16, 614),
        ],
        "bwd_rows N=4096 bf16": [(16, 58, 32, 227), (8, 98, 16, 378), (32, 32, 64, 141)],
        "fwd_row N=5120 bf16 +residual (BLOCK 8192)": [
            (4, 64, 32, 718),
            (8, 40, 48, 386),
            (16, 32, 64, 218),
        ],
    },
}
#: per target, (table, key) -> num_warps where the derived entry is not shipped (see above)
ADJUSTED: dict[str, dict[tuple, int]] = {"sm90": {("fwd", (2, 8192)): 16}}


def _adjusted(c: Config, warps: int) -> Config:
    return Config(c.kernel, c.BLOCK, c.R, warps, notes={"from": "model, adjusted"})


def _derived(target: str) -> dict[str, dict]:
    """gfx950's table at ``target``'s lanes per warp, with ``target``'s ``ADJUSTED`` entries."""
    f = lane_factor(target)
    if f == 1:
        got = dict(_GFX950)
    else:
        got = {
            kind: {
                k: Config(c.kernel, c.BLOCK, c.R, min(32, c.num_warps * f), notes={"from": TARGET})
                for k, c in table.items()
            }
            for kind, table in _GFX950.items()
        }
    for (kind, key), warps in ADJUSTED.get(target, {}).items():
        got[kind] = {**got[kind], key: _adjusted(got[kind][key], warps)}
    return got


#: every tuned target's table: ``{"fwd", "fwd_looped", "bwd", "bwd_rowdot", "bwd_cols",
#: "dw_reduce"}`` -> entries (``_target.TUNED_TARGETS``; gfx950's is the model's, the others
#: derive from it as said above)
TABLES: dict[str, dict[str, dict]] = {
    t: _GFX950 if t == TARGET else _derived(t) for t in TUNED_TARGETS
}


def table(target=None) -> dict[str, dict]:
    """``target``'s table (None and the CPU backends: gfx950's; a GPU target without a shipped
    table: gfx950's at its lanes per warp)."""
    name = table_target(None, target)
    got = TABLES.get(name)
    if got is None:
        got = TABLES[name] = _derived(name)
    return got


# -- selection -------------------------------------------------------------------------------------


def select(kind: str, N: int, dtype, M: int | None = None, target=None):
    """The shipped config(s) of ``target``'s table for rows of ``N`` elements of ``dtype``:

    * ``"fwd"``: the forward kernel's ``Config``; ``M`` (the rows), when given, only matters to
      the multi-row kernel (``m_choice``);
    * ``"bwd"``: ``(bwd_rows,)`` or ``(bwd_rowdot, bwd_cols)``;
    * ``"dw_reduce"``: the dweight reduction's ``Config`` (by the dtype only).
    """
    if kind == "fwd":
        return _forward(N, dtype, M, target)
    t = table(target)
    nb = elem_bytes(dtype)
    if kind == "bwd":
        b = next_pow2(max(N, 1))
        if b <= BWD_ROW_MAX_BLOCK[nb]:
            return (t["bwd"][(nb, b)],)
        return (t["bwd_rowdot"][nb], t["bwd_cols"][nb])
    if kind == "dw_reduce":
        return t["dw_reduce"][nb]
    raise ValueError(f"RMSNorm select: kind {kind!r} is not one of {', '.join(KINDS)}")


def _forward(N, dtype, M, target) -> Config:
    cfg = _forward_of_table(N, dtype, target)
    if M is None or cfg.kernel != "fwd_rows":
        return cfg
    steps = _rows_steps(cfg, target)
    n = sum(1 for bound, _ in steps if bound >= M)  # the bounds do not increase: a prefix
    r, w = steps[n - 1][1] if n else (cfg.R, cfg.num_warps)
    return cfg if (r, w) == (cfg.R, cfg.num_warps) else Config("fwd_rows", cfg.BLOCK, r, w)


def _forward_of_table(N, dtype, target) -> Config:
    t = table(target)
    nb, b = elem_bytes(dtype), next_pow2(max(N, 1))
    if b > ROW_MAX_BLOCK[nb]:
        return t["fwd_looped"][nb]
    return t["fwd"][(nb, b)]


def _rows_steps(cfg: Config, target) -> list[tuple[int, tuple[int, int]]]:
    """The multi-row kernel's shrinking for short batches: ``R`` is halved (and ``num_warps``
    with it, keeping at least one element per lane) while the grid would bring fewer warps than
    the GPU keeps resident (``_target.resident_warps``), so short batches still spread over
    every CU. Step ``i`` is taken when ``ceil(M / r) * w < full``, i.e. ``M <= r * (ceil(full
    / w) - 1)`` for the ``(r, w)`` before it; since a step is taken only after every earlier
    one, the ``i``-th step's bound is the smallest of the first ``i``. Returns ``[(bound,
    (r, w) after the step)]``."""
    full, lanes = resident_warps(target), 64 // lane_factor(target)
    r, w, b = cfg.R, cfg.num_warps, cfg.BLOCK
    out, bound = [], None
    while r > 1:
        t = r * (cdiv(full, w) - 1)
        bound = t if bound is None else min(bound, t)
        r //= 2
        if r * b < lanes * w and w > 1:
            w //= 2
        out.append((bound, (r, w)))
    return out


def m_choice(kind: str, N: int, dtype, target=None) -> MChoice:
    """The forward's config over the rows ``M`` (``choice.MChoice``): the table's entry, whose
    multi-row kernel shrinks its ``R`` below the bounds of ``_rows_steps``. The function API
    takes its forward config from here."""
    if kind != "fwd":
        raise ValueError(f"RMSNorm m_choice: only the forward's config depends on M, not {kind!r}")
    cfg = _forward_of_table(N, dtype, target)

    def choose(M: int) -> Choice:
        return Choice(_forward(N, dtype, M, target))

    def bounds() -> tuple[int, ...]:
        if cfg.kernel != "fwd_rows":
            return ()
        return tuple(b for b, _ in _rows_steps(cfg, target) if b > 0)

    return MChoice(choose, bounds)


# -- the backward's grids --------------------------------------------------------------------------


def backward_programs(M: int, R: int, target=None) -> tuple[int, int]:
    """``(programs, rows per program)`` for the register-resident backward.

    At most two programs per CU (each then walks its chunk of rows, keeping
    its dweight partial in registers), and chunks are whole ``R``-row tiles."""
    groups = math.ceil(M / R)
    p = max(1, min(groups, 2 * num_cus(target)))
    chunk = math.ceil(groups / p) * R
    return math.ceil(M / chunk), chunk


def cols_programs(M: int, N: int, BLOCK: int, target=None) -> tuple[int, int, int]:
    """``(column blocks, row chunks, rows per chunk)`` for ``bwd_cols``: about four programs
    per CU in all, each with at least 8 rows where there are that many."""
    nb = math.ceil(N / BLOCK)
    p = max(1, min(math.ceil(M / 8), math.ceil(4 * num_cus(target) / nb)))
    chunk = math.ceil(M / p)
    return nb, math.ceil(M / chunk), chunk
