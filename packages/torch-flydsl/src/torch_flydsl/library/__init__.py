"""Every custom op torch_flydsl defines, in one namespace: ``flydsl::``.

======================  ===========================================================  ==========
op                      what                                                         module
======================  ===========================================================  ==========
``gemm``, ``swiglu``    the dense GEMMs the torch.compile pass emits (epilogues,     ``gemm``
                        SwiGLU); ``triton_op``s
``grouped_mm``          ``torch._grouped_mm`` (all four forms), the same             ``gemm``
``mx_mm``,              MX GEMMs (``torch._scaled_mm`` / ``_scaled_grouped_mm``),    ``gemm``
``mx_grouped_mm``       the same
``<op>_cpu``            opaque twins of the five above for CPU graphs                ``gemm``
``hf_rms_norm``,        the transformers routes' launches (``custom_op``s: opaque    ``hf``
``hf_add_rms_norm``,    under torch.compile, named in profiles, a kernel error
``hf_moe_router``,      answered by the route's PyTorch formula)
``hf_grouped_mm``,
``hf_mx_grouped_mm``,
``hf_attention``,       (``hf_attention``: the ``"flydsl"`` attention implementation,
``..._backward``        differentiable through ``hf_attention_backward``)
``flex_attention``,     flex_attention's HOP rewrite (registered by                  ``flex``
``..._backward``        ``torch_flydsl.flex.compile``, next to the rewrite)
======================  ===========================================================  ==========

Importing this package registers the ``gemm`` and ``hf`` ops; it compiles nothing.
"""

from __future__ import annotations

from . import gemm, hf
from .gemm import NAMESPACE

__all__ = ["NAMESPACE", "gemm", "hf"]
