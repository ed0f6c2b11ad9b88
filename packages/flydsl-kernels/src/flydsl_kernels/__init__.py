"""The FlyDSL kernel library.

Kernel families (GEMM, grouped and MX GEMM, attention, RMSNorm, TopK), each
written in the FlyDSL language with a PyTorch reference, a function API over
torch tensors, and a config space with shipped defaults for gfx950. This
package knows nothing of PyTorch dispatch; that is torch-flydsl's job.

The families arrive with their own issues; today the package carries the
library's shared conventions only.
"""

__version__ = "0.1.0"

#: kernel families shipped so far, by name
FAMILIES: tuple[str, ...] = ()
