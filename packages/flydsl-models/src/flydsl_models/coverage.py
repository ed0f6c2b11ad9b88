"""Op coverage: how much of a model's time torch.profiler sees in FlyDSL kernels, per op family.

Attribution (the same on a CPU and a GPU):

* **Which time is FlyDSL's.** Every FlyDSL launch of the transformers routes
  is a ``torch_flydsl::hf_*`` custom op, and the profiler records the op's
  name around everything it runs; ``record_function`` ranges named
  ``flydsl::...`` count the same way (``torch_flydsl.transformers.PROFILE_PREFIXES``),
  for launches that come from elsewhere. On a GPU a kernel also counts as
  FlyDSL when its name is one of the FlyDSL kernels' names (``flydsl_kernels``
  families), whichever op launched it. On the CPU backend a "kernel" is the
  reference backend's torch ops, so names cannot tell: only the op ranges do.
* **Which family.** ``torch_flydsl::hf_rms_norm`` / ``hf_add_rms_norm`` are norm,
  ``hf_moe_router`` / ``hf_grouped_mm`` / ``hf_mx_grouped_mm`` are MoE. Other ops
  take the family of the module they run in, from ``record_function`` ranges
  this module opens around modules while profiling (``module_ranges``): the
  MoE block (router, experts and the routing glue) is MoE, a norm module is
  norm; outside those, GEMM ops (``mm``, ``addmm``, ``linear``, ``bmm``...) are
  GEMM, attention ops (``scaled_dot_product_attention``...) and whatever else
  runs inside an attention module besides its projections are attention, and
  the rest is other. Under torch.compile the module ranges are not installed
  (hooks would be traced), so families come from op names alone there.
* **Which time.** CPU: each op's *self* time (its span less its children's),
  so nothing counts twice; GPU: the device time of each kernel, charged to the
  CPU op that launched it (kineto's correlation ids). Only events inside the
  measured phases' ranges count. The raw kineto events are read directly
  (``_cpu_tree``): building ``prof.events()`` for the CPU backend's many small
  ops takes longer than the run profiled.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

FAMILIES = ("gemm", "attention", "norm", "moe", "other")
PHASE_PREFIX = "flydsl_models::phase::"
MODULE_PREFIX = "flydsl_models::module::"
OUR_OP_PREFIXES = ("torch_flydsl::", "flydsl::")

_FLYDSL_OP_FAMILY = {
    "hf_rms_norm": "norm",
    "hf_add_rms_norm": "norm",
    "hf_moe_router": "moe",
    "hf_grouped_mm": "moe",
    "hf_mx_grouped_mm": "moe",
}
_GEMM_OPS = frozenset(
    "aten::" + n
    for n in (
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "matmul",
        "linear",
        "mv",
        "addmv",
        "_grouped_mm",
        "grouped_mm",
        "_scaled_mm",
        "_scaled_grouped_mm",
    )
)
_ATTENTION_MARKS = (
    "scaled_dot_product",
    "flash_attention",
    "efficient_attention",
    "flex_attention",
)


@functools.cache
def flydsl_kernel_names() -> frozenset[str]:
    """The names FlyDSL kernels carry on a GPU (the generated Triton function is named after the
    kernel): every kernel a shipped family lists in its public ``KERNELS``."""
    import importlib

    import flydsl_kernels

    names = set()
    for fam in flydsl_kernels.FAMILIES:
        kernels = importlib.import_module(f"flydsl_kernels.{fam}").KERNELS
        names.update(k.name for k in kernels.values())
    return frozenset(names)


def _is_flydsl(name: str) -> bool:
    return name.startswith(OUR_OP_PREFIXES)


def _flydsl_family(name: str) -> str:
    op = name.split("::", 1)[1] if "::" in name else name
    return _FLYDSL_OP_FAMILY.get(op.split(".")[0], "other")


def _op_family(name: str) -> str | None:
    if name in _GEMM_OPS:
        return "gemm"
    if any(m in name for m in _ATTENTION_MARKS):
        return "attention"
    return None


def _cpu_tree(result):
    """``[(name, self_us, ctx)]`` of the profile's CPU events, nested per thread by time, and
    ``{correlation id: index}``; ``ctx = (phase, module, flydsl op, op family, outermost op)``.

    Reads the profiler's raw kineto events rather than ``prof.events()``: the CPU
    backend's kernels are torch ops, tens of thousands of events, and building
    ``FunctionEvent``s for them costs far more than the run profiled.
    """
    cpu = []
    for e in result.events():
        if e.device_type() != torch.autograd.DeviceType.CPU or e.is_async():
            continue
        if e.start_thread_id() != e.end_thread_id() or e.linked_correlation_id() > 0:
            continue  # async spans, and device-runtime calls (launches): the kernels carry time
        name = e.name()
        if name.startswith("[") or name.startswith("ProfilerStep"):
            continue  # memory records, profiler steps
        cpu.append((e.start_thread_id(), e.start_ns(), -e.end_ns(), name, e.correlation_id()))
    cpu.sort()
    records = []
    by_corr = {}
    stack: list[tuple[int, int]] = []  # (end_ns, record index)
    thread = None
    for tid, start, neg_end, name, corr in cpu:
        end = -neg_end
        if tid != thread:
            stack.clear()
            thread = tid
        while stack and stack[-1][0] <= start:
            stack.pop()
        dur = (end - start) / 1000.0
        if stack:
            parent = records[stack[-1][1]]
            parent[1] -= dur
            phase, module, fly, fam, outer = parent[2]
        else:
            phase = module = fly = fam = outer = None
        if name.startswith(PHASE_PREFIX):
            phase = name[len(PHASE_PREFIX) :]
        elif name.startswith(MODULE_PREFIX):
            module = name[len(MODULE_PREFIX) :]  # the innermost module range wins
        else:
            if fly is None and _is_flydsl(name):
                fly = name
            if fam is None:
                fam = _op_family(name)
            if outer is None and "::" in name and not name.startswith("flydsl_models::"):
                outer = name
        records.append([name, dur, (phase, module, fly, fam, outer)])
        by_corr[corr] = len(records) - 1
        stack.append((end, len(records) - 1))
    return records, by_corr


def _family(fly, module, fam) -> str:
    if fly is not None:
        return _flydsl_family(fly)
    if module in ("moe", "norm"):
        return module
    if fam is not None:
        return fam
    if module == "attention":
        return "attention"
    return "other"


@dataclasses.dataclass
class Coverage:
    """Profiled time per family, FlyDSL's share of it, and the biggest ops not in FlyDSL."""

    device_kind: str  # "cpu" (CPU time of ops) or "gpu" (device time of kernels)
    total_us: float
    by_family: dict  # family -> {"total_us", "flydsl_us"}
    by_phase: dict  # phase -> {"total_us", "flydsl_us"}
    top_unrouted: list  # [{"op", "family", "us", "share"}]
    flydsl_ops: dict  # FlyDSL op / kernel name -> us
    module_context: bool

    @property
    def flydsl_us(self) -> float:
        return sum(v["flydsl_us"] for v in self.by_family.values())

    @property
    def share(self) -> float:
        return self.flydsl_us / self.total_us if self.total_us else 0.0

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["flydsl_us"] = self.flydsl_us
        d["share"] = self.share
        return d


def attribute(result, *, gpu: bool, module_context: bool, top: int = 8) -> Coverage:
    """Coverage of a profile (``prof.profiler.kineto_results``) inside the phase ranges."""
    kernel_names = flydsl_kernel_names() if gpu else frozenset()
    records, by_corr = _cpu_tree(result)
    items = []  # (record index, kernel or op name, us)
    if gpu:
        for e in result.events():
            if e.device_type() == torch.autograd.DeviceType.CPU:
                continue
            i = by_corr.get(e.linked_correlation_id())
            if i is not None:
                items.append((i, e.name(), e.duration_ns() / 1000.0))
    else:
        items = [(i, r[0], r[1]) for i, r in enumerate(records)]
    fam = {f: {"total_us": 0.0, "flydsl_us": 0.0} for f in FAMILIES}
    phases: dict[str, dict] = {}
    unrouted: dict[tuple[str, str], float] = {}
    fly_ops: dict[str, float] = {}
    for i, kname, us in items:
        name, _, (phase, module, fly, opfam, outer) = records[i]
        if phase is None or us <= 0 or name.startswith("flydsl_models::"):
            continue
        f = _family(fly, module, opfam)
        # a FlyDSL kernel launched under an ATen op (a compile backend's) keeps that op's family
        is_fly = fly is not None or kname in kernel_names
        fam[f]["total_us"] += us
        ph = phases.setdefault(phase, {"total_us": 0.0, "flydsl_us": 0.0})
        ph["total_us"] += us
        if is_fly:
            fam[f]["flydsl_us"] += us
            ph["flydsl_us"] += us
            key = fly or kname
            fly_ops[key] = fly_ops.get(key, 0.0) + us
        else:
            key = (outer or name, f)
            unrouted[key] = unrouted.get(key, 0.0) + us
    total = sum(v["total_us"] for v in fam.values())
    biggest = sorted(unrouted.items(), key=lambda kv: -kv[1])[:top]
    return Coverage(
        device_kind="gpu" if gpu else "cpu",
        total_us=total,
        by_family=fam,
        by_phase=phases,
        top_unrouted=[
            {"op": op, "family": f, "us": us, "share": us / total if total else 0.0}
            for (op, f), us in biggest
        ],
        flydsl_ops=dict(sorted(fly_ops.items(), key=lambda kv: -kv[1])),
        module_context=module_context,
    )


# -- module ranges ---------------------------------------------------------------------------------


def module_kind(module) -> str | None:
    """The family a module's ops belong to, for the ranges: moe, norm, attention, or None."""
    cls = type(module).__name__
    if any(_is_experts(c) for c in module.children()) or "router" in dict(module.named_children()):
        return "moe"
    if cls.endswith(("RMSNorm", "LayerNorm")):
        return "norm"
    if cls.endswith("Attention"):
        return "attention"
    return None


def _is_experts(m) -> bool:
    fwd = type(m).forward
    return hasattr(fwd, "__wrapped__") and hasattr(m, "num_experts") and hasattr(m, "down_proj")


class module_ranges:
    """Context manager: ``record_function`` ranges around MoE blocks, norms and attention modules."""

    def __init__(self, model):
        self.model = model
        self.handles = []
        self.stack = []

    def __enter__(self):
        for m in self.model.modules():
            kind = module_kind(m)
            if kind is None:
                continue
            name = MODULE_PREFIX + kind
            self.handles.append(m.register_forward_pre_hook(functools.partial(self._open, name)))
            self.handles.append(m.register_forward_hook(self._close, always_call=True))
        return self

    def _open(self, name, module, args):
        rf = torch.autograd.profiler.record_function(name)
        rf.__enter__()
        self.stack.append(rf)

    def _close(self, module, args, output):
        if self.stack:
            self.stack.pop().__exit__(None, None, None)

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles.clear()
        while self.stack:
            self.stack.pop().__exit__(None, None, None)
