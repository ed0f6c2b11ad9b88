"""Autotuning: static pruning first, then timing on a GPU where one is present.

Without a matching GPU the tuner says plainly that it only pruned: the
chosen config is the static model's pick (fewest registers at the highest
occupancy among survivors, a stated heuristic) and the result is marked
``"static"``. With one, survivors are timed with device events: median over
repeats, with inputs rotated so caches do not flatter later runs, and the
fastest is marked ``"timed"``. Recording the winner is the caller's business:
the kernel families write theirs into their ``configs.py`` with its source.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .config import Config
from .prune import Candidate, PruneResult, prune


@dataclass
class TuneResult:
    best: Config | None
    method: str  # "timed" | "static"
    message: str
    pruned: PruneResult
    timings_ms: dict[Config, float]


def static_pick(survivors: list[Candidate]) -> Candidate | None:
    """The static model's choice: highest occupancy, then fewest instructions, then fewest VGPRs."""
    if not survivors:
        return None

    def score(c: Candidate):
        r = c.report or {}
        return (
            -(r.get("occupancy") or 0),
            r.get("instruction_count") or 1 << 30,
            r.get("vgpr") or 1 << 30,
        )

    return min(survivors, key=score)


def gpu_matches(target) -> bool:
    """Whether the current GPU is one of ``target``'s arch."""
    from ..targets import detected_arch_to_target_name, device_arch

    arch = device_arch()
    return arch is not None and detected_arch_to_target_name(arch) == target.name


def time_config(run, input_sets, repeats: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of ``run(inputs)`` with device events, rotating ``input_sets``."""
    import torch

    for i in range(warmup):
        run(input_sets[i % len(input_sets)])
    times = []
    for i in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run(input_sets[i % len(input_sets)])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def tune(
    kernel,
    args,
    space,
    target,
    *,
    run=None,
    input_sets=None,
    occupancy_floor: int = 1,
    jobs=None,
) -> TuneResult:
    """Prune ``space`` for ``target``; time the survivors if a GPU of that arch is here.

    ``run(config, inputs)`` launches the kernel with a config on one input
    set; it is only called where a GPU is present.
    """
    from ..targets import get_target

    tgt = get_target(target)
    pruned = prune(kernel, args, space, tgt.name, occupancy_floor=occupancy_floor, jobs=jobs)
    timings: dict[Config, float] = {}
    if not pruned.survivors:
        return TuneResult(
            None, "static", f"no config survives static pruning on {tgt.name}", pruned, timings
        )
    if run is not None and input_sets and gpu_matches(tgt):
        for c in pruned.survivors:
            timings[c.config] = time_config(lambda inp, c=c: run(c.config, inp), input_sets)
        best = min(timings, key=timings.get)
        method = "timed"
        msg = f"timed {len(timings)} survivors on the GPU; best {best} at {timings[best]:.4f} ms (median)"
    else:
        pick = static_pick(pruned.survivors)
        best, method = pick.config, "static"
        msg = (
            f"no {tgt.name} GPU here: pruned only, nothing was timed. {pruned.summary()}; "
            f"static pick {best} (highest occupancy, then fewest instructions)"
        )
    return TuneResult(best, method, msg, pruned, timings)
