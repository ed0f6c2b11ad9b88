"""FlyDSL launches as Triton kernels of a torch graph (``wrap_triton``), and the choice by M.

``with sink(t):`` around a ``flydsl_kernels`` API call on FakeTensors (the ``flydsl::`` ops'
traced path) takes its launches over (``flydsl_core.launch_sink``). Each launch becomes
``torch.library.wrap_triton(jit)[grid](*args)`` where ``jit`` is the ``@triton.jit`` function
FlyDSL generates for that specialization (``flydsl_core.generated_launch``: generated, not
compiled; Inductor compiles it) and ``args`` are read from the launch's tensors, sizes and
strides as FlyDSL's own launcher would (``GeneratedLaunch.arguments``).

The specialization is taken from the traced tensors with no guard: a size or stride counts
as 1 or as a multiple of 16 only where the shape environment proves it for every value
(``statically_known_true``); a symbolic one carries no fact, and a tensor with a symbolic
size or stride gets 64-bit index math (its extent is unbounded). So one traced kernel is
valid for every M the graph will see. Launch options: the options FlyDSL's compile would use
(``GeneratedLaunch.options``: ``num_warps`` / ``num_stages`` and the target's other compiler
options, e.g. AMD's ``matrix_instr_nonkdim`` / ``kpack``), through a one-config
``triton.autotune`` wrapper, the form Inductor reads them from.

Config choice with a symbolic M (``by_m``): the eager APIs pick a config per call from M
through their family's ``configs.m_choice`` (``flydsl_kernels.choice.MChoice``: the config
and its M breakpoints). Traced, the M axis is cut at those breakpoints and the launches of
each range are traced into one branch of a ``cond`` on M, so one graph picks each call's
config at run time, with no recompilation; a static M traces only its own config. The
``*_ranges`` functions only bind the traced sizes to the kernels' ``m_choice``.
"""

from __future__ import annotations

import threading

import torch

from . import eligibility
from .ops import _sym

#: CPU tensors normally decompose into the opaque ``flydsl::<op>_cpu`` twins (library.py);
#: the tests set this to ``"cpu-interpret"`` to trace them into wrap_triton kernels too (for
#: Triton's interpreter), which checks the traced path's wiring on a machine without a GPU
CPU_TRACE_TARGET: str | None = None


def traces_cpu() -> bool:
    return CPU_TRACE_TARGET is not None


_ASSUMED = threading.local()


class assume_arch:
    """``with assume_arch("gfx950"):`` traced GPU launches on this thread are generated for that
    arch instead of the device's (the pass's ``arch`` setting: lowering without the GPU)."""

    def __init__(self, arch: str | None):
        self.arch = arch
        self._prev = None

    def __enter__(self):
        self._prev = getattr(_ASSUMED, "arch", None)
        if self.arch:
            _ASSUMED.arch = self.arch
        return self

    def __exit__(self, *exc):
        _ASSUMED.arch = self._prev


def target_for(t: torch.Tensor) -> str:
    """The FlyDSL target of ``t``'s device: an assumed arch (``assume_arch``), else the
    device's (``flydsl_core.targets.device_arch``, which ``$FLYDSL_GPU_ARCH`` overrides),
    looked up in flydsl-core's target registry; it must be a GPU target whose backend
    generates source (``Backend.generates_source``: Triton that Inductor compiles)."""
    from flydsl_core.backends import get_backend
    from flydsl_core.targets import all_targets, lookup_target

    if t.device.type == "cpu" and CPU_TRACE_TARGET is not None:
        return CPU_TRACE_TARGET
    arch = getattr(_ASSUMED, "arch", None) or eligibility.resolve_arch(t.device.index)
    tgt = lookup_target(arch) if arch else None
    if tgt is None or not tgt.is_gpu or not get_backend(tgt).generates_source:
        known = [x.name for x in all_targets() if x.is_gpu and get_backend(x).generates_source]
        raise RuntimeError(
            f"torch_flydsl cannot trace FlyDSL kernels for {t.device} (arch {arch!r}); "
            f"FlyDSL generates Triton for {', '.join(known)}"
        )
    return tgt.name


# -- facts of traced values -------------------------------------------------------------------------


def _fact_int(v):
    """A stand-in int carrying exactly the facts provable for every value of ``v``: 1, a
    multiple of 16 (16), or none (3); ``v`` itself when it is fixed."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    k = _sym.static(v)
    if k is not None:
        return k
    if statically_known_true(v == 1):
        return 1
    if statically_known_true(v % 16 == 0):
        return 16
    return 3


def tensor_spec(t):
    from flydsl_core import TensorSpec

    shape = tuple(_fact_int(s) for s in t.shape)
    stride = tuple(_fact_int(s) for s in t.stride())
    fixed = all(_sym.static(s) is not None for s in (*t.shape, *t.stride()))
    bits = 64
    if fixed:
        span = 1 + sum((s - 1) * abs(st) for s, st in zip(shape, stride) if s > 0)
        bits = 32 if span < 2**31 and t.numel() < 2**31 else 64
    return TensorSpec(t.dtype, shape, stride, aligned=True, index_bits=bits)


def spec_value(v):
    """What a launch argument is specialized as when traced: a tensor's ``TensorSpec``, a
    symbolic int's provable facts (``_fact_int``), any float for a symbolic float."""
    if isinstance(v, torch.Tensor):
        return tensor_spec(v)
    if isinstance(v, torch.SymInt):
        return _fact_int(v)
    if isinstance(v, torch.SymFloat):
        return 1.5  # a float argument: no facts
    if isinstance(v, torch.SymBool):
        # a flag computed from symbolic sizes (the GEMM's EVEN_K: K a multiple of the K tile)
        # holds only where proven for every value; else the kernel's general path (masked
        # loads), with no guard: a growing K would otherwise recompile at each multiple
        from torch.fx.experimental.symbolic_shapes import statically_known_true

        return statically_known_true(v)
    return v


# -- the sink ---------------------------------------------------------------------------------------

_wrappers: dict = {}
_wrappers_lock = threading.Lock()


def _launchable(jit, options: dict, target: str):
    """``jit`` with its launch options (``GeneratedLaunch.options``: complete, defaults filled
    in), as ``wrap_triton`` and Inductor take them: ``num_warps`` / ``num_stages`` and the rest
    as the config's keyword options."""
    import triton

    opts = {k: v for k, v in options.items() if v is not None}
    extra = {k: v for k, v in opts.items() if k not in ("num_warps", "num_stages")}
    key = (jit, tuple(sorted(opts.items())), target)
    with _wrappers_lock:
        w = _wrappers.get(key)
        if w is None:
            cfg = triton.Config(extra, num_warps=opts["num_warps"], num_stages=opts["num_stages"])
            w = _wrappers[key] = triton.autotune(configs=[cfg], key=[])(jit)
    return w


def _grid3(grid):
    g = (grid,) if not isinstance(grid, (tuple, list)) else tuple(grid)
    return g + (1,) * (3 - len(g))


def launch(kernel, grid, args, kwargs):
    """One FlyDSL launch as a ``wrap_triton`` launch (the ``launch_sink`` callback)."""
    from torch.library import wrap_triton
    from torch.utils._python_dispatch import _disable_current_modes

    from flydsl_core import generated_launch, split_launch_options

    kwargs, target, options = split_launch_options(kernel, kwargs)
    if target is None:
        raise RuntimeError(f"{kernel.name}: a traced FlyDSL launch needs an explicit target")
    bound = kernel.bind(args, kwargs)
    specs = {n: spec_value(v) for n, v in bound.items()}
    # FlyDSL's code generation is not part of the traced program: outside the tracer's modes
    # (it may use torch itself, e.g. to round a constant to bf16, which a FakeTensor can't)
    with _disable_current_modes():
        gl = generated_launch(kernel, specs, target=target, options=options)
    wrap_triton(_launchable(gl.function, gl.options, gl.target))[_grid3(grid)](*gl.arguments(bound))


class _Sink:
    """``with sink(t):`` route FlyDSL launches to ``launch`` (see the module docstring)."""

    def __call__(self, t):
        from flydsl_core import launch_sink

        return launch_sink(launch)

    @staticmethod
    def target_of(t):
        return target_for(t)


sink = _Sink()


# -- config choice by M -----------------------------------------------------------------------------


def by_m(M, choice, variant, operands, m_of):
    """``variant(cfg, split)(*operands)`` for M's config (``choice``: a family's
    ``MChoice``): for a fixed M its own; for a symbolic one a ``cond`` chain over the ranges
    ``(.., bounds[0]], (bounds[0], bounds[1]], ...`` (``MChoice.ranges``: each range takes
    ``choose`` at its top)."""
    m = _sym.static(M)
    if m is not None:
        return variant(*choice.choose(m))(*operands)
    return _chain(choice.ranges(), choice.choose, variant, tuple(operands), m_of)


def _chain(ranges, choose, variant, operands, m_of):
    (hi, rep), rest = ranges[0], ranges[1:]
    run = variant(*choose(rep))
    if not rest:
        return run(*operands)
    from torch._higher_order_ops.cond import cond_op

    def later(*ops):
        return _chain(rest, choose, variant, ops, m_of)

    return cond_op(m_of(operands) <= hi, run, later, operands)


def dense_ranges(M, N, K, batch, swiglu=False, target=None):
    """The dense GEMM's (or fused SwiGLU's) choice over M for ``target``'s table, as the eager
    API makes it: ``flydsl_kernels.gemm.configs.m_choice``.

    ``N`` and ``K`` go in as they are, symbolic ones included (an attention matmul's KV
    length): the rule's comparisons on them (split-K's tile counts, the grid-fill bound) then
    each add a guard on that condition alone, a range of the size, and a split count or M
    bound computed from one is specialized to its value (``int``, a guard on that value). So a
    growing KV length recompiles only where the eager API's choice changes, and each graph
    launches the config the eager API would for every size its guards admit."""
    from flydsl_kernels.choice import Choice, MChoice
    from flydsl_kernels.gemm import configs

    kind = "swiglu" if swiglu else "dense"
    choice = configs.m_choice(kind, N, K, _sym.hint(batch), target=target)
    if _sym.static(N) is not None and _sym.static(K) is not None:
        return choice

    def choose(m):
        c = choice.choose(m)
        return Choice(c.config, None if c.split_k is None else int(c.split_k))

    return MChoice(choose, lambda: choice.bounds)


def grouped_ranges(M, N, K, G, target=None):
    """The grouped GEMM's choice over M (``G`` groups of a ragged M, else 0)."""
    from flydsl_kernels.gemm import configs

    return configs.m_choice("grouped", _sym.static(N), _sym.static(K), G, target=target)


def mx_ranges(M, N, K, fa, fb, target=None):
    """The MX GEMM's choice over M."""
    from flydsl_kernels.mx import configs

    return configs.m_choice("gemm", _sym.static(N), _sym.static(K), fa, fb, target=target)


def mx_grouped_ranges(M, N, K, G, fa, fb, target=None):
    """The grouped MX GEMM's choice over M (``G`` groups of a ragged M, else 0)."""
    from flydsl_kernels.mx import configs

    return configs.m_choice("grouped", _sym.static(N), _sym.static(K), G, fa, fb, target=target)
