"""Compilation of FlyDSL kernels: lowering to Triton, compiling, and reporting resources."""
