"""Turns a scheduler decision into flat tensors, runs the model over the paged KV cache and
samples the next token of every request whose prompt (or recompute) is fully computed."""

from __future__ import annotations

import numpy as np
import torch

from engine.config import ModelConfig
from engine.core.request import Request, SamplingParams
from engine.core.scheduler import SchedulerOutput
from engine.model import compiled_forward
from engine.model.llama import LlamaForCausalLM
from engine.ops import AttentionMetadata, KVCache, cpu_decode_attention
from engine.ops.fp8 import FP8
from engine.sampler import sample


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        model_config: ModelConfig,
        num_blocks: int,
        block_size: int,
        seed: int,
        kv_dtype: torch.dtype | None = None,
        kv_scales: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        compile_decode: bool = False,
    ) -> None:
        """kv_dtype: the cache's storage dtype (default: the model's); fp8 needs `kv_scales`,
        one (k_scale, v_scale) pair per layer (see engine/model/kv_scales.py). compile_decode: use
        the compiled CPU forward and decode attention where they apply (not fp8, not CUDA)."""
        self.model = model
        self.block_size = block_size
        p = model.embed_tokens.weight
        self.device, self.dtype = p.device, p.dtype
        kv_dtype = kv_dtype or self.dtype
        if (kv_dtype == FP8) != (kv_scales is not None):
            raise ValueError("an fp8 KV cache needs scales, and only an fp8 one takes them")
        shape = (model_config.num_kv_heads, num_blocks, block_size, model_config.head_dim)
        # Zeros, not empty: masked-out slots are still multiplied by 0, and 0 * NaN is NaN.
        self.kv_caches: list[KVCache] = []
        for layer in range(model_config.num_layers):
            k_scale, v_scale = kv_scales[layer] if kv_scales else (None, None)
            self.kv_caches.append(
                KVCache(
                    torch.zeros(shape, dtype=kv_dtype, device=self.device),
                    torch.zeros(shape, dtype=kv_dtype, device=self.device),
                    None if k_scale is None else k_scale.to(self.device),
                    None if v_scale is None else v_scale.to(self.device),
                )
            )
        self.generator = torch.Generator().manual_seed(seed)
        self.fused_decode = (
            compile_decode
            and self.device.type == "cpu"
            and kv_dtype != FP8
            and cpu_decode_attention.warm_up(
                self.kv_caches[0].k,
                model_config.num_heads // model_config.num_kv_heads,
                self.dtype,
                model_config.head_dim**-0.5,
            )
        )
        # The compiled forward (engine/model/compiled_forward.py) for every step; the eager
        # model with the compiled decode attention where it cannot run (its steps with prefill
        # use that attention too).
        self.compiled_forward = compile_decode and compiled_forward.warm_up(
            model, self.kv_caches[0], self._warm_up_step
        )

    @torch.inference_mode()
    def execute(
        self, out: SchedulerOutput, block_tables: dict[str, list[int]]
    ) -> list[tuple[Request, int]]:
        """Run one step; returns (request, sampled token) for requests that caught up."""
        # Decodes (single-token queries) first: attention batches them without padding.
        items = sorted(out.scheduled, key=lambda item: item[1] != 1)
        input_ids, positions, meta = self.prepare_inputs(items, block_tables)
        if not self.compiled_forward:
            hidden = self.model(input_ids, positions, self.kv_caches, meta)
        elif meta.num_decode_tokens == len(input_ids):
            mask = meta.decode_mask.view(len(input_ids), -1)
            hidden = compiled_forward.decode_forward(
                self.model, input_ids, positions, self.kv_caches, meta.slot_mapping,
                meta.decode_block_tables, mask,
            )  # fmt: skip
        else:
            hidden = compiled_forward.step_forward(
                self.model, input_ids, positions, self.kv_caches, meta
            )
        ends = np.cumsum([n for _, n in items]) - 1
        done = [i for i, (r, n) in enumerate(items) if r.num_computed_tokens + n == r.num_tokens]
        if not done:
            return []
        rows = torch.as_tensor(ends[done], device=self.device)
        logits = self.model.compute_logits(hidden[rows])
        reqs = [items[i][0] for i in done]
        return list(zip(reqs, self.sample(logits, reqs), strict=True))

    def sample(self, logits: torch.Tensor, reqs: list[Request]) -> list[int]:
        return sample(logits, reqs, self.generator)

    @torch.inference_mode()
    def prefill(
        self, token_ids: list[int], block_table: list[int], chunk_size: int
    ) -> torch.Tensor:
        """Hidden states [n, hidden] of every token of one sequence, computed through the paged
        cache `chunk_size` tokens at a time (each chunk reads the earlier ones from the cache,
        as chunked prefill does). For calibration and scoring, between engine steps."""
        req = Request("prefill", token_ids, SamplingParams(max_tokens=1))
        tables = {req.request_id: block_table}
        hidden = []
        while req.num_computed_tokens < len(token_ids):
            n = min(chunk_size, len(token_ids) - req.num_computed_tokens)
            input_ids, positions, meta = self.prepare_inputs([(req, n)], tables)
            hidden.append(self.model(input_ids, positions, self.kv_caches, meta))
            req.num_computed_tokens += n
        return torch.cat(hidden)

    def _warm_up_step(self) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """A step over a 4-block scratch cache for compiled_forward.warm_up: a decode beside a
        prefill chunk that continues its prompt (the masked prefill path)."""
        bs = self.block_size
        decode = Request("warm-decode", list(range(1, bs + 3)), SamplingParams(max_tokens=1))
        decode.num_computed_tokens = bs + 1
        chunk = Request("warm-chunk", list(range(2, bs + 6)), SamplingParams(max_tokens=1))
        chunk.num_computed_tokens = bs - 2
        tables = {"warm-decode": [3, 1], "warm-chunk": [0, 2]}
        return self.prepare_inputs([(decode, 1), (chunk, 6)], tables)

    def prepare_inputs(
        self, items: list[tuple[Request, int]], block_tables: dict[str, list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        bs = self.block_size
        starts = np.array([r.num_computed_tokens for r, _ in items], dtype=np.int64)
        q_lens = np.array([n for _, n in items], dtype=np.int64)
        seq_lens = starts + q_lens
        tokens: list[int] = []
        for r, n in items:
            tokens += r.token_ids[r.num_computed_tokens : r.num_computed_tokens + n]
        # Position of each token: its request's start + its offset within the chunk.
        owner = np.repeat(np.arange(len(items)), q_lens)
        first = np.cumsum(q_lens) - q_lens
        pos = starts[owner] + np.arange(len(tokens)) - first[owner]

        max_blocks = int(-(-seq_lens.max() // bs))
        tables = np.zeros((len(items), max_blocks), dtype=np.int64)
        for i, (r, _) in enumerate(items):
            table = block_tables[r.request_id][:max_blocks]
            tables[i, : len(table)] = table
        slots = tables[owner, pos // bs] * bs + pos % bs

        nd = int((q_lens == 1).sum())  # items are sorted: decodes come first
        dev = self.device

        def t(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(dev)

        # Decode: one query per request; key j is valid while j < seq_len.
        d_blocks = int(-(-seq_lens[:nd].max() // bs)) if nd else 0
        d_keys = np.arange(d_blocks * bs)
        d_mask = (d_keys[None, :] < seq_lens[:nd, None])[:, None, None, :]

        # Prefill: queries padded to the longest chunk; query i of a request sees keys up to
        # its own position (pad rows repeat the last real row, so no row is fully masked).
        pq = q_lens[nd:]
        p_blocks = int(-(-seq_lens[nd:].max() // bs)) if len(pq) else 0
        q_max = int(pq.max()) if len(pq) else 0
        qi = np.arange(q_max)
        real = qi[None, :] < pq[:, None]  # [Bp, Qp]
        p_first = np.cumsum(pq) - pq
        gather = np.where(real, p_first[:, None] + qi[None, :], 0)
        scatter = (np.arange(len(pq))[:, None] * q_max + qi[None, :])[real]
        p_mask = None
        if starts[nd:].any():
            q_pos = starts[nd:, None] + np.minimum(qi[None, :], pq[:, None] - 1)
            p_keys = np.arange(p_blocks * bs)
            p_mask = t((p_keys[None, None, :] <= q_pos[:, :, None])[:, None, :, :])

        meta = AttentionMetadata(
            slot_mapping=t(slots),
            num_decode_tokens=nd,
            decode_block_tables=t(tables[:nd, :d_blocks]),
            decode_mask=t(d_mask),
            decode_fused=self.fused_decode and cpu_decode_attention.usable(nd, d_blocks),
            prefill_block_tables=t(tables[nd:, :p_blocks]),
            prefill_gather=t(gather),
            prefill_scatter=t(scatter),
            prefill_mask=p_mask,
        )
        input_ids = torch.tensor(tokens, dtype=torch.int64, device=dev)
        return input_ids, t(pos), meta
