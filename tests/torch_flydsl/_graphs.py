"""Helpers of the torch.compile tests: post-grad-like graphs without running Inductor, and an
executor for graphs holding traced Triton kernels (Triton's interpreter, no GPU)."""

from __future__ import annotations

import sys
import typing

import torch
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext


def fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(shape_env=ShapeEnv())


def fake(mode, t, dynamic=(), device=None):
    """A FakeTensor of ``t`` whose dims ``dynamic`` are symbolic, on ``device``."""
    ctx = StatelessSymbolicContext(
        dynamic_sizes=[
            DimDynamic.DYNAMIC if i in dynamic else DimDynamic.STATIC for i in range(t.dim())
        ]
    )
    f = mode.from_tensor(t, symbolic_context=ctx)
    if device is not None:
        with mode:
            f = f.to(device)
    return f


def post_grad(fn, fakes):
    """``fn`` traced the way Inductor's patterns are (``fwd_only``: Inductor's decompositions,
    the ops a post-grad graph holds) on FakeTensors."""
    from torch._inductor.pattern_matcher import fwd_only

    mode = fakes[0].fake_mode
    with mode:
        return fwd_only(fn, fakes)


def targets(gm) -> list:
    """Every call_function target of ``gm`` and its subgraphs."""
    out = []
    for mod in gm.modules():
        if isinstance(mod, torch.fx.GraphModule):
            out += [n.target for n in mod.graph.nodes if n.op == "call_function"]
    return out


def _interpreted(jit):
    """The kernel of a generated ``cpu-interpret`` module as an InterpretedFunction, with its
    helper functions interpreted too (as ``InterpretedExecutable`` does)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    mod = sys.modules[jit.fn.__module__]
    for name, val in list(vars(mod).items()):
        if isinstance(val, JITFunction) and val is not jit:
            setattr(mod, name, InterpretedFunction(val.fn))
    return InterpretedFunction(jit.fn)


class RunTriton(torch.fx.Interpreter):
    """Runs a graph holding ``triton_kernel_wrapper_functional`` and ``cond`` nodes on the CPU:
    the kernels (generated for ``cpu-interpret``) through Triton's interpreter. Counts the
    kernels it ran in ``launches``."""

    launches: typing.ClassVar[list] = []

    def call_function(self, target, args, kwargs):
        from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
        from triton.runtime.autotuner import Autotuner

        hop = torch.ops.higher_order
        if target is hop.triton_kernel_wrapper_functional:
            kernel = kernel_side_table.get_kernel(kwargs["kernel_idx"])
            consts = kernel_side_table.get_constant_args(kwargs["constant_args_idx"])
            kw = {**kwargs["kwargs"], **consts}
            for name in kwargs["tensors_to_clone"]:
                kw[name] = kw[name].clone()
            jit = kernel.fn if isinstance(kernel, Autotuner) else kernel
            from flydsl_core.backends.triton.launcher import interpret_scope

            grid = tuple(int(g) for g in kwargs["grid"][0])
            run = _interpreted(jit)
            params = [p.name for p in jit.params]
            with interpret_scope():
                run[grid](*[kw[p] for p in params if p in kw])
            RunTriton.launches.append(jit.fn.__name__)
            return {name: kw[name] for name in kwargs["tensors_to_clone"]}
        if target is hop.cond:
            pred, true_gm, false_gm, ops = args
            sub = true_gm if bool(pred) else false_gm
            return RunTriton(sub).run(*ops)
        return super().call_function(target, args, kwargs)


class StubDriver:
    """A Triton driver that only names a target: Inductor's analysis of which kernel arguments
    a user Triton kernel writes (``identify_accessed_tensors``) lowers it to TTIR for the
    active driver's target, which a machine without a GPU lacks."""

    def __init__(self, arch: str = "gfx950"):
        self.arch = arch

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        if self.arch.startswith("sm"):
            return GPUTarget("cuda", int(self.arch[2:]), 32)
        return GPUTarget("hip", self.arch, 64)
