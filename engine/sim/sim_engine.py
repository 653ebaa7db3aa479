"""`SimEngine`: the engine's scheduler, KV cache manager, prefix cache, preemption and request
handling (n > 1, held siblings, stops at max_tokens), unchanged, over a runner that computes
nothing and says how long the step would have taken."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.config import EngineConfig, ModelConfig
from engine.core.kv_cache_manager import builtin_chain_hashes
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import SchedulerOutput
from engine.engine import LLMEngine
from engine.model.cost import StepShape, matmul_params
from engine.resolve import resolve_dtype
from engine.sim.clock import VirtualClock
from engine.sim.hardware import DeviceSpec
from engine.sim.lazy_decodes import LazyDecodes
from engine.sim.speculation import Acceptance, DraftShare, SimProposer
from engine.sim.step_time import (
    COST_SETTINGS,
    DTYPE_BYTES,
    Calibrated,
    Roofline,
    StepTimeModel,
)
from engine.spec_decode.speculator import Speculator

GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of a GPU's memory for weights + KV
ACTIVATION_RESERVE = 2 * 2**30  # per GPU: activations, CUDA graphs, the allocator's slack


@dataclass(slots=True)
class Progress:
    """A step's news of an unfinished completion: what the load generator reads, without the
    copies of prompt and output a RequestOutput makes (an hour holds billions of them)."""

    request_id: str  # the parent's (n > 1: the completion's index says which)
    index: int
    new_token_ids: list[int]
    finished: bool = False


class SimRunner:
    """Stands in for ModelRunner: every request that catches up samples one token (the
    same, never a stop token), plus the drafts the proposer says are accepted; the step's
    modelled duration (drafting included) is kept for the engine."""

    tp = None
    triton = fused_decode = compiled_forward = False

    def __init__(self, step_model: StepTimeModel, token_id: int) -> None:
        self.step_model = step_model
        self.token_id = token_id
        self.last_step_s = 0.0
        self.proposer: SimProposer | None = None  # speculative decoding

    def execute(
        self, out: SchedulerOutput, block_tables: dict[str, list[int]]
    ) -> list[tuple[Request, list[int]]]:
        self.last_step_s = self.step_model.step_time(out.shape())
        token, proposer = self.token_id, self.proposer
        if proposer is None:
            return [
                (r, [token]) for r, n in out.scheduled if r.num_computed_tokens + n == r.num_tokens
            ]
        self.last_step_s += proposer.last_draft_s
        proposer.last_draft_s = 0.0
        sampled = []
        for r, n in out.scheduled:
            drafts = len(r.spec_token_ids)  # a verified decode's: its token and each draft's
            if r.num_computed_tokens + n - drafts == r.num_tokens:
                sampled.append((r, [token] * (1 + proposer.accepted(drafts))))
        return sampled


class SimEngine(LLMEngine):
    """An LLMEngine without weights on a virtual clock: `step()` schedules as the real one,
    returns at once, and `last_step_s` says how long the step takes; whoever drives it waits
    that long on the virtual clock before the outputs count as delivered."""

    block_hasher = staticmethod(builtin_chain_hashes)  # no KV to serve: 64 bits will do

    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        step_model: StepTimeModel,
        clock: VirtualClock,
        acceptance: Acceptance | None = None,
        draft_share: DraftShare | None = None,
    ) -> None:
        """acceptance: of draft tokens, with speculative decoding; draft_share: of decodes
        that get a draft (engine/sim/speculation.py)."""
        spec = config.speculative_config
        if spec is not None and acceptance is None:
            raise ValueError(
                "the simulated engine cannot tell which drafts the model would accept: give "
                "--sim-acceptance (a rate per token, 0.7, or vLLM's rates per draft position, "
                "0.8,0.6,0.45)"
            )
        if "auto" in (config.dtype, config.cache.kv_cache_dtype):
            raise ValueError("resolve the dtypes for the simulated device (resolve_sim_config)")
        self.config = config
        self.clock = clock
        self.tokenizer = None  # the load generator sends token ids
        self.model_source = "simulated"
        self.workers = None
        self.speculator = None
        kv_bytes = DTYPE_BYTES[config.cache.kv_cache_dtype]
        self._init_core(config, model_config, kv_bytes)
        self.scheduler.clock = clock.time
        self.weight_bytes = weight_bytes(model_config, config)
        self.weight_bytes_bf16 = weight_bytes(model_config, config, bf16=True)
        stops = set(self.eos_token_ids)
        token = next(i for i in range(model_config.vocab_size) if i not in stops)
        self.runner = SimRunner(step_model, token)  # type: ignore[assignment]
        # What config.json says of the drafts (nothing without speculation).
        self.speculation = (
            None
            if acceptance is None
            else acceptance.describe() | {"draft_share": (draft_share or DraftShare()).describe()}
        )
        if spec is not None:
            assert acceptance is not None
            layer_share = (spec.num_draft_layers or 0) / model_config.num_layers
            draft_time = step_model.step_time if spec.method == "draft_layers" else None
            proposer = SimProposer(
                acceptance,
                spec.num_speculative_tokens,
                config.seed,
                token,
                draft_time,
                layer_share,
                draft_share,
            )
            self.runner.proposer = proposer
            self.speculator = Speculator(spec, proposer, self.max_model_len)
        self.lazy: LazyDecodes | None = None  # steps every request (lazy_decodes())

    def lazy_decodes(self, on_tokens: Callable[[Request, int, int], None]) -> bool:
        """Advance decodes without visiting them (lazy_decodes.py) where the group can describe
        the batch (continuous fcfs batching). Their tokens come in no step's outputs but by
        `on_tokens(request, first, stop)`: one at the end of each group step first..stop-1
        (`self.lazy.ends`). False where the settings do not allow it."""
        sched = self.config.scheduler
        if sched.batching != "continuous" or sched.scheduling_policy != "fcfs":
            return False
        if self.speculator is not None:  # a group decodes one token a step
            return False
        self.lazy = LazyDecodes(self)
        self.lazy.on_tokens = on_tokens
        return True

    def step(self) -> list[Any]:
        lazy = self.lazy
        if lazy is not None:
            outputs = lazy.step()
            if outputs is not None:
                return outputs
            lazy.dissolve()
        outputs = super().step()
        if lazy is not None:
            lazy.rebuild()
        return outputs

    def abort_request(self, request_id: str) -> Any:
        if self.lazy is not None:
            self.lazy.dissolve()
        return super().abort_request(request_id)

    def fail_running(self, error: str) -> list[Any]:
        if self.lazy is not None:
            self.lazy.dissolve()
        return super().fail_running(error)

    @property
    def decode_attention(self) -> str:
        return "simulated"

    @property
    def model_forward(self) -> str:
        return "simulated"

    @property
    def linears(self) -> str:
        return "simulated"

    @property
    def last_step_s(self) -> float:
        return self.runner.last_step_s  # type: ignore[attr-defined]

    def _step_started(self) -> float:
        return self.clock.now

    def _output(self, req: Request, new_token_ids: list[int]) -> Any:
        if req.is_finished:
            return super()._output(req, new_token_ids)
        return Progress(req.parent_id, req.index, new_token_ids)

    def decode_stretch(self, deadline: float) -> list[float]:
        """Run, at once, the decode-only steps nothing could change: every running request
        decodes, nobody waits, nobody finishes, and the pool has the blocks they grow into,
        so the scheduler would give each request one token a step. Stops before the first
        step that starts at or after `deadline` (the next arrival or timer of the load).
        State, block allocations (in the scheduler's order), prefix-cache hashes, counters
        and step log lines end as step() would leave them; returns the steps' end times.
        The speed of a simulated hour: 20x fewer Python operations per decode token."""
        if self.lazy is not None and self.lazy.members:
            return []  # the group's steps are already this cheap
        if self.speculator is not None:
            return []  # steps of several tokens, as many as the verifier accepts
        sched, kv, cfg = self.scheduler, self.kv, self.config.scheduler
        running = sched.running
        budget = cfg.max_num_batched_tokens or 0
        if sched.batch_waiting or self._held or not 0 < len(running) <= budget:
            return []
        # Waiting requests stay waiting only where no seat can free up without a finish: a
        # static batch runs to its end; a full continuous batch (fcfs: nobody preempted).
        seated = cfg.batching == "static" or (
            cfg.scheduling_policy == "fcfs" and len(running) >= cfg.max_num_seqs
        )
        if sched.waiting and not seated:
            return []
        left = math.inf
        for r in running:
            if r.status is not RequestStatus.RUNNING or r.num_computed_tokens != r.num_tokens - 1:
                return []
            left = min(left, r.params.max_tokens - r.num_output_tokens)
            left = min(left, self.max_model_len - r.num_tokens)
        k_max = int(left) - 1  # a request with `left` tokens to go finishes in step `left`
        t, n = self.clock.now, len(running)
        if k_max < 2 or t >= deadline:
            return []
        bs, tables = kv.block_size, kv.block_tables
        grows: dict[int, list[Request]] = defaultdict(list)  # step -> who needs a block
        fills: dict[int, list[Request]] = defaultdict(list)  # step -> who fills one
        starts = [r.num_computed_tokens for r in running]
        for r, c in zip(running, starts, strict=True):
            for j in range(len(tables[r.request_id]) * bs - c, k_max, bs):
                grows[j].append(r)
            if kv.enable_prefix_caching:
                for j in range((bs - (c + 1) % bs) % bs, k_max, bs):
                    fills[j].append(r)
            r.token_ids.extend(itertools.repeat(self.runner.token_id, k_max))
        context = sum(starts)
        log = self._step_log
        cost0 = cost1 = {}
        if log is not None:  # affine in the step: two exact ones give all of them
            cost0, cost1 = (log.cost(_decode_chunks(n, context + j * n), n) for j in (0, 1))
        ends: list[float] = []
        step_time = self.runner.step_model.step_time  # type: ignore[attr-defined]
        for j in range(k_max):
            if t >= deadline or len(grows.get(j, ())) > kv.pool.num_free:
                break
            for r, c in ((r, r.num_computed_tokens) for r in grows.get(j, ())):
                kv.allocate_slots(r.request_id, c + j + 1)
            keys = context + j * n + n  # each request's computed tokens and its new one
            shape = StepShape(0, n, n, keys, keys, 0, n)
            dur = step_time(shape)
            for r in fills.get(j, ()):
                kv.cache_computed(r.request_id, r.token_ids, r.num_computed_tokens + j + 1)
            if log is not None:
                cost = {k: v + j * (cost1[k] - v) for k, v in cost0.items()}
                log.write(self, t, dur, shape, keys, cost)
            t += dur
            ends.append(t)
        k = len(ends)
        for r in running:
            del r.token_ids[r.num_tokens - k_max + k :]
            r.num_computed_tokens += k
        if k:
            self._counters["steps"] += k
            self._counters["generation_tokens"] += n * k
            self._last_step = {"num_tokens": n, "num_seqs": n, "time_s": dur}
        return ends

    def _step_time(self, t0: float) -> float:
        return self.last_step_s


def _decode_chunks(n: int, keys: int) -> list[tuple[int, int]]:
    """n one-token chunks whose cached contexts sum to `keys` (what step_cost sums)."""
    return [(0, 1)] * (n - 1) + [(keys, 1)]


def weight_bytes(model: ModelConfig, config: EngineConfig, bf16: bool = False) -> int:
    """Bytes of all weights (whole model, every rank together): linears at the weights'
    dtype, embeddings, LM head and norms at the model's."""
    dtype = "bfloat16" if bf16 else config.dtype
    linear = DTYPE_BYTES["fp8" if config.quantization == "fp8" and not bf16 else dtype]
    embed = model.vocab_size * model.hidden_size * (1 if model.tie_word_embeddings else 2)
    norms = model.hidden_size * (2 * model.num_layers + 1)
    return int(matmul_params(model) * linear + (embed + norms) * DTYPE_BYTES[dtype])


def resolve_sim_config(config: EngineConfig, device: DeviceSpec) -> None:
    """'auto' settings as the engine resolves them on that device: bf16 and Triton on GPUs;
    on this machine float32 (unless the CPU has native bf16) and the torch backend."""
    gpu = device.name != "local"
    if config.dtype == "auto":
        config.dtype = "bfloat16" if gpu else resolve_dtype("auto", torch.device("cpu"))
    if config.cache.kv_cache_dtype == "auto":
        config.cache.kv_cache_dtype = config.dtype
    if config.attention_backend == "auto":
        config.attention_backend = "triton" if gpu else "torch"


def size_gpu_kv_cache(config: EngineConfig, model: ModelConfig, device: DeviceSpec) -> None:
    """On a simulated GPU with no KV size given: what vLLM would take, 90 % of the GPUs'
    memory less the weights and an activation reserve per GPU."""
    cache = config.cache
    if device.name == "local" or cache.num_kv_blocks or cache.kv_cache_memory_gb is not None:
        return
    tp = config.tensor_parallel_size
    free = GPU_MEMORY_UTILIZATION * device.memory_bytes * tp - weight_bytes(model, config)
    free -= ACTIVATION_RESERVE * tp
    if free <= 0:
        need = weight_bytes(model, config) / 1e9
        raise ValueError(
            f"the weights ({need:.1f} GB) do not fit on {tp} x {device.name} "
            f"({device.memory_bytes / 1e9:.0f} GB each): raise --tensor-parallel-size"
        )
    cache.kv_cache_memory_gb = math.floor(free / 2**30 * 100) / 100


def step_model_for(
    kind: str,
    model: ModelConfig,
    config: EngineConfig,
    device: DeviceSpec,
    profile: Calibrated | None = None,
) -> StepTimeModel:
    """The step-time model asked for, checked against the engine settings."""
    if kind == "calibrated":
        if profile is None:
            raise ValueError("--sim-cost-model calibrated needs a profile (bench calibrate)")
        profile.check_settings(cost_settings(config.to_dict()))
        return profile
    if kind != "roofline":
        raise ValueError(f"sim cost model {kind!r}: expected calibrated or roofline")
    weights = "fp8" if config.quantization == "fp8" else config.dtype
    kv = config.cache.kv_cache_dtype
    roofline = Roofline(model, device, config.dtype, weights, kv, config.tensor_parallel_size)
    if profile is not None and (fitted := profile.efficiency(device.name)) is not None:
        roofline.eff = fitted  # measured on this device by bench calibrate
        roofline.efficiency_source = f"fitted by bench calibrate ({profile.fit.get('created_at')})"
    return roofline


def cost_settings(engine: dict[str, Any]) -> dict[str, Any]:
    """The resolved engine settings (EngineConfig.to_dict(), as config.json records them) a
    calibration profile is bound to (step_time.COST_SETTINGS)."""
    flat = engine | engine.get("cache", {})
    return {k: flat.get(k) for k in COST_SETTINGS}
