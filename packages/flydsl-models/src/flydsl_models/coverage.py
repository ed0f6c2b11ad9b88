"""Op coverage: how much of a model's time torch.profiler sees in FlyDSL kernels, per op family.

Attribution (the same on a CPU and a GPU):

* **Which time is FlyDSL's.** (1) Ops and ranges whose names start with
  ``torch_flydsl.transformers.PROFILE_PREFIXES`` (``flydsl::hf_*``, the
  ``flydsl::`` ops of the compile pass): all of their time. (2) ATen ops that
  torch-flydsl's eager overrides took (``torch_flydsl.stats()`` keys that name an
  ATen overload, read over the profiled window): their time times the share of their
  calls that hit FlyDSL (1 or 0 in practice: the calls of one op in one run are alike).
  transformers' ``"flydsl"`` attention implementation runs as ``flydsl::hf_attention``
  (and ``flydsl::hf_attention_backward``), so (1) names it. (3) On a GPU, kernels whose
  name is one of the kernel families' kernels (``flydsl_kernels.<family>.KERNELS``;
  the generated Triton function is named after the kernel), whichever op launched it.
* **Which family** (``FAMILIES``). A FlyDSL op takes the family of the kernel family
  it runs, found in the kernels' registry (``registry_family``); the registry's tags
  map a kernel family onto a report family (``_TAGS``). ATen ops take GEMM /
  attention / norm by their names. In the eager arms ``module_ranges`` opens a range
  around every MoE block, norm and attention module, and time inside the MoE block
  (router, experts, routing glue) counts as MoE and inside a norm as norm, whatever
  the op; under torch.compile there are no module ranges (hooks would be traced), so
  there the experts' grouped GEMMs count as GEMM.
* **Which time.** CPU: each op's *self* time (its span less its children's), so
  nothing counts twice; GPU: the device time of each kernel, charged to the CPU op
  that launched it (kineto's correlation ids). Only events inside the measured
  phases' ranges count. The raw kineto events are read directly (``_cpu_tree``):
  building ``prof.events()`` for the CPU backend's many small ops takes longer
  than the run profiled.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib

import torch

FAMILIES = ("gemm", "attention", "norm", "moe", "other")
PHASE_PREFIX = "flydsl_models::phase::"
MODULE_PREFIX = "flydsl_models::module::"
_OWN_PREFIX = "flydsl_models::"

#: registry tag -> report family, in the order a family's tags are read (mx: quantization
#: and gemm -> gemm; topk: selection and moe -> moe)
_TAGS = (("attention", "attention"), ("norm", "norm"), ("gemm", "gemm"), ("moe", "moe"))

#: ATen op families by name (ATen's own op names: no registry lists them)
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
        "_scaled_mm_v2",
        "_scaled_grouped_mm",
        "_scaled_grouped_mm_v2",
    )
)
_ATTENTION_MARKS = (
    "scaled_dot_product",
    "flash_attention",
    "efficient_attention",
    "flex_attention",
)
_NORM_MARKS = ("rms_norm", "layer_norm")


def _prefixes() -> tuple[str, ...]:
    from torch_flydsl.transformers import PROFILE_PREFIXES

    return tuple(PROFILE_PREFIXES)


# -- the kernels' registry ---------------------------------------------------------------------------


@functools.cache
def _registry() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """``(public function -> family, kernel name -> family, family -> report family)`` from
    ``flydsl_kernels.families()``: each family's public API (``__all__``) and ``KERNELS``."""
    import flydsl_kernels

    functions, kernels, report = {}, {}, {}
    for name, fam in flydsl_kernels.families().items():
        mod = importlib.import_module(f"flydsl_kernels.{name}")
        report[name] = next((f for tag, f in _TAGS if tag in fam.tags), "other")
        for fn in getattr(mod, "__all__", ()):
            if callable(getattr(mod, fn, None)) and not fn.isupper():
                functions.setdefault(fn, name)
        for k in getattr(mod, "KERNELS", {}).values():
            kernels[getattr(k, "name", str(k))] = name
    return functions, kernels, report


def flydsl_kernel_names() -> frozenset[str]:
    """The names FlyDSL kernels carry on a GPU (every family's ``KERNELS``)."""
    return frozenset(_registry()[1])


def registry_family(op: str) -> str | None:
    """The kernel family a FlyDSL op runs: ops are named after the family API function they
    call (``flydsl::gemm`` -> ``gemm.gemm``, ``flydsl::hf_moe_router`` ->
    ``topk.moe_router``), a variant of one (``hf_add_rms_norm`` -> ``fused_add_rms_norm``),
    or name the family (``flydsl::flex_attention`` -> attention, ``flydsl::mx_mm`` -> mx)."""
    functions, kernels, report = _registry()
    short = op.split("::", 1)[-1].split(".")[0]
    if short.startswith("hf_"):
        short = short[3:]
    for suffix in ("_backward", "_cpu"):
        short = short.removesuffix(suffix)
    if short in functions:
        return functions[short]
    if short in kernels:
        return kernels[short]
    tails = [f for f in functions if f.endswith("_" + short)]
    if len(tails) == 1:
        return functions[tails[0]]
    tokens = short.split("_")
    names = [n for n in report if n in tokens or n == short.replace("_", "")]
    return names[0] if len(names) == 1 else None


def report_family(kernel_family: str | None) -> str:
    """A kernel family's report family (``FAMILIES``), through the registry's tags."""
    if kernel_family is None:
        return "other"
    return _registry()[2].get(kernel_family, "other")


def _aten_family(name: str) -> str | None:
    if name in _GEMM_OPS:
        return "gemm"
    if any(m in name for m in _ATTENTION_MARKS):
        return "attention"
    if name.startswith("aten::") and any(m in name for m in _NORM_MARKS):
        return "norm"
    return None


# -- marks: what the profiler cannot name --------------------------------------------------------


@dataclasses.dataclass
class Marks:
    """FlyDSL work the profile's names cannot show, collected while profiling: ``overrides``,
    ``{"aten::op": share of calls that hit}`` from ``torch_flydsl.stats()`` over the window
    (an ATen op an eager override took keeps its ATen name)."""

    overrides: dict = dataclasses.field(default_factory=dict)


def override_shares(before: dict, after: dict) -> dict[str, float]:
    """``{"aten::op": hits / calls}`` of the eager overrides between two ``torch_flydsl.stats()``
    snapshots; keys naming an ATen overload are those with no ``:`` and no ``hf.`` prefix
    (``stats()``'s documented key forms)."""
    acc: dict[str, list[int]] = {}
    for key, now in after.items():
        if ":" in key or key.startswith("hf."):
            continue
        was = before.get(key, {"calls": 0, "hits": 0})
        calls, hits = now["calls"] - was["calls"], now["hits"] - was["hits"]
        if calls > 0:
            a = acc.setdefault("aten::" + key.split(".")[0], [0, 0])
            a[0] += hits
            a[1] += calls
    return {op: h / c for op, (h, c) in acc.items()}


# -- the profile's CPU events, nested --------------------------------------------------------------


def _cpu_tree(result, marks: Marks):
    """``[(name, self_us, ctx)]`` of the profile's CPU events, nested per thread by time, and
    ``{correlation id: index}``; ``ctx = (phase, module, fly, fly_family, share, op family,
    outermost op)``: ``fly`` names the FlyDSL op (or call) the event runs in, ``share`` the
    part of its time that is FlyDSL's.

    Reads the profiler's raw kineto events rather than ``prof.events()``: the CPU
    backend's kernels are torch ops, tens of thousands of events, and building
    ``FunctionEvent``s for them costs far more than the run profiled.
    """
    prefixes = _prefixes()
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
            phase, module, fly, ffam, share, fam, outer = parent[2]
        else:
            phase, module, fly, ffam, share, fam, outer = None, None, None, None, 0.0, None, None
        if name.startswith(PHASE_PREFIX):
            phase = name[len(PHASE_PREFIX) :]
        elif name.startswith(MODULE_PREFIX):
            module = name[len(MODULE_PREFIX) :]  # the innermost module range wins
        elif fly is None:
            if name.startswith(prefixes):
                fly, ffam, share = name, report_family(registry_family(name)), 1.0
            elif marks.overrides.get(name):
                fly, ffam, share = name, _aten_family(name) or "other", marks.overrides[name]
        if not name.startswith(_OWN_PREFIX):
            if fam is None:
                fam = _aten_family(name)
            if outer is None and "::" in name:
                outer = name
        records.append([name, dur, (phase, module, fly, ffam, share, fam, outer)])
        by_corr[corr] = len(records) - 1
        stack.append((end, len(records) - 1))
    return records, by_corr


def _family(module, ffam, fam) -> str:
    if module in ("moe", "norm"):
        return module
    if ffam is not None:
        return ffam
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
    by_phase: dict  # phase -> {"total_us", "flydsl_us", "by_family": {family -> {...}}}
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


def _empty() -> dict:
    return {f: {"total_us": 0.0, "flydsl_us": 0.0} for f in FAMILIES}


def attribute(
    result, *, gpu: bool, module_context: bool, marks: Marks | None = None, top: int = 8
) -> Coverage:
    """Coverage of a profile (``prof.profiler.kineto_results``) inside the phase ranges."""
    marks = marks or Marks()
    kernel_names = _registry()[1] if gpu else {}
    records, by_corr = _cpu_tree(result, marks)
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
    fam = _empty()
    phases: dict[str, dict] = {}
    unrouted: dict[tuple[str, str], float] = {}
    fly_ops: dict[str, float] = {}
    for i, kname, us in items:
        name, _, (phase, module, fly, ffam, share, opfam, outer) = records[i]
        if phase is None or us <= 0 or name.startswith(_OWN_PREFIX):
            continue
        if fly is None and kname in kernel_names:  # a FlyDSL kernel under an ATen-named op
            fly, ffam, share = kname, report_family(kernel_names[kname]), 1.0
        f = _family(module, ffam, opfam)
        fly_us = us * share if fly is not None else 0.0
        ph = phases.setdefault(phase, {"total_us": 0.0, "flydsl_us": 0.0, "by_family": _empty()})
        for bucket in (fam[f], ph, ph["by_family"][f]):
            bucket["total_us"] += us
            bucket["flydsl_us"] += fly_us
        if fly_us:
            fly_ops[fly] = fly_ops.get(fly, 0.0) + fly_us
        if us - fly_us > 0:
            key = (outer or name, f)
            unrouted[key] = unrouted.get(key, 0.0) + us - fly_us
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
