"""TopK configs: the kernel choice by (M, N, k) (``select``), its ``Config``, every target's table.

Selection rule
--------------
Seeded from the upstream dispatch regions published for MI355X (gfx950.md:
small-K register kernel for K in {2,4,8,16} and power-of-two N in [1024,
8192]; radix kernel for K 64-1024 over N 8k-256k), and extended to every
(k, N) by a stated cost model (vector operations per element per program):

* ``small`` when k <= 16 and N <= 16384: k rounds of (argmax, mask) over a
  register-resident row, about 3k ops per element: cheaper than the
  ~log2(N)^2/2 compare-exchange stages of a bitonic tile sort (84 at
  N = 8192) and the radix select's ~9 ops per element per pass (5 passes
  over fp32 keys) while k <= 16. Also k <= 8 at any N (the chunked variant
  takes 2 argmax per round per chunk, ~6k ops per element, below the radix
  select's ~45 for fp32).
* ``sort`` when N <= 8192 (any k): one bitonic tile top-k of the row (<= 8192
  (key, index) pairs). The upstream radix region starts at N = 8k: the switch.
* ``radix`` otherwise: one program per row, all passes fused, deterministic,
  when M >= CUs / 2 (256 CUs on gfx950); with fewer rows, ``radix_split``
  spreads each row over S = min(chunks, CUs // M) programs to fill the GPU
  (NPASS + 2 launches; NPASS = 4 for fp32 keys, 2 for 16-bit keys).
* radix survivors are sorted by ``sort_tile`` when k <= 4096, else by the
  stable merge sort (``sort_runs`` + ``merge_pass``); ``sorted=False`` skips it.

Tables
------
``BUCKETS`` are the problem sizes each kernel's config is chosen for (a problem uses the
smallest bucket at least its tile); ``TABLES`` holds each target's config per bucket. No
gfx950 was available to time on: the gfx950 table was picked by the static model in
``model.py`` (cross-compiled candidates, ranked without timing; ``flydsl-kernels model topk`` re-derives and prints it), the other targets' derive from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flydsl_core import cdiv

from .. import supported
from .._target import TUNED_TARGETS, lane_factor, num_cus, table_target
from ..choice import Choice, MChoice

#: the GPU target the model ranked the shipped defaults for (the other tables derive from it)
TARGET = "gfx950"
#: the selection kinds (``select``'s first argument)
KINDS = ("topk", "router")
#: key bits per supported dtype: 16-bit floats rank on their own 16 bits (2 radix passes)
KEY_BITS = {dt: torch.finfo(dt).bits for dt in supported.TOPK}

SMALL_K_MAX = 16
SMALL_K_ANY_N = 8  # k at or below which the chunked small-k kernel serves any N
SMALL_TILE_MAX = 16384  # largest register-resident row of the small-k kernel
SMALL_CHUNK = 4096  # chunk of the chunked small-k kernel
SORT_N_DEFAULT = 8192  # the rule's switch from tile sort to radix select
SORT_TILE_MAX = 16384  # largest row topk_sort accepts (method="sort")
SURVIVOR_TILE_MAX = 4096  # sort_tile up to this k, merge sort above
MERGE_B = 1024  # merge sort block (runs of MERGE_B; 2*MERGE_B-element tile sorts)
METHODS = ("small", "sort", "radix", "radix_split")


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class Config:
    """The kernel chosen for a problem and its config (constexprs and launch options)."""

    kernel: str  # one of METHODS, or "router"
    KP: int = 1  # k rounded up to a power of two (small / sort)
    BLOCK: int = 1024  # row tile (small / sort / router) or chunk (radix)
    CHUNKED: bool = False  # small: loop over chunks of BLOCK
    num_warps: int = 4
    split: int = 1  # radix_split: programs per row
    deterministic: bool = True
    sorter: str | None = None  # "tile" | "merge" (radix survivors), None: unsorted or k == 1
    SORT_KP: int = 1
    MERGE_B: int = MERGE_B
    sort_warps: int = 4  # warps of the survivor sort

    def slices(self, n: int) -> tuple[int, int]:
        """(programs per row, elements per program) for radix_split; spans are whole chunks."""
        chunks = cdiv(n, self.BLOCK)
        per = cdiv(chunks, max(1, self.split))
        return cdiv(chunks, per), per * self.BLOCK

    def as_dict(self) -> dict:
        d = {"kernel": self.kernel, "num_warps": self.num_warps, "BLOCK": self.BLOCK}
        if self.kernel in ("small", "sort"):
            d["KP"] = self.KP
            if self.kernel == "small":
                d["CHUNKED"] = self.CHUNKED
        if self.kernel == "radix_split":
            d.update(split=self.split, deterministic=self.deterministic)
        if self.sorter:
            d.update(sorter=self.sorter, sort_warps=self.sort_warps)
            d.update(
                {"SORT_KP": self.SORT_KP} if self.sorter == "tile" else {"MERGE_B": self.MERGE_B}
            )
        return d


# -- the buckets and the tables --------------------------------------------------------------------

#: the buckets each kernel's config is chosen for (a problem uses the smallest one >= its tile)
BUCKETS = {
    "small": [(b, False) for b in (256, 512, 1024, 2048, 4096, 8192, 16384)]
    + [(SMALL_CHUNK, True)],
    "sort": [(b,) for b in (512, 1024, 2048, 4096, 8192, 16384)],
    "radix": [(32,), (16,)],  # key bits
    "sort_tile": [(b,) for b in (256, 512, 1024, 2048, 4096)],
    "merge": [(MERGE_B,)],
    "router": [(b,) for b in (64, 128, 256, 512, 1024, 2048, 4096)],
}

#: gfx950 static picks, (kernel, *bucket) -> config, as printed by ``model.main()``; the comment
#: is the chosen compile's report (see model.model_launch for each bucket's worst case). The one
#: table kept aligned by hand: its lines are the generator's output, each with its figures.
# fmt: off
_GFX950: dict[tuple, dict] = {
    ('small', 256, False): {'num_warps': 1},  # vgpr 17, sgpr 34, occ 8, instr 1898; 4 survivors
    ('small', 512, False): {'num_warps': 1},  # vgpr 28, sgpr 34, occ 8, instr 2404; 4 survivors
    ('small', 1024, False): {'num_warps': 1},  # vgpr 52, sgpr 34, occ 8, instr 3451; 4 survivors
    ('small', 2048, False): {'num_warps': 2},  # vgpr 60, sgpr 34, occ 8, instr 3748; 4 survivors
    ('small', 4096, False): {'num_warps': 4},  # vgpr 60, sgpr 34, occ 8, instr 3900; 4 survivors
    ('small', 8192, False): {'num_warps': 8},  # vgpr 55, sgpr 34, occ 8, instr 4110; 3 survivors
    ('small', 16384, False): {'num_warps': 8},  # vgpr 100, sgpr 46, occ 4, instr 5852; 2 survivors
    ('small', 4096, True): {'num_warps': 4},  # vgpr 61, sgpr 86, occ 8, instr 4827; 2 survivors
    ('sort', 512): {'num_warps': 2},  # vgpr 34, sgpr 50, occ 8, instr 1454; 4 survivors
    ('sort', 1024): {'num_warps': 2},  # vgpr 52, sgpr 70, occ 8, instr 3448; 4 survivors
    ('sort', 2048): {'num_warps': 4},  # vgpr 62, sgpr 74, occ 8, instr 4392; 4 survivors
    ('sort', 4096): {'num_warps': 16},  # vgpr 50, sgpr 65, occ 8, instr 2902; 4 survivors
    ('sort', 8192): {'num_warps': 16},  # vgpr 72, sgpr 83, occ 7, instr 6507; 4 survivors
    ('sort', 16384): {'num_warps': 16},  # vgpr 108, sgpr 82, occ 4, instr 15472; 3 survivors
    ('radix', 32): {'BLOCK': 1024, 'num_warps': 4},  # vgpr 62, sgpr 89, occ 8, instr 2478; 8 survivors
    ('radix', 16): {'BLOCK': 1024, 'num_warps': 4},  # vgpr 61, sgpr 90, occ 8, instr 1499; 7 survivors
    ('sort_tile', 256): {'num_warps': 2},  # vgpr 24, sgpr 46, occ 8, instr 732; 4 survivors
    ('sort_tile', 512): {'num_warps': 2},  # vgpr 34, sgpr 50, occ 8, instr 1475; 4 survivors
    ('sort_tile', 1024): {'num_warps': 2},  # vgpr 52, sgpr 68, occ 8, instr 3485; 4 survivors
    ('sort_tile', 2048): {'num_warps': 4},  # vgpr 62, sgpr 70, occ 8, instr 4427; 4 survivors
    ('sort_tile', 4096): {'num_warps': 16},  # vgpr 50, sgpr 64, occ 8, instr 2921; 3 survivors
    ('merge', 1024): {'num_warps': 8},  # vgpr 45, sgpr 69, occ 8, instr 2563; 3 survivors
    ('router', 64): {'num_warps': 1},  # vgpr 21, sgpr 34, occ 8, instr 432; 3 survivors
    ('router', 128): {'num_warps': 1},  # vgpr 23, sgpr 37, occ 8, instr 646; 3 survivors
    ('router', 256): {'num_warps': 1},  # vgpr 33, sgpr 48, occ 8, instr 1034; 3 survivors
    ('router', 512): {'num_warps': 1},  # vgpr 41, sgpr 66, occ 8, instr 1853; 3 survivors
    ('router', 1024): {'num_warps': 1},  # vgpr 54, sgpr 59, occ 8, instr 3573; 3 survivors
    ('router', 2048): {'num_warps': 2},  # vgpr 60, sgpr 61, occ 8, instr 3984; 3 survivors
    ('router', 4096): {'num_warps': 4},  # vgpr 60, sgpr 72, occ 8, instr 4365; 2 survivors
}
# fmt: on


def bucket_of(kernel: str, size: int, chunked: bool = False) -> tuple:
    """The bucket of ``kernel`` for a tile of ``size`` (the smallest at least it)."""
    if kernel == "radix":
        return (size,)
    if kernel == "small" and chunked:
        return (SMALL_CHUNK, True)
    sizes = [b[0] for b in BUCKETS[kernel] if len(b) == 1 or b[1] is False]
    b = next((s for s in sizes if s >= size), sizes[-1])
    return (b, False) if kernel == "small" else (b,)


# The other targets' tables. gfx942 has gfx950's wave64 and register file, so it ships gfx950's
# table (not re-ranked there; its report compiles every TopK case clean with it); sm90 and
# gfx1250 run warps of 32 lanes: their table is gfx950's at equal elements per lane, num_warps x 2
# (``_target.lane_factor``), at most 32 warps. ``EVIDENCE`` holds the sm90 compile report of
# the derived entries at the report's cases (Triton 3.9, cross-compiled, untimed): (num_warps,
# registers per thread, warps per SM, PTX statements), none with a stack frame. The model's
# full re-ranking on sm90 (``model.derive(target="sm90")``) was not run: on the shared 2-core
# machine its unrolled small-k candidates alone took over 15 minutes; RMSNorm's re-ranking on
# sm90 picked the derived entry at every sampled bucket (rmsnorm/configs.py).
EVIDENCE: dict[str, dict] = {
    "sm90": {
        "small 256x4096 k=8": (8, 56, 32, 1636),
        "small 256x1024 k=2": (2, 48, 40, 506),
        "sort 256x8192 k=64": (32, 54, 32, 4584),
        "radix fp32 keys (N 16k-256k)": (8, 64, 32, 1032),
        "sort_tile k=256": (4, 32, 64, 898),
        "sort_tile k=1024": (4, 56, 36, 4115),
        "radix_hist_split 4x262144": (8, 34, 48, 340),
        "router 128 experts": (2, 30, 64, 583),
        "router 256 experts (DeepSeek-V3)": (2, 32, 64, 1002),
    },
}


def _derived(target: str) -> dict[tuple, dict]:
    """gfx950's table at ``target``'s lanes per warp (num_warps x the lane factor, <= 32)."""
    f = lane_factor(target)
    if f == 1:
        return _GFX950
    return {k: {**c, "num_warps": min(32, c["num_warps"] * f)} for k, c in _GFX950.items()}


#: every tuned target's table, ``(kernel, *bucket) -> config`` (``_target.TUNED_TARGETS``)
TABLES: dict[str, dict[tuple, dict]] = {t: _derived(t) for t in TUNED_TARGETS}


def table(target=None) -> dict[tuple, dict]:
    """``target``'s table (None and the CPU backends: gfx950's; a GPU target without a shipped
    table: gfx950's at its lanes per warp)."""
    name = table_target(None, target)
    got = TABLES.get(name)
    if got is None:
        got = TABLES[name] = _derived(name)
    return got


def entry(kernel: str, bucket: tuple, target=None) -> dict:
    """The config of a bucket in ``target``'s table (a plain fallback where the table has no
    entry, at the target's lanes per warp)."""
    got = table(target).get((kernel, *bucket))
    if got is not None:
        return dict(got)
    if kernel == "radix":
        cfg = {"BLOCK": 2048, "num_warps": 8}
    else:
        cfg = {"num_warps": max(1, min(8, bucket[0] // 512))}
    f = lane_factor(target)
    if f > 1:
        cfg["num_warps"] = min(32, cfg["num_warps"] * f)
    return cfg


# -- selection -------------------------------------------------------------------------------------


def select(kind, *sizes, target=None, **options) -> Config:
    """The kernel and config of ``target``'s table for a problem (see the module doc):

    * ``select("topk", M, N, k, dtype, *, sorted=True, deterministic=True, method=None,
      cus=None)``: M rows of N elements, 1 <= k <= N; ``method`` forces a kernel, ``cus``
      defaults to the target's CUs / SMs;
    * ``select("router", E)``: the fused MoE router over ``E`` experts.
    """
    if kind == "topk":
        return _topk(*sizes, target=target, **options)
    if kind == "router":
        (experts,) = sizes
        block = next_pow2(experts)
        return Config(
            "router",
            BLOCK=block,
            num_warps=entry("router", bucket_of("router", block), target)["num_warps"],
        )
    raise ValueError(f"TopK select: kind {kind!r} is not one of {', '.join(KINDS)}")


def _topk(
    m: int,
    n: int,
    k: int,
    dtype,
    *,
    sorted: bool = True,
    deterministic: bool = True,
    method: str | None = None,
    cus: int | None = None,
    target=None,
) -> Config:
    if cus is None:
        cus = num_cus(target)
    if not 1 <= k <= n:
        raise ValueError(f"select needs 1 <= k <= n, got k={k}, n={n}")
    if method is not None and method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    kb = KEY_BITS[dtype]
    kp = next_pow2(k)
    tile = next_pow2(n)
    if method is None:
        if (k <= SMALL_K_MAX and n <= SMALL_TILE_MAX) or k <= SMALL_K_ANY_N:
            method = "small"
        elif n <= SORT_N_DEFAULT:
            method = "sort"
        else:
            chunk = entry("radix", (kb,), target)["BLOCK"]
            method = "radix_split" if (m < cus // 2 and n > chunk) else "radix"
    if method == "small":
        if k > SMALL_K_MAX:
            raise ValueError(f"the small-k kernel unrolls k rounds: k={k} > {SMALL_K_MAX}")
        chunked = tile > SMALL_TILE_MAX
        block = SMALL_CHUNK if chunked else max(tile, kp)
        cfg = entry("small", bucket_of("small", block, chunked), target)
        return Config("small", KP=kp, BLOCK=block, CHUNKED=chunked, num_warps=cfg["num_warps"])
    if method == "sort":
        if tile > SORT_TILE_MAX:
            raise ValueError(f"the sort kernel holds a row in one tile: N={n} > {SORT_TILE_MAX}")
        cfg = entry("sort", bucket_of("sort", tile), target)
        return Config("sort", KP=kp, BLOCK=tile, num_warps=cfg["num_warps"])
    cfg = entry("radix", (kb,), target)
    sorter, skp, sw = None, 1, 4
    if sorted and k > 1:
        if k <= SURVIVOR_TILE_MAX:
            sorter, skp = "tile", next_pow2(k)
            sw = entry("sort_tile", bucket_of("sort_tile", skp), target)["num_warps"]
        else:
            sorter = "merge"
            sw = entry("merge", (MERGE_B,), target)["num_warps"]
    split = 1
    if method == "radix_split":
        split = max(1, min(cdiv(n, cfg["BLOCK"]), cus // max(1, m)))
    return Config(
        method,
        BLOCK=cfg["BLOCK"],
        num_warps=cfg["num_warps"],
        split=split,
        deterministic=bool(deterministic),
        sorter=sorter,
        SORT_KP=skp,
        sort_warps=sw,
    )


def m_choice(kind: str, n: int, k: int, dtype, *, cus=None, target=None, **options) -> MChoice:
    """The top-k kernel choice over the rows ``M`` (``choice.MChoice``) of ``select("topk", M,
    n, k, dtype, **options)``: only the radix select depends on ``M`` (``radix_split`` below
    ``cus // 2`` rows, its split ``cus // M``), so the bounds are where that changes, all below
    ``cus``. The function API takes its choice from here."""
    if kind != "topk":
        raise ValueError(f"TopK m_choice: only the top-k's choice depends on M, not {kind!r}")
    cus = num_cus(target) if cus is None else cus

    def choose(M: int) -> Choice:
        return Choice(_topk(M, n, k, dtype, cus=cus, target=target, **options))

    def bounds() -> tuple[int, ...]:
        # nothing depends on M past the CU count (cus // M < 1 there): compare neighbours
        seen = [choose(m).config for m in range(1, cus + 2)]
        return tuple(m for m in range(1, cus + 1) if seen[m - 1] != seen[m])

    return MChoice(choose, bounds)
