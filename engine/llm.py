"""The offline API: `LLM(model=..., **engine_args).generate(prompts, params)`, as vLLM's."""

from __future__ import annotations

import itertools
from typing import Any

from engine.config import EngineConfig
from engine.core.request import RequestOutput, SamplingParams, merge_outputs
from engine.engine import LLMEngine
from engine.model.tokenizer import Tokenizer


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
        priority: list[int] | None = None,
    ) -> list[RequestOutput]:
        """One output per prompt (with n > 1, its n completions in `outputs`); `priority`:
        one per prompt, lower first (used under scheduling_policy="priority")."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        if not isinstance(sampling_params, list):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        priority = priority if priority is not None else [0] * len(prompts)
        if len(priority) != len(prompts):
            raise ValueError("give one priority per prompt")
        engine = self.llm_engine
        # Every prompt is validated before any is queued: one bad prompt leaves nothing behind.
        requests = [
            engine.make_request(f"gen-{next(self._ids)}", prompt, params, priority=p)
            for prompt, params, p in zip(prompts, sampling_params, priority, strict=True)
        ]
        for req in requests:
            engine.add(req)
        ids = [req.request_id for req in requests]
        latest: dict[str, dict[int, RequestOutput]] = {i: {} for i in ids}
        finished: dict[str, RequestOutput] = {}
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    latest[out.request_id][out.outputs[0].index] = out
                    if out.finished:
                        finished[out.request_id] = merge_outputs(
                            list(latest[out.request_id].values())
                        )
        finally:  # interrupted (Ctrl-C, a failed step): the next call must not compute these
            for i in ids:
                engine.abort_request(i)
        return [finished[i] for i in ids]
