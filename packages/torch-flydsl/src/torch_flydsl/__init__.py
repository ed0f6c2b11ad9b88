"""PyTorch integration of FlyDSL kernels.

Eager overrides of the ops users already call (RMSNorm, TopK), GEMMs under
``torch.compile`` and a ``flex_attention`` backend. Importing this package
compiles nothing and touches no GPU.
"""

__version__ = "0.1.0"
