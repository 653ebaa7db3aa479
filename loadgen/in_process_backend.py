"""Our async engine in this process as a backend (`InProcessBackend`): no HTTP in the
measurement, for quick runs and tests. It fills a `RequestRecord` as backends.py's
`OpenAIBackend` does; it imports the engine inside its methods (loadgen loads without torch)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from loadgen.records import RequestRecord
from loadgen.workload import RequestSpec


class InProcessBackend:
    """Our async engine in this process: no HTTP in the measurement, for quick runs and tests.
    Each engine output that brings new tokens counts as one chunk."""

    name = "in-process"

    def __init__(
        self,
        async_engine: Any,
        endpoint: str = "completions",
        ignore_eos: bool = True,
        sampling: dict[str, Any] | None = None,
    ):
        self.engine = async_engine
        self.chat = endpoint == "chat"
        self.ignore_eos = ignore_eos
        self.sampling = sampling or {"temperature": 0.0}  # the request body's sampling fields
        self._owned = False

    @classmethod
    def from_engine_args(
        cls,
        model: str,
        endpoint: str = "completions",
        ignore_eos: bool = True,
        sampling: dict[str, Any] | None = None,
        **engine_args: Any,
    ) -> InProcessBackend:
        from engine.config import EngineConfig
        from engine.engine import LLMEngine
        from engine.serving.async_engine import AsyncLLMEngine

        engine = LLMEngine(EngineConfig.from_kwargs(model, **engine_args))
        backend = cls(AsyncLLMEngine(engine), endpoint, ignore_eos, sampling)
        backend._owned = True
        return backend

    def engine_info(self) -> dict[str, Any]:
        """The engine's whole resolved config, for config.json."""
        engine = self.engine.engine
        return engine.config.to_dict() | {
            "decode_attention": engine.decode_attention,
            "model_forward": engine.model_forward,
            "linears": engine.linears,
            "cpu_threads": engine.cpu_threads,
            "cpu_pool_threads": engine.cpu_pool_threads,
        }

    async def start(self) -> None:
        if self._owned:
            await self.engine.start()

    async def close(self) -> None:
        if self._owned:
            await self.engine.stop()

    async def send(self, spec: RequestSpec, rec: RequestRecord, t0: float) -> None:
        from engine.core.request import SamplingParams

        prompt: str | list[int] = spec.text()
        tokenizer = self.engine.engine.tokenizer
        if self.chat and tokenizer is not None and tokenizer.chat_template:
            prompt = tokenizer.encode_chat(spec.messages())
        # n and priority go to the engine as asked: an engine that refuses them (parallel
        # sampling or priority scheduling not there yet) fails the request with its message.
        extra = {} if spec.priority is None else {"priority": spec.priority}
        clock = time.perf_counter
        rec.send_s = clock() - t0
        try:
            params = SamplingParams(
                max_tokens=spec.output_len, ignore_eos=self.ignore_eos, n=spec.n, **self.sampling
            )
            stream = self.engine.generate(rec.request_id, prompt, params, **extra)
            latest: dict[int, Any] = {}  # each completion's latest state, by its index
            async for out in stream:
                for c in out.outputs:  # one completion an output (n > 1: any of them)
                    latest[c.index] = c
                    if out.new_token_ids:
                        rec.chunk_s.append(clock() - t0)
                        rec.chunk_tokens.append(len(out.new_token_ids))
                        if spec.n > 1:
                            rec.chunk_choice.append(c.index)
                if out.finished:
                    done = [latest[i] for i in sorted(latest)]
                    if rec.session is not None:
                        rec.reply = done[0].text
                    rec.prompt_tokens = len(out.prompt_token_ids)
                    rec.output_tokens = sum(len(c.token_ids) for c in done)  # all n
                    rec.cached_tokens = out.num_cached_tokens
                    reasons = [c.finish_reason for c in done]
                    rec.finish_reason = next((r for r in reasons if r in ("abort", "error")), None)
                    rec.finish_reason = rec.finish_reason or reasons[0]
                    rec.error = out.error
        except asyncio.CancelledError:
            rec.status, rec.error, rec.end_s = "cancelled", "the run was stopped", clock() - t0
            _keep_streamed(rec)
            raise
        except Exception as e:  # a bad request or an engine failure: this request fails
            rec.status, rec.error, rec.end_s = "error", f"{type(e).__name__}: {e}", clock() - t0
            _keep_streamed(rec)
            return
        rec.end_s = clock() - t0
        rec.prompt_tokens_source = rec.output_tokens_source = "engine"
        if rec.chunk_s:  # kept for failed requests too (they stay out of the latency figures)
            rec.first_chunk_s = rec.chunk_s[0]
        if rec.error or not rec.chunk_s or rec.finish_reason in ("abort", "error"):
            rec.status, rec.error = "error", rec.error or f"ended ({rec.finish_reason}) early"
            return
        rec.status = "ok"


def _keep_streamed(rec: RequestRecord) -> None:
    """An in-process request cut short keeps what it streamed: first chunk and token count."""
    if rec.chunk_s:
        rec.first_chunk_s = rec.chunk_s[0]
        rec.output_tokens, rec.output_tokens_source = sum(rec.chunk_tokens), "engine"
