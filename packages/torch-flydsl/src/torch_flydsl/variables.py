"""torch-flydsl's ``FLYDSL_*`` environment variables (``flydsl_core.settings.declare``).

Listed by ``flydsl settings`` through the ``flydsl.settings`` entry point (pyproject.toml),
which loads this module on its own: it imports nothing but ``flydsl_core.settings``.
"""

from __future__ import annotations

from flydsl_core.settings import Var, declare

VARIABLES = declare(
    "torch-flydsl",
    Var("FLYDSL_TORCH", "flag", "1: `import torch_flydsl` enables the overrides", False),
    Var(
        "FLYDSL_TORCH_DEVICE",
        "choice",
        "the device enable() registers for when none is given",
        "cuda",
        choices=("cuda", "cpu", "rocm", "hip", "gpu"),
    ),
    Var(
        "FLYDSL_TORCH_PRECEDENCE",
        "choice",
        "ours: register over prior (e.g. torch's own) "
        "overrides; upstream: leave op groups that already have one",
        "ours",
        choices=("ours", "upstream"),
    ),
    Var(
        "FLYDSL_TORCH_ARCHS",
        "list",
        "GPU targets (names or aliases) the overrides and the "
        "compile pass run on (default gfx950); an unknown one is an error",
    ),
    Var(
        "FLYDSL_TORCH_CPU_TARGET",
        "str",
        "the CPU target of the CPU test backend: cpu-reference "
        "or cpu-interpret (or an alias); default: $FLYDSL_TARGET where it names a CPU target, "
        "else cpu-reference",
    ),
    Var(
        "FLYDSL_TORCH_GATES",
        "path",
        "the local gate table (default <cache dir>/torch_gates.json); "
        "set to a missing file, it is warned about and the shipped table is used",
    ),
)
