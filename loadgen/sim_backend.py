"""The simulated engine as a backend (`bench run --engine sim`): requests go to a SimEngine
(engine/sim) on a virtual clock, and the records are filled exactly as the in-process
backend fills them, so every metric, table, report and gate reads them as a real run's."""

from __future__ import annotations

import asyncio
import contextlib
import math
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.core.request import Request, SamplingParams
from engine.sim.clock import VirtualClock
from engine.sim.hardware import DeviceSpec
from engine.sim.sim_engine import Progress, SimEngine
from loadgen.records import TIME_FORMAT, RequestRecord, TimeTexts
from loadgen.workload import PromptBuilder, RequestSpec


@dataclass(slots=True)
class _Pending:
    rec: RequestRecord
    t0: float
    done: asyncio.Future
    texts: list[str] = field(default_factory=list)  # rec.chunk_s by TIME_FORMAT, in order


class SimBackend:
    """One coroutine steps the engine: a step is scheduled at once, then the virtual clock
    moves on by its modelled time (requests arriving meanwhile wait for the next step, as on
    a real engine) and its tokens are stamped at the step's end. Records are written by that
    loop directly (lazy decodes' tokens when they leave the group): no per-token wake-ups."""

    name = "sim"
    # Lazy decodes and decode stretches (False: every request visited every step; same result)
    fast_forward = True

    def __init__(
        self,
        engine: SimEngine,
        clock: VirtualClock,
        tokenizer: Any,
        device: DeviceSpec,
        endpoint: str = "completions",
    ) -> None:
        self.engine, self.clock, self.tokenizer = engine, clock, tokenizer
        self.device = device
        self.chat = endpoint == "chat"
        self._pending: dict[str, _Pending] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._replies: PromptBuilder | None = None  # multi-turn: text to carry the reply
        # " word" -> its id, PromptBuilder.words' ids in order, what encode puts first
        self._words: tuple[dict[str, int], np.ndarray, list[int]] | None = None
        self._words_fit = False  # all of those ids in the simulated vocabulary
        self._checks = 3
        # t0 -> group steps' ends - t0, and as texts (each formatted once for every record)
        self._stamps: dict[float, tuple[list[float], list[str]]] = {}
        self.time_texts = TimeTexts()  # finished records' chunk_s as JSON, for their lines
        if self.fast_forward:
            engine.lazy_decodes(self._stamp)

    def engine_info(self) -> dict[str, Any]:
        engine = self.engine
        return engine.config.to_dict() | {
            "decode_attention": "simulated",
            "model_forward": "simulated",
            "linears": "simulated",
            "simulated": True,
            "sim": engine.runner.step_model.describe()  # type: ignore[attr-defined]
            | ({"speculation": engine.speculation} if engine.speculation else {}),
            "weight_bytes": engine.weight_bytes,
        }

    def device_peak(self) -> dict[str, Any]:
        """The simulated device's peaks, as bench_cli/device_peak.py gives this machine's:
        what the report's utilization of simulated steps is against."""
        d = self.device
        return {
            "peak_flops": d.flops(self.engine.config.dtype),
            "peak_read_bytes_per_s": d.memory_bw,
            "peak_bytes_per_s": d.memory_bw,
            "device": f"simulated {d.name}",
            "source": d.source,
        }

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._serve())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _ids(self, spec: RequestSpec) -> tuple[list[int], bool]:
        """The prompt's tokens by the run's tokenizer (prefix caching sees what a server
        would), folded into the simulated model's vocabulary where it is smaller; and whether
        they are known to be in it (the load generator's words: the engine need not check
        each id of 360,000 prompts an hour)."""
        tok = self.tokenizer
        vocab = self.engine.model_config.vocab_size
        if self.chat and getattr(tok, "chat_template", None):
            ids = tok.encode_chat(spec.messages())
        else:
            text = spec.text()
            ids = self._word_ids(text, spec)
            if ids is not None and self._words_fit:
                return ids, True
            ids = ids or tok.encode(text)
        return (ids if max(ids, default=0) < vocab else [i % vocab for i in ids]), False

    def _word_ids(self, text: str, spec: RequestSpec) -> list[int] | None:
        """The ids of a prompt the load generator built from " word" tokens: from the spec's
        word indices, or by looking its words up (the tokenizer takes ~1 ms a prompt; an hour
        at 100 req/s has 360,000); None for any other text. Checked against the tokenizer on
        the first prompts."""
        if self._words is None:
            builder = PromptBuilder(self.tokenizer)
            ids = builder.word_ids
            words = {w[1:]: i for w, i in zip(builder.words, ids.tolist(), strict=True)}
            bos = self.tokenizer.encode("")
            self._words = (words, ids, bos)
            top = max(max(bos, default=0), int(ids.max(initial=0)))
            self._words_fit = top < self.engine.model_config.vocab_size
        words, by_index, bos = self._words
        if spec.words is not None and not spec.history and len(by_index):
            ids = bos + by_index[spec.words].tolist()
        else:
            pieces = text.split(" ")
            if pieces[0]:
                return None
            try:
                ids = bos + [words[w] for w in pieces[1:]]
            except KeyError:
                return None
        if self._checks:  # the lookup must give the tokenizer's ids exactly
            self._checks -= 1
            if ids != self.tokenizer.encode(text):
                self._words = ({}, np.empty(0, np.int64), [])
                return None
        return ids

    async def send(self, spec: RequestSpec, rec: RequestRecord, t0: float) -> None:
        assert self._wake is not None, "start() the backend first"
        engine = self.engine
        rec.send_s = self.clock.now - t0
        try:
            params = SamplingParams(max_tokens=spec.output_len, ignore_eos=True, n=spec.n)
            ids, checked = self._ids(spec)
            req = engine.make_request(
                rec.request_id, ids, params, self.clock.now, spec.priority or 0, checked
            )
            engine.add(req)
        except ValueError as e:  # too long for the context, or the KV cache: as the engine says
            rec.status, rec.error, rec.end_s = "error", f"ValueError: {e}", rec.send_s
            return
        pending = _Pending(rec, t0, asyncio.get_running_loop().create_future())
        self._pending[rec.request_id] = pending
        self._wake.set()
        try:
            await pending.done
        except asyncio.CancelledError:
            engine.abort_request(rec.request_id)
            rec.status, rec.error = "cancelled", "the run was stopped"
            rec.end_s = self.clock.now - t0
            while rec.chunk_s and rec.chunk_s[-1] > rec.end_s:  # a stretch's future tokens
                rec.chunk_s.pop()
                rec.chunk_tokens.pop()
                if rec.chunk_choice:
                    rec.chunk_choice.pop()
            if rec.chunk_s:
                rec.first_chunk_s = rec.chunk_s[0]
                rec.output_tokens, rec.output_tokens_source = sum(rec.chunk_tokens), "engine"
            raise
        finally:
            self._pending.pop(rec.request_id, None)

    async def _serve(self) -> None:
        try:
            await self._step_loop()
        except Exception as e:  # a scheduler bug must not leave requests waiting forever
            for pending in list(self._pending.values()):
                pending.rec.status, pending.rec.error = "error", f"{type(e).__name__}: {e}"
                pending.rec.end_s = self.clock.now - pending.t0
                if not pending.done.done():
                    pending.done.set_result(None)
            raise

    async def _step_loop(self) -> None:
        engine, wake = self.engine, self._wake
        assert wake is not None
        while True:
            steps = engine._counters["steps"]
            outputs = engine.step() if engine.has_unfinished_requests() else []
            if engine._counters["steps"] == steps:  # nothing could run: wait for a request
                wake.clear()
                await wake.wait()
                continue
            await asyncio.sleep(engine.last_step_s)
            self._deliver(outputs)
            if self.fast_forward:
                await self._decode_stretch()

    async def _decode_stretch(self) -> None:
        """Decode-only steps nothing can change, taken at once (SimEngine.decode_stretch):
        each running request gets a token stamped at each step's end."""
        loop = asyncio.get_running_loop()
        next_event = getattr(loop, "next_event", None)
        lazy = self.engine.lazy
        if next_event is None or (lazy is not None and lazy.members):
            return  # not on the virtual-time loop (step by step), or the group steps
        running = list(self.engine.scheduler.running)
        ends = self.engine.decode_stretch(next_event())
        if not ends:
            return
        k = len(ends)
        by_t0: dict[float, tuple[list[float], list[str]]] = {}
        children: dict[str, list[int]] = {}  # n > 1: a record's running completions
        for req in running:
            pending = self._pending.get(req.parent_id)
            if pending is None:
                continue
            rec, t0 = pending.rec, pending.t0
            if rec.n > 1:
                children.setdefault(req.parent_id, []).append(req.index)
                continue
            made = by_t0.get(t0)
            if made is None:
                made = by_t0[t0] = _with_texts([t - t0 for t in ends])
            rec.chunk_s += made[0]
            pending.texts += made[1]
            rec.chunk_tokens += [1] * k
        for parent, indices in children.items():  # step by step, as their outputs come
            pending = self._pending[parent]
            rec, c = pending.rec, len(indices)
            stamps, texts = _with_texts([t - pending.t0 for t in ends])
            rec.chunk_s += [t for t in stamps for _ in range(c)]
            pending.texts += [x for x in texts for _ in range(c)]
            rec.chunk_tokens += [1] * (k * c)
            rec.chunk_choice += indices * k
        await asyncio.sleep(ends[-1] - self.clock.now)

    def _stamp(self, req: Request, first: int, stop: int) -> None:
        """Tokens a request took as a lazy decode (engine/sim/lazy_decodes.py), one a group
        step, each stamped at its step's end. A step's stamp is one float object shared by
        every record (an hour holds ~50 million stamps: 8 bytes each, not 32)."""
        pending = self._pending.get(req.parent_id)
        if pending is None:
            return
        rec, t0 = pending.rec, pending.t0
        made = self._stamps.get(t0)
        if made is None:
            made = self._stamps[t0] = ([], [])
        stamps, texts = made
        if len(stamps) < stop:
            ends = self.engine.lazy.ends  # type: ignore[union-attr]
            new, new_texts = _with_texts([t - t0 for t in ends[len(stamps) : stop]])
            stamps += new
            texts += new_texts
        rec.chunk_s += stamps[first:stop]
        pending.texts += texts[first:stop]
        rec.chunk_tokens += [1] * (stop - first)

    def _deliver(self, outputs: list[Any]) -> None:
        """A step's outputs, stamped at its end (now)."""
        now = self.clock.now
        t, text = math.nan, ""  # the last stamp and its text (most outputs share it)
        for out in outputs:
            pending = self._pending.get(out.request_id)
            if pending is None:
                continue
            rec = pending.rec
            if out.new_token_ids:
                if now - pending.t0 != t:
                    t = now - pending.t0
                    text = TIME_FORMAT % t
                rec.chunk_s.append(t)
                pending.texts.append(text)
                rec.chunk_tokens.append(len(out.new_token_ids))
                if rec.n > 1:
                    index = out.index if type(out) is Progress else out.outputs[0].index
                    rec.chunk_choice.append(index)
            if out.finished:
                self._finish(rec, out, now - pending.t0)
                texts = pending.texts
                self.time_texts[rec.request_id] = (len(texts), "[" + ",".join(texts) + "]")
                pending.done.set_result(None)

    def _finish(self, rec: RequestRecord, out: Any, end_s: float) -> None:
        rec.end_s = end_s
        rec.prompt_tokens = len(out.prompt_token_ids)
        rec.output_tokens = sum(rec.chunk_tokens)
        rec.cached_tokens = out.num_cached_tokens
        rec.prompt_tokens_source = rec.output_tokens_source = "engine"
        rec.finish_reason = out.outputs[0].finish_reason
        if rec.chunk_s:
            rec.first_chunk_s = rec.chunk_s[0]
        if rec.session is not None:
            rec.reply = self._reply(rec)
        if out.error or not rec.chunk_s or rec.finish_reason in ("abort", "error"):
            rec.status, rec.error = "error", out.error or f"ended ({rec.finish_reason}) early"
        else:
            rec.status = "ok"

    def _reply(self, rec: RequestRecord) -> str:
        """A conversation's next turn carries the reply: text of as many tokens."""
        if self._replies is None:
            self._replies = PromptBuilder(self.tokenizer)
        rng = np.random.default_rng(zlib.crc32(rec.request_id.encode()))
        return self._replies.prompt(rec.output_tokens, rng)


def _with_texts(stamps: list[float]) -> tuple[list[float], list[str]]:
    """Token times, and each as the records write it (TIME_FORMAT)."""
    return stamps, [TIME_FORMAT % t for t in stamps]
