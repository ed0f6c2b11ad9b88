"""``patch(model)``: route a transformers model's RMSNorm, router and experts into FlyDSL, reversibly."""

from __future__ import annotations

import dataclasses
import functools
import logging
import types

import torch

from ..library import hf as _hf  # registers the flydsl::hf_* ops
from . import _checks, _experts, _forms

log = logging.getLogger("torch_flydsl")

ROUTES = ("rms_norm", "add_rms_norm", "moe_router", "experts", "mx_experts", "attention")
_MISSING = object()


@dataclasses.dataclass(frozen=True)
class Replacement:
    """One module whose computation now runs FlyDSL kernels."""

    route: str  # one of ROUTES
    module: str  # its qualified name in the model ("" for the model itself)
    cls: str  # its class name
    detail: str  # numerics / kernel, in words


@dataclasses.dataclass(frozen=True)
class NotRouted:
    """A module (or a family of modules) left on its PyTorch path, and why."""

    what: str  # "rms_norm", "router", "experts", "attention", "linear", "residual_add"
    module: str
    cls: str
    reason: str


class Patch:
    """What ``patch`` did: ``replaced``, ``not_routed``, and ``undo()`` to restore the model.

    Also a context manager: ``with patch(model): ...`` undoes on exit.
    """

    def __init__(self, model):
        self.model = model
        self.replaced: list[Replacement] = []
        self.not_routed: list[NotRouted] = []
        self._undo: list = []
        self.active = True

    def undo(self) -> None:
        """Restore every forward, config and buffer ``patch`` changed (idempotent)."""
        while self._undo:
            self._undo.pop()()
        self.active = False

    def counts(self) -> dict[str, int]:
        """Modules replaced per route."""
        out = dict.fromkeys(ROUTES, 0)
        for r in self.replaced:
            out[r.route] += 1
        return out

    def as_dict(self) -> dict:
        return {
            "active": self.active,
            "counts": self.counts(),
            "replaced": [dataclasses.asdict(r) for r in self.replaced],
            "not_routed": [dataclasses.asdict(n) for n in self.not_routed],
        }

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.undo()

    def __repr__(self):
        c = ", ".join(f"{k}={v}" for k, v in self.counts().items() if v)
        return f"<torch_flydsl.transformers.Patch {'active' if self.active else 'undone'}: {c or 'nothing'}>"

    # -- helpers used by patch() --

    def set_forward(self, module, fn, **options) -> None:
        """``module.forward = fn(module, *args, **options, **kwargs)`` on the instance."""

        # a plain function (not a partial): torch.compile traces bound methods of functions only
        def forward(self, *args, **kwargs):
            return fn(self, *args, **options, **kwargs)

        module.forward = types.MethodType(forward, module)
        self._undo.append(functools.partial(_del_forward, module))

    def set_attr(self, obj, name: str, value) -> None:
        old = obj.__dict__.get(name, _MISSING)
        setattr(obj, name, value)
        self._undo.append(functools.partial(_restore_attr, obj, name, old))

    def add_buffers(self, module, names) -> None:
        self._undo.append(functools.partial(_del_buffers, module, tuple(names)))


def _del_forward(module) -> None:
    module.__dict__.pop("forward", None)


def _restore_attr(obj, name, old) -> None:
    if old is _MISSING:
        obj.__dict__.pop(name, None)
    else:
        obj.__dict__[name] = old


def _del_buffers(module, names) -> None:
    for n in names:
        module._buffers.pop(n, None)


# -- the replacement forwards ---------------------------------------------------------------------


def _norm_forward(module, hidden_states, *, eps: float, mode: int):
    w = module.weight
    why = _checks.why_not_norm(hidden_states, w)
    if why:
        _checks.count_fallback(_checks.RMS_NORM, why)
        return type(module).forward(module, hidden_states)
    return torch.ops.flydsl.hf_rms_norm(hidden_states, w, eps, mode)


def _add_norm(norm, x, residual, eps: float, mode: int):
    """``(norm(residual + x), residual + x)``, fused when FlyDSL can take it."""
    w = norm.weight
    why = _checks.why_not_add_norm(x, residual, w)
    if why:
        _checks.count_fallback(_checks.ADD_RMS_NORM, why)
        h = residual + x
        return norm(h), h
    return torch.ops.flydsl.hf_add_rms_norm(x, residual, w, eps, mode)


def _layer_forward(
    layer,
    hidden_states,
    attention_mask=None,
    position_ids=None,
    cache=None,
    use_cache=False,
    position_embeddings=None,
    *,
    tuple_mlp: bool,
    eps: float,
    mode: int,
    **kwargs,
):
    """The recognized pre-norm decoder layer (``_forms.LAYER_FORMS``) with the attention
    residual add fused into ``post_attention_layernorm``; otherwise the same statements."""
    if "past_key_values" in kwargs:  # transformers' deprecate_kwarg renames it to cache
        cache = kwargs.pop("past_key_values")
    residual = hidden_states
    hidden_states = layer.input_layernorm(hidden_states)
    hidden_states, _ = layer.self_attn(
        hidden_states=hidden_states,
        attention_mask=attention_mask,
        position_ids=position_ids,
        cache=cache,
        use_cache=use_cache,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    hidden_states, residual = _add_norm(
        layer.post_attention_layernorm, hidden_states, residual, eps, mode
    )
    hidden_states = layer.mlp(hidden_states)
    if tuple_mlp:
        hidden_states = hidden_states[0]
    return residual + hidden_states


def _router_forward(router, hidden_states, *, scoring: str, renormalize, has_bias: bool):
    """The recognized router (``_forms.ROUTER_FORMS``): the gate GEMM stays ``F.linear``;
    scoring, top-k and renormalization run ``flydsl_kernels.topk.moe_router``."""
    if scoring == "softmax":
        hidden_states = hidden_states.reshape(-1, router.hidden_dim)
    logits = torch.nn.functional.linear(
        hidden_states, router.weight, router.bias if has_bias else None
    )
    renorm = router.norm_topk_prob if renormalize is None else renormalize
    why = _checks.why_not_router(logits, router.top_k)
    if why:
        _checks.count_fallback(_checks.ROUTER, why)
        weights, ids = _hf.router_reference(logits, router.top_k, scoring, bool(renorm))
    else:
        weights, ids = torch.ops.flydsl.hf_moe_router(logits, router.top_k, scoring, bool(renorm))
    # transformers returns the routing weights in the logits' dtype
    return logits, weights.to(logits.dtype), ids


# -- patch ----------------------------------------------------------------------------------------


def _instance_forward(module) -> bool:
    return "forward" in module.__dict__


def patch(
    model: torch.nn.Module,
    *,
    norms: bool = True,
    fuse_residual: bool = True,
    router: bool = True,
    experts: bool = True,
    mx_experts: bool | str = "auto",
) -> Patch:
    """Route ``model``'s RMSNorm, MoE router and experts into FlyDSL; returns a ``Patch``.

    * ``norms``: every module whose ``forward`` is a known RMSNorm body
      (``_forms.NORM_FORMS``: LlamaRMSNorm's, GptOssRMSNorm's, GemmaRMSNorm's and
      their copies) runs ``flydsl::hf_rms_norm`` with that body's cast order.
    * ``fuse_residual``: decoder layers whose ``forward`` is the known pre-norm
      body add the attention output to the residual inside
      ``post_attention_layernorm`` (``flydsl::hf_add_rms_norm``). The MLP's
      residual add feeds the next layer's norm, across the layer boundary: not fused.
    * ``router``: known router bodies (Qwen3-MoE's softmax top-k, gpt-oss's top-k
      softmax) run ``flydsl::hf_moe_router`` after their gate ``F.linear``.
    * ``experts``: experts modules take transformers' ``ExpertsInterface``
      implementation ``"flydsl"`` (their config's ``_experts_implementation`` is
      set, and restored by ``undo``).
    * ``mx_experts``: ``"auto"`` quantizes the experts of models whose config says
      their checkpoint is MXFP4 (``quantization_config.quant_method == "mxfp4"``,
      gpt-oss) with ``to_mx`` and runs the MX grouped GEMM; True / False force it.

    Attention is the model's ``attn_implementation``: ``patch`` registers ``"flydsl"``
    (``register()``) and reports the attention modules as routed (``attention``) where the
    model uses it, else under ``not_routed`` with the call that routes them
    (``model.set_attn_implementation("flydsl")``); the report is of the model as ``patch``
    found it. Linear layers are not touched (listed in ``not_routed``). Each
    replaced forward checks its inputs per call (device arch, dtype, layout) and
    falls back to the module's own forward, counted in ``torch_flydsl.stats()``
    under ``hf.*``. ``patch`` compiles nothing; kernels compile on first use.
    """
    p = Patch(model)
    modes: dict[torch.nn.Module, tuple[int, float]] = {}

    for name, m in model.named_modules():
        mode = _forms.norm_mode(m)
        if mode is None:
            if type(m).__name__.endswith("RMSNorm"):
                p.not_routed.append(
                    NotRouted("rms_norm", name, type(m).__name__, "forward body not recognized")
                )
            continue
        eps = _forms.norm_eps(m)
        if eps is None or not isinstance(getattr(m, "weight", None), torch.Tensor):
            p.not_routed.append(NotRouted("rms_norm", name, type(m).__name__, "no eps or weight"))
            continue
        modes[m] = (_checks.MODES[mode], eps)
        if not norms:
            continue
        if _instance_forward(m):
            p.not_routed.append(
                NotRouted(
                    "rms_norm", name, type(m).__name__, "forward already replaced on the instance"
                )
            )
            continue
        p.set_forward(m, _norm_forward, eps=eps, mode=_checks.MODES[mode])
        p.replaced.append(
            Replacement("rms_norm", name, type(m).__name__, f"{mode} numerics, eps={eps:g}")
        )

    if fuse_residual:
        _patch_layers(p, model, modes)
    if router:
        _patch_routers(p, model)
    if experts:
        _patch_experts(p, model, mx_experts)
    _note_unrouted(p, model)
    log.info("torch_flydsl.transformers.patch: %s", p)
    return p


def _patch_layers(p: Patch, model, modes) -> None:
    for name, m in model.named_modules():
        form = _forms.layer_form(m)
        if form is None:
            continue
        post = getattr(m, "post_attention_layernorm", None)
        if post not in modes:
            p.not_routed.append(
                NotRouted(
                    "residual_add",
                    name,
                    type(m).__name__,
                    "post_attention_layernorm not a known RMSNorm",
                )
            )
            continue
        if _instance_forward(m):
            p.not_routed.append(
                NotRouted(
                    "residual_add",
                    name,
                    type(m).__name__,
                    "forward already replaced on the instance",
                )
            )
            continue
        mode, eps = modes[post]
        p.set_forward(m, _layer_forward, tuple_mlp=form == "tuple", eps=eps, mode=mode)
        p.replaced.append(
            Replacement(
                "add_rms_norm",
                f"{name}.post_attention_layernorm" if name else "post_attention_layernorm",
                type(post).__name__,
                f"attention residual add fused into the norm ({type(m).__name__})",
            )
        )


def _patch_routers(p: Patch, model) -> None:
    for name, m in model.named_modules():
        form = _forms.router_form(m)
        if form is None:
            if type(m).__name__.endswith(("Router", "TopkRouter", "TopKRouter")):
                p.not_routed.append(
                    NotRouted("router", name, type(m).__name__, "forward body not recognized")
                )
            continue
        if _instance_forward(m):
            p.not_routed.append(
                NotRouted(
                    "router", name, type(m).__name__, "forward already replaced on the instance"
                )
            )
            continue
        scoring, renorm, has_bias = form
        p.set_forward(m, _router_forward, scoring=scoring, renormalize=renorm, has_bias=has_bias)
        r = renorm if renorm is not None else bool(getattr(m, "norm_topk_prob", False))
        p.replaced.append(
            Replacement(
                "moe_router",
                name,
                type(m).__name__,
                f"{scoring}, top-{m.top_k} of {m.num_experts}{', renormalized' if r else ''}",
            )
        )


def is_mxfp4(config) -> bool:
    """Whether a transformers config declares MXFP4 quantization (``quantization_config``'s
    ``quant_method``, a dict or an object): ``patch(mx_experts="auto")`` routes its experts
    through the MX kernels."""
    q = getattr(config, "quantization_config", None)
    method = q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", None)
    return str(getattr(method, "value", method)).lower() == "mxfp4"


def _patch_experts(p: Patch, model, mx_experts) -> None:
    found = [(n, m) for n, m in model.named_modules() if _experts.is_experts_module(m)]
    if not found:
        return
    _experts.register()
    previous: dict[int, str] = {}  # id(config) -> the implementation it named before
    for name, m in found:
        if "_flydsl_fallback" in m.__dict__:
            p.not_routed.append(
                NotRouted(
                    "experts", name, type(m).__name__, "already patched (undo that patch first)"
                )
            )
            continue
        cfg = m.config
        if id(cfg) not in previous:
            prev = getattr(cfg, "_experts_implementation", None)
            previous[id(cfg)] = "eager" if prev in (None, _experts.NAME) else prev
            p.set_attr(cfg, "_experts_implementation_internal", _experts.NAME)
        cfg_prev = previous[id(cfg)]
        p.set_attr(m, "_flydsl_fallback", cfg_prev)
        use_mx = is_mxfp4(cfg) if mx_experts == "auto" else bool(mx_experts)
        detail = "grouped_mm (bf16/fp16), bias fused" if m.has_bias else "grouped_mm (bf16/fp16)"
        route = "experts"
        if use_mx:
            why = _experts.mx_reason(m)
            if why:
                p.not_routed.append(
                    NotRouted(
                        "mx_experts",
                        name,
                        type(m).__name__,
                        f"MX route not taken ({why}); bf16 route instead",
                    )
                )
            else:
                err = _experts.quantize_mx(m)
                p.add_buffers(m, _experts.MX_BUFFERS)
                route = "mx_experts"
                detail = (
                    "mx_grouped_mm: MXFP4 weights (to_mx), activations to mxfp8 e4m3 per call "
                    f"(a8w4); weight requantization max abs error {err:.3g}"
                )
        p.replaced.append(
            Replacement(
                route, name, type(m).__name__, f"{detail}; fallback {cfg_prev!r} where not eligible"
            )
        )


def _note_attention(p: Patch, model) -> None:
    """Report the attention modules: routed where their config names ``"flydsl"`` (FlyDSL's
    attention implementation, registered here so that it can be named), else not routed."""
    from ._attention import NAME
    from ._attention import register as register_attention

    register_attention()
    attn: dict[tuple[str, str], list[str]] = {}
    for name, m in model.named_modules():
        cfg = getattr(m, "config", None)
        impl = getattr(cfg, "_attn_implementation", None) if cfg is not None else None
        if impl is not None and type(m).__name__.endswith("Attention"):
            attn.setdefault((type(m).__name__, impl), []).append(name)
    for (cls, impl), mods in attn.items():
        if impl == NAME:
            p.replaced += [
                Replacement(
                    "attention",
                    name,
                    cls,
                    f"attn_implementation={NAME!r}: flydsl::hf_attention (FlyDSL's attention "
                    "forward and backward); fallback: the same math in PyTorch where not eligible",
                )
                for name in mods
            ]
            continue
        where = f"{len(mods)} modules ({mods[0]}, ...)" if len(mods) > 1 else mods[0]
        p.not_routed.append(
            NotRouted(
                "attention",
                where,
                cls,
                f"attn_implementation={impl!r}: transformers' attention path; "
                f"model.set_attn_implementation({NAME!r}) routes it (registered by patch)",
            )
        )


def _note_unrouted(p: Patch, model) -> None:
    _note_attention(p, model)
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    if linears:
        p.not_routed.append(
            NotRouted(
                "linear",
                f"{linears} nn.Linear modules",
                "Linear",
                "eager: ATen; torch.compile(backend='flydsl') routes them where that backend exists",
            )
        )
