"""The gate table: where FlyDSL beats ATen, by (arch, op, dtype) and shape bucket.

A table is a list of rules. Each rule names an ``arch`` (``gfx950``, ``sm90``,
``cpu``), an ``op`` (``OPS``: ``rms_norm``, ``rms_norm_backward``, ``topk``, ``gemm``,
``grouped_mm``, ``mx_gemm``, ``mx_grouped_mm``), a ``dtype`` (``float32``, ``bfloat16``,
``float16``; the MX ops' A element dtype) and one shape bucket: a box of closed ranges over
``m`` (rows; rows per group for the grouped GEMMs), ``n`` (row length / columns) and, for
topk and the GEMMs, ``k``,
with optional constraints (``k_in``: a set of k, ``n_pow2``, ``largest``,
``sorted``). A call is inside the gate when any rule of its (arch, op, dtype)
holds. Every rule carries ``source``: where its numbers come from.

Two tables:

* the shipped one (``SHIPPED``): gfx950 seeded with the upstream dispatch
  regions published for MI355X (../shared/reference/gfx950.md), plus an
  open ``cpu`` entry for the CPU test backend;
* the local one, written by ``torch_flydsl calibrate``: JSON at
  ``$FLYDSL_TORCH_GATES``, else ``<FlyDSL cache dir>/torch_gates.json``
  (``$FLYDSL_CACHE_DIR``, ``$XDG_CACHE_HOME/flydsl`` or ``~/.cache/flydsl``).
  For every (arch, op, dtype) it lists, its rules replace the shipped ones;
  other keys keep the shipped rules.

File format (``FORMAT``)::

    {"format": "torch_flydsl.gates/1",
     "rules": [{"arch": "gfx950", "op": "topk", "dtype": "float32",
                "m": [256, null], "n": [1024, 8192], "k": [2, 16], "k_in": [2, 4, 8, 16],
                "n_pow2": true, "largest": true, "sorted": true,
                "source": "calibrated ..."}]}

``null`` is an open end; an (arch, op, dtype) listed with an empty rule set
closes the gate there (a calibration where FlyDSL never won).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .ops import GATES

FORMAT = "torch_flydsl.gates/1"
#: gate ops, from the op specs (``Overload.gate``): the eager norms and TopK, and the GEMMs
#: (``m`` rows, or rows per group for the grouped ones, ``n`` columns, ``k`` the contraction;
#: MX keys are the A element dtype)
OPS = tuple(GATES)
DTYPE_NAMES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.float8_e5m2: "float8_e5m2",
    torch.float4_e2m1fn_x2: "float4_e2m1fn_x2",
}
MX_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2")
DTYPES_BY_NAME = {v: k for k, v in DTYPE_NAMES.items()}

#: the reference sheet the shipped rules cite, relative to the repository root (as the docs
#: cite it). A citation only: no code opens it (a clean clone or an installed package may not
#: have it), so its location is no setting
_UPSTREAM = "../shared/reference/gfx950.md"
SRC_RMS = (
    f"upstream torch 2.15 FlyDSL RMSNorm forward dispatch region, MI355X ({_UPSTREAM}: "
    "'Published dispatch regions of the upstream eager overrides')"
)
SRC_RMS_BWD = (
    "assumption: the upstream forward region reused for the backward (upstream left the "
    "backward on ATen and published no backward figures); replace with `torch_flydsl calibrate`"
)
SRC_TOPK_SMALL = (
    f"upstream torch 2.15 FlyDSL TopK small-K region, MI355X, fp32 largest sorted, M >= CUs "
    f"({_UPSTREAM})"
)
SRC_TOPK_RADIX = (
    f"upstream torch 2.15 FlyDSL TopK radix region, MI355X, fp32 largest sorted, M >= CUs "
    f"({_UPSTREAM})"
)
SRC_CPU = "CPU test backend: open gate so that the dispatch path runs (no performance claim)"
SRC_GEMM = (
    f"upstream torch 2.15 FlyDSL dense BF16 GEMM, MI355X ({_UPSTREAM}: 1.10x geomean over the "
    "faster of ATen and Triton, 15 NT shapes, largest square shapes lose): assumption that "
    "ours wins up to M = 2048 as theirs does; replace with `torch_flydsl calibrate`"
)
SRC_GROUPED = (
    f"upstream torch 2.15 FlyDSL grouped GEMM, MI355X ({_UPSTREAM}: 1.95x vs ATen over 24 "
    "uniform / projection / ragged cases): assumption that ours wins likewise; calibrate"
)
SRC_MX = (
    f"upstream torch 2.15 FlyDSL MXFP8 / MXFP4 GEMM, MI355X ({_UPSTREAM}: 1.58x / 1.68x "
    "geomean vs hipBLASLt, every one of 17 NT shapes won): assumption that ours wins "
    "likewise; calibrate"
)
SRC_MX_GROUPED = (
    f"assumption: the upstream MX GEMM region ({_UPSTREAM}) reused for the grouped MX GEMM "
    "(upstream published no grouped MX figure); replace with `torch_flydsl calibrate`"
)
#: shape classes a table remembers the answer for (``GateTable.allows``); cleared when full
MEMO_SIZE = 4096
#: gfx950 compute units: the upstream TopK regions need a full wave of rows
GFX950_CUS = 256


@dataclass(frozen=True, slots=True)
class Rule:
    arch: str
    op: str
    dtype: str
    m: tuple[int | None, int | None] = (None, None)
    n: tuple[int | None, int | None] = (None, None)
    k: tuple[int | None, int | None] = (None, None)
    k_in: frozenset[int] | None = None
    n_pow2: bool = False
    largest: bool | None = None
    sorted: bool | None = None
    source: str = ""

    def holds(self, m: int, n: int, k: int, largest: bool, sorted_: bool) -> bool:
        lo, hi = self.m
        if (lo is not None and m < lo) or (hi is not None and m > hi):
            return False
        lo, hi = self.n
        if (lo is not None and n < lo) or (hi is not None and n > hi):
            return False
        lo, hi = self.k
        if (lo is not None and k < lo) or (hi is not None and k > hi):
            return False
        if self.k_in is not None and k not in self.k_in:
            return False
        if self.n_pow2 and n & (n - 1):
            return False
        if self.largest is not None and largest != self.largest:
            return False
        return self.sorted is None or sorted_ == self.sorted

    @property
    def empty(self) -> bool:
        """Whether no shape satisfies the rule (a ``closed`` entry: ``m`` = [1, 0])."""
        for lo, hi in (self.m, self.n, self.k):
            if lo is not None and hi is not None and lo > hi:
                return True
        return self.k_in is not None and not self.k_in

    def to_json(self) -> dict:
        d = asdict(self)
        d["m"], d["n"], d["k"] = list(self.m), list(self.n), list(self.k)
        d["k_in"] = sorted(self.k_in) if self.k_in is not None else None
        return {k: v for k, v in d.items() if v is not None and v is not False}

    @classmethod
    def from_json(cls, d: dict) -> Rule:
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown gate rule fields {sorted(unknown)}")
        if d.get("op") not in OPS:
            raise ValueError(f"gate rule op {d.get('op')!r} is not one of {OPS}")
        if d.get("dtype") not in DTYPES_BY_NAME:
            raise ValueError(
                f"gate rule dtype {d.get('dtype')!r} is not one of {list(DTYPES_BY_NAME)}"
            )

        def rng(v):
            if v is None:
                return (None, None)
            lo, hi = v
            return (None if lo is None else int(lo), None if hi is None else int(hi))

        return cls(
            arch=str(d["arch"]),
            op=d["op"],
            dtype=d["dtype"],
            m=rng(d.get("m")),
            n=rng(d.get("n")),
            k=rng(d.get("k")),
            k_in=frozenset(int(x) for x in d["k_in"]) if d.get("k_in") is not None else None,
            n_pow2=bool(d.get("n_pow2", False)),
            largest=d.get("largest"),
            sorted=d.get("sorted"),
            source=str(d.get("source", "")),
        )


def _shipped() -> list[Rule]:
    rules = []
    for dt in DTYPE_NAMES.values():
        for op, src in (("rms_norm", SRC_RMS), ("rms_norm_backward", SRC_RMS_BWD)):
            rules += [
                Rule("gfx950", op, dt, m=(8192, None), n=(4096, 8191), source=src),
                Rule("gfx950", op, dt, m=(4096, None), n=(8192, 16383), source=src),
                Rule("gfx950", op, dt, m=(2048, None), n=(16384, 114688), source=src),
            ]
    for dt in ("bfloat16", "float16"):
        rules.append(Rule("gfx950", "gemm", dt, m=(1, 2048), source=SRC_GEMM))
        rules.append(Rule("gfx950", "grouped_mm", dt, source=SRC_GROUPED))
    for dt in MX_DTYPES:
        rules.append(Rule("gfx950", "mx_gemm", dt, source=SRC_MX))
        rules.append(Rule("gfx950", "mx_grouped_mm", dt, source=SRC_MX_GROUPED))
    for op, dts in GATES.items():  # the CPU test backend: every gate op, in its dtypes
        rules += [Rule("cpu", op, DTYPE_NAMES[dt], source=SRC_CPU) for dt in dts]
    fp32 = dict(arch="gfx950", op="topk", dtype="float32", m=(GFX950_CUS, None))
    fp32.update(largest=True, sorted=True)
    rules.append(
        Rule(
            **fp32,
            n=(1024, 8192),
            k=(2, 16),
            k_in=frozenset({2, 4, 8, 16}),
            n_pow2=True,
            source=SRC_TOPK_SMALL,
        )
    )
    for k, n in (
        ((64, 256), (8192, 32768)),
        ((257, 383), (16384, 32768)),
        ((384, 831), (32768, 131072)),
        ((832, 1024), (32768, 262144)),
    ):
        rules.append(Rule(**fp32, n=n, k=k, source=SRC_TOPK_RADIX))
    return rules


#: the shipped rules
SHIPPED: tuple[Rule, ...] = tuple(_shipped())


def local_path() -> Path:
    """Where the calibrated table lives: ``$FLYDSL_TORCH_GATES`` or the FlyDSL cache dir."""
    from flydsl_core import settings

    return settings.get("FLYDSL_TORCH_GATES") or settings.default_cache_dir() / "torch_gates.json"


class GateTableWarning(UserWarning):
    """The local gate table named by ``$FLYDSL_TORCH_GATES`` is missing or unreadable: the
    shipped table is used."""


_WARNED: set[str] = set()


def _explicit_missing(path: Path) -> None:
    """Warn once per path where ``$FLYDSL_TORCH_GATES`` names a file that is not there."""
    from flydsl_core import settings

    if settings.get("FLYDSL_TORCH_GATES") is None or str(path) in _WARNED:
        return
    _WARNED.add(str(path))
    what = "a folder" if path.is_dir() else "no such file"
    warnings.warn(
        f"FLYDSL_TORCH_GATES={str(path)!r}: {what}; the shipped gate table is used "
        "(`torch_flydsl calibrate` writes a table there)",
        GateTableWarning,
        stacklevel=3,
    )


def read_table(path: Path) -> list[Rule]:
    data = json.loads(Path(path).read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: format {data.get('format')!r}, expected {FORMAT!r}")
    rules = [Rule.from_json(r) for r in data.get("rules", [])]
    # an (arch, op, dtype) with no rules is closed: keep the key in "closed"
    for c in data.get("closed", []):
        rules.append(Rule.from_json({**c, "m": [1, 0], "source": c.get("source", "closed")}))
    return rules


def write_table(path: Path, rules: list[Rule], closed: list[dict] = ()) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "rules": [r.to_json() for r in rules], "closed": list(closed)}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


class GateTable:
    """The merged table, indexed by (arch, op, dtype) for a cheap lookup."""

    def __init__(self, shipped=SHIPPED, local: list[Rule] | None = None, local_source=None):
        idx: dict[tuple, list[Rule]] = {}
        for r in shipped:
            idx.setdefault((r.arch, r.op, DTYPES_BY_NAME[r.dtype]), []).append(r)
        self.local_source = local_source
        self.local_keys: set[tuple] = set()
        if local:
            fresh: dict[tuple, list[Rule]] = {}
            for r in local:
                fresh.setdefault((r.arch, r.op, DTYPES_BY_NAME[r.dtype]), []).append(r)
            idx.update(fresh)
            self.local_keys = set(fresh)
        self._idx = {k: tuple(v) for k, v in idx.items()}
        self._memo: dict[tuple, bool] = {}

    def rules(self, arch: str, op: str, dtype: torch.dtype) -> tuple[Rule, ...]:
        return self._idx.get((arch, op, dtype), ())

    def closed(self, arch: str, op: str, dtype: torch.dtype) -> bool:
        """Whether no call of ``(arch, op, dtype)`` is inside the gate, whatever its shape."""
        return all(r.empty for r in self._idx.get((arch, op, dtype), ()))

    def min_mn(self, arch: str, op: str, dtype: torch.dtype) -> int:
        """The least ``m * n`` any rule of ``(arch, op, dtype)`` takes (its lowest corner): a
        call with fewer is outside the gate whatever its shape; 1 where a rule has no corner."""
        low = None
        for r in self._idx.get((arch, op, dtype), ()):
            if not r.empty:
                mn = max(r.m[0] or 1, 1) * max(r.n[0] or 1, 1)
                low = mn if low is None else min(low, mn)
        return low or 1

    def allows(self, arch, op, dtype, m, n, k=0, largest=True, sorted_=True) -> bool:
        """Whether a call is inside the gate; answers are kept per shape class (the rule
        fields), so a repeated shape costs one dict lookup."""
        key = (arch, op, dtype, m, n, k, largest, sorted_)
        hit = self._memo.get(key)
        if hit is None:
            rules = self._idx.get((arch, op, dtype), ())
            hit = any(r.holds(m, n, k, largest, sorted_) for r in rules)
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()
            self._memo[key] = hit
        return hit

    def summary(self) -> dict:
        out: dict[str, list] = {}
        for (arch, op, dt), rules in sorted(self._idx.items(), key=lambda kv: str(kv[0])):
            key = f"{arch}/{op}/{DTYPE_NAMES[dt]}"
            local = (arch, op, dt) in self.local_keys
            out[key] = [
                {**r.to_json(), "from": "local" if local else "shipped"}
                for r in rules
                if r.m != (1, 0)
            ]
        return out


def open_table() -> GateTable:
    """Every (arch, op, dtype) open, for every arch the overrides may run on: benchmarks and
    the GPU tests use it to run FlyDSL wherever it applies (``gates="open"``)."""
    from . import eligibility

    archs = sorted(eligibility.allowed_archs() | {eligibility.CPU_ARCH})
    src = "open table (gates='open'): every shape, no performance claim"
    rules = [Rule(a, op, dt, source=src) for a in archs for op in OPS for dt in DTYPES_BY_NAME]
    return GateTable(shipped=(), local=rules, local_source="open")


def load(source: str | None = None) -> GateTable:
    """The gate table: ``source`` None / ``"local"`` is the shipped rules overridden by the
    local calibrated table where one exists; ``"shipped"`` the shipped rules only; ``"open"``
    ``open_table()``; anything else a table file's path."""
    if source == "shipped":
        return GateTable()
    if source == "open":
        return open_table()
    if source not in (None, "local"):
        return GateTable(local=read_table(Path(source)), local_source=str(source))
    path = local_path()
    if path.is_file():
        try:
            return GateTable(local=read_table(path), local_source=str(path))
        except (OSError, ValueError, KeyError, TypeError) as e:
            import logging

            logging.getLogger("torch_flydsl").warning(
                "ignoring the local gate table %s (FLYDSL_TORCH_GATES or the cache dir): %s",
                path,
                e,
            )
    else:
        _explicit_missing(path)
    return GateTable()
