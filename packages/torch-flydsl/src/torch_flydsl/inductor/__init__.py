"""GEMMs and flex_attention under torch.compile: a post-grad Inductor pass that rewrites them
into FlyDSL kernels (flex_attention's HOP nodes: ``torch_flydsl.flex.compile``).

Two ways in::

    model = torch.compile(model, backend="flydsl")                 # entry point: no import
    model = torch.compile(model, backend="flydsl", options={"ops": ["gemm"], "gates": "open"})

    import torch_flydsl.inductor as fi
    fi.install(options={...})      # keep backend="inductor": our pass joins Inductor's
    model = torch.compile(model)   # post_grad_custom_post_pass (after any pass already there)
    fi.uninstall()

``backend="flydsl"`` is registered through the ``torch_dynamo_backends`` entry point of the
torch-flydsl distribution (pyproject.toml), so Dynamo finds it by name. It is Inductor
(``compile_fx``) with ``FlyDSLPass`` added to ``post_grad_custom_post_pass`` and the mode's
Inductor options (``torch._inductor.list_mode_options``); ``options=`` are ours
(``settings.py``), and ``options["inductor"]`` passes Inductor config on.

``FlyDSLPass`` is a ``CustomGraphPass``; its ``uuid()`` covers FlyDSL's compiler
fingerprint, the kernels' and torch_flydsl's sources, the settings and the gate table, so
Inductor's FX graph cache never serves a graph compiled under other conditions.
"""

from __future__ import annotations

import logging

from torch._inductor import custom_graph_pass as _cgp
from torch._inductor.custom_graph_pass import CustomGraphPass

# registers flydsl::flex_attention(_backward): a graph served from Inductor's FX graph cache
# calls them without running the pass that would import them
from ..flex import compile as _flex_compile
from .settings import Settings

log = logging.getLogger("torch_flydsl")

__all__ = ["FlyDSLPass", "Settings", "backend", "install", "installed", "uninstall"]


class FlyDSLPass(CustomGraphPass):
    """The post-grad pass (``graph_pass.rewrite``) with its settings."""

    def __init__(self, settings: Settings | None = None):
        self.settings = settings or Settings.from_options()
        self._uuid = None

    def __call__(self, graph) -> None:
        from .graph_pass import rewrite

        n = rewrite(graph, self.settings)
        if n:
            log.info("torch_flydsl: rewrote %d GEMM node(s) into FlyDSL kernels", n)
        from .graph_pass import CompileContext, splice

        n = _flex_compile.rewrite(graph, CompileContext(self.settings), splice)
        if n:
            log.info("torch_flydsl: rewrote %d flex_attention node(s) into FlyDSL kernels", n)

    def uuid(self):
        if self._uuid is None:
            from .graph_pass import fingerprint

            self._uuid = f"torch_flydsl:{fingerprint(self.settings)}"
        return self._uuid

    def __repr__(self) -> str:
        return f"FlyDSLPass({self.settings.key()})"


#: whether Inductor's custom-pass options take a sequence of passes (newer torch); before,
#: they take one pass, and several go in as one ``_Chain``
_SEQUENCES = hasattr(_cgp, "get_custom_graph_passes")


class _Chain(CustomGraphPass):
    """Several passes as one, for a torch whose options take one pass: each in turn."""

    def __init__(self, passes):
        self.passes = tuple(passes)

    def __call__(self, graph) -> None:
        for p in self.passes:
            p(graph)

    def uuid(self):
        return repr(tuple(p.uuid() if hasattr(p, "uuid") else repr(p) for p in self.passes))


def _passes(existing) -> tuple:
    """``existing`` (None, one pass, a sequence, or a ``_Chain``) as a tuple of passes."""
    if existing is None:
        return ()
    if isinstance(existing, _Chain):
        return existing.passes
    return tuple(existing) if isinstance(existing, (list, tuple)) else (existing,)


def _with(existing, ours: FlyDSLPass | None):
    """``existing`` without any FlyDSLPass, and with ``ours`` appended unless it is None; in
    the form the config takes (None, one pass, or a tuple; a ``_Chain`` on older torch)."""
    passes = [p for p in _passes(existing) if not isinstance(p, FlyDSLPass)]
    if ours is not None:
        passes.append(ours)
    if not passes:
        return None
    if len(passes) == 1:
        return passes[0]
    return tuple(passes) if _SEQUENCES else _Chain(passes)


def install(options=None) -> FlyDSLPass:
    """Add ``FlyDSLPass(options)`` to Inductor's ``post_grad_custom_post_pass``, after any pass
    already there (a previous FlyDSLPass is replaced). Returns the pass."""
    from torch._inductor import config

    ours = FlyDSLPass(Settings.from_options(options))
    config.post_grad_custom_post_pass = _with(config.post_grad_custom_post_pass, ours)
    return ours


def uninstall() -> None:
    """Remove FlyDSL's pass from ``post_grad_custom_post_pass``; other passes stay."""
    from torch._inductor import config

    config.post_grad_custom_post_pass = _with(config.post_grad_custom_post_pass, None)


def installed() -> bool:
    from torch._inductor import config

    return any(isinstance(p, FlyDSLPass) for p in _passes(config.post_grad_custom_post_pass))


def backend(gm, example_inputs, *, mode=None, options=None):
    """The ``flydsl`` Dynamo backend: Inductor with FlyDSL's pass (the module docstring)."""
    import torch
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx

    settings = Settings.from_options(options, mode)
    patches = {}
    if mode not in (None, "default"):
        patches.update(torch._inductor.list_mode_options(mode))
    patches.update(settings.inductor)
    patches["post_grad_custom_post_pass"] = _with(
        patches.get("post_grad_custom_post_pass", config.post_grad_custom_post_pass),
        FlyDSLPass(settings),
    )
    return compile_fx(gm, example_inputs, config_patches=patches)
