"""Which transformers modules a route can replace: their ``forward`` bodies, recognized by source.

transformers copies one module body into many models (``# Copied from`` /
modular files): the LlamaRMSNorm body is the forward of some 140 RMSNorm
classes in transformers 5.24, the Llama decoder-layer body that of some 70
decoder layers. A route replaces a module only when the module's ``forward``
body is, statement for statement, one whose numerics the route reproduces
(compared as ``ast.unparse`` of the body without its docstring, so comments
and formatting do not matter). Anything else is left alone and reported as
not recognized: a class name says nothing about its math, its body does.

The forms were read from transformers 5.24's sources (models/llama,
qwen3_moe, gpt_oss, gemma and the classes that copy them).
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap


def _body(src: str) -> str:
    """A function's (or a statement list's) body, docstring dropped, as ``ast.unparse`` prints it."""
    tree = ast.parse(textwrap.dedent(src))
    body = tree.body
    if len(body) == 1 and isinstance(body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        body = body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return ast.unparse(ast.Module(body=body, type_ignores=[]))


@functools.cache
def body_of(func) -> str | None:
    """The normalized body of ``func`` (decorators unwrapped), or None without source."""
    try:
        return _body(inspect.getsource(inspect.unwrap(func)))
    except (OSError, TypeError, SyntaxError):
        return None


def _forms(**sources: str) -> dict[str, str]:
    return {_body(src): name for name, src in sources.items()}


#: RMSNorm ``forward`` bodies -> the numerics (``library.hf.MODES``) that reproduce them
NORM_FORMS = _forms(
    llama="""
input_dtype = hidden_states.dtype
hidden_states = hidden_states.to(torch.float32)
variance = hidden_states.pow(2).mean(-1, keepdim=True)
hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
return self.weight * hidden_states.to(input_dtype)
""",
    aten="""
input_dtype = hidden_states.dtype
hidden_states = hidden_states.to(torch.float32)
variance = hidden_states.pow(2).mean(-1, keepdim=True)
hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
return (self.weight * hidden_states).to(input_dtype)
""",
    gemma="""
output = self._norm(x.float())
output = output * (1.0 + self.weight.float())
return output.type_as(x)
""",
)
#: the ``_norm`` helper the gemma form calls (checked as well)
GEMMA_NORM_HELPER = _body("""
return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
""")

_LAYER = """
residual = hidden_states
hidden_states = self.input_layernorm(hidden_states)
hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask, position_ids=position_ids, cache=cache, use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
hidden_states = residual + hidden_states
residual = hidden_states
hidden_states = self.post_attention_layernorm(hidden_states)
{mlp}
hidden_states = residual + hidden_states
return hidden_states
"""
#: pre-norm decoder-layer bodies whose attention residual add can fuse into the second norm:
#: "tensor" (the MLP returns a tensor: Llama, Qwen3, Qwen3-MoE, Mistral...) or "tuple" (gpt-oss:
#: the MLP returns ``(hidden_states, router_scores)``)
LAYER_FORMS = _forms(
    tensor=_LAYER.format(mlp="hidden_states = self.mlp(hidden_states)"),
    tuple=_LAYER.format(mlp="hidden_states, _ = self.mlp(hidden_states)"),
)
#: the decoder-layer ``forward`` parameters the fused body passes on (in this order)
LAYER_PARAMS = (
    "self",
    "hidden_states",
    "attention_mask",
    "position_ids",
    "cache",
    "use_cache",
    "position_embeddings",
    "kwargs",
)

#: router ``forward`` bodies -> ``(scoring, renormalize)`` of ``flydsl_kernels.topk.moe_router``;
#: renormalize None means "the module's ``norm_topk_prob``"
ROUTER_FORMS = {
    _body("""
hidden_states = hidden_states.reshape(-1, self.hidden_dim)
router_logits = F.linear(hidden_states, self.weight)
router_probs = torch.nn.functional.softmax(router_logits, dtype=torch.float, dim=-1)
router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
if self.norm_topk_prob:
    router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
router_top_value = router_top_value.to(router_logits.dtype)
router_scores = router_top_value
return (router_logits, router_scores, router_indices)
"""): ("softmax", None, False),
    _body("""
hidden_states = hidden_states.reshape(-1, self.hidden_dim)
router_logits = F.linear(hidden_states, self.weight)
router_probs = torch.nn.functional.softmax(router_logits, dtype=torch.float, dim=-1)
router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
router_top_value = router_top_value.to(router_logits.dtype)
router_scores = router_top_value
return (router_logits, router_scores, router_indices)
"""): ("softmax", True, False),
    _body("""
router_logits = F.linear(hidden_states, self.weight, self.bias)
router_top_value, router_indices = torch.topk(router_logits, self.top_k, dim=-1)
router_scores = torch.nn.functional.softmax(router_top_value, dim=1, dtype=router_top_value.dtype)
return (router_logits, router_scores, router_indices)
"""): ("topk_softmax", False, True),
}


def norm_mode(module) -> str | None:
    """``"llama"`` / ``"aten"`` / ``"gemma"`` when ``module``'s forward is a known RMSNorm body."""
    cls = type(module)
    mode = NORM_FORMS.get(body_of(cls.forward))
    if mode == "gemma" and body_of(getattr(cls, "_norm", None)) != GEMMA_NORM_HELPER:
        return None
    return mode


def norm_eps(module) -> float | None:
    """The epsilon attribute the recognized body reads."""
    eps = getattr(module, "variance_epsilon", None)
    if eps is None:
        eps = getattr(module, "eps", None)
    return float(eps) if isinstance(eps, (int, float)) else None


def layer_form(module) -> str | None:
    """``"tensor"`` / ``"tuple"`` when ``module`` is a pre-norm decoder layer the fusion reproduces."""
    fwd = type(module).forward
    form = LAYER_FORMS.get(body_of(fwd))
    if form is None:
        return None
    try:
        params = tuple(inspect.signature(inspect.unwrap(fwd)).parameters)
    except (TypeError, ValueError):
        return None
    return form if params == LAYER_PARAMS else None


def router_form(module) -> tuple[str, bool | None, bool] | None:
    """``(scoring, renormalize, has_bias)`` when ``module``'s forward is a known router body."""
    return ROUTER_FORMS.get(body_of(type(module).forward))
