"""Turns a scheduler decision into flat tensors, runs the model over the paged KV cache and
samples the next token of every request whose prompt (or recompute) is fully computed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from engine.config import ModelConfig
from engine.core.request import Request, SamplingParams
from engine.core.scheduler import SchedulerOutput
from engine.cuda_graphs import DecodeGraphs
from engine.distributed.group import TPGroup
from engine.distributed.sharding import vocab_sizes
from engine.model import compiled_forward, triton_forward
from engine.model.llama import LlamaForCausalLM
from engine.ops import AttentionMetadata, KVCache, cpu_decode_attention
from engine.ops.attention import token_positions
from engine.ops.cpu_linear import PackedLinear
from engine.ops.fp8 import FP8, Fp8Linear
from engine.sampler import sample
from engine.spec_decode.rejection import verify


@dataclass(slots=True)
class StepInputs:
    """What a step computes, as plain lists (what a tensor-parallel driver sends its
    workers): q_lens[i] tokens of sequence i from position starts[i], its KV in blocks
    tables[i]; `tokens` concatenated."""

    tokens: list[int]
    starts: list[int]
    q_lens: list[int]
    tables: list[list[int]]


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
        attention_backend: str = "torch",
        tp: TPGroup | None = None,
    ) -> None:
        """kv_dtype: the cache's storage dtype (default: the model's); fp8 needs `kv_scales`,
        one (k_scale, v_scale) pair per layer (see engine/model/kv_scales.py). compile_decode: use
        the compiled CPU forward and decode attention where they apply (not fp8, not CUDA).
        attention_backend: "torch" (the ops in engine/ops) or "triton" (every step through
        engine/model/triton_forward.py; nothing compiled by torch then)."""
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
        self.triton = attention_backend == "triton"
        # Tensor parallelism: this rank's group (the model is this rank's shard); the eager
        # forward only (the compiled graphs have no collectives).
        self.tp = tp
        self.vocab_size = model_config.vocab_size
        compile_decode = compile_decode and not self.triton and tp is None
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
        self.graphs: DecodeGraphs | None = None  # set by the engine (cuda_graphs=True)

    @property
    def decode_attention(self) -> str:
        """What `enforce_eager` resolved to here: 'compiled' (ops/cpu_decode_attention.py)
        or 'eager' (asked for, CUDA, an fp8 cache, or no C++ compiler); 'triton' under the
        Triton backend."""
        if self.triton:
            return "triton"
        return "compiled" if self.fused_decode else "eager"

    @property
    def model_forward(self) -> str:
        """'compiled' (engine/model/compiled_forward.py: every step runs compiled
        layers) or 'eager' (asked for, CUDA, fp8 weights or cache, or no C++ compiler);
        'triton' (engine/model/triton_forward.py) under the Triton backend."""
        if self.triton:
            return "triton"
        return "compiled" if self.compiled_forward else "eager"

    @property
    def linears(self) -> str:
        """What the layers' linears run as: 'kernel' (engine/ops/cpu_kernels.cpp), 'onednn'
        (where that cannot be built), 'fp8 kernel' (e4m3 weights through the kernel), 'bf16
        kernel' (engine/ops/cpu_kernels_bf16.cpp), 'fp8' (e4m3 weights upcast, then torch's
        product), or 'torch' (CUDA, bf16 on CPUs without AVX512-BF16, SERVEBENCH_ONEDNN=0)."""
        linear = self.model.layers[0].mlp.down_proj
        if isinstance(linear, PackedLinear):
            if linear.weight_scale is not None:
                return "fp8 kernel"
            if linear.packed_weight.dtype == torch.bfloat16:
                return "bf16 kernel"
            return "kernel" if linear.native else "onednn"
        return "fp8" if isinstance(linear, Fp8Linear) else "torch"

    @torch.inference_mode()
    def execute(
        self, out: SchedulerOutput, block_tables: dict[str, list[int]]
    ) -> list[tuple[Request, list[int]]]:
        """Run one step; returns (request, new tokens) for requests that caught up: one token,
        or with speculative decoding the accepted drafts and one of the target's."""
        # Decodes (single-token queries) first: attention batches them without padding.
        items = sorted(out.scheduled, key=lambda item: item[1] != 1)
        ends = np.cumsum([n for _, n in items]) - 1
        rows: list[int] = []  # hidden-state rows to sample or verify from
        spec_rows: list[bool] = []
        plain: list[Request] = []
        spec: list[tuple[Request, list[int]]] = []
        for end, (r, n) in zip(ends, items, strict=True):
            s = len(r.spec_token_ids)  # a verified decode's rows: its token and each draft's
            if r.num_computed_tokens + n - s == r.num_tokens:
                rows += range(end - s, end + 1)
                spec_rows += [s > 0] * (s + 1)
                if s:
                    spec.append((r, r.spec_token_ids))
                else:
                    plain.append(r)
        logits = self.logits(self.step_inputs(items, block_tables), rows)
        if logits is None:
            return []
        if not spec:
            return [(r, [t]) for r, t in zip(plain, self.sample(logits, plain), strict=True)]
        is_spec = torch.tensor(spec_rows, device=self.device)
        results: list[tuple[Request, list[int]]] = []
        if plain:
            tokens = self.sample(logits[~is_spec], plain)
            results += [(r, [t]) for r, t in zip(plain, tokens, strict=True)]
        verified = verify(logits[is_spec], spec, self.generator)
        return results + [(r, t) for (r, _), t in zip(spec, verified, strict=True)]

    def logits(
        self, step: StepInputs, rows: list[int], num_layers: int | None = None, eager: bool = False
    ) -> torch.Tensor | None:
        """Run a step and the LM head on the hidden-state `rows` ([rows, vocab]; None for no
        rows); `num_layers`: the first ones only (a draft); `eager`: the backend's eager
        forward. Under tensor parallelism the driver first sends the step to the workers,
        every rank computes its share, and the driver gets the gathered logits."""
        if self.tp is not None and self.tp.rank == 0:
            self.tp.broadcast(("step", step, rows, num_layers, eager))
        input_ids, positions, meta = self.build_inputs(step)
        if eager:
            hidden = self.forward(input_ids, positions, meta, num_layers)
        else:
            hidden = self.run(input_ids, positions, meta, num_layers)
        if not rows:
            return None
        local = self.model.compute_logits(hidden[torch.as_tensor(rows, device=self.device)])
        if self.tp is None:
            return local
        return self.tp.gather_logits(local, vocab_sizes(self.vocab_size, self.tp.size))

    @torch.inference_mode()
    def serve_worker(self) -> None:
        """A tensor-parallel worker's loop: compute the driver's steps until told to stop."""
        assert self.tp is not None and self.tp.rank > 0
        while (message := self.tp.broadcast())[0] != "stop":
            self.logits(*message[1:])

    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        num_layers: int | None = None,
    ) -> torch.Tensor:
        """Hidden states [T, hidden] of a step through the fastest path that applies: CUDA
        graphs, the compiled CPU forward, or the backend's eager one; `num_layers`: the first
        ones only (a draft)."""
        decodes_only = meta.num_decode_tokens == len(input_ids)
        graphs = self.graphs
        if num_layers is None and graphs and decodes_only and graphs.supports(len(input_ids)):
            return graphs.run(input_ids, positions, meta)
        if self.triton or not self.compiled_forward:
            return self.forward(input_ids, positions, meta, num_layers)
        if decodes_only:
            mask = meta.decode_mask.view(len(input_ids), -1)
            return compiled_forward.decode_forward(
                self.model, input_ids, positions, self.kv_caches, meta.slot_mapping,
                meta.decode_block_tables, mask, num_layers,
            )  # fmt: skip
        return compiled_forward.step_forward(
            self.model, input_ids, positions, self.kv_caches, meta, num_layers
        )

    def sample(self, logits: torch.Tensor, reqs: list[Request]) -> list[int]:
        return sample(logits, reqs, self.generator)

    @torch.inference_mode()
    def prefill(
        self, token_ids: list[int], block_table: list[int], chunk_size: int
    ) -> torch.Tensor:
        """Hidden states [n, hidden] of every token of one sequence, computed through the paged
        cache `chunk_size` tokens at a time (each chunk reads the earlier ones from the cache,
        as chunked prefill does). For calibration, between engine steps."""
        hidden = []
        for step in prompt_chunks(token_ids, block_table, chunk_size):
            hidden.append(self.forward(*self.build_inputs(step)))
        return torch.cat(hidden)

    @torch.inference_mode()
    def prompt_logits(
        self, token_ids: list[int], block_table: list[int], chunk_size: int
    ) -> torch.Tensor:
        """Float32 logits [n, vocab] after every token of one sequence, chunked as `prefill`
        (and through every rank under tensor parallelism). For scoring, between steps."""
        out = []
        for step in prompt_chunks(token_ids, block_table, chunk_size):
            logits = self.logits(step, list(range(len(step.tokens))), eager=True)
            assert logits is not None
            out.append(logits.float())
        return torch.cat(out)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        num_layers: int | None = None,
    ) -> torch.Tensor:
        """The eager forward of this runner's attention backend."""
        args = (input_ids, positions, self.kv_caches, meta, num_layers)
        if self.triton:
            return triton_forward.forward(self.model, *args)
        return self.model(*args)

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

    def step_inputs(
        self, items: list[tuple[Request, int]], block_tables: dict[str, list[int]]
    ) -> StepInputs:
        """A step computing n tokens of each request from its first uncomputed one (draft
        tokens follow a request's own)."""
        tokens: list[int] = []
        for r, n in items:
            seq = r.token_ids + r.spec_token_ids if r.spec_token_ids else r.token_ids
            tokens += seq[r.num_computed_tokens : r.num_computed_tokens + n]
        return StepInputs(
            tokens,
            [r.num_computed_tokens for r, _ in items],
            [n for _, n in items],
            [block_tables[r.request_id] for r, _ in items],
        )

    def prepare_inputs(
        self, items: list[tuple[Request, int]], block_tables: dict[str, list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        return self.build_inputs(self.step_inputs(items, block_tables))

    def build_inputs(
        self, step: StepInputs
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Token ids, positions and attention metadata of a step, on the device."""
        bs = self.block_size
        start = np.array(step.starts, dtype=np.int64)
        q_len = np.array(step.q_lens, dtype=np.int64)
        max_blocks = int(-(-(start + q_len).max() // bs))
        table = np.zeros((len(step.starts), max_blocks), dtype=np.int64)
        for i, row in enumerate(step.tables):
            row = row[:max_blocks]
            table[i, : len(row)] = row
        dev = self.device
        pos = token_positions(start, q_len)
        meta = AttentionMetadata.build(start, q_len, table, bs, dev, self.fused_decode, pos)
        input_ids = torch.tensor(step.tokens, dtype=torch.int64, device=dev)
        return input_ids, torch.from_numpy(pos).to(dev), meta


def prompt_chunks(
    token_ids: list[int], block_table: list[int], chunk_size: int
) -> Iterator[StepInputs]:
    """One sequence's tokens as steps of `chunk_size` tokens, in order."""
    for start in range(0, len(token_ids), chunk_size):
        chunk = token_ids[start : start + chunk_size]
        yield StepInputs(chunk, [start], [len(chunk)], [block_table])
