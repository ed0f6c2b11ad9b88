"""The post-grad pass: eligible GEMM nodes become ``flydsl::`` ops (``library/gemm.py``).

For every node whose target is a compile overload of an enabled spec (``ops/``), the spec's
predicate runs on the node's FakeTensors (``CompileContext`` is its ``ctx``). A rejected
node stays ATen's and its reason is counted under ``compile:<op>`` in
``torch_flydsl.stats()``. An accepted one is lowered by the spec (``Call`` or ``Dense``);
dense GEMMs are first extended with their epilogue chain, and SwiGLU pairs are found before
anything else (``epilogue.py``).

The replacement is a small function of the node's inputs written in torch ops and
``torch.ops.flydsl.*``, traced with ``make_fx`` on their FakeTensors and spliced in
(``splice``):

* GPU nodes (``kernels="triton"``): traced through ``FunctionalTensorMode``, where the
  ``triton_op`` decomposes into ``triton_kernel_wrapper_functional`` nodes of FlyDSL's
  generated kernels (and a ``cond`` over M's ranges when M is symbolic); Inductor then
  reinplaces, decomposes and compiles them like its own user Triton kernels. The pass
  runs before those Inductor passes (``post_grad_custom_post_pass``).
* CPU nodes, and GPU nodes with ``kernels="extern"``: the ``flydsl::`` op itself, which
  Inductor calls as an extern kernel (on CPU: FlyDSL's CPU backend).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch
from torch import fx
from torch.utils import _pytree as pytree

from .. import eligibility, gates
from .. import library as _library  # noqa: F401 - registers the flydsl:: ops the pass emits
from ..dispatch import aten_overload
from ..ops import SPECS, _sym
from ..ops._calls import Call, Dense
from ..stats import get as _stat
from . import epilogue
from .settings import Settings

log = logging.getLogger("torch_flydsl")


class CompileContext:
    """The spec predicates' ``ctx`` in the pass: FakeTensors are what it looks at.

    Eligibility is ``torch_flydsl.eligibility``'s, with the pass's two settings on top: CPU
    nodes only with ``device="cpu"``, and ``arch`` naming the GPU target to compile for where
    the device cannot be asked."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.table = gates.load(settings.gates)
        self.allowed = eligibility.allowed_archs()
        self.target = None
        #: the GPU target traced kernels are generated for where set (``arch``, else
        #: ``$FLYDSL_TARGET`` naming a GPU target), else None: the device's own
        self.assumed_arch = settings.arch or eligibility.env_gpu_target()
        self._arch: dict = {}

    @staticmethod
    def plain(t) -> bool:
        return isinstance(t, torch.Tensor)

    def arch(self, t) -> str:
        dev = t.device
        if dev.type == "cpu":
            return eligibility.CPU_ARCH if self.settings.cpu else ""
        if dev.type != "cuda":
            return ""
        a = self._arch.get(dev.index)
        if a is None:
            a = self.assumed_arch or eligibility.gpu_target(dev.index) or ""
            self._arch[dev.index] = a = a if a in self.allowed else ""
        return a


# -- fingerprint (Inductor's FX graph cache key) ----------------------------------------------------


def _tree_hash(pkg) -> str:
    root = Path(pkg.__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        if "__pycache__" not in p.parts:
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def fingerprint(settings: Settings) -> str:
    """What the pass's output depends on: FlyDSL's compiler, the kernels' and torch_flydsl's
    sources, the settings, the gate table in force and the allowed archs."""
    import flydsl_kernels
    import torch_flydsl
    from flydsl_core.cache import compiler_fingerprint

    table = gates.load(settings.gates)
    h = hashlib.sha256()
    for part in (
        compiler_fingerprint(),
        _tree_hash(flydsl_kernels),
        _tree_hash(torch_flydsl),
        settings.key(),
        repr(sorted(table.summary().items())),
        repr(sorted(eligibility.allowed_archs())),
        eligibility.cpu_target() if settings.cpu else "",
        eligibility.env_gpu_target() or "",
    ):
        h.update(part.encode() + b"\0")
    return h.hexdigest()


# -- splicing a traced function into the graph ------------------------------------------------------


def _trace(fn, inputs, decompose: bool, arch=None) -> tuple[fx.GraphModule, list]:
    """``make_fx`` of ``fn(*inputs)`` on the inputs' FakeTensors: ``(gm, input nodes, spec)``;
    fx nodes among the (nested) inputs become placeholders, other leaves are constants."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode
    from torch._subclasses.functional_tensor import dispatch_functionalize
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.traceback import preserve_node_meta

    flat, spec = pytree.tree_flatten(inputs)
    where = [i for i, x in enumerate(flat) if isinstance(x, fx.Node)]
    vals = [flat[i].meta["val"] for i in where]

    def traced(*vs):
        f = list(flat)
        for i, v in zip(where, vs):
            f[i] = v
        return fn(*pytree.tree_unflatten(f, spec))

    from torch._inductor.decomposition import select_decomp_table

    from ..graph_launch import assume_arch

    mode = detect_fake_mode(vals)
    body = dispatch_functionalize(traced) if decompose else traced
    # Inductor's decompositions, as for the rest of a post-grad graph (``t`` -> ``permute``)
    with mode, enable_python_dispatcher(), preserve_node_meta(), assume_arch(arch):
        gm = make_fx(body, select_decomp_table(), tracing_mode="real")(*vals)
    return gm, [flat[i] for i in where]


def splice(
    graph: fx.Graph,
    anchor: fx.Node,
    fn,
    inputs,
    decompose: bool,
    arch=None,
    tuple_out: bool = False,
):
    """Insert the trace of ``fn(*inputs)`` before ``anchor`` and use its output for
    ``anchor``'s value (``anchor``'s users are moved to it). ``arch``: the GPU arch the traced
    kernels are generated for where the device cannot say (``Settings.arch``).
    ``tuple_out``: ``anchor`` is a multi-output node (a HOP) whose users are ``getitem``s,
    possibly nested; ``fn`` returns the same (nested) tuple and each ``getitem`` is pointed at
    its item."""
    gm, nodes = _trace(fn, inputs, decompose, arch)
    owner = graph.owning_module
    env: dict[fx.Node, object] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for p, n in zip(placeholders, nodes):
        env[p] = n
    out = None
    with graph.inserting_before(anchor):
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                out = pytree.tree_map(lambda x: env[x] if isinstance(x, fx.Node) else x, n.args[0])
                continue
            if n.op == "get_attr":  # a cond branch: move the submodule over, renamed
                name = _free_name(owner, f"flydsl_{n.target}")
                owner.register_module(name, getattr(gm, n.target))
                new = graph.get_attr(name)
                new.meta = dict(n.meta)
                env[n] = new
                continue
            env[n] = graph.node_copy(n, lambda x: env[x])
    if tuple_out:
        _repoint_items(anchor, out)
        return out
    if isinstance(out, (list, tuple)):
        out = out[0]
    anchor.replace_all_uses_with(out)
    return out


def _repoint_items(node: fx.Node, items) -> None:
    """Point the ``getitem`` users of ``node`` at ``items`` (nested tuples recursed into)."""
    import operator

    for u in list(node.users):
        if u.target is not operator.getitem:
            raise ValueError(f"a user of a multi-output node is not a getitem: {u.format_node()}")
        item = items[u.args[1]]
        if isinstance(item, (list, tuple)):
            _repoint_items(u, item)
        elif item is None:
            if u.users:
                raise ValueError(f"{u.format_node()} is read but the replacement has no value")
        else:
            u.replace_all_uses_with(item)


def _repoint_sizes(replaced, out: fx.Node, a: fx.Node) -> None:
    """Size reads (``sym_size`` ...) of replaced nodes read the replacement instead, so the
    replaced nodes die: from ``out`` where the shapes agree, else (a 2-D GEMM result under a
    3-D output) the leading dims from the A operand, which the GEMM's result shares."""
    ov = out.meta["val"]
    for x in replaced:
        xv = x.meta.get("val")
        for u in list(x.users):
            if u.target not in epilogue.SIZE_READERS or xv is None:
                continue
            if u.target is not torch.ops.aten.sym_numel.default and _sym.shape_eq(
                tuple(xv.shape), tuple(ov.shape)
            ):
                u.replace_input_with(x, out)
            elif u.target is torch.ops.aten.sym_size.int and u.args[1] % xv.dim() < xv.dim() - 1:
                d = u.args[1] % xv.dim()
                u.args = (a, d + a.meta["val"].dim() - xv.dim())
            elif _sym.shape_eq(tuple(xv.shape), tuple(ov.shape)):
                u.replace_input_with(x, out)


def _free_name(module, base: str) -> str:
    base = base.replace(".", "_")
    name, i = base, 0
    while hasattr(module, name):
        i += 1
        name = f"{base}_{i}"
    return name


# -- the rewrite ------------------------------------------------------------------------------------


def _normalized(node: fx.Node, op) -> list:
    """The node's arguments in schema order, defaults filled in."""
    schema = op._schema
    args = list(node.args)
    kwargs = dict(node.kwargs)
    out = []
    for i, a in enumerate(schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out.append(args[i])
        elif a.name in kwargs:
            out.append(kwargs[a.name])
        elif a.has_default_value():
            d = a.default_value
            out.append(list(d) if isinstance(d, list) else d)
        else:
            raise ValueError(f"{node}: argument {a.name} missing")
    return out


def _vals(args):
    return pytree.tree_map(lambda x: x.meta.get("val") if isinstance(x, fx.Node) else x, args)


def _decompose(settings: Settings, val) -> bool:
    from ..graph_launch import traces_cpu

    return settings.kernels == "triton" and (val.device.type == "cuda" or traces_cpu())


class Rewriter:
    def __init__(self, graph: fx.Graph, settings: Settings):
        self.graph = graph
        self.settings = settings
        self.ctx = CompileContext(settings)
        self.index = {}
        for name in settings.ops:
            for ov in SPECS[name].compile_overloads:
                self.index[aten_overload(ov.op)] = ov
        self.rewritten = 0
        self.done: set[fx.Node] = set()  # GEMM nodes already replaced (SwiGLU pairs)

    def run(self) -> int:
        if self.settings.swiglu and aten_overload("mm") in self.index:
            for node in list(self.graph.nodes):
                if node.op == "call_function" and node.target is epilogue.MUL:
                    self._swiglu(node)
        for node in list(self.graph.nodes):
            if node.op != "call_function" or node in self.done:
                continue
            ov = self.index.get(node.target)
            if ov is not None and node.users:
                self._one(node, ov)
        if self.rewritten:
            self.graph.eliminate_dead_code()
        return self.rewritten

    def _check(self, node, ov):
        """``(args, vals, None)`` or ``(.., .., reason)`` for ``node``."""
        args = _normalized(node, aten_overload(ov.op))
        vals = _vals(args)
        return args, vals, ov.reason(self.ctx, *vals)

    def _one(self, node: fx.Node, ov) -> None:
        st = _stat(f"compile:{ov.op}")
        args, vals, reason = self._check(node, ov)
        if reason is not None:
            st.fallback(reason)
            return
        low = ov.lower(self.ctx, *vals)
        if low is None:
            st.fallback("params")
            return
        if self.settings.autotune and not self._autotune_keeps(node, ov, vals):
            st.fallback("autotune")
            return
        if isinstance(low, Dense):
            self._dense(node, low, args, vals)
        elif isinstance(low, Call):
            splice(
                self.graph,
                node,
                low.build,
                args,
                _decompose(self.settings, vals[0]),
                self.ctx.assumed_arch,
            )
        st.hits += 1
        self.rewritten += 1

    def _autotune_keeps(self, node, ov, vals) -> bool:
        from .autotune import flydsl_wins

        return flydsl_wins(ov, vals, self.settings)

    def _dense(self, node: fx.Node, d: Dense, args, vals) -> None:
        chain = epilogue.extend(node) if self.settings.epilogue else epilogue.Chain(end=node)
        a, b = args[d.a], args[d.b]
        c = args[d.c] if d.c is not None else None
        bias, alpha, beta = chain.bias, d.alpha, d.beta
        c_is_bias = c is not None and d.c_is_bias and bias is None
        act, rows, out_dtype, shape = (
            chain.activation,
            chain.bias_rows,
            chain.out_dtype,
            chain.shape,
        )
        residual = chain.residual

        def build(a, b, c, bias, residual, shape):
            if c_is_bias:
                c, bias, cb = None, c, 0.0
            else:
                cb = beta if c is not None else 0.0
            m, n = a.shape[-2], b.shape[-1]
            if bias is not None:
                bias = bias.reshape(-1, 1) if rows else bias.reshape(-1)
            if residual is not None and shape is not None:
                residual = residual.reshape(m, n)
            out = torch.ops.flydsl.gemm(a, b, bias, c, residual, alpha, cb, act, out_dtype)
            return out.reshape(shape) if shape is not None else out

        out = splice(
            self.graph,
            chain.end,
            build,
            [a, b, c, bias, residual, shape],
            _decompose(self.settings, vals[d.a]),
            self.ctx.assumed_arch,
        )
        _repoint_sizes([node, *chain.nodes], out, a)
        if chain.fused:
            _stat("compile:epilogue").hits += 1
            log.debug("torch_flydsl: %s fused %s", node, "+".join(chain.fused))

    def _swiglu(self, mul: fx.Node) -> None:
        found = epilogue.find_swiglu(mul)
        if found is None:
            return
        ov = self.index[aten_overload("mm")]
        _, gvals, rg = self._check(found.gate, ov)
        _, _uvals, ru = self._check(found.up, ov)
        if rg is not None or ru is not None:
            return  # each mm is then counted on its own
        a, wg, wu = found.gate.args[0], found.gate.args[1], found.up.args[1]
        out_dtype = mul.meta["val"].dtype
        out_dtype = None if out_dtype == gvals[0].dtype else out_dtype
        shape = found.shape

        def build(a, wg, wu, shape):
            out = torch.ops.flydsl.swiglu(a, wg, wu, out_dtype)
            return out.reshape(shape) if shape is not None else out

        out = splice(
            self.graph,
            mul,
            build,
            [a, wg, wu, shape],
            _decompose(self.settings, gvals[0]),
            self.ctx.assumed_arch,
        )
        gate_chain = [found.gate, *found.gate.users, found.up, *found.up.users]
        _repoint_sizes(gate_chain, out, a)
        self.done.update((found.gate, found.up))
        _stat("compile:mm").hits += 2
        _stat("compile:swiglu").hits += 1
        self.rewritten += 2


def rewrite(graph: fx.Graph, settings: Settings) -> int:
    """Run the pass on ``graph``; returns how many ATen nodes were rewritten."""
    return Rewriter(graph, settings).run()
