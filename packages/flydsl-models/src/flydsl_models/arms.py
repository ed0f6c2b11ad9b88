"""The arms an evaluation compares: FlyDSL ``off``, ``eager`` routes, ``compile``, and ``train``.

* ``off``: the model as transformers builds it (ATen, SDPA / eager attention), inside
  ``torch_flydsl.disabled()`` so nothing of FlyDSL runs even where ``FLYDSL_TORCH=1``
  enabled the overrides at import.
* ``eager``: FlyDSL on as a user turns it on, through torch-flydsl's public API:
  ``torch_flydsl.enable(device=...)`` (the eager overrides, SDPA's included),
  ``torch_flydsl.transformers.register()`` and ``patch(model)`` (RMSNorm with the
  attention residual add fused, MoE router, experts), and attention through
  ``model.set_attn_implementation("flydsl")``.
* ``compile``: the same overrides and patch plus ``torch.compile(model,
  backend="flydsl")`` for the linear layers (forward and, in training, backward
  graphs); attention stays the model's own call (SDPA), which the SDPA override
  sends to FlyDSL's FMHA from inside the compiled graph. The arm looks the backend up
  by name in torch's registry (``lookup_backend``: registered at import of
  torch_flydsl, or through the ``torch_dynamo_backends`` entry point); where it is
  not registered the arm is reported as unavailable, with that reason.
* ``train``: ``train.py``: optimizer steps FlyDSL off and on.

``Session`` holds the "FlyDSL on" state the arms share and undoes all of it.
"""

from __future__ import annotations

import dataclasses

ARMS = ("off", "eager", "compile", "train")
INFERENCE_ARMS = ("off", "eager", "compile")
BACKEND = "flydsl"


@dataclasses.dataclass
class Arm:
    name: str
    available: bool = True
    reason: str | None = None
    forward: object = None  # the callable the measurements call (the model, or its compiled form)
    patch: object = None  # the torch_flydsl.transformers.Patch, for eager and compile
    attention: str | None = None  # the attn_implementation the arm runs


def compile_backend() -> tuple[object | None, str | None]:
    """``(compiler function, None)`` when backend ``"flydsl"`` is registered, else ``(None, why)``.

    Only the two places a backend can come from are looked at (torch's
    registry after importing torch_flydsl, and the entry points): torch's
    ``list_backends`` would import every built-in backend first (seconds).
    """
    from importlib.metadata import entry_points

    from torch._dynamo.backends import registry

    import torch_flydsl  # noqa: F401  (a backend registered at import is registered now)

    if (
        BACKEND in registry._BACKENDS
        or BACKEND in entry_points(group="torch_dynamo_backends").names
    ):
        try:
            return registry.lookup_backend(BACKEND), None
        except Exception as e:  # a broken registration: report it, do not hide it
            return (
                None,
                f"torch.compile backend {BACKEND!r} failed to load: {type(e).__name__}: {e}",
            )
    return None, (
        f"torch.compile backend {BACKEND!r} is not registered: importing torch_flydsl registers "
        "none and no 'torch_dynamo_backends' entry point provides it (this torch-flydsl has no "
        "torch.compile backend yet)"
    )


def parse(arms: str | list[str]) -> list[str]:
    names = [a.strip() for a in (arms.split(",") if isinstance(arms, str) else arms) if a.strip()]
    bad = [a for a in names if a not in ARMS]
    if bad or not names:
        from .checks import UsageError

        raise UsageError(
            f"--arms {','.join(names)}: expected a comma-separated subset of {','.join(ARMS)}"
        )
    if "off" not in names:
        names.insert(0, "off")  # every arm is checked against off
    return sorted(dict.fromkeys(names), key=ARMS.index)


def compile_options(device_type: str) -> dict:
    """torch-flydsl's backend options for a model on ``device_type``.

    On the CPU the backend rewrites CPU nodes only when asked (its CPU test backend, the
    one the eager arm's routes run on); on a GPU its default (the device's own arch)
    holds. Inductor's FX graph cache is off: on a hit the pass does not run, and the
    arm's report of the nodes it rewrote (``compile:<op>`` in the stats) would read zero.
    """
    options: dict = {"inductor": {"fx_graph_cache": False}}
    if device_type == "cpu":
        options["device"] = "cpu"
    return options


def attention_implementation(model) -> str | None:
    """The model's ``attn_implementation`` (None for a module that is not a transformers model)."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return None
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return getattr(cfg, "_attn_implementation", None)


class Session:
    """The FlyDSL state the arms share: overrides enabled, the transformers patch, the
    attention implementation; ``off()`` and ``close()`` undo exactly what was done."""

    def __init__(self, model, *, mx_experts):
        self.model = model
        self.mx = mx_experts
        self.device = next(model.parameters()).device.type
        self.original_attention = attention_implementation(model)
        self.patch = None
        self.patched_attention: str | None = None  # the attn_implementation patch saw
        self.enabled = False
        self.prior: list[str] = []

    def _dev(self) -> str:
        return "cpu" if self.device == "cpu" else "cuda"

    def on(self, attention: str | None = None):
        """FlyDSL on, with the model's ``attn_implementation`` set to ``attention`` (None: the
        model's own) before ``patch``, so that the patch reports the attention the arm runs.
        Returns ``(patch, the attn_implementation in effect)``."""
        import torch_flydsl
        from torch_flydsl.transformers import patch, register

        if not self.enabled:
            dev = self._dev()
            self.prior = [g for g in torch_flydsl.OPS if torch_flydsl.enabled(g, dev)]
            torch_flydsl.enable(device=dev)  # the default groups
            torch_flydsl.enable(ops=["sdpa"], device=dev)  # opt-in: attention
            self.enabled = True
        register()  # names "flydsl" for set_attn_implementation
        attn = self.set_attention(attention or self.original_attention)
        if self.patch is not None and self.patched_attention != attn:
            self.patch.undo()  # patched under another attention: its report would be stale
            self.patch = None
        if self.patch is None:
            self.patch = patch(self.model, mx_experts=self.mx)
            self.patched_attention = attn
        return self.patch, attn

    def set_attention(self, name: str | None) -> str | None:
        """Switch the model's ``attn_implementation``; returns the one in effect (None when
        transformers refuses: the model keeps its own, and the report says so)."""
        if name is None or name == attention_implementation(self.model):
            return attention_implementation(self.model)
        try:
            self.model.set_attn_implementation(name)
        except (ValueError, KeyError, ImportError) as e:
            import logging

            logging.getLogger("flydsl_models").warning(
                "attn_implementation=%r refused: %s", name, e
            )
            return None
        return attention_implementation(self.model)

    def off(self):
        import torch_flydsl

        if self.patch is not None:
            self.patch.undo()
            self.patch = None
        if self.enabled:
            ours = [g for g in torch_flydsl.OPS if g not in self.prior]
            torch_flydsl.disable(ops=ours, device=self._dev())  # what was on before stays on
            self.enabled = False
        self.set_attention(self.original_attention)

    close = off


def prepare(name: str, model, session: Session) -> Arm:
    """Set the model up for inference arm ``name``."""
    from torch_flydsl.transformers import ATTENTION_IMPLEMENTATION

    if name == "off":
        session.off()
        return Arm("off", forward=model, attention=attention_implementation(model))
    if name == "compile":
        backend, why = compile_backend()
        if backend is None:
            return Arm("compile", available=False, reason=why)
    if name == "eager":
        p, attn = session.on(ATTENTION_IMPLEMENTATION)
        return Arm("eager", forward=model, patch=p, attention=attn)
    import torch

    # the model's own attention call: SDPA, which the SDPA override routes inside the graph
    p, attn = session.on()
    options = compile_options(session.device)
    return Arm(
        "compile",
        forward=torch.compile(model, backend=BACKEND, options=options),
        patch=p,
        attention=attn,
    )
