"""`LLMEngine` (add_request / step / abort) and the offline `LLM.generate`, shaped like vLLM's."""

from __future__ import annotations

import functools
import itertools
import json
import time
from pathlib import Path
from typing import Any, NamedTuple, TextIO

import torch

from engine.config import EngineConfig
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import FinishReason, Request, RequestOutput, SamplingParams
from engine.core.scheduler import Scheduler
from engine.model.kv_scales import calibrate_kv_scales, calibration_token_ids
from engine.model.loader import LoadedModel, load_model
from engine.model.tokenizer import IncrementalDetokenizer, Tokenizer
from engine.ops.cpu_linear import onednn_packing_enabled
from engine.ops.fp8 import FP8
from engine.runner import ModelRunner

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "fp8": FP8}


class ModelKey(NamedTuple):
    """What makes two engines' weights the same: they share one loaded model."""

    model: str
    dtype: torch.dtype
    device: torch.device
    seed: int
    quantization: str | None
    pack: bool  # oneDNN-prepacked CPU linears


@functools.lru_cache(maxsize=2)
def _load_shared(key: ModelKey) -> LoadedModel:
    """Weights are read-only to the engine, so engines in one process share them: a benchmark
    or test that compares settings loads the model once."""
    loaded = load_model(key.model, key.dtype, key.device, key.seed)
    if key.quantization == "fp8":
        loaded.model.quantize_fp8()
    if key.pack:  # fp8 is asked for to save memory: no packed copy of a tied LM head then
        loaded.model.pack_for_cpu(tied_head=key.quantization != "fp8")
    return loaded


@functools.lru_cache(maxsize=4)
def _kv_scales(key: ModelKey) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loaded = _load_shared(key)
    ids = calibration_token_ids(loaded.tokenizer, loaded.config.vocab_size)
    return calibrate_kv_scales(loaded.model, loaded.config, ids, block_size=16)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def cpu_has_native_bf16() -> bool:
    """x86 AVX512-BF16 or AMX, or ARM BF16: the CPUs where oneDNN runs bf16 matmuls natively."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags = set(line.split(":", 1)[1].split())
            break
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def resolve_dtype(dtype: str, device: torch.device) -> str:
    """'auto' is bfloat16 on CUDA and on CPUs with native bf16 math, float32 on the others,
    where bf16 matmuls fall back to a path hundreds of times slower (README, "Measured design
    choices")."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if device.type == "cuda" or cpu_has_native_bf16() else "float32"


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        config.dtype = resolve_dtype(config.dtype, self.device)  # recorded as resolved
        dtype = DTYPES[config.dtype]
        torch.manual_seed(config.seed)
        model_key = ModelKey(
            config.model,
            dtype,
            self.device,
            config.seed,
            config.quantization,
            onednn_packing_enabled(dtype, self.device),
        )
        loaded = _load_shared(model_key)
        cache = config.cache
        if cache.kv_cache_dtype == "auto":
            cache.kv_cache_dtype = config.dtype  # recorded as resolved
        kv_dtype = DTYPES[cache.kv_cache_dtype]
        self.model_config = loaded.config
        self.tokenizer: Tokenizer | None = loaded.tokenizer
        self.model_source = loaded.source
        if (config.max_model_len or 0) > loaded.config.max_position_embeddings:
            raise ValueError(
                f"max_model_len={config.max_model_len} exceeds the model's context length "
                f"{loaded.config.max_position_embeddings}"
            )
        config.resolve(loaded.config, kv_dtype.itemsize)
        assert config.max_model_len is not None and config.cache.num_kv_blocks is not None
        self.max_model_len = config.max_model_len
        loaded.model.prepare(self.max_model_len)
        self.kv = KVCacheManager(
            config.cache.num_kv_blocks, config.cache.block_size, cache.enable_prefix_caching
        )
        self.scheduler = Scheduler(config.scheduler, self.kv, self.max_model_len)
        self.runner = ModelRunner(
            loaded.model,
            loaded.config,
            self.kv.num_blocks,
            cache.block_size,
            config.seed,
            kv_dtype,
            _kv_scales(model_key) if kv_dtype == FP8 else None,
            compile_decode=not config.enforce_eager,
        )
        self.weight_bytes = loaded.model.weight_bytes()
        self.weight_bytes_bf16 = loaded.model.weight_bytes(torch.bfloat16)
        self.eos_token_ids = loaded.config.eos_token_ids or (
            loaded.tokenizer.eos_token_ids if loaded.tokenizer else ()
        )
        self.requests: dict[str, Request] = {}
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._counters = {"steps": 0, "prompt_tokens": 0, "generation_tokens": 0}
        self._last_step = {"num_tokens": 0, "num_seqs": 0, "time_s": 0.0}
        self._step_log: TextIO | None = None
        self._step_outputs: list[RequestOutput] = []

    # ---- requests ----------------------------------------------------------------------

    @property
    def decode_attention(self) -> str:
        """What `enforce_eager` resolved to here: 'compiled' (ops/cpu_decode_attention.py)
        or 'eager' (asked for, CUDA, an fp8 cache, or no C++ compiler)."""
        return "compiled" if self.runner.fused_decode else "eager"

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
    ) -> Request:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        req = self.make_request(request_id, prompt, params, arrival_time)
        self.add(req)
        return req

    def make_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
    ) -> Request:
        """Tokenize and validate without touching engine state: safe from another thread
        while a step runs (the async engine validates on the event loop)."""
        params = params or SamplingParams()
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"model {self.config.model!r} has no tokenizer: pass token ids")
            text: str | None = prompt
            ids = self.tokenizer.encode(prompt)
        else:
            text, ids = None, list(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        vocab = self.model_config.vocab_size
        if any(not isinstance(i, int) or not 0 <= i < vocab for i in ids):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        self.scheduler.check_fits(len(ids), params.max_tokens)
        return Request(request_id, ids, params, text, arrival_time, self.eos_token_ids)

    def add(self, req: Request) -> None:
        """Queue a request built by `make_request`."""
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        self.requests[req.request_id] = req
        if self.tokenizer is not None:
            detok = IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids)
            self._detokenizers[req.request_id] = detok
        self.scheduler.add(req)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        req = self.requests.get(request_id)
        if req is None or req.is_finished:
            return None
        self._finish(req, FinishReason.ABORT)
        return RequestOutput.of(req, [])

    def fail_running(self, error: str) -> list[RequestOutput]:
        """After a step raised: the requests it had already finished get their final outputs
        (their clients would wait forever otherwise); the running ones, whose state is now
        unknown, end with the error."""
        outputs = [o for o in self._step_outputs if o.finished]
        self._step_outputs = []
        for req in list(self.scheduler.running):
            req.error = error
            self._finish(req, FinishReason.ERROR, flush=False)
            outputs.append(RequestOutput.of(req, []))
        return outputs

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- one iteration -----------------------------------------------------------------

    def log_steps(self, path: str | Path | None) -> None:
        """Append one JSON line per step to `path` (None: stop): when it started on the
        perf_counter clock (shared by processes on one machine), how long it took, what it
        computed, and the queues and KV blocks after it. A few microseconds a step."""
        if self._step_log is not None:
            self._step_log.close()
        self._step_log = None if path is None else open(path, "a", buffering=1)  # noqa: SIM115

    def step(self) -> list[RequestOutput]:
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        t0 = time.perf_counter()
        if self._step_log is not None:  # before advance(): what each request is doing now
            decode = sum(n for r, n in out.scheduled if r.num_computed_tokens == r.num_tokens - 1)
        sampled = self.runner.execute(out, self.kv.block_tables)
        self.scheduler.advance(out)
        now = time.monotonic()
        outputs: list[RequestOutput] = []
        self._step_outputs = outputs  # what fail_running delivers if the loop below raises
        for req, token in sampled:
            req.token_ids.append(token)
            if req.metrics.first_token_time is None:
                req.metrics.first_token_time = now
                self._counters["prompt_tokens"] += req.num_prompt_tokens
            self._process_token(req, token)
            outputs.append(RequestOutput.of(req, [token]))
        self._counters["steps"] += 1
        self._counters["generation_tokens"] += len(sampled)
        self._last_step = {
            "num_tokens": out.num_batched_tokens,
            "num_seqs": len(out.scheduled),
            "time_s": time.perf_counter() - t0,
        }
        if self._step_log is not None:
            line = {
                "t": t0,
                "dur_s": self._last_step["time_s"],
                "prefill_tokens": out.num_batched_tokens - decode,
                "decode_tokens": decode,
                "seqs": len(out.scheduled),
                "running": len(self.scheduler.running),
                "waiting": self.scheduler.num_waiting,
                "kv_blocks_used": self.kv.num_used_blocks,
                "preempted": len(out.preempted),
                "cached_tokens": out.cached_tokens,  # admitted from the prefix cache, not computed
                "prefix_cache_hit_rate": self._hit_rate(),
            }
            self._step_log.write(json.dumps(line) + "\n")
        self._step_outputs = []
        return outputs

    def _process_token(self, req: Request, token: int) -> None:
        params = req.params
        detok = self._detokenizers.get(req.request_id)
        if detok is not None:
            before = len(req.output_text)
            req.output_text += detok.step(req.token_ids)
            for stop in params.stop:
                idx = req.output_text.find(stop, max(0, before - len(stop) + 1))
                if idx >= 0:
                    end = idx + len(stop) if params.include_stop_str_in_output else idx
                    req.output_text = req.output_text[:end]
                    req.stop_reason = stop
                    self._finish(req, FinishReason.STOP, flush=False)
                    return
        if token in req.stop_token_ids:
            req.stop_reason = token if token in params.stop_token_ids else None
            self._finish(req, FinishReason.STOP)
        elif req.num_output_tokens >= params.max_tokens or req.num_tokens >= self.max_model_len:
            self._finish(req, FinishReason.LENGTH)

    def _finish(self, req: Request, reason: FinishReason, flush: bool = True) -> None:
        self.scheduler.finish(req, reason)
        detok = self._detokenizers.pop(req.request_id, None)
        if detok is not None and flush:
            req.output_text += detok.step(req.token_ids, final=True)
        del self.requests[req.request_id]

    @torch.inference_mode()
    def prompt_logits(self, token_ids: list[int], chunk_size: int | None = None) -> torch.Tensor:
        """Float32 logits [n, vocab] of the next token after each of `token_ids`, computed
        through this engine's paged KV cache (its dtype, its scales) in chunks of the step
        budget, as a prompt would be: for perplexity and divergence between settings. Uses free
        KV blocks; call it between steps."""
        n = len(token_ids)
        if not 0 < n <= self.max_model_len:
            raise ValueError(f"need 1..{self.max_model_len} tokens, got {n}")
        chunk = chunk_size or self.config.scheduler.max_num_batched_tokens or n
        rid = "\0prompt_logits"
        if not self.kv.allocate_slots(rid, n):
            raise RuntimeError(f"{n} tokens need more free KV blocks than the engine has")
        try:
            hidden = self.runner.prefill(token_ids, self.kv.block_tables[rid], chunk)
            return torch.cat(
                [self.runner.model.compute_logits(h).float() for h in hidden.split(512)]
            )
        finally:
            self.kv.free(rid)

    # ---- observability -----------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        block_bytes = self.config.cache.block_size * self.model_config.kv_bytes_per_token(
            DTYPES[self.config.cache.kv_cache_dtype].itemsize
        )
        token_bytes = block_bytes // self.config.cache.block_size
        return {
            "num_running": len(self.scheduler.running),
            "num_waiting": self.scheduler.num_waiting,
            "num_preemptions": self.scheduler.num_preemptions,
            "kv_blocks_used": self.kv.num_used_blocks,
            "kv_blocks_total": self.kv.num_blocks,
            "kv_block_size": self.config.cache.block_size,
            "kv_block_bytes": block_bytes,
            "kv_peak_blocks_used": self.kv.peak_blocks_used,
            "kv_peak_bytes_used": self.kv.peak_blocks_used * block_bytes,
            # What the same peak concurrency would reserve with one max-length slab per request.
            "kv_contiguous_bytes_equivalent": self.kv.peak_num_requests
            * self.max_model_len
            * token_bytes,
            "prefix_cache_queries": self.kv.prefix_queries,
            "prefix_cache_hits": self.kv.prefix_hits,
            "prefix_cache_hit_rate": self._hit_rate(),
            "kv_blocks_cached": len(self.kv.pool.cached),
            "last_step_num_tokens": self._last_step["num_tokens"],
            "last_step_num_seqs": self._last_step["num_seqs"],
            "last_step_time_s": self._last_step["time_s"],
            "num_steps": self._counters["steps"],
            "prompt_tokens_total": self._counters["prompt_tokens"],
            "generation_tokens_total": self._counters["generation_tokens"],
        }

    def _hit_rate(self) -> float:
        """Prompt tokens found in the prefix cache / prompt tokens looked up (vLLM's)."""
        return self.kv.prefix_hits / self.kv.prefix_queries if self.kv.prefix_queries else 0.0

    def reset_prefix_cache(self) -> int:
        """Forget the cached blocks nobody uses (for runs that must start cold)."""
        return self.kv.reset_prefix_cache()


class LLM:
    """Offline batch generation: `LLM(model=..., **engine_args).generate(prompts, params)`."""

    def __init__(self, model: str = "smollm2-135m", **engine_args: Any) -> None:
        self.llm_engine = LLMEngine(EngineConfig.from_kwargs(model, **engine_args))
        self._ids = itertools.count()

    def get_tokenizer(self) -> Tokenizer | None:
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        if not isinstance(sampling_params, list):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        engine = self.llm_engine
        # Every prompt is validated before any is queued: one bad prompt leaves nothing behind.
        requests = [
            engine.make_request(f"gen-{next(self._ids)}", prompt, params)
            for prompt, params in zip(prompts, sampling_params, strict=True)
        ]
        for req in requests:
            engine.add(req)
        ids = [req.request_id for req in requests]
        finished: dict[str, RequestOutput] = {}
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        finished[out.request_id] = out
        finally:  # interrupted (Ctrl-C, a failed step): the next call must not compute these
            for i in ids:
                engine.abort_request(i)
        return [finished[i] for i in ids]
