import sys
from types import FrameType

from hypothesis import given
from hypothesis import strategies as st

from edge.protocol import sse
from edge.protocol.sse import SseDecoder, SseEvent

STREAM = (
    b"retry: 2000\n"
    b'event: data\ndata: [\ndata: {"k":1}\ndata: ]\nid: 0_9\n\n'
    b": heartbeat\n\n"
    b'event: control\r\ndata: {"streamNextOffset":"0_9"}\r\n\r\n'
)


def test_whole_stream_decodes() -> None:
    decoder = SseDecoder()
    events = decoder.feed(STREAM)
    assert events == [
        SseEvent(event="data", data='[\n{"k":1}\n]', id="0_9", retry_ms=2000),
        SseEvent(event="control", data='{"streamNextOffset":"0_9"}', id=None),
    ]
    assert decoder.comments == 1
    assert decoder.last_event_id == "0_9"


def test_any_chunking_gives_the_same_events() -> None:
    expected = SseDecoder().feed(STREAM)
    for size in range(1, 12):
        decoder = SseDecoder()
        events = []
        for start in range(0, len(STREAM), size):
            events += decoder.feed(STREAM[start : start + size])
        assert events == expected, size


def test_cr_only_line_endings_and_split_crlf() -> None:
    decoder = SseDecoder()
    assert decoder.feed("data: a\r") == []
    assert decoder.feed("\n\r\n") == [SseEvent(event="message", data="a", id=None)]
    assert decoder.feed("data:b\r\r") == [SseEvent(event="message", data="b", id=None)]


def test_event_without_data_is_not_dispatched_but_sets_id() -> None:
    decoder = SseDecoder()
    assert decoder.feed("id: 5\nevent: control\n\n") == []
    assert decoder.last_event_id == "5"


def test_multibyte_character_split_across_chunks() -> None:
    payload = "data: héllo ✓\n\n".encode()
    decoder = SseDecoder()
    events = [e for i in range(len(payload)) for e in decoder.feed(payload[i : i + 1])]
    assert events == [SseEvent(event="message", data="héllo ✓", id=None)]


def test_encoding_round_trips_through_the_decoder() -> None:
    from edge.protocol.sse import encode_comment, encode_event, encode_retry

    payload = " leading space\nsecond line\n\n trailing "
    frames = (
        encode_retry(1500)
        + encode_event("data", payload, event_id="0_9")
        + encode_comment("heartbeat")
        + encode_event("control", '{"streamNextOffset":"0_9"}', event_id="0_9")
    )
    decoder = SseDecoder()
    events = decoder.feed(frames)
    assert events == [
        SseEvent(event="data", data=payload, id="0_9"),
        SseEvent(event="control", data='{"streamNextOffset":"0_9"}', id="0_9"),
    ]
    assert decoder.retry_ms == 1500
    assert decoder.comments == 1


def test_payloads_cannot_inject_events() -> None:
    from edge.protocol.sse import encode_event

    for attack in (
        'start\r\revent: control\rdata: {"x":1}\r\rend',
        "start\n\nevent: control\ndata: {}\n\nend",
        "a\r\n\r\nevent: control\r\n",
    ):
        events = SseDecoder().feed(encode_event("data", attack, event_id="1"))
        assert [e.event for e in events] == ["data"]
        assert "control" in events[0].data


def test_plain_lines_are_framed_as_the_origin_frames_them() -> None:
    from edge.protocol.sse import encode_event

    assert encode_event("data", "line1\nline2") == b"event: data\ndata:line1\ndata:line2\n\n"
    assert encode_event("data", " x") == b"event: data\ndata:  x\n\n"


@given(
    st.lists(st.sampled_from(["data", "event", "id", ":", " ", "x", "é", "\r", "\n", "\r\n"])),
    st.lists(st.integers(min_value=0, max_value=200)),
)
def test_any_text_in_any_chunking_gives_the_same_events(pieces: list[str], cuts: list[int]) -> None:
    text = "".join(pieces).encode()
    whole = SseDecoder()
    expected = whole.feed(text)
    decoder, events, start = SseDecoder(), [], 0
    for cut in sorted({min(cut, len(text)) for cut in cuts}):
        events += decoder.feed(text[start:cut])
        start = cut
    events += decoder.feed(text[start:])
    assert events == expected
    assert (decoder.comments, decoder.last_event_id) == (whole.comments, whole.last_event_id)


def test_a_long_line_is_scanned_once_not_once_per_chunk() -> None:
    """An event of megabytes on one line (a tool's result, a stream's big message) arriving in
    many chunks: each chunk's characters are looked at once, not the whole line again per
    chunk (which was quadratic, Python-level, and held the event loop for seconds per MiB).
    Counted as lines of the decoder executed: a measure of work, not of time."""
    chunks = [b"data: "] + [b"x" * 1024] * 64 + [b"\n\n"]
    executed = 0

    def count(frame: FrameType, event: str, _arg: object) -> object:
        nonlocal executed
        if event == "line":
            executed += 1
        return count

    def trace(frame: FrameType, event: str, _arg: object) -> object:
        return count if frame.f_code.co_filename == sse.__file__ else None

    decoder = SseDecoder()
    sys.settrace(trace)
    try:
        events = [event for chunk in chunks for event in decoder.feed(chunk)]
    finally:
        sys.settrace(None)
    assert events == [SseEvent(event="message", data="x" * 64 * 1024, id=None)]
    assert executed < 40 * len(chunks), executed


def test_bytes_that_are_not_utf8_are_replaced_not_fatal() -> None:
    """The SSE decode is UTF-8 with replacement (HTML: "UTF-8 decode"): one bad byte from an
    upstream (or an origin) costs a U+FFFD, not the pump or the tail that read it."""
    decoder = SseDecoder()
    events = decoder.feed(b"data: a\xff\xfeb\n\ndata: \xe2\x9c")
    events += decoder.feed(b"\x93 ok\n\n")
    assert events == [
        SseEvent(event="message", data="a\ufffd\ufffdb", id=None),
        SseEvent(event="message", data="\u2713 ok", id=None),
    ]


def test_held_counts_the_event_not_yet_ended_and_nothing_after_it_ends() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: abc\ndata: de") == []
    assert decoder.held == len("abc") + len("data: de")  # a data line, and the line begun
    decoder.feed(b"f" * 1000)
    assert decoder.held == 3 + len("data: de") + 1000
    (event,) = decoder.feed(b"\n\n")
    assert event.data == "abc\nde" + "f" * 1000
    assert decoder.held == 0
