"""End-to-end LLM evaluations with transformers: FlyDSL on versus off.

Evaluations check both correctness (logits and generations against the
ATen run) and speed, using only the public APIs of torch-flydsl.
"""

__version__ = "0.1.0"
