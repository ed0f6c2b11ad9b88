"""Tracing FlyDSL launches into a torch graph as Triton kernels (``wrap_triton``).

``with sink(t):`` around a ``flydsl_kernels`` API call on FakeTensors (the ``flydsl::`` ops'
traced path) takes its launches over (``flydsl_core.runtime.kernel.launch_sink``). Each
launch becomes ``torch.library.wrap_triton(jit)[grid](*args)`` where ``jit`` is the
``@triton.jit`` function FlyDSL generates for that specialization (``Kernel.triton_function``:
generated, not compiled; Inductor compiles it) and ``args`` are read from the launch's
tensors, sizes and strides as FlyDSL's own launcher would (``GeneratedKernel.params``).

The specialization is taken from the traced tensors with no guard: a size or stride counts
as 1 or as a multiple of 16 only where the shape environment proves it for every value
(``statically_known_true``); a symbolic one carries no fact, and a tensor with a symbolic
size or stride gets 64-bit index math (its extent is unbounded). So one traced kernel is
valid for every M the graph will see. Launch options: ``num_warps`` / ``num_stages`` and,
on AMD targets, ``matrix_instr_nonkdim`` / ``kpack`` / ``waves_per_eu``, through a
one-config ``triton.autotune`` wrapper, the form Inductor reads them from.

Config choice with a symbolic M (``by_m``): the eager APIs pick a config per call from M
(decode / small / medium / large classes, the split-K rule). Traced, the M axis is cut where
that choice changes (``*_choice``) and the launches of each range are traced into one
branch of a ``cond`` on M, so one graph picks each call's config at run time, with no
recompilation; a static M traces only its own config.
"""

from __future__ import annotations

import threading

import torch

from . import _runtime

#: FlyDSL target names by GPU arch
TARGETS = {"gfx950": "gfx950", "gfx942": "gfx942", "gfx1250": "gfx1250", "sm90": "sm90"}
_AMD_OPTIONS = ("matrix_instr_nonkdim", "kpack", "waves_per_eu")


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
    device's (``flydsl_core.targets.device_arch``, which ``$FLYDSL_GPU_ARCH`` overrides)."""
    if t.device.type == "cpu" and CPU_TRACE_TARGET is not None:
        return CPU_TRACE_TARGET
    arch = getattr(_ASSUMED, "arch", None) or _runtime.resolve_arch(t.device.index)
    tgt = TARGETS.get(arch or "")
    if tgt is None:
        raise RuntimeError(
            f"torch_flydsl cannot trace FlyDSL kernels for {t.device} (arch {arch!r}); "
            f"FlyDSL generates Triton for {', '.join(TARGETS)}"
        )
    return tgt


# -- facts of traced values -------------------------------------------------------------------------


def _known_int(v):
    """``v`` as an int when it is one or the shape environment fixes it, else None."""
    if isinstance(v, int):
        return v
    return v.node.maybe_as_int()


def _fact_int(v):
    """A stand-in int carrying exactly the facts provable for every value of ``v``: 1, a
    multiple of 16 (16), or none (3); ``v`` itself when it is fixed."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    k = _known_int(v)
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
    fixed = all(_known_int(s) is not None for s in (*t.shape, *t.stride()))
    bits = 64
    if fixed:
        span = 1 + sum((s - 1) * abs(st) for s, st in zip(shape, stride) if s > 0)
        bits = 32 if span < 2**31 and t.numel() < 2**31 else 64
    return TensorSpec(t.dtype, shape, stride, aligned=True, index_bits=bits)


def _spec_value(v):
    if isinstance(v, torch.Tensor):
        return tensor_spec(v)
    if isinstance(v, torch.SymInt):
        return _fact_int(v)
    if isinstance(v, torch.SymFloat):
        return 1.5  # a float argument: no facts
    return v


# -- the sink ---------------------------------------------------------------------------------------

_wrappers: dict = {}
_wrappers_lock = threading.Lock()


def _launchable(jit, options: dict, target: str):
    """``jit`` with its launch options, as ``wrap_triton`` and Inductor take them."""
    import triton

    opts = {k: v for k, v in options.items() if v is not None}
    amd = target.startswith("gfx")
    extra = {k: opts[k] for k in _AMD_OPTIONS if amd and k in opts}
    key = (jit, tuple(sorted(opts.items())), target)
    with _wrappers_lock:
        w = _wrappers.get(key)
        if w is None:
            cfg = triton.Config(
                extra, num_warps=opts.get("num_warps", 4), num_stages=opts.get("num_stages", 2)
            )
            w = _wrappers[key] = triton.autotune(configs=[cfg], key=[])(jit)
    return w


def _grid3(grid):
    g = (grid,) if not isinstance(grid, (tuple, list)) else tuple(grid)
    return g + (1,) * (3 - len(g))


def launch(kernel, grid, args, kwargs):
    """One FlyDSL launch as a ``wrap_triton`` launch (the ``launch_sink`` callback)."""
    from torch.library import wrap_triton

    from flydsl_core.backends.triton.launcher import make_extractor
    from flydsl_core.runtime.kernel import LAUNCH_OPTIONS

    kwargs = dict(kwargs)
    opts = {
        k: kwargs.pop(k)
        for k in LAUNCH_OPTIONS
        if k in kwargs and k not in kernel.signature.parameters
    }
    target = opts.pop("target", None)
    if target is None:
        raise RuntimeError(f"{kernel.name}: a traced FlyDSL launch needs an explicit target")
    options = dict(opts.pop("options", None) or {})
    options.update(opts)
    bound = kernel.bind(args, kwargs)
    specs = {n: _spec_value(v) for n, v in bound.items()}
    from torch.utils._python_dispatch import _disable_current_modes

    # FlyDSL's code generation is not part of the traced program: outside the tracer's modes
    # (it may use torch itself, e.g. to round a constant to bf16, which a FakeTensor can't)
    with _disable_current_modes():
        jit, gen = kernel.triton_function(target=target, **specs)
        runtime = kernel.specialize(kernel.bind((), specs)).runtime
    kargs = make_extractor(gen.params, gen.nargs)(tuple(bound[n] for n in runtime))
    wrap_triton(_launchable(jit, options, target))[_grid3(grid)](*kargs)


class _Sink:
    """``with sink(t):`` route FlyDSL launches to ``launch`` (see the module docstring)."""

    def __call__(self, t):
        from flydsl_core.runtime.kernel import launch_sink

        return launch_sink(launch)

    @staticmethod
    def target_of(t):
        return target_for(t)


sink = _Sink()


# -- config choice by M -----------------------------------------------------------------------------


def by_m(M, choice, variant, operands, m_of):
    """``variant(cfg, split)(*operands)`` for M's config (``choice = (choose, bounds)``): for a
    fixed M its own; for a symbolic one a ``cond`` chain over the ranges ``(.., bounds[0]],
    (bounds[0], bounds[1]], ...`` (each range's config is ``choose`` at its top)."""
    choose, bounds = choice
    m = _known_int(M)
    if m is not None:
        return variant(*choose(m))(*operands)
    reps = [*bounds, bounds[-1] + 1 if bounds else 1]
    return _chain(list(zip([*bounds, None], reps)), choose, variant, tuple(operands), m_of)


def _chain(ranges, choose, variant, operands, m_of):
    (hi, rep), rest = ranges[0], ranges[1:]
    run = variant(*choose(rep))
    if not rest:
        return run(*operands)
    from torch._higher_order_ops.cond import cond_op

    def later(*ops):
        return _chain(rest, choose, variant, ops, m_of)

    return cond_op(m_of(operands) <= hi, run, later, operands)


def _hint(v) -> int:
    k = _known_int(v)
    if k is not None:
        return k
    return int(v.node.hint) if v.node.has_hint() else 1


def dense_ranges(M, N, K, batch, swiglu=False, target=None):
    """The dense GEMM's (or fused SwiGLU's) choice for ``target`` (its shipped table and CU
    count, as the eager API reads them): ``configs.select`` / ``select_swiglu`` and
    ``split_k``; it changes at M = 16, 64, 128, 256 and where the large tile starts to fill
    the GPU (``_fills_the_gpu``)."""
    from flydsl_kernels._target import num_cus
    from flydsl_kernels.gemm import configs

    n, k, b = _known_int(N), _known_int(K), _hint(batch)

    def choose(m):
        if swiglu:
            return configs.select_swiglu(m, n, k, b, target), None
        cfg = configs.select(m, n, k, b, target)
        return cfg, configs.split_k(cfg, m, n, k, b, target)

    large = configs.shipped_table(target)["large"]
    need = -(-num_cus(target) // (-(-n // large.BN) * b))  # row tiles to fill the GPU
    fill = max(256, large.BM * (need - 1))
    return choose, sorted({16, 64, 128, 256, fill})


def grouped_ranges(M, N, K, G, target=None):
    """The grouped GEMM's choice: by rows per group (``M // G``, ragged M) or by M (other
    forms), in the dense classes."""
    from flydsl_kernels.gemm import configs

    n, k = _known_int(N), _known_int(K)

    def choose(m):
        return configs.select_grouped(max(1, m // G) if G else m, n, k, target), None

    cuts = (16, 64, 256)
    return choose, [(c + 1) * G - 1 for c in cuts] if G else list(cuts)


def mx_ranges(M, N, K, fa, fb, target=None):
    from flydsl_kernels.mx import configs

    n, k = _known_int(N), _known_int(K)
    return (lambda m: (configs.select_gemm(m, n, k, fa, fb, target), None)), [32]


def mx_grouped_ranges(M, N, K, G, fa, fb, target=None):
    from flydsl_kernels.mx import configs

    n, k = _known_int(N), _known_int(K)

    def choose(m):
        return configs.select_grouped(max(1, m // G) if G else m, n, k, fa, fb, target), None

    cuts = (16, 64)
    return choose, [(c + 1) * G - 1 for c in cuts] if G else list(cuts)
