"""The arms an evaluation compares: FlyDSL ``off``, ``eager`` routes, and ``compile``.

* ``off``: the model as transformers builds it (ATen, SDPA / eager attention).
* ``eager``: ``torch_flydsl.transformers.patch(model)``: RMSNorm (with the
  attention residual add fused), MoE router and experts in FlyDSL kernels.
* ``compile``: the eager routes plus ``torch.compile(model, backend="flydsl")``,
  torch-flydsl's compile backend, which routes the linear layers. The arm
  looks the backend up by name in torch's registry (``lookup_backend``:
  registered at import of torch_flydsl, or through the ``torch_dynamo_backends``
  entry point); where it is not registered the arm is reported as
  unavailable, with that reason, and nothing else stands in for it.
"""

from __future__ import annotations

import dataclasses

ARMS = ("off", "eager", "compile")
BACKEND = "flydsl"


@dataclasses.dataclass
class Arm:
    name: str
    available: bool = True
    reason: str | None = None
    forward: object = None  # the callable the measurements call (the model, or its compiled form)
    patch: object = None  # the torch_flydsl.transformers.Patch, for eager and compile


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
        raise ValueError(
            f"--arms {','.join(names)}: expected a comma-separated subset of {','.join(ARMS)}"
        )
    if "off" not in names:
        names.insert(0, "off")  # every arm is checked against off
    return sorted(dict.fromkeys(names), key=ARMS.index)


def prepare(name: str, model, *, patch_state: dict, mx_experts="auto") -> Arm:
    """Set the model up for arm ``name``; ``patch_state`` keeps the one Patch the arms share."""
    from torch_flydsl.transformers import patch

    if name == "off":
        p = patch_state.pop("patch", None)
        if p is not None:
            p.undo()
        return Arm("off", forward=model)
    if name == "compile":
        backend, why = compile_backend()
        if backend is None:
            return Arm("compile", available=False, reason=why)
    if "patch" not in patch_state:
        patch_state["patch"] = patch(model, mx_experts=mx_experts)
    p = patch_state["patch"]
    if name == "eager":
        return Arm("eager", forward=model, patch=p)
    import torch

    # on the CPU the backend rewrites CPU nodes only when asked (its CPU test backend, the one
    # the eager arm's routes run on); on a GPU its default (the device's own arch) holds
    cpu = next(model.parameters()).device.type == "cpu"
    # Inductor's FX graph cache off: on a hit the pass does not run, and the arm's report of
    # the nodes it rewrote (``compile:<op>`` in the stats) would read zero for a warm cache
    options = {"inductor": {"fx_graph_cache": False}}
    if cpu:
        options["device"] = "cpu"
    return Arm("compile", forward=torch.compile(model, backend=BACKEND, options=options), patch=p)
