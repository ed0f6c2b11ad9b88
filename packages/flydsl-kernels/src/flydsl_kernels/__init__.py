"""The FlyDSL kernel library.

Kernel families (RMSNorm, TopK and the MoE router, dense and grouped GEMM, MX GEMMs,
attention with flash-attn's API), each
written in the FlyDSL language with a PyTorch reference, a function API over
torch tensors, and a config space with shipped defaults for gfx950. This
package knows nothing of PyTorch dispatch; that is torch-flydsl's job.

Each family is a subpackage exposing ``FAMILY`` (see ``registry.py``);
``families()`` imports them lazily.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"
__all__ = ["FAMILIES", "families"]

#: kernel families shipped so far, by name (subpackages of this package)
FAMILIES: tuple[str, ...] = ("rmsnorm", "topk", "gemm", "mx", "attention")


def families():
    """``{name: Family}`` for every shipped family."""
    return {n: importlib.import_module(f"{__name__}.{n}").FAMILY for n in FAMILIES}
