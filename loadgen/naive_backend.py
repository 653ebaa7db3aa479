"""The naive serving baseline: Hugging Face transformers `model.generate` in this process,
one request at a time or in static batches, on the same weights as our engine.

PagedAttention and continuous batching are claimed to serve several times more than this;
the claim means something only if the baseline is measured exactly as the engine is: same
model, same token ids, same records. A static batch takes the requests waiting when the
previous batch ends (up to `batch_size`), left-pads them and generates them together; each
request streams its own tokens and completes at its own length, but its slot frees only when
the whole batch ends."""

from __future__ import annotations

import asyncio
import importlib.metadata
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from loadgen.records import RequestRecord
from loadgen.workload import RequestSpec

# Engine settings this backend honours; quantization and an fp8 KV cache change the
# arithmetic (the baseline would not be the same model); the rest (batching, KV blocks,
# prefix caching, ...) configure the engine's scheduler and cache, which the baseline lacks.
HONOURED = ("dtype", "device", "seed", "max_model_len")
REFUSED = ("quantization",)


def check_engine_settings(engine: dict[str, Any]) -> None:
    refused = [k for k in REFUSED if engine.get(k) is not None]
    if str(engine.get("kv_cache_dtype", "auto")).startswith("fp8"):
        refused.append("kv_cache_dtype")
    if refused:
        names = ", ".join(f"--{k.replace('_', '-')}" for k in refused)
        raise ValueError(f"{names}: the naive baseline (--naive-batch) runs the model unquantized")


def describe(batch_size: int) -> str:
    """The target in words, for config.json and the result's title (1: one at a time)."""
    return f"transformers generate, static batches of {batch_size} (in process)"


@dataclass(slots=True)
class _Pending:
    """One request in this backend: its prompt ids, what it streamed, when it is over."""

    ids: list[int]
    max_tokens: int
    rec: RequestRecord
    t0: float
    done: asyncio.Event = field(default_factory=asyncio.Event)
    tokens: list[int] = field(default_factory=list)
    cancelled: bool = False

    def take(self, token: int, now: float, eos: tuple[int, ...]) -> None:
        if self.done.is_set() or self.cancelled:  # its batch still runs: static batching
            return
        self.tokens.append(token)
        self.rec.chunk_s.append(now - self.t0)
        self.rec.chunk_tokens.append(1)
        if token in eos:
            self.rec.finish_reason = "stop"
            self.done.set()
        elif len(self.tokens) >= self.max_tokens:
            self.rec.finish_reason = "length"
            self.done.set()


class NaiveBackend:
    """Requests queue here; one worker thread runs one `generate` call a batch. Batches are
    formed on the event loop one iteration after a request arrives or a batch ends, so the
    requests sent together are batched together."""

    name = "naive"

    def __init__(
        self,
        model: str,
        batch_size: int = 1,
        endpoint: str = "completions",
        ignore_eos: bool = True,
        sampling: dict[str, Any] | None = None,
        **engine_args: Any,
    ) -> None:
        try:
            import transformers  # noqa: F401
        except ImportError:
            raise ValueError(
                "the naive baseline (--naive-batch) needs Hugging Face transformers: "
                "pip install transformers"
            ) from None
        check_engine_settings(engine_args)
        if batch_size < 1:
            raise ValueError(f"naive batch size must be >= 1, got {batch_size}")
        self.batch_size, self.chat, self.ignore_eos = batch_size, endpoint == "chat", ignore_eos
        self.sampling = sampling or {"temperature": 0.0}
        self.engine_args = engine_args
        self.hf, self.tokenizer, self.model_config, self.dtype = _load(model, engine_args)
        self.max_model_len = engine_args.get("max_model_len") or (
            self.model_config.max_position_embeddings
        )
        self.eos = tuple(self.model_config.eos_token_ids) or (
            tuple(self.tokenizer.eos_token_ids) if self.tokenizer else ()
        )
        self._waiting: deque[_Pending] = deque()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="naive-generate")
        self._running = self._closed = False

    def info(self) -> dict[str, Any]:
        """For config.json: what ran, and the engine settings it had no use for."""
        ignored = sorted(k for k in self.engine_args if k not in HONOURED)
        return {
            "server": describe(self.batch_size),
            "naive_batch": self.batch_size,
            "dtype": str(self.dtype).removeprefix("torch."),
            "transformers": importlib.metadata.version("transformers"),
            "ignored_engine_settings": ignored,
        }

    async def start(self) -> None:
        """The model was loaded when the backend was built, on this thread; its worker thread
        is to hold the only OpenMP pool (engine/omp_wait.py: two make each region sleep)."""
        from engine import omp_wait

        omp_wait.release_thread_pool()

    async def close(self) -> None:
        """Stop batching; a batch still running stops at its next step (its requests were
        cancelled), waited for off the event loop."""
        self._closed = True
        for p in self._waiting:
            p.cancelled = True
        await asyncio.to_thread(self._pool.shutdown, wait=True, cancel_futures=True)

    async def send(self, spec: RequestSpec, rec: RequestRecord, t0: float) -> None:
        clock = time.perf_counter
        rec.send_s = clock() - t0
        try:
            if spec.n != 1:
                raise ValueError("the naive baseline generates one completion a prompt (n = 1)")
            ids = self._encode(spec)
            if len(ids) + spec.output_len > self.max_model_len:
                raise ValueError(
                    f"{len(ids)} prompt + {spec.output_len} output tokens exceed the "
                    f"context length {self.max_model_len}"
                )
        except ValueError as e:
            rec.status, rec.error, rec.end_s = "error", f"ValueError: {e}", clock() - t0
            return
        pending = _Pending(ids, spec.output_len, rec, t0)
        rec.prompt_tokens = len(ids)
        rec.prompt_tokens_source = rec.output_tokens_source = "engine"
        self._waiting.append(pending)
        self._schedule()
        try:
            await pending.done.wait()
        except asyncio.CancelledError:
            pending.cancelled = True  # its batch stops once all its rows are cancelled
            rec.status, rec.error, rec.end_s = "cancelled", "the run was stopped", clock() - t0
            self._finish(pending)
            raise
        rec.end_s = clock() - t0
        self._finish(pending)
        if rec.error is None and rec.chunk_s:
            rec.status = "ok"
        else:
            rec.status, rec.error = "error", rec.error or "generate ended without any output"

    def _finish(self, p: _Pending) -> None:
        p.rec.output_tokens = len(p.tokens)
        if p.rec.chunk_s:
            p.rec.first_chunk_s = p.rec.chunk_s[0]
        if p.rec.session is not None:
            p.rec.reply = self.tokenizer.decode(p.tokens) if self.tokenizer else ""

    def _encode(self, spec: RequestSpec) -> list[int]:
        """The token ids our engine would see (InProcessBackend's rule for chat)."""
        tok = self.tokenizer
        if tok is None:
            raise ValueError("this model has no tokenizer: text prompts cannot be encoded")
        if self.chat and tok.chat_template:
            return list(tok.encode_chat(spec.messages()))
        ids = tok.encode(spec.text())
        if not ids:
            raise ValueError("the prompt is empty")
        return ids

    def _schedule(self) -> None:
        if not self._running:
            self._running = True
            asyncio.get_running_loop().call_soon(self._next_batch)

    def _next_batch(self) -> None:
        """Static batching: the requests waiting now, up to batch_size; the next batch only
        when this one's `generate` has returned."""
        while self._waiting and self._waiting[0].cancelled:
            self._waiting.popleft()
        if not self._waiting or self._closed:
            self._running = False
            return
        n = min(self.batch_size, len(self._waiting))
        batch = [self._waiting.popleft() for _ in range(n)]
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._pool, self._generate, batch, loop)
        future.add_done_callback(lambda f: self._batch_ended(batch, f))

    def _batch_ended(self, batch: list[_Pending], future: asyncio.Future) -> None:
        error = None if future.cancelled() else future.exception()
        for p in batch:
            if not p.done.is_set():
                p.rec.error = f"{type(error).__name__}: {error}" if error else None
                p.done.set()
        self._next_batch()

    def _generate(self, batch: list[_Pending], loop: asyncio.AbstractEventLoop) -> None:
        """On the worker thread: one left-padded `generate` call for the whole batch."""
        import torch
        from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
        from transformers.generation.streamers import BaseStreamer

        eos = () if self.ignore_eos else self.eos
        width = max(len(p.ids) for p in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)  # pad id 0, masked out
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for row, p in enumerate(batch):
            ids[row, width - len(p.ids) :] = torch.tensor(p.ids)
            mask[row, width - len(p.ids) :] = 1

        def deliver(tokens: list[int]) -> None:  # on the event loop: one stamp a step
            now = time.perf_counter()
            for p, token in zip(batch, tokens, strict=True):
                p.take(token, now, eos)

        class Streamer(BaseStreamer):
            def __init__(self) -> None:
                self.prompt_seen = False

            def put(self, value: torch.Tensor) -> None:
                if not self.prompt_seen:  # the first put is the prompt
                    self.prompt_seen = True
                    return
                loop.call_soon_threadsafe(deliver, value.reshape(-1).tolist())

            def end(self) -> None:
                pass

        class RowDone(StoppingCriteria):
            """A row stops at its own length or when cancelled; generate ends when all have."""

            def __call__(self, input_ids: torch.Tensor, scores: Any, **kw: Any) -> torch.Tensor:
                made = input_ids.shape[1] - width
                done = [made >= p.max_tokens or p.cancelled for p in batch]
                return torch.tensor(done, device=input_ids.device)

        s = self.sampling
        temperature = float(s.get("temperature") or 0.0)
        config = GenerationConfig(
            max_new_tokens=max(p.max_tokens for p in batch),
            do_sample=temperature > 0,
            temperature=temperature or None,
            top_p=s.get("top_p") if temperature > 0 else None,
            top_k=max(int(s.get("top_k") or 0), 0) if temperature > 0 else None,
            eos_token_id=list(eos) or None,
            pad_token_id=0,
        )
        with torch.inference_mode():
            self.hf.generate(
                input_ids=ids.to(self.hf.device),
                attention_mask=mask.to(self.hf.device),
                generation_config=config,
                streamer=Streamer(),
                stopping_criteria=StoppingCriteriaList([RowDone()]),
            )


def _load(model: str, engine_args: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """Our loader's weights in `transformers.LlamaForCausalLM`: the engine's model, dtype and
    device (its `auto` rules), the same random weights for the tiny test models (same seed)."""
    import torch
    import transformers

    from engine.model.export import hf_config, hf_state_dict
    from engine.model.loader import load_model
    from engine.model_store import DTYPES
    from engine.resolve import resolve_device, resolve_dtype

    device = resolve_device(engine_args.get("device") or "auto")
    dtype = DTYPES[resolve_dtype(engine_args.get("dtype") or "auto", device)]
    loaded = load_model(model, torch.float32, torch.device("cpu"), engine_args.get("seed") or 0)
    c = loaded.config
    # eos off: generate stops each row itself (ignore_eos or not); pad 0 for left padding
    config = transformers.LlamaConfig(
        **hf_config(loaded) | {"eos_token_id": None, "pad_token_id": 0}
    )
    hf = transformers.LlamaForCausalLM(config)
    missing, unexpected = hf.load_state_dict(hf_state_dict(loaded), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"weights do not fit transformers' Llama: {missing} {unexpected}")
    if c.tie_word_embeddings:
        hf.tie_weights()
    return hf.to(device=device, dtype=dtype).eval(), loaded.tokenizer, c, dtype
