"""Sampling parameters, a request's state as it moves through the engine, and its outputs."""

from __future__ import annotations

import dataclasses
import enum
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.core.stop_strings import StopMatcher, check_stops, matcher


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    n: int = 1
    # vLLM's logits processors and penalties (engine/logits_processors.py).
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    min_tokens: int = 0  # EOS and stop tokens are masked, stop strings ignored, until then
    presence_penalty: float = 0.0  # [-2, 2]: subtracted once from tokens the output has
    frequency_penalty: float = 0.0  # [-2, 2]: subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # > 0: divides (or multiplies) prompt+output logits
    min_p: float = 0.0  # [0, 1]: drops tokens under min_p x the most likely one's probability
    # Whether any of the six is set: the sampler skips their work for a batch without one.
    processes_logits: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.top_k == -1:
            self.top_k = 0
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (or -1 for off), got {self.top_k}")
        if not 1 <= self.n <= 256:
            raise ValueError(f"n must be in [1, 256], got {self.n}")
        check_stops(self.stop)
        self._check_logits_processing()

    def _check_logits_processing(self) -> None:
        """vLLM's ranges for the logits processors and penalties."""
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if not 0.0 < self.repetition_penalty < math.inf:
            raise ValueError(
                f"repetition_penalty must be greater than zero, got {self.repetition_penalty}"
            )
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int):
            raise ValueError(f"min_tokens must be an integer, got {self.min_tokens!r}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        if self.logit_bias:
            for token, bias in self.logit_bias.items():
                if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                    raise ValueError(f"logit_bias keys must be token ids, got {token!r}")
                if isinstance(bias, bool) or not isinstance(bias, int | float):
                    raise ValueError(f"logit_bias values must be numbers, got {bias!r}")
                if not math.isfinite(bias):
                    raise ValueError(f"logit_bias values must be finite, got {bias}")
        self.processes_logits = bool(
            self.logit_bias
            or self.min_tokens
            or self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.min_p
        )
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise ValueError(f"seed must fit in 64 bits, got {self.seed}")

    @property
    def greedy(self) -> bool:
        # Below 1e-5 dividing logits by the temperature overflows: treat it as greedy (as vLLM).
        return self.temperature < 1e-5 or self.top_k == 1


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the context length
    ABORT = "abort"
    ERROR = "error"


@dataclass(slots=True)
class RequestMetrics:
    """Wall-clock timestamps (time.monotonic) of one request's life in the engine."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0


class Request:
    """One generation request. `token_ids` is prompt + output; the KV of the first
    `num_computed_tokens` of them is in the cache."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        arrival_time: float | None = None,
        eos_token_ids: tuple[int, ...] = (),
        priority: int = 0,
    ) -> None:
        self.request_id = request_id
        # Parallel sampling (n > 1): each completion is a child request of its own, sharing
        # the prompt's KV blocks; outputs carry the parent's id and the child's index.
        self.parent_id = request_id
        self.index = 0
        self.priority = priority  # lower is served first (vLLM's convention)
        self.arrival_seq: int | None = None  # the scheduler's tie-break among equal arrivals
        self.prompt = prompt
        self.num_prompt_tokens = len(prompt_token_ids)
        self.token_ids: list[int] = list(prompt_token_ids)
        self.params = params
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_reason: str | int | None = None  # the stop string or token id that matched
        self.num_computed_tokens = 0
        # Speculative decoding: drafts to make room for (set before scheduling), and the
        # drafts this step verifies (after); extra query tokens after token_ids.
        self.num_spec_wanted = 0
        self.spec_token_ids: list[int] = []
        self.num_cached_tokens: int | None = None  # prompt tokens found in the prefix cache
        self.metrics = RequestMetrics(time.monotonic() if arrival_time is None else arrival_time)
        self.stop_token_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            self.stop_token_ids.update(eos_token_ids)
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)
        self.output_text = ""
        # While a stop string could still complete, its first characters may already be at
        # the end of the text: hold them back from streamed outputs (as vLLM does) so that no
        # output ever shows text the final one cuts away.
        self.stop_matcher: StopMatcher | None = matcher(tuple(params.stop)) if params.stop else None
        self.stop_hold = 0
        if self.stop_matcher is not None and not params.include_stop_str_in_output:
            self.stop_hold = self.stop_matcher.max_len - 1
        self.error: str | None = None
        self.logits_prepared: Any = None  # logits_processors.py's tensors, made when needed

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    @property
    def stable_output_text(self) -> str:
        """The text no later step can take back: all of it once finished."""
        if self.is_finished or not self.stop_hold:
            return self.output_text
        return self.output_text[: max(0, len(self.output_text) - self.stop_hold)]

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.value}, prompt={self.num_prompt_tokens}, "
            f"out={self.num_output_tokens}, computed={self.num_computed_tokens})"
        )


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclass(slots=True)
class RequestOutput:
    """What `LLM.generate` returns and `LLMEngine.step` emits, shaped like vLLM's."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    new_token_ids: list[int] = field(default_factory=list)  # generated in the last step
    error: str | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (vLLM's name)

    @classmethod
    def of(
        cls, req: Request, new_token_ids: list[int], finished: bool | None = None
    ) -> RequestOutput:
        """One completion's progress, under its parent's id; `finished`: the whole request
        (every sibling) is done (default: this one is)."""
        reason = req.finish_reason.value if req.finish_reason else None
        completion = CompletionOutput(
            req.index, req.stable_output_text, req.output_token_ids, reason, req.stop_reason
        )
        return cls(
            req.parent_id,
            req.prompt,
            req.prompt_token_ids,
            [completion],
            req.is_finished if finished is None else finished,
            req.metrics,
            new_token_ids,
            req.error,
            req.num_cached_tokens or 0,
        )


def merge_outputs(outputs: list[RequestOutput]) -> RequestOutput:
    """One request's completions (each child's latest output) as one output, by index."""
    last = outputs[-1]
    completions = sorted((o.outputs[0] for o in outputs), key=lambda c: c.index)
    return dataclasses.replace(
        last,
        outputs=completions,
        finished=all(c.finish_reason is not None for c in completions),
        num_cached_tokens=max(o.num_cached_tokens for o in outputs),
    )
