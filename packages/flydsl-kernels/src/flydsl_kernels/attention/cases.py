"""Report cases of the attention family (filled in below)."""

from __future__ import annotations

import torch

from .. import registry

#: (rtol, atol) of outputs against the float64 reference, by input dtype
TOLERANCE = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (5e-3, 5e-3)}


def _cases():
    return iter(())


FAMILY = registry.Family(
    "attention", _cases, description="flash attention: fwd, bwd, varlen, paged decode"
)
