"""`LLMEngine` (add_request / step / abort), shaped like vLLM's; the offline `LLM` is in llm.py.

About 400 lines, as one class whose set-up, request state and step loop read best together;
what can stand apart does: a prompt's checks (input_processor.py), when a request stops
(stops.py), `stats()` (stats.py), the step log (step_log.py), parallel sampling
(parallel_sampling.py), what 'auto' settings become (resolve.py) and what the model's paths
resolved to (runner.py)."""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engine import kernel_pool, omp_wait
from engine.config import EngineConfig, ModelConfig
from engine.core.kv_cache_manager import KVCacheManager, chain_hashes
from engine.core.request import FinishReason, Request, RequestOutput, SamplingParams, merge_outputs
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.cuda_graphs import DecodeGraphs
from engine.distributed.workers import TPWorkers, check_tensor_parallel
from engine.dtype_choice import DtypeChoice, choose_dtype
from engine.dtype_choice import cpu_has_native_bf16 as cpu_has_native_bf16  # re-exported
from engine.input_processor import make_request as build_request
from engine.model.tokenizer import IncrementalDetokenizer, Tokenizer
from engine.model_store import DTYPES, ModelKey, load_shared, make_runner
from engine.model_store import kv_scales as load_kv_scales
from engine.ops import cpu_kernels
from engine.ops.fp8 import FP8
from engine.parallel_sampling import fan_out, release_held, shares_prompt
from engine.resolve import resolve_attention_backend, resolve_device
from engine.spec_decode import make_proposer
from engine.spec_decode.speculator import Speculator, speculation_stats
from engine.startup import Phases
from engine.stats import engine_stats
from engine.step_log import StepLog
from engine.stops import check_stop

logger = logging.getLogger(__name__)


class LLMEngine:
    block_hasher = staticmethod(chain_hashes)  # the prefix cache's (128-bit blake2b)
    _stepping_thread = omp_wait.SteppingThread(cpu=False)  # __init__ sets the real one

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype_choice = (
            choose_dtype(self.device)
            if config.dtype == "auto"
            else DtypeChoice(config.dtype, "asked for")
        )
        config.dtype = self.dtype_choice.dtype  # recorded as resolved
        logger.info("dtype %s: %s", config.dtype, self.dtype_choice.reason)
        logger.info("OpenMP wait policy %s: %s", omp_wait.state.policy, omp_wait.state.reason)
        config.attention_backend = resolve_attention_backend(config.attention_backend, self.device)
        torch.manual_seed(config.seed)
        tp_size = config.tensor_parallel_size
        if tp_size > 1:
            check_tensor_parallel(config, self.device)
        model_key = ModelKey.of(config, self.device)
        self.startup = Phases()
        if self.device.type == "cpu":  # before loading: packing the weights uses them
            with self.startup.phase("building kernels"):  # C++, once a machine (then cached)
                cpu_kernels.available()
        with self.startup.phase("loading"):
            loaded = load_shared(model_key)
        cache = config.cache
        if cache.kv_cache_dtype == "auto":
            cache.kv_cache_dtype = config.dtype  # recorded as resolved
        kv_dtype = DTYPES[cache.kv_cache_dtype]
        self.tokenizer: Tokenizer | None = loaded.tokenizer
        self.model_source = loaded.source
        self._init_core(config, loaded.config, kv_dtype.itemsize)
        loaded.model.prepare(self.max_model_len)
        kv_scales = load_kv_scales(model_key) if kv_dtype == FP8 else None
        self.workers: TPWorkers | None = None
        if tp_size > 1:  # ranks 1.. in processes of their own; this one is rank 0
            self.workers = TPWorkers(config, kv_scales, tp_size, self.device)
            weakref.finalize(self, self.workers.stop)
        tp = self.workers.group if self.workers else None
        with self.startup.phase("compiling"):  # the runner's warm-ups compile its kernels
            self.runner = make_runner(config, loaded, kv_scales, tp)
        if self.workers is not None:
            self.workers.wait_ready()
        if config.cuda_graphs:
            if self.device.type != "cuda" or config.attention_backend != "triton":
                raise ValueError(
                    "cuda_graphs needs CUDA and attention_backend='triton' (this engine: "
                    f"{self.device.type}, {config.attention_backend})"
                )
            max_blocks = -(-self.max_model_len // cache.block_size)
            self.runner.graphs = DecodeGraphs(
                loaded.model, self.runner.kv_caches, config.scheduler.max_num_seqs, max_blocks
            )
        self.speculator: Speculator | None = None
        if config.speculative_config is not None:
            spec = config.speculative_config
            proposer = make_proposer(spec, self.runner, self.kv.block_tables)
            self.speculator = Speculator(spec, proposer, self.max_model_len)
        self._stepping_thread = omp_wait.SteppingThread(cpu=self.device.type == "cpu")
        self.weight_bytes = loaded.model.weight_bytes()
        self.weight_bytes_bf16 = loaded.model.weight_bytes(torch.bfloat16)

    def _init_core(self, config: EngineConfig, model_config: ModelConfig, kv_bytes: int) -> None:
        """What every engine has, with weights or simulated (engine/sim): the resolved
        config, the KV cache manager, the scheduler and the requests' state."""
        self.model_config = model_config
        if (config.max_model_len or 0) > model_config.max_position_embeddings:
            raise ValueError(
                f"max_model_len={config.max_model_len} exceeds the model's context length "
                f"{model_config.max_position_embeddings}"
            )
        config.resolve(model_config, kv_bytes)
        assert config.max_model_len is not None and config.cache.num_kv_blocks is not None
        self.max_model_len = config.max_model_len
        cache = config.cache
        self.kv = KVCacheManager(
            cache.num_kv_blocks,
            cache.block_size,
            cache.enable_prefix_caching,
            reserve_tokens=self.max_model_len if cache.kv_reservation == "max_len" else 0,
            hasher=self.block_hasher,
        )
        self.scheduler = Scheduler(config.scheduler, self.kv, self.max_model_len)
        self.eos_token_ids = model_config.eos_token_ids or (
            self.tokenizer.eos_token_ids if self.tokenizer else ()
        )
        self.requests: dict[str, Request] = {}  # by the engine's own (child) ids
        # Parallel sampling: a parent id's n children, and those held back until the first
        # child has computed (and cached) the prompt's full blocks, which they then share.
        self._children: dict[str, list[Request]] = {}
        self._held: dict[str, list[Request]] = {}
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._counters = {
            "steps": 0,
            "prompt_tokens": 0,
            "prompt_tokens_computed": 0,  # not served by the prefix cache or a sibling
            "generation_tokens": 0,
        }
        self._last_step = {"num_tokens": 0, "num_seqs": 0, "time_s": 0.0}
        self._step_log: StepLog | None = None
        # Called with each request's queue delay (first scheduled - arrival, s) as it is first
        # scheduled, in the stepping thread: the server's queue-time histogram.
        self.on_queue_time: Callable[[float], None] | None = None
        self._step_outputs: list[RequestOutput] = []

    # ---- requests ----------------------------------------------------------------------

    @property
    def decode_attention(self) -> str:
        """'compiled', 'eager' or 'triton': what the decode attention runs as (the runner's)."""
        return self.runner.decode_attention

    @property
    def model_forward(self) -> str:
        """'compiled', 'eager' or 'triton': what the model's forward runs as (the runner's)."""
        return self.runner.model_forward

    @property
    def cpu_threads(self) -> str:
        """How the CPU's threads run a step (engine/kernel_pool.py); '' on other devices."""
        taken = kernel_pool.current()
        return taken.reason if taken is not None and self.device.type == "cpu" else ""

    @property
    def cpu_pool_threads(self) -> int:
        """Threads of the kernels' own pool (engine/kernel_pool.py); 1: OpenMP's, or no CPU."""
        taken = kernel_pool.current()
        return taken.pool_threads if taken is not None and self.device.type == "cpu" else 1

    @property
    def linears(self) -> str:
        """What the layers' linears run as: 'kernel', 'onednn', 'torch', ... (the runner's)."""
        return self.runner.linears

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> Request:
        if self._in_use(request_id):
            raise ValueError(f"request id {request_id!r} is already in use")
        req = self.make_request(request_id, prompt, params, arrival_time, priority)
        self.add(req)
        return req

    def make_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        ids_checked: bool = False,
    ) -> Request:
        """Tokenize and validate without touching engine state: safe from another thread
        while a step runs (the async engine validates on the event loop). ids_checked: the
        caller made the ids in the vocabulary itself (engine/input_processor.py)."""
        return build_request(self, request_id, prompt, params, arrival_time, priority, ids_checked)

    def _in_use(self, request_id: str) -> bool:
        return request_id in self.requests or request_id in self._children

    def add(self, req: Request) -> None:
        """Queue a request built by `make_request`; with n > 1, as n children."""
        if self._in_use(req.request_id):
            raise ValueError(f"request id {req.request_id!r} is already in use")
        children = fan_out(req, self.eos_token_ids)
        for child in children:
            self.requests[child.request_id] = child
            if self.tokenizer is not None:
                detok = IncrementalDetokenizer(self.tokenizer, child.prompt_token_ids)
                self._detokenizers[child.request_id] = detok
        if len(children) == 1:
            self.scheduler.add(req)
            return
        self._children[req.parent_id] = children
        self.scheduler.add(children[0])
        if shares_prompt(self.config, req):  # the siblings wait for its prompt's blocks
            self._held[req.parent_id] = children[1:]
        else:
            for child in children[1:]:
                self.scheduler.add(child)

    def _group(self, req: Request) -> list[Request]:
        return self._children.get(req.parent_id, [req])

    def _output(self, req: Request, new_token_ids: list[int]) -> RequestOutput:
        """A completion's output; finished once every completion of its request is."""
        done = all(c.is_finished for c in self._group(req))
        return RequestOutput.of(req, new_token_ids, finished=done)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Abort a request (every completion of it); its final output."""
        group = self._children.get(request_id)
        if group is None:
            req = self.requests.get(request_id)
            if req is None or req.is_finished or req.parent_id != req.request_id:
                return None
            group = [req]
        if all(c.is_finished for c in group):
            return None
        for child in group:
            if not child.is_finished:
                self._finish(child, FinishReason.ABORT)
        return merge_outputs([RequestOutput.of(c, [], finished=True) for c in group])

    def fail_running(self, error: str) -> list[RequestOutput]:
        """After a step raised: the requests it had already finished get their final outputs
        (their clients would wait forever otherwise); the running ones, whose state is now
        unknown, end with the error."""
        outputs = [o for o in self._step_outputs if o.finished]
        self._step_outputs = []
        for running in list(self.scheduler.running):
            for req in self._group(running):  # n > 1: its waiting and held siblings too
                if not req.is_finished:
                    req.error = error
                    self._finish(req, FinishReason.ERROR, flush=False)
                    outputs.append(self._output(req, []))
        return outputs

    @property
    def num_waiting(self) -> int:
        """Sequences added and not running: the scheduler's waiting ones and the siblings of
        parallel-sampling requests held back for their prompt's blocks (each child counts)."""
        return self.scheduler.num_waiting + sum(len(h) for h in self._held.values())

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._held)

    # ---- one iteration -----------------------------------------------------------------

    def log_steps(self, path: str | Path | None) -> None:
        """Append one JSON line per step to `path` (None: stop): when it started on the
        perf_counter clock (shared by processes on one machine), how long it took, what it
        computed and the KV it read, the queues, KV blocks and KV tokens after it, and the
        queueing delays of the requests it started. A few microseconds a step."""
        if self._step_log is not None:
            self._step_log.close()
        self._step_log = None if path is None else StepLog(path, self.config, self.model_config)

    def step(self) -> list[RequestOutput]:
        self._stepping_thread.check()
        spec = self.speculator
        candidates = spec.want_drafts(self.scheduler.running) if spec is not None else []
        out = self.scheduler.schedule()
        if candidates:
            assert spec is not None
            spec.propose(candidates, out)
        if self.on_queue_time is not None:
            for r in out.first_scheduled:
                self.on_queue_time(r.metrics.first_scheduled_time - r.metrics.arrival_time)
        if out.is_empty:
            return []
        if self.workers is not None:
            self.workers.check_alive()
        tp = self.runner.tp
        reduce_s0 = tp.allreduce_s if tp is not None else 0.0
        t0 = self._step_started()
        log = self._step_log
        before = log.scheduled(out) if log is not None else None  # before advance() moves on
        self._count_prompt_computed(out)
        sampled = self.runner.execute(out, self.kv.block_tables)
        logit_rows = sum(len(r.spec_token_ids) + 1 for r, _ in sampled)
        rejected = spec.count(sampled) if spec is not None and out.num_spec else None
        self.scheduler.advance(out, rejected)
        now = self.scheduler.clock()
        outputs: list[RequestOutput] = []
        self._step_outputs = outputs  # what fail_running delivers if the loop below raises
        num_new = 0
        for req, tokens in sampled:
            outputs.append(self._emit(req, tokens, now))
            num_new += len(outputs[-1].new_token_ids)
        if self._held:
            release_held(self._held, self._children, self.scheduler, self.config.cache.block_size)
        self._counters["steps"] += 1
        self._counters["generation_tokens"] += num_new
        self._last_step = {
            "num_tokens": out.num_batched_tokens,
            "num_seqs": len(out.scheduled),
            "time_s": self._step_time(t0),
        }
        if log is not None and before is not None:
            reduce_s = tp.allreduce_s - reduce_s0 if tp is not None else 0.0
            dur = self._last_step["time_s"]
            log.stepped(self, out, t0, dur, before, logit_rows, rejected, reduce_s)
        self._step_outputs = []
        return outputs

    def _count_prompt_computed(self, out: SchedulerOutput) -> None:
        """Prompt tokens the step's chunks compute (call before `Scheduler.advance`)."""
        self._counters["prompt_tokens_computed"] += sum(
            max(0, min(r.num_prompt_tokens, r.num_computed_tokens + n) - r.num_computed_tokens)
            for r, n in out.scheduled
        )

    def _emit(self, req: Request, tokens: list[int], now: float) -> RequestOutput:
        """A request's sampled tokens (several with speculative decoding), up to a stop:
        appended, checked for stops, and its output."""
        req.spec_token_ids = []
        if req.metrics.first_token_time is None:
            req.metrics.first_token_time = now
            if req.index == 0:  # n > 1: the children share one prompt
                self._counters["prompt_tokens"] += req.num_prompt_tokens
        emitted = []
        for token in tokens:
            req.token_ids.append(token)
            emitted.append(token)
            self._process_token(req, token)
            if req.is_finished:
                break
        return self._output(req, emitted)

    def _step_started(self) -> float:
        """When a step starts, on the step log's clock (perf_counter; virtual when simulated)."""
        return time.perf_counter()

    def _step_time(self, t0: float) -> float:
        """How long the step that started at t0 took (measured; modelled when simulated)."""
        return time.perf_counter() - t0

    def _process_token(self, req: Request, token: int) -> None:
        """Finish the request if `token` stops it (engine/stops.py)."""
        detok = self._detokenizers.get(req.request_id)
        stop = check_stop(req, token, detok, self.max_model_len)
        if stop is not None:
            self._finish(req, *stop)

    def _finish(self, req: Request, reason: FinishReason, flush: bool = True) -> None:
        self.scheduler.finish(req, reason)
        detok = self._detokenizers.pop(req.request_id, None)
        if detok is not None and flush:
            req.output_text += detok.step(req.token_ids, final=True)
        del self.requests[req.request_id]
        group = self._children.get(req.parent_id)
        if group is not None and all(c.is_finished for c in group):
            del self._children[req.parent_id]
            self._held.pop(req.parent_id, None)

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
            return self.runner.prompt_logits(token_ids, self.kv.block_tables[rid], chunk)
        finally:
            self.kv.free(rid)

    # ---- observability -----------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The gauges and counters /metrics and the load generator read (engine/stats.py)."""
        return engine_stats(self)

    def shutdown(self) -> None:
        """Stop tensor-parallel workers (also done when the engine is collected or the
        process exits); nothing to do for one rank."""
        if self.workers is not None:
            self.workers.stop()

    def spec_stats(self) -> dict[str, Any]:
        """Speculative decoding's counters (zeros when off; engine/spec_decode/speculator.py)."""
        return speculation_stats(self.speculator)

    def reset_prefix_cache(self) -> int:
        """Forget the cached blocks nobody uses (for runs that must start cold)."""
        return self.kv.reset_prefix_cache()
