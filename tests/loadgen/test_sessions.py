"""Multi-turn conversations: each turn after the previous reply plus the think time, with the
whole conversation as its context; per-turn TTFT; a failed turn ends its conversation."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loadgen.load_plan import LoadPlan
from loadgen.profiles import build_config
from loadgen.records import RequestRecord
from loadgen.runner import LoadRunner
from loadgen.sessions import Session, multi_turn_summary, sharegpt_sessions
from loadgen.workload import RequestSpec, read_sharegpt

DATA = Path(__file__).parents[1] / "data"


@pytest.fixture(scope="module")
def tk() -> Any:
    from engine.model.sources import load_tokenizer

    return load_tokenizer("smollm2-135m")


class _EchoBackend:
    """Replies `reply-<prompt>` after 10 ms; fails any prompt named in `fail`."""

    name = "echo"

    def __init__(self, fail: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.fail, self.seen = fail, []

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def send(self, spec: RequestSpec, rec: RequestRecord, t0: float) -> None:
        rec.send_s = time.perf_counter() - t0
        self.seen.append(spec)
        await asyncio.sleep(0.01)
        rec.end_s = rec.first_chunk_s = time.perf_counter() - t0
        if spec.prompt in self.fail:
            rec.status, rec.error = "error", "refused"
            return
        rec.status, rec.reply, rec.output_tokens = "ok", f"reply-{spec.prompt}", 3


def _session(name: str, n: int, think_s: float = 0.0) -> Session:
    return Session(tuple(RequestSpec(f"{name}{k}", 5, 3) for k in range(n)), think_s)


def _run(backend: _EchoBackend, sessions: list[Session], **plan_kw: Any) -> list[RequestRecord]:
    plan = LoadPlan(iter(sessions), **plan_kw)
    outcome = asyncio.run(LoadRunner(backend, plan).run())
    return sorted(outcome.records, key=lambda r: (r.session, r.turn))


@pytest.mark.parametrize("closed", [False, True])
def test_each_turn_carries_the_conversation_and_waits_its_think_time(closed: bool) -> None:
    backend = _EchoBackend()
    sessions = [_session("a", 3, think_s=0.05), _session("b", 2, think_s=0.05)]
    kw: dict[str, Any] = (
        {"offsets": None, "concurrency": 1, "num_requests": 2}
        if closed
        else {"offsets": [0.0, 0.0]}
    )
    records = _run(backend, sessions, **kw)
    assert [(r.session, r.turn) for r in records] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert len({r.index for r in records}) == 5  # every turn its own record
    third = next(s for s in backend.seen if s.prompt == "a2")
    assert third.history == (("user", "a0"), ("assistant", "reply-a0"), ("user", "a1"),
                             ("assistant", "reply-a1"))  # fmt: skip
    assert third.input_len == (5 + 3) + (5 + 3) + 5  # its 5 tokens after two turns of 8
    assert third.messages()[-1] == {"role": "user", "content": "a2"}
    assert third.text() == "a0reply-a0a1reply-a1a2"
    by = {(r.session, r.turn): r for r in records}
    for (s, k), r in by.items():
        if k:  # sent at least the think time after the previous reply ended
            assert r.send_s >= by[(s, k - 1)].end_s + 0.05 - 1e-3
            assert r.scheduled_s == pytest.approx(by[(s, k - 1)].end_s + 0.05, abs=2e-3)
    if closed:  # one conversation at a time: b starts after a's last reply
        assert by[(1, 0)].send_s >= by[(0, 2)].end_s


def test_a_failed_turn_ends_its_conversation() -> None:
    backend = _EchoBackend(fail={"a1"})
    records = _run(backend, [_session("a", 4), _session("b", 2)], offsets=[0.0, 0.0])
    assert [(r.session, r.turn, r.status) for r in records] == [
        (0, 0, "ok"),
        (0, 1, "error"),
        (1, 0, "ok"),
        (1, 1, "ok"),
    ]
    multi = multi_turn_summary(records)
    assert (multi["conversations"], multi["cut_short"]) == (2, 1)
    assert multi["per_turn"]["2"]["requests"] == 2 and multi["per_turn"]["2"]["completed"] == 1
    assert multi["turns_completed"]["mean"] == 1.5


def test_sharegpt_dialogues_give_their_turns_in_order(tk: Any) -> None:
    data = read_sharegpt(DATA / "sharegpt_sample.json", tk, dialogues=True)
    longest = max(data.dialogues, key=len)
    assert len(longest) == 2 and len(data.dialogues) == len(data.pairs)
    raw = json.loads((DATA / "sharegpt_sample.json").read_text())
    four = next(item["conversations"] for item in raw if len(item["conversations"]) == 4)
    assert [p for p, _, _ in longest] == [four[0]["value"], four[2]["value"]]
    sessions = sharegpt_sessions(data, "2", 0.0, seed=0)
    lengths = {len(next(sessions).turns) for _ in range(40)}
    assert lengths == {1, 2}  # a conversation with fewer turns gives what it has


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"think_time": 1.0}, "it needs --turns"),
        ({"turns": "0"}, "a length is >= 1"),
        ({"turns": "2", "think_time": -1.0}, "think time must be >= 0"),
        ({"turns": "2", "arrival": "trace", "trace": "t.jsonl", "rate": None}, "--turns cannot"),
    ],
)
def test_bad_multi_turn_settings_are_refused(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_config({"rate": 1.0, "num_requests": 3}, flags, set())


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_multi_turn_run_against_a_server(
    tmp_path: Path, mock_server: Callable[..., str], endpoint: str
) -> None:
    """The server sees the conversation grow (the mock's usage counts every word sent); the
    summary and the printed table give TTFT turn by turn."""
    import io

    from rich.console import Console

    from bench_cli.run.execute import execute

    url = mock_server("--ttft", "0.002", "--itl", "0.001")
    flags = {
        "base_url": url,
        "model": "mock",
        "endpoint": endpoint,
        "turns": "3",
        "think_time": 0.02,
        "rate": 20.0,
        "max_p99_lag_ms": 1000.0,  # a busy machine's lag is not checked here
        "num_requests": 4,
        "warmup": 0,
        "input_len": "10",
        "output_len": "4",
        "out": str(tmp_path / "run"),
    }
    buf = io.StringIO()
    rc = execute("default", flags, dashboard=False, console=Console(file=buf, width=150))
    printed = buf.getvalue()
    assert rc == 0, printed
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed"] == 12 and summary["multi_turn"]["conversations"] == 4
    per_turn = summary["multi_turn"]["per_turn"]
    prompts = [per_turn[k]["mean_prompt_tokens"] for k in ("1", "2", "3")]
    # the mock counts words: 10 prompt words, then each turn adds a reply (4 " tok") + 10
    assert prompts == [10, 24, 38]
    assert summary["arrival_check"]["n"] == 4  # the schedule's arrivals: first turns only
    assert "Multi-turn: 4 conversations, 0 cut short" in printed
    assert "poisson 20 conversations/s, 3 turns, 0.02 s think" in " ".join(printed.split())


def test_a_multi_turn_run_against_bench_serve(tmp_path: Path) -> None:
    """The bundled server takes the growing conversation through its chat template: its usage
    shows every later turn's prompt longer than the one before."""
    import io

    from rich.console import Console

    from bench_cli.run.execute import execute

    flags = {
        "model": "tiny-smollm2",
        "max_num_seqs": 4,
        "enforce_eager": True,  # the server starts without torch.compile's seconds
        "endpoint": "chat",
        "turns": "3",
        "concurrency": 2,
        "rate": None,
        "num_requests": 2,
        "warmup": 0,
        "input_len": "12",
        "output_len": "5",
        "extra_body": '{"min_p": 0.05}',  # unknown to our server: ignored, as vLLM ignores it
        "out": str(tmp_path / "run"),
    }
    buf = io.StringIO()
    rc = execute("default", flags, dashboard=False, console=Console(file=buf, width=150))
    assert rc == 0, buf.getvalue()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    per_turn = summary["multi_turn"]["per_turn"]
    prompts = [per_turn[k]["mean_prompt_tokens"] for k in ("1", "2", "3")]
    assert prompts[0] < prompts[1] < prompts[2] and summary["completed"] == 6
