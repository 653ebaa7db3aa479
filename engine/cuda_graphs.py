"""CUDA graphs of decode-only steps under the Triton backend, one per batch-size bucket (as
nano-vllm and vLLM capture them): a decode step of a small model on a GPU is mostly kernel
launches (30 layers x ~10 kernels), which a graph replays in one. Off by default
(`cuda_graphs=True`) until benchmarks/gpu_check.sh has measured it on a real GPU.

A graph replays fixed addresses and shapes, so a step's inputs are copied into static
buffers sized for the bucket: rows past the real batch are padding (slot -1, which the
cache-write kernel skips; one key of block 0 to attend to; outputs thrown away), block tables
are padded to the longest context, and the attention kernel reads each sequence's length from
memory, so nothing else depends on the step. `capture=False` runs the same buffers eagerly:
how the padding is tested without a GPU."""

from __future__ import annotations

import bisect

import torch

from engine.model import triton_forward
from engine.model.llama import LlamaForCausalLM
from engine.ops import AttentionMetadata, KVCache


def buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to max_num_seqs (vLLM's capture sizes)."""
    sizes = [b for b in (1, 2, 4) if b < max_num_seqs] + list(range(8, max_num_seqs + 8, 8))
    return sorted({min(b, max_num_seqs) for b in sizes})


class DecodeGraphs:
    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[KVCache],
        max_num_seqs: int,
        max_blocks: int,
        capture: bool = True,
    ) -> None:
        self.model, self.kv_caches = model, kv_caches
        self.sizes = buckets(max_num_seqs)
        device = model.embed_tokens.weight.device
        n = self.sizes[-1]

        def zeros(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids, self.positions, self.slots = zeros(n), zeros(n), zeros(n)
        # int32, as AttentionMetadata.build gives them to the kernel
        self.block_tables = zeros(n, max_blocks, dtype=torch.int32)
        self.seq_lens = zeros(n, dtype=torch.int32)
        self.query_start = torch.arange(n + 1, dtype=torch.int32, device=device)
        # The rotary table is read by address in a graph: `prepare` must not replace it after.
        assert model.cos_sin is not None, "call prepare() first"
        self._cos_sin_ptr = model.cos_sin.data_ptr()
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture_all()

    def _meta(self, b: int) -> AttentionMetadata:
        """The Triton forward reads slots, block tables, lengths and query starts only."""
        empty = self.slots[:0]
        return AttentionMetadata(
            slot_mapping=self.slots[:b], num_decode_tokens=b, decode_block_tables=empty,
            decode_mask=empty, decode_fused=False, prefill_block_tables=empty,
            prefill_gather=empty, prefill_scatter=empty, prefill_mask=None,
            block_tables=self.block_tables[:b], seq_lens=self.seq_lens[:b],
            query_start=self.query_start[: b + 1],
        )  # fmt: skip

    def _forward(self, b: int) -> torch.Tensor:
        return triton_forward.forward(
            self.model, self.input_ids[:b], self.positions[:b], self.kv_caches, self._meta(b)
        )

    @torch.inference_mode()
    def _capture_all(self) -> None:
        self._pad(0)  # every row a padding row while capturing: no cache slot is written
        pool = torch.cuda.graph_pool_handle()
        for b in reversed(self.sizes):  # the largest first: the others fit in its memory
            self._forward(b)  # warm-up: Triton compiles, cuBLAS picks its kernels
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[b] = self._forward(b)
            self.graphs[b] = graph
        torch.cuda.synchronize()

    def _pad(self, b: int) -> None:
        self.slots[b:] = -1
        self.seq_lens[b:] = 1
        self.input_ids[b:] = 0
        self.positions[b:] = 0
        self.block_tables[b:] = 0

    def supports(self, batch: int) -> bool:
        return batch <= self.sizes[-1]

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Hidden states [B, hidden] of a decode-only step of B <= the largest bucket."""
        b = len(input_ids)
        assert self.model.cos_sin is not None
        if self.model.cos_sin.data_ptr() != self._cos_sin_ptr:
            raise RuntimeError("the rotary table was rebuilt after the CUDA graphs captured it")
        size = self.sizes[bisect.bisect_left(self.sizes, b)]
        self.input_ids[:b] = input_ids
        self.positions[:b] = positions
        self.slots[:b] = meta.slot_mapping
        self.seq_lens[:b] = meta.seq_lens
        nb = meta.block_tables.shape[1]
        self.block_tables[:b, :nb] = meta.block_tables
        self._pad(b)
        if size in self.graphs:
            self.graphs[size].replay()
            return self.outputs[size][:b]
        return self._forward(size)[:b]
