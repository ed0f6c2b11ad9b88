"""The ``offs`` rule of the grouped GEMMs (``gemm.grouped_mm``, ``mx.mx_grouped_mm``).

``offs`` is what ``torch._grouped_mm`` takes: a 1-D int32 tensor of ``G``
cumulative group ends along the ragged dimension (rows, columns or K), so
group ``g`` spans ``offs[g-1]:offs[g]`` (``0:offs[0]`` for the first). Its
values must be non-negative, non-decreasing and at most the ragged
dimension's extent; elements past ``offs[-1]`` belong to no group (torch
leaves those output rows unwritten, and so do we).

The type, dtype, shape, device and length are checked on the host for
free. The values are checked on the host where that costs no device sync
(``offs`` on the CPU, or a form that syncs anyway): a broken rule is a
``ValueError`` naming the first offending entry. A GPU ``offs`` is not read
on the host (that would stall the stream, and breaks CUDA-graph capture);
there the kernels clamp every group's bounds to the operand
(``gemm.kernels.group_schedule``), so hostile values never make a kernel
touch memory outside its operands; what such a call computes is then as
unspecified as torch's answer for it.
"""

from __future__ import annotations

import torch

RULE = "offs holds non-negative, non-decreasing int32 cumulative group ends"


def check_offs(
    offs,
    *,
    groups: int | None,
    extent: int,
    dim: str,
    device,
    what: str,
    multiple: int = 1,
    values: bool | None = None,
) -> torch.Tensor:
    """``offs`` made contiguous, after the checks above.

    ``groups``: the group count the other operands imply (None: any);
    ``extent``: the size of the ragged dimension ``dim``; ``multiple``: every
    value must be a multiple of it (MX ragged K: 32). ``values`` forces the value
    checks on (True, a sync on a GPU) or off; None checks them where ``offs`` is
    on the CPU.
    """
    if offs is None:
        raise ValueError(f"{what}: this form needs offs ({RULE}, one per group)")
    if not isinstance(offs, torch.Tensor):
        raise TypeError(f"{what}: offs must be a 1-D int32 tensor, got {type(offs).__name__}")
    if offs.dtype != torch.int32:
        raise TypeError(f"{what}: offs must be a 1-D int32 tensor, got {offs.dtype}")
    if offs.dim() != 1:
        raise ValueError(f"{what}: offs must be a 1-D int32 tensor, got {offs.dim()}-D")
    if groups is not None and offs.shape[0] != groups:
        raise ValueError(
            f"{what}: the operands have {groups} groups but offs has {offs.shape[0]} entries"
        )
    if offs.device != device:
        raise ValueError(f"{what}: offs is on {offs.device}, the operands on {device}")
    offs = offs.contiguous()
    if values is None:
        values = offs.device.type == "cpu"
    if values and offs.numel():
        _check_values(offs, extent, dim, what, multiple)
    return offs


def _first(mask: torch.Tensor) -> int | None:
    hit = mask.nonzero()
    return int(hit[0, 0]) if hit.numel() else None


def _check_values(offs: torch.Tensor, extent: int, dim: str, what: str, multiple: int) -> None:
    o = offs.cpu().long()
    i = _first(o < 0)
    if i is not None:
        raise ValueError(f"{what}: {RULE}; offs[{i}] = {int(o[i])} is negative")
    i = _first(o[1:] < o[:-1])
    if i is not None:
        raise ValueError(
            f"{what}: {RULE}; offs[{i + 1}] = {int(o[i + 1])} is below offs[{i}] = {int(o[i])}"
        )
    if int(o[-1]) > extent:
        raise ValueError(
            f"{what}: {RULE} up to the {dim} extent {extent}; offs[{o.numel() - 1}] = "
            f"{int(o[-1])} is past it"
        )
    if multiple > 1:
        i = _first(o % multiple != 0)
        if i is not None:
            raise ValueError(
                f"{what} ragged K (2-D x 2-D) needs every offs to be a multiple of the MX "
                f"block {multiple} (scales are per {multiple} elements along K); "
                f"offs[{i}] = {int(o[i])}"
            )
