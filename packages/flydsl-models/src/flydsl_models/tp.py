"""Tensor parallelism through transformers' ``tp_plan="auto"`` over ``torch.distributed``.

Run under torchrun (``torchrun --nproc-per-node N -m flydsl_models.eval --tp N``):
each process joins the default group (``gloo`` on the CPU, ``nccl`` on GPUs),
and transformers shards the model by its ``base_model_tp_plan`` while
loading it (``from_pretrained(..., distributed_config=DistributedConfig(
tp_plan="auto"))``, which needs accelerate). Loading is the only way
transformers applies a plan, so a model built from a config is first written
by rank 0 to a temporary checkpoint (identical seeded weights), which every
rank then loads sharded.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import torch


def init(tp: int, device: str) -> dict:
    """Join the process group torchrun set up; ``{"rank", "world", "backend", "device"}``."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != tp:
        raise SystemExit(
            f"--tp {tp} needs {tp} processes: run `torchrun --nproc-per-node {tp} -m "
            f"flydsl_models.eval --tp {tp} ...` (WORLD_SIZE is {world})"
        )
    backend = "nccl" if device.startswith("cuda") else "gloo"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = device
    if device.startswith("cuda"):
        torch.cuda.set_device(local)
        dev = f"cuda:{local}"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return {"rank": dist.get_rank(), "world": world, "backend": backend, "device": dev}


def shared_checkpoint(spec, dtype, device: str, seed: int, rank: int) -> tuple[str, bool]:
    """A checkpoint directory every rank can load: the spec's own, or one rank 0 writes now.

    Returns ``(path, temporary)``."""
    import torch.distributed as dist

    from .models import build

    if spec.source == "checkpoint":
        return spec.path, False
    box = [None]
    if rank == 0:
        path = tempfile.mkdtemp(prefix="flydsl-eval-tp-")
        model = build(spec, dtype, "cpu", seed)
        model.save_pretrained(path)
        del model
        box[0] = path
    dist.broadcast_object_list(box, src=0)
    return box[0], True


def load(path: str, dtype, tp: int):
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, distributed_config=DistributedConfig(tp_plan="auto", tp_size=tp)
    )
    return model.eval()


def load_single(path: str, dtype, device: str):
    """The same checkpoint in one process, unsharded (the TP reference)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def finish(path: str | None, temporary: bool, rank: int) -> None:
    import torch.distributed as dist

    barrier()
    if temporary and rank == 0 and path:
        shutil.rmtree(path, ignore_errors=True)
    if dist.is_initialized():
        dist.destroy_process_group()
