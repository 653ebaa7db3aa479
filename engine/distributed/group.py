"""The collectives of one tensor-parallel engine: the all-reduce after each row-parallel
linear (timed: what tensor parallelism costs), the vocab-parallel embedding lookup, the
logits gathered on rank 0, and the driver's broadcast of each step to the workers.

Steps travel as small Python objects (token ids, positions, block tables) over a gloo group
even on CUDA, as vLLM's CPU group does; every rank builds its tensors from them."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


class TPGroup:
    def __init__(self, rank: int, size: int, port: int, device: torch.device) -> None:
        self.rank, self.size, self.device = rank, size, device
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=size,
            timeout=timedelta(seconds=300),
        )
        self.cpu_group = dist.new_group(backend="gloo") if backend == "nccl" else None
        self.allreduce_s = 0.0  # time in all-reduces (rank 0's view), and how many
        self.num_allreduces = 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum a row-parallel linear's partial outputs over the ranks, in place."""
        t0 = time.perf_counter()
        dist.all_reduce(x)
        self.allreduce_s += time.perf_counter() - t0
        self.num_allreduces += 1
        return x

    def embed(self, weight: torch.Tensor, ids: torch.Tensor, start: int) -> torch.Tensor:
        """Rows of a vocab-parallel embedding: each rank looks up the ids in its slice,
        zeros for the others, and the sum over ranks is the full lookup (exact: one rank
        contributes each row)."""
        local = ids - start
        mine = (local >= 0) & (local < weight.shape[0])
        x = torch.nn.functional.embedding(local.clamp(0, weight.shape[0] - 1), weight)
        x = x * mine.unsqueeze(1).to(x.dtype)
        return self.all_reduce(x)

    def gather_logits(self, local: torch.Tensor, vocab_sizes: list[int]) -> torch.Tensor | None:
        """Rank 0 gets [rows, vocab] from every rank's vocab slice (padded to the widest slice
        for the collective); the others None."""
        width = max(vocab_sizes)
        if local.shape[1] < width:
            pad = local.new_full((local.shape[0], width - local.shape[1]), float("-inf"))
            local = torch.cat([local, pad], dim=1)
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(self.size)] if self.rank == 0 else None
        dist.gather(local, parts, dst=0)
        if parts is None:
            return None
        return torch.cat([p[:, :n] for p, n in zip(parts, vocab_sizes, strict=True)], dim=1)

    def broadcast(self, message: Any = None) -> Any:
        """Rank 0 sends `message`; every rank returns it."""
        box = [message]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        return box[0]

    def destroy(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
