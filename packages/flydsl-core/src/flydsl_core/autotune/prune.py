"""Static pruning: compile every candidate for the target and reject the bad ones.

No GPU is needed. A candidate is rejected when its code spills (scratch or
spill counts above zero), when it needs more LDS / shared memory than one
workgroup may have on the target, or when its occupancy falls below a
floor. Candidates compile in parallel processes when the kernel can be
imported by name in a fresh process, else one after another.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context

from ..exc import FlyDSLError
from .config import Config

log = logging.getLogger(__name__)


@dataclass
class Candidate:
    config: Config
    report: dict | None = None  # ResourceReport.to_dict()
    rejected: str | None = None  # why, or None if it survived
    compile_s: float = 0.0


@dataclass
class PruneResult:
    target: str
    candidates: list[Candidate] = field(default_factory=list)

    @property
    def survivors(self) -> list[Candidate]:
        return [c for c in self.candidates if c.rejected is None]

    @property
    def rejected(self) -> list[Candidate]:
        return [c for c in self.candidates if c.rejected is not None]

    def summary(self) -> str:
        return f"{len(self.survivors)} of {len(self.candidates)} configs survive static pruning on {self.target}"


def _kernel_ref(kernel) -> str | None:
    """``module:qualname`` if a fresh process can import the kernel, else None."""
    mod = getattr(kernel.fn, "__module__", None)
    qual = getattr(kernel.fn, "__qualname__", "")
    if not mod or mod == "__main__" or "<locals>" in qual:
        return None
    try:
        obj = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return f"{mod}:{qual}" if obj is kernel else None


def _resolve(ref: str):
    mod, qual = ref.split(":")
    obj = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def compile_candidate(kernel, args, config: Config, target: str) -> Candidate:
    t = time.perf_counter()
    try:
        ck = kernel.compile(
            *args, target=target, options=config.launch_options(), **config.constexprs()
        )
        report = ck.executable.report
        return Candidate(config, report.to_dict(), None, time.perf_counter() - t)
    except FlyDSLError as e:
        return Candidate(config, None, f"compile failed: {e.msg}", time.perf_counter() - t)


def _worker(ref, args, config, target):
    return compile_candidate(_resolve(ref), args, config, target)


def judge(c: Candidate, target, occupancy_floor: int) -> Candidate:
    if c.rejected or c.report is None:
        return c
    r = c.report
    spills = [
        (r.get("scratch_bytes") or 0),
        (r.get("vgpr_spill_count") or 0),
        (r.get("sgpr_spill_count") or 0),
    ]
    lds_limit = target.lds_bytes_per_block or target.lds_bytes_per_cu
    if any(spills):
        c.rejected = f"spills (scratch {spills[0]} B, {spills[1]} VGPR / {spills[2]} SGPR spills)"
    elif lds_limit and (r.get("lds_bytes") or 0) > lds_limit:
        c.rejected = f"LDS {r['lds_bytes']} B exceeds the {lds_limit} B a workgroup may use"
    elif r.get("occupancy") is not None and r["occupancy"] < occupancy_floor:
        c.rejected = f"occupancy {r['occupancy']} below the floor {occupancy_floor}"
    return c


def prune(
    kernel,
    args,
    space,
    target: str,
    *,
    occupancy_floor: int = 1,
    jobs: int | None = None,
    progress=None,
) -> PruneResult:
    """Compile every config of ``space`` for ``target`` and judge it statically.

    ``args`` are the kernel's run-time arguments as tensors or ``TensorSpec``s
    (constexprs come from each config). ``progress`` is called with each
    finished candidate, for a progress bar.
    """
    from ..targets import get_target

    tgt = get_target(target)
    if not tgt.is_gpu:
        raise FlyDSLError(f"static pruning needs a GPU target to compile for; {target} is not one")
    configs = list(space)
    ref = _kernel_ref(kernel)
    jobs = jobs if jobs is not None else max(1, min(len(configs), os.cpu_count() or 1))
    out = PruneResult(tgt.name)
    if ref is not None and jobs > 1 and len(configs) > 1:
        with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
            futs = [pool.submit(_worker, ref, args, c, tgt.name) for c in configs]
            for f in futs:
                cand = judge(f.result(), tgt, occupancy_floor)
                out.candidates.append(cand)
                if progress:
                    progress(cand)
    else:
        for c in configs:
            cand = judge(compile_candidate(kernel, args, c, tgt.name), tgt, occupancy_floor)
            out.candidates.append(cand)
            if progress:
                progress(cand)
    log.info(out.summary())
    return out
