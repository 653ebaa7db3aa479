"""`bench run` against servers that are not ours (issue 47): the mock server speaking vLLM's,
SGLang's and llama.cpp's dialects."""

from __future__ import annotations

import http.server
import io
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from bench_cli.tables import print_result
from tests.cli.test_bench_run import bench_run


def _printed(summary: dict) -> str:
    out = io.StringIO()
    print_result(Console(file=out, width=200), summary, "title")
    return out.getvalue()


def test_the_table_shows_the_scheduled_rate_beside_the_achieved_one() -> None:
    from loadgen.metrics import summarize

    summary = summarize([], 1.0, None)
    summary["arrival_check"] = {"achieved_rate": 1.49, "scheduled_rate": 1.486}
    text = _printed(summary)
    assert "1.49 (scheduled 1.49)" in text


# dialect -> (server kind, version, the engine columns its /metrics fills)
DIALECTS = {
    "vllm": ("vllm", "0.11.0", {"running", "waiting", "kv_usage", "preemptions"}),
    "sglang": ("sglang", "0.5.3", {"running", "waiting", "kv_usage", "preemptions"}),
    "llamacpp": ("llamacpp", "b6700-mock", {"running", "waiting", "kv_usage"}),
    "servebench": ("servebench", "0.0.0-mock", {"running", "waiting", "preemptions"}),
}


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_each_peers_metrics_kind_and_version_are_read(
    tmp_path: Path, mock_server: Callable[..., str], dialect: str
) -> None:
    kind, version, columns = DIALECTS[dialect]
    url = mock_server("--ttft", "0.05", "--itl", "0.02", "--dialect", dialect)
    flags = {"base_url": url, "model": None, "tokenizer": "smollm2-135m"}
    rc, printed, out = bench_run(tmp_path, **flags, telemetry_interval=0.02, warmup=0)
    assert rc == 0, printed
    summary = json.loads((out / "summary.json").read_text())
    telemetry = summary["telemetry"]
    assert telemetry["metrics_dialect"] == dialect
    assert {f"engine_{c}" for c in columns} <= set(telemetry["columns"])
    assert not [n for n in telemetry["notes"] if n.startswith("no engine gauges")]
    assert f"engine gauges: {dialect}'s /metrics names" in printed
    config = json.loads((out / "config.json").read_text())
    assert config["server"]["kind"] == kind and config["server"]["version"] == version
    assert config["run"]["engine_kind"] is None  # not "bundled": the engine is not ours
    assert f"server: {kind} {version}" in printed


def test_a_metrics_page_of_unknown_names_is_said_so(tmp_path: Path) -> None:
    from loadgen.telemetry import Telemetry

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"# TYPE tgi_queue_size gauge\ntgi_queue_size 3\n"
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        tel = Telemetry(pid=None, metrics_url=url, interval_s=0.01, scrape_every=1)
        tel.start()
        tel.stop()
    finally:
        server.shutdown()
    s = tel.summary()
    assert s["metrics_dialect"] is None
    assert any("carries none of servebench:, vllm:, sglang:, llamacpp:" in n for n in s["notes"])


def test_a_relative_model_id_from_another_directory_is_refused_naming_tokenizer(
    tmp_path: Path, mock_server: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-server lists its -m path as given: from elsewhere, the run used smollm2-135m's
    tokenizer without a word; now it says why it has none and names --tokenizer."""
    url = mock_server("--ttft", "0.01", "--itl", "0.001", "--dialect", "llamacpp")
    monkeypatch.chdir(tmp_path)
    rc, printed, out = bench_run(tmp_path, base_url=url, model=None, warmup=0)
    assert rc == 2, printed
    assert "no tokenizer for model 'models/SmolLM2-135M-Instruct.Q4_1.gguf'" in printed
    assert "--tokenizer" in printed and str(tmp_path) in printed.replace("\n", "")
    assert not (out / "summary.json").exists()


def test_a_relative_model_id_resolves_where_the_file_is(
    tmp_path: Path, mock_server: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.model.sources import resolve_model_path
    from loadgen.mock_server import MOCK_MODEL_PATH

    url = mock_server("--ttft", "0.01", "--itl", "0.001", "--dialect", "llamacpp")
    (tmp_path / MOCK_MODEL_PATH).parent.mkdir()
    (tmp_path / MOCK_MODEL_PATH).symlink_to(resolve_model_path("smollm2-135m"))
    monkeypatch.chdir(tmp_path)
    rc, printed, out = bench_run(tmp_path, base_url=url, model=None, warmup=0)
    assert rc == 0, printed
    assert json.loads((out / "config.json").read_text())["tokenizer"] == MOCK_MODEL_PATH


def test_a_served_name_resolves_through_the_model_path_the_server_reports(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    """vLLM's --served-model-name hides the path; its /v1/models `root` still says it."""
    url = mock_server("--ttft", "0.01", "--itl", "0.001", "--dialect", "vllm")
    rc, printed, out = bench_run(tmp_path, base_url=url, model="mock", warmup=0)
    assert rc == 0, printed
    assert "the model path the server reports" in printed
    assert json.loads((out / "config.json").read_text())["tokenizer"] == "smollm2-135m"


def test_a_chat_run_says_what_the_template_added(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    """SmolLM2's template made --input-len 32 into 62 prompt tokens without a word."""
    url = mock_server("--ttft", "0.01", "--itl", "0.001", "--template-tokens", "30")
    flags = {"base_url": url, "model": "mock", "endpoint": "chat", "input_len": "32"}
    rc, printed, out = bench_run(tmp_path, **flags, num_requests=5, warmup=0)
    assert rc == 0, printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["prompt_tokens_added"] == {"mean": 30.0, "min": 30, "max": 30, "total": 150}
    assert summary["total_input_tokens"] == 5 * 62
    text = " ".join(printed.split())
    assert "32 asked, 62 counted" in text and "--input-len N-30" in text
    assert "of which added by the server │ 150 (30 a request)" in text
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert [json.loads(line)["prompt_tokens_added"] for line in lines] == [30] * 5


def test_a_server_that_is_down_is_unknown_and_asked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import loadgen.server_info as server_info

    asked: list[str] = []
    real = server_info.http_get
    monkeypatch.setattr(server_info, "http_get", lambda url, *a: asked.append(url) or real(url, *a))
    info = server_info.detect_server("http://127.0.0.1:9/v1", "m")
    assert (info.kind, info.version, info.listed) == ("unknown", None, False)
    assert asked == ["http://127.0.0.1:9/v1/models"]  # not /props, /version, ... too
    assert "not detected" in info.text()


def test_input_len_after_template_targets_the_templated_length(tmp_path: Path) -> None:
    """The engine counts the templated prompt itself: 62 asked, 62 counted."""
    flags = {"in_process": True, "endpoint": "chat", "input_len": "62", "output_len": "2"}
    rc, printed, out = bench_run(
        tmp_path, **flags, input_len_after_template=True, num_requests=4, warmup=0
    )
    assert rc == 0, printed
    summary = json.loads((out / "summary.json").read_text())
    taken_off = summary["config"]["template_tokens"]
    assert taken_off > 0 and f"the chat template adds {taken_off} tokens" in printed
    assert summary["total_input_tokens"] == 4 * 62
    assert summary["prompt_tokens_added"]["mean"] == taken_off
    assert not [w for w in summary["warnings"] if "prompt" in w]


def test_a_server_template_unlike_the_tokenizers_is_said_so(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server("--ttft", "0.01", "--itl", "0.001", "--template-tokens", "5")
    flags = {"base_url": url, "model": "mock", "endpoint": "chat", "input_len": "62"}
    rc, printed, out = bench_run(
        tmp_path, **flags, input_len_after_template=True, num_requests=3, warmup=0
    )
    assert rc == 0, printed
    summary = json.loads((out / "summary.json").read_text())
    assert any("its template is not the tokenizer's" in w for w in summary["warnings"])


def test_input_len_after_template_needs_a_synthetic_chat_run(tmp_path: Path) -> None:
    rc, printed, _ = bench_run(tmp_path, input_len_after_template=True, in_process=True)
    assert rc == 2 and "needs --endpoint chat" in " ".join(printed.split())
