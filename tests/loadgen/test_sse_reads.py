"""The client's server-sent-event reader (loadgen/backends.py): its one-split fast path reads
any stream, cut into reads anywhere, as the event-by-event reading does; its JSON decoding
reads what Python's json writes."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.backends import OpenAIBackend, _event_data, _read_events
from loadgen.records import RequestRecord

PAYLOADS = [b'{"choices": [{"index": 0, "text": " a"}]}', b'{"text": "data: x\\n\\ndata: y"}']
LINE = st.one_of(
    st.sampled_from(PAYLOADS).map(lambda p: b"data: " + p),
    st.sampled_from(PAYLOADS).map(lambda p: b"data:" + p),  # no space (TGI)
    st.sampled_from([b"data: [DONE]", b"data:[DONE]", b"data: [DONE] "]),
    st.sampled_from([b": ping", b"event: message", b"id: 7", b"retry: 10", b"data:"]),
)
EVENT = st.lists(LINE, min_size=1, max_size=3).map(b"\n".join)


def _by_event(reads: list[bytes]) -> tuple[list[bytes], bool]:
    """The reference: every complete event split out and read on its own."""
    got: list[bytes] = []
    buf = b""
    for data in reads:
        *events, buf = (buf + data).replace(b"\r\n", b"\n").split(b"\n\n")
        datas, done = _event_data(events)
        got += [d.strip() for d in datas]
        if done:
            return got, True
    return got, False


def _fast(reads: list[bytes]) -> tuple[list[bytes], bool]:
    got: list[bytes] = []
    buf = b""
    for data in reads:
        datas, done, buf = _read_events(buf + data)
        got += [d.strip() for d in datas]  # JSON reads the spaces either leaves
        if done:
            return got, True
    return got, False


@settings(max_examples=400, deadline=None)
@given(
    events=st.lists(EVENT, min_size=1, max_size=8),
    crlf=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=6),
)
def test_any_stream_cut_anywhere_reads_as_event_by_event(
    events: list[bytes], crlf: bool, cuts: list[int]
) -> None:
    stream = b"".join(e + b"\n\n" for e in events)
    if crlf:
        stream = stream.replace(b"\n", b"\r\n")
    at = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    reads = [stream[a:b] for a, b in itertools.pairwise(at) if b > a]
    assert _fast(reads) == _by_event(reads)


def test_a_read_of_one_line_events_is_split_at_once_and_stops_at_done() -> None:
    datas, done, _ = _read_events(b"data: {}\n\ndata:{}\n\ndata: [DONE]\n\ndata: {}\n\ndat")
    assert (datas, done) == ([b" {}", b"{}"], True)
    assert _read_events(b"data: {}\n\ndata: {") == ([b" {}"], False, b"data: {")
    assert _read_events(b"data: {}\n") == ([], False, b"data: {}\n")


def test_chunks_json_reads_that_orjson_refuses_still_count() -> None:
    """Python's json writes -Infinity for a logprob of a token never chosen; orjson refuses
    it, so such chunks are read by json's decoder, in a read of several events or alone."""
    backend = OpenAIBackend("http://127.0.0.1:1/v1", "m")
    odd = b' {"choices": [{"index": 0, "text": "t", "logprobs": {"x": -Infinity}}]}'
    for datas in ([odd, odd], [odd]):
        rec = RequestRecord(index=0, request_id="r", input_len=1, output_len=4)
        assert not backend._take(datas, 0.5, rec, [], {}, set())
        assert rec.chunk_s == [0.5] * len(datas)
