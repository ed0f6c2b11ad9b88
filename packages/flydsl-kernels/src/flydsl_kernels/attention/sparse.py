"""Block sparsity for the attention API: torch's ``BlockMask`` lists as a ``BlockSparse``, and
the checks of those lists before a launch (dtype, device, broadcast shape, coverage of the
sequence) and of the transposed lists the backward walks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from flydsl_core import cdiv


@dataclass(frozen=True)
class BlockSparse:
    """torch's ``BlockMask`` lists (``torch.nn.attention.flex_attention``), all int32:

    * ``kv_num_blocks (B, H, q_blocks)`` / ``kv_indices (B, H, q_blocks, kv_blocks)``: the key
      blocks each query block visits where the mask mod decides (partial blocks);
    * ``full_kv_*``: blocks visited with no mask mod (every element visible);
    * ``q_*`` / ``full_q_*``: the transposed lists (per key block), for the dK/dV backward;
    * ``block_size``: ``(Q, KV)`` elements per block (BlockMask's ``BLOCK_SIZE``).

    ``B`` and ``H`` may be 1 (broadcast). Blocks in neither list are skipped. ``H`` counts
    query heads.
    """

    kv_num_blocks: Any
    kv_indices: Any
    full_kv_num_blocks: Any = None
    full_kv_indices: Any = None
    q_num_blocks: Any = None
    q_indices: Any = None
    full_q_num_blocks: Any = None
    full_q_indices: Any = None
    block_size: tuple = (128, 128)

    @classmethod
    def from_block_mask(cls, bm) -> BlockSparse:
        """From a ``torch.nn.attention.flex_attention.BlockMask``."""
        bs = bm.BLOCK_SIZE
        return cls(
            bm.kv_num_blocks,
            bm.kv_indices,
            bm.full_kv_num_blocks,
            bm.full_kv_indices,
            bm.q_num_blocks,
            bm.q_indices,
            bm.full_q_num_blocks,
            bm.full_q_indices,
            (int(bs[0]), int(bs[1])) if isinstance(bs, tuple) else (int(bs), int(bs)),
        )

    def lists(self, B, H, transposed=False):
        """The four tensors a kernel takes, broadcast to ``(B, H, ...)`` (None where absent)."""
        names = (
            ("q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")
            if transposed
            else ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
        )
        out = []
        for n in names:
            t = getattr(self, n)
            out.append(None if t is None else t.expand(B, H, *t.shape[2:]))
        return tuple(out)


def check_block_sparse(bs, B, H, sq, sk, device) -> BlockSparse | None:
    """``block_sparse`` (None, a ``BlockSparse`` or a torch ``BlockMask``) as a ``BlockSparse``
    whose lists are int32 on ``device``, broadcastable to ``(B, H, ...)`` and cover ``sq`` / ``sk``."""
    if bs is None:
        return None
    if not isinstance(bs, BlockSparse):
        if hasattr(bs, "kv_num_blocks") and hasattr(bs, "BLOCK_SIZE"):
            bs = BlockSparse.from_block_mask(bs)
        else:
            raise TypeError("block_sparse must be a BlockSparse or a torch BlockMask")
    bq, bkv = bs.block_size
    for n, blk in (("Q", bq), ("KV", bkv)):
        if blk < 16 or blk % 16:
            raise ValueError(f"block_sparse: {n} block size must be a multiple of 16, got {blk}")
    nq, nk = cdiv(sq, bq), cdiv(sk, bkv)
    for name in (
        "kv_num_blocks",
        "kv_indices",
        "full_kv_num_blocks",
        "full_kv_indices",
        "q_num_blocks",
        "q_indices",
        "full_q_num_blocks",
        "full_q_indices",
    ):
        t = getattr(bs, name)
        if t is None:
            continue
        if t.dtype != torch.int32 or t.device != device:
            raise TypeError(f"block_sparse.{name} must be int32 on the inputs' device")
        if t.shape[0] not in (1, B) or t.shape[1] not in (1, H):
            raise ValueError(
                f"block_sparse.{name} must be (batch or 1, nheads or 1, ...), got {list(t.shape)}"
            )
        rows = nk if name.startswith(("q_", "full_q")) else nq
        if t.shape[2] < rows:
            raise ValueError(
                f"block_sparse.{name} covers {t.shape[2]} blocks, the sequence needs {rows}"
            )
    if (bs.full_kv_num_blocks is None) != (bs.full_kv_indices is None):
        raise ValueError("block_sparse: give full_kv_num_blocks and full_kv_indices together")
    return bs


def backward_lists(sparse, p) -> dict:
    """The backward's keyword lists of ``sparse`` for problem ``p`` (none without sparsity)."""
    if sparse is None:
        return {}
    if sparse.q_num_blocks is None or sparse.q_indices is None:
        raise NotImplementedError(
            "the block-sparse backward walks the transposed lists: give q_num_blocks and "
            "q_indices (a torch BlockMask has them)"
        )
    if (sparse.full_kv_num_blocks is None) != (sparse.full_q_num_blocks is None):
        raise ValueError("block_sparse: full_kv_* and full_q_* go together")
    return {
        "sparse_kv": sparse.lists(p.batch, p.heads_q),
        "sparse_q": sparse.lists(p.batch, p.heads_q, transposed=True),
    }
