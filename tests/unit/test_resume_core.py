"""The pure core of resume routes (edge.resume): ids, what is kept of an upstream SSE answer,
and how a reader gets it back from a stream, from any point, however the reads are batched."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from edge.protocol.sse import SseDecoder, SseEvent
from edge.resume.cors import route_cors
from edge.resume.events import (
    LEASE,
    UNKEPT,
    Finale,
    Replay,
    append_body,
    kept_message,
    request_message,
)
from edge.resume.ids import (
    TOKEN_CHARS,
    ResumePoint,
    credential_scope,
    encode_id,
    mint_token,
    parse_id,
    principal_scope,
    stream_name,
)
from edge.resume.requests import (
    Keep,
    NotFound,
    Preflight,
    Relay,
    Resume,
    asked_of,
    upstream_headers,
)

offsets = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=60)
tokens = st.builds(lambda _: mint_token(), st.integers())


@given(tokens, offsets, st.integers(min_value=0, max_value=10**9))
def test_an_id_names_its_point_again(token: str, offset: str, skip: int) -> None:
    point = ResumePoint(token=token, offset=offset, skip=skip)
    assert parse_id(encode_id(point)) == point


@given(st.text(max_size=120))
def test_only_the_edges_own_ids_are_read(text: str) -> None:
    point = parse_id(text)
    if point is not None:
        assert encode_id(point) == text.strip()


def test_an_upstream_id_is_not_the_edges() -> None:
    for upstream_id in ("1", "abc_123", "session-1:17", "x.y.z", f"{'a' * TOKEN_CHARS}.@@.1"):
        assert parse_id(upstream_id) is None


def test_tokens_are_unguessable_and_bound_to_the_credential() -> None:
    minted = {mint_token() for _ in range(1000)}
    assert len(minted) == 1000
    assert all(len(token) == TOKEN_CHARS for token in minted)
    token = mint_token()
    assert stream_name(token, "public") == stream_name(token, "public")
    assert stream_name(token, "public") != stream_name(token, "cred:abc")
    assert stream_name(token, "cred:abc") != stream_name(token, "cred:abd")


# --- an upstream answer, kept, then read back by a model of a Durable Streams JSON stream ---

data_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\x00"), max_size=40
)
upstream_events = st.lists(
    st.tuples(
        st.sampled_from(["message", "progress"]),
        data_text,
        st.one_of(
            st.none(),
            st.text(st.characters(min_codepoint=0x30, max_codepoint=0x7A), min_size=1, max_size=8),
        ),
    ),
    max_size=12,
)


def upstream_bytes(events: list[tuple[str, str, str | None]]) -> bytes:
    out = ""
    for name, data, upstream_id in events:
        out += f"event: {name}\n" if name != "message" else ""
        if upstream_id is not None:
            out += f"id: {upstream_id}\n"
        out += "".join(f"data: {line}\n" for line in data.split("\n"))
        out += "\n"
    return out.encode()


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    pieces, start = [], 0
    for point in points:
        pieces.append(data[start:point])
        start = point
    pieces.append(data[start:])
    return pieces


def offset_of(index: int) -> str:
    return f"{index:016d}_{index * 7:016d}"


def index_of(offset: str) -> int:
    return 0 if offset == "-1" else int(offset.split("_")[0])


def stream_sse(messages: list[dict[str, str]], offset: str, cuts: list[int]) -> list[bytes]:
    """What a Durable Streams origin (or the edge) sends an SSE reader of a closed JSON stream
    from ``offset``: batches of messages, each followed by a control event."""
    start = index_of(offset)
    rest = list(range(start, len(messages)))
    ends = sorted({start + cut % (len(rest) + 1) for cut in cuts} - {start} | {len(messages)})
    frames, at = [], start
    for end in ends:
        if end > at:
            batch = json.dumps(messages[at:end])
            frames.append(f"event: data\ndata: {batch}\n\n")
        closed = end == len(messages)
        control = {"streamNextOffset": offset_of(end) if end else offset, "streamClosed": closed}
        frames.append(f"event: control\ndata: {json.dumps(control)}\n\n")
        at = end
    return chunked("".join(frames).encode(), cuts)


def read_back(
    point: ResumePoint, messages: list[dict[str, str]], cuts: list[int]
) -> list[SseEvent]:
    replay, decoder, client = Replay(point), SseDecoder(), SseDecoder()
    events: list[SseEvent] = []
    at = replay.rewind()
    for chunk in stream_sse(messages, at.offset, cuts):
        replayed = replay.feed(decoder.feed(chunk))
        for frame in replayed.frames:
            events.extend(client.feed(frame))
        if replayed.ended:
            return events
    raise AssertionError("the stream ended without its closing control event")


@given(upstream_events, st.lists(st.integers(min_value=0), max_size=6), st.data())
def test_every_kept_event_is_read_once_from_any_point(
    events: list[tuple[str, str, str | None]], cuts: list[int], data: st.DataObject
) -> None:
    decoder = SseDecoder()
    kept = []
    for piece in chunked(upstream_bytes(events), cuts):
        for event in decoder.feed(piece):
            message = kept_message(event)
            if message is not None:
                kept.append(message)
    # Empty-data events (an MCP server's priming event) are not kept; the rest all are, in order.
    assert kept == [{"event": name, "data": text} for name, text, _ in events if text != ""]
    token = mint_token()
    read_cuts = data.draw(st.lists(st.integers(min_value=0), max_size=6))
    whole = read_back(ResumePoint(token=token, offset="-1", skip=0), kept, read_cuts)
    assert [{"event": e.event, "data": e.data} for e in whole] == kept
    upstream_ids = {upstream_id for _, _, upstream_id in events if upstream_id is not None}
    for event in whole:
        assert event.id not in upstream_ids
        point = parse_id(event.id)
        assert point is not None
        assert point.token == token
    # A reader that resumes at any event's id reads exactly what came after it.
    if whole:
        at = data.draw(st.integers(min_value=0, max_value=len(whole) - 1))
        resumed_point = parse_id(whole[at].id)
        assert resumed_point is not None
        again = read_back(
            resumed_point, kept, data.draw(st.lists(st.integers(min_value=0), max_size=6))
        )
        assert [(e.event, e.data) for e in again] == [(e.event, e.data) for e in whole[at + 1 :]]
        # and its ids name the same points as the first reader's
        assert [index_after(parse_id(e.id)) for e in again] == [
            index_after(parse_id(e.id)) for e in whole[at + 1 :]
        ]


def index_after(point: ResumePoint | None) -> int:
    assert point is not None
    return index_of(point.offset) + point.skip


def test_append_body_is_one_message_per_event() -> None:
    body = append_body([{"event": "message", "data": "a"}, {"event": "x", "data": "b\nc"}])
    assert json.loads(body) == [{"event": "message", "data": "a"}, {"event": "x", "data": "b\nc"}]


def test_a_json_rpc_request_is_owed_its_response() -> None:
    request = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{}}'
    finale = Finale.of_request(request)
    finale.heard(
        {"event": "message", "data": '{"jsonrpc":"2.0","method":"notifications/progress"}'}
    )
    (error,) = finale.still_owed()
    owed = json.loads(error["data"])
    assert owed["id"] == 7
    assert owed["error"]["code"] == -32000
    finale.heard({"event": "message", "data": '{"jsonrpc":"2.0","id":7,"result":{}}'})
    assert finale.still_owed() == []


@given(
    st.lists(st.one_of(st.integers(), st.text(max_size=5)), unique=True, max_size=4),
    st.data(),
)
def test_the_log_alone_tells_what_is_still_owed(owed: list[int | str], data: st.DataObject) -> None:
    # A replica that never saw the request ends an answer from its stream alone: the ids its
    # first message names, less the responses kept since (leases and progress in between).
    answered = data.draw(st.lists(st.sampled_from(owed), unique=True) if owed else st.just([]))
    log: list[object] = [request_message(owed), LEASE]
    for request_id in answered:
        log.append({"event": "message", "data": json.dumps({"jsonrpc": "2.0", "method": "n"})})
        log.append(
            {
                "event": "message",
                "data": json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {}}),
            }
        )
        log.append(LEASE)
    left = [json.loads(error["data"])["id"] for error in Finale.of_log(log).still_owed()]
    assert left == [request_id for request_id in owed if request_id not in answered]


def test_the_edges_own_messages_are_news_but_never_shown() -> None:
    replay = Replay(ResumePoint(token=mint_token(), offset="-1", skip=0))
    shown = {"event": "message", "data": "{}"}
    data = json.dumps([request_message([1]), LEASE, shown])
    replayed = replay.feed([SseEvent(event="data", data=data, id=None)])
    assert replayed.news == 3
    assert len(replayed.frames) == 1
    again = Replay(replay.rewind()).feed([SseEvent(event="data", data=data, id=None)])
    assert again.news == 0  # read again after a rotation: nothing new, the lease does not move


def test_a_point_past_the_log_still_sees_the_log_move() -> None:
    """A forged ``skip`` past the log: what is appended after the read caught up is live (the
    pump is alive), though it is skipped; a reader must not take the pump for lost."""
    replay = Replay(ResumePoint(token=mint_token(), offset="-1", skip=10**9))
    control = SseEvent(event="control", data='{"streamNextOffset":"0_1"}', id=None)
    catch_up = json.dumps([request_message([1])])
    first = replay.feed([SseEvent(event="data", data=catch_up, id=None), control])
    assert first.news == 0  # the catch-up is old
    live = replay.feed([SseEvent(event="data", data=json.dumps([LEASE]), id=None)])
    assert live.news == 1
    assert not live.frames


def test_only_the_answers_own_reader_stops_where_it_outgrew_the_caps() -> None:
    shown = {"event": "message", "data": "{}"}
    owed = {"event": "message", "data": '{"jsonrpc":"2.0","id":1,"error":{}}'}
    data = json.dumps([request_message([1]), shown, UNKEPT, owed])
    point = ResumePoint(token=mint_token(), offset="-1", skip=0)
    own = Replay(point, own=True).feed([SseEvent(event="data", data=data, id=None)])
    assert own.handed_over
    assert len(own.frames) == 1  # up to the mark; the rest comes to it directly
    other = Replay(point).feed([SseEvent(event="data", data=data, id=None)])
    assert not other.handed_over
    assert len(other.frames) == 2  # on to the owed error


def test_notifications_and_other_bodies_owe_nothing() -> None:
    assert Finale.of_request(b'{"jsonrpc":"2.0","method":"notifications/initialized"}').owed == []
    assert Finale.of_request(b"not json").owed == []
    assert Finale.of_request(b'[{"jsonrpc":"2.0","id":"a","method":"x"},{"id":true}]').owed == ["a"]


def test_what_a_request_asks_for() -> None:
    point = ResumePoint(token=mint_token(), offset="0000_0001", skip=2)
    assert asked_of("POST", [("Content-Type", "application/json")]) == Keep()
    # A browser's EventSource (no header of its own) is kept; MCP's standalone GET is relayed.
    assert asked_of("GET", [("Accept", "text/event-stream")]) == Keep()
    assert asked_of("GET", [("MCP-Protocol-Version", "2025-11-25")]) == Relay()
    assert asked_of("GET", [("Mcp-Session-Id", "s")]) == Relay()
    assert asked_of("OPTIONS", [("Access-Control-Request-Method", "GET")]) == Preflight()
    assert asked_of("OPTIONS", []) == Relay()
    assert asked_of("GET", [("Last-Event-ID", encode_id(point))]) == Resume(point)
    assert asked_of("GET", [("Last-Event-ID", "upstream-17")]) == NotFound()
    assert asked_of("DELETE", [("Mcp-Session-Id", "s")]) == Relay()
    assert asked_of("POST", [("MCP-Protocol-Version", "2026-07-28")]) == Relay()
    assert (
        asked_of("GET", [("mcp-protocol-version", "2026-07-28"), ("Last-Event-ID", "x")]) == Relay()
    )
    assert asked_of("POST", [("MCP-Protocol-Version", "2025-11-25")]) == Keep()


def test_last_event_id_never_goes_upstream() -> None:
    sent = upstream_headers(
        [("Last-Event-ID", "x"), ("Authorization", "Bearer t"), ("Accept-Encoding", "gzip")],
        keep=True,
    )
    assert sent == [("Authorization", "Bearer t")]
    assert ("Accept-Encoding", "gzip") in upstream_headers(
        [("Accept-Encoding", "gzip")], keep=False
    )


@given(
    st.lists(
        # Upstream data is decoded UTF-8: never a lone surrogate (one cannot be encoded again).
        st.text(
            st.characters(blacklist_characters="\r\x00", blacklist_categories=("Cs",)), max_size=5
        ),
        min_size=1,
        max_size=15,
    ),
    st.lists(st.integers(min_value=0), min_size=1, max_size=6),
    st.lists(st.integers(min_value=2, max_value=8), min_size=1, max_size=20),
)
def test_reads_cut_anywhere_go_on_from_where_they_stopped(
    texts: list[str], cuts: list[int], frames_per_read: list[int]
) -> None:
    # A read may end anywhere between two frames (the edge rotates its SSE viewers; a
    # connection breaks), even between a batch and its control event: the next read starts
    # from ``rewind()`` and the reader sees every event once, in order. (Each read brings two
    # frames at least: a read that brought less every time would never move, here or live.)
    kept = [{"event": "message", "data": f"{index}:{text}"} for index, text in enumerate(texts)]
    replay, client = Replay(ResumePoint(token=mint_token(), offset="-1", skip=0)), SseDecoder()
    seen: list[SseEvent] = []
    reads = iter(frames_per_read * 50)
    for _ in range(1000):
        at = replay.rewind()
        frames = b"".join(stream_sse(kept, at.offset, cuts)).split(b"\n\n")
        taking = [frame + b"\n\n" for frame in frames if frame][: next(reads)]
        decoder, ended = SseDecoder(), False
        for frame in taking:
            replayed = replay.feed(decoder.feed(frame))
            for out in replayed.frames:
                seen.extend(client.feed(out))
            if replayed.ended:
                ended = True
                break
        if ended:
            break
    else:
        raise AssertionError("never ended")
    assert [{"event": e.event, "data": e.data} for e in seen] == kept


@given(st.text(min_size=1), st.text(min_size=1))
def test_an_answer_is_bound_to_its_principal_whatever_the_token(alice: str, bob: str) -> None:
    token = mint_token()
    bound = stream_name(token, principal_scope("jwt", alice))
    assert bound == stream_name(token, principal_scope("jwt", alice))  # any token of alice's
    assert (bound == stream_name(token, principal_scope("jwt", bob))) == (alice == bob)
    assert bound != stream_name(token, principal_scope("forward", alice))
    assert bound != stream_name(mint_token(), principal_scope("jwt", alice))


def test_without_a_principal_the_credential_binds() -> None:
    assert credential_scope([]) == "public"
    both = [("Authorization", "Bearer x"), ("Cookie", "s=1")]
    assert credential_scope(both) == credential_scope(
        [("cookie", "s=1"), ("authorization", "Bearer x")]
    )
    assert credential_scope([("Authorization", "Bearer x")]) != credential_scope(
        [("Authorization", "Bearer y")]
    )
    assert credential_scope([("Authorization", "Bearer x")]) != principal_scope("jwt", "x")


# What the reference origin grants every Origin.
ORIGIN_GRANT = [
    ("access-control-allow-origin", "*"),
    ("access-control-allow-methods", "GET, POST, PUT, DELETE, HEAD, OPTIONS"),
    ("access-control-allow-headers", "content-type, authorization, Stream-Seq"),
    ("access-control-expose-headers", "Stream-Next-Offset, etag"),
    ("x-content-type-options", "nosniff"),
]


def test_a_routes_cors_is_the_origins_grant_widened_for_the_route() -> None:
    headers = {name.lower(): value for name, value in route_cors(ORIGIN_GRANT)}
    assert headers["access-control-allow-origin"] == "*"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    allowed = [name.strip() for name in headers["access-control-allow-headers"].split(",")]
    assert allowed[:3] == ["content-type", "authorization", "Stream-Seq"]  # the origin's, kept
    assert {"last-event-id", "mcp-session-id", "mcp-protocol-version"} <= set(allowed)
    assert len({name.lower() for name in allowed}) == len(allowed)  # each once
    exposed = headers["access-control-expose-headers"]
    assert exposed == "Stream-Next-Offset, etag, Edge-Resume-Stream, Mcp-Session-Id"
    assert len(route_cors(ORIGIN_GRANT)) == len(headers)  # one header of each name


def test_an_origin_that_grants_nothing_gets_nothing_added() -> None:
    assert route_cors([]) == []
    assert route_cors([("access-control-expose-headers", "etag")]) == []


DEEP = "[" * 100_000 + "]" * 100_000  # valid JSON, nested past what the parser recurses


def test_json_nested_too_deep_is_not_json_here_never_an_error() -> None:
    """A request body, or an upstream event, nested deeper than the parser recurses raised
    RecursionError (not a ValueError): a 500 for the request, a dead pump for the event."""
    assert Finale.of_request(DEEP.encode()).owed == []
    finale = Finale.of_request(b'{"jsonrpc":"2.0","id":1,"method":"m"}')
    finale.heard({"event": "message", "data": DEEP})
    assert finale.owed == [1]
    replay = Replay(ResumePoint(token=mint_token(), offset="-1", skip=0))
    replayed = replay.feed([SseEvent(event="data", data=DEEP, id=None)])
    assert replayed.frames == []
