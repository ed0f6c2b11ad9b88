"""The CPU reference backend: FlyIR executed with PyTorch, program by program.

This is the executable definition of the language's semantics, including
the rounding of bf16, fp16 and fp8.
"""

from .interpreter import ReferenceBackend, ReferenceExecutable

__all__ = ["ReferenceBackend", "ReferenceExecutable"]
