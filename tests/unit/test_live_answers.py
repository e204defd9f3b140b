"""Live answers from generated logs (``edge.live.answers``), checked against what they must carry.

* A long-poll's 200 holds exactly the bytes of the segments from its offset (as many as
  ``max_response_bytes`` lets in), says the offset where they end, and is up to date (and, for a
  closed stream, closed) only when that is the tail and nothing was left out; it carries the
  cursor it was given unless it ends a closed stream.
* It carries the catch-up answer's validator and caching verdict for the same range: the real
  ``CatchupCache.read`` and the real ``LiveHub.settle`` are asked the same read of the same log.
* A 204 says "nothing new at this offset": no browser keeps it, a CDN for a second.
* SSE frames decode (``edge.protocol.sse``) back to exactly those bytes, every id the offset
  after the batch, and their control event says what a long-poll's headers say.
"""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass, replace
from typing import Any, NoReturn, cast

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from edge.catchup import Answer, CatchupCache
from edge.config import Address, Settings
from edge.live.answers import (
    Pending,
    long_poll_data,
    long_poll_empty,
    sse_encoding,
    sse_frames,
)
from edge.live.hub import LiveHub
from edge.live.tail import Tail
from edge.log.freshness import LONG_POLL_CDN_SECONDS, Lifetime, Reuse
from edge.log.policy import Coverage, cover, etag
from edge.log.segment import Segment, content_digest
from edge.log.stream_log import LogKey, StreamInstance, StreamLog, TailFact
from edge.metrics import Metrics
from edge.origin import OriginClient
from edge.protocol.http1 import chunk
from edge.protocol.purge_keys import purge_keys
from edge.protocol.reads import PUBLIC_SCOPE, START, Read
from edge.protocol.sse import SseDecoder, SseEvent
from edge.web.wiring import build_catchup

STREAM = "/v1/stream/s"
JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"
BINARY_TYPE = "application/octet-stream"
TEMPLATE = (("X-Content-Type-Options", "nosniff"),)
NOW = 1_000.0
CURSOR = "4242"
MiB = 1024 * 1024

SETTINGS = Settings(
    origin="http://origin.invalid",
    listen=Address.parse("127.0.0.1:0"),
    admin_listen=Address.parse("127.0.0.1:0"),
)


def position(n: int) -> str:
    """An offset as the origin issues them: fixed width, so string order is stream order."""
    return f"{n:06d}_{n * 7:07d}"


json_values = st.one_of(
    st.integers(),
    st.text(max_size=5),
    st.dictionaries(st.text(max_size=3), st.booleans(), max_size=2),
)
# SSE data lines cannot carry a CR: every line-break form ends a field line, so a text stream's
# CR reaches SSE readers as LF (long-polls carry it as it is). Generated text has none.
text_characters = st.characters(exclude_categories=["Cs"], exclude_characters="\r")


@dataclass(frozen=True)
class World:
    """A stream's log as the edge holds it, and a read of it."""

    content_type: str
    scope: str
    segments: tuple[Segment, ...]  # a chain: each starts where the one before ends
    messages: tuple[tuple[Any, ...], ...]  # JSON values per segment (JSON streams)
    read_from: int  # the index of the segment the read starts at
    tail: str
    closed: bool
    lifetime_known: bool
    max_bytes: int

    @property
    def key(self) -> LogKey:
        return LogKey(stream=STREAM, scope=self.scope)

    @property
    def offset(self) -> str:
        return self.segments[self.read_from].start

    @property
    def json(self) -> bool:
        return self.content_type == JSON_TYPE

    def expected(self) -> tuple[int, bool]:
        """How many segments the answer holds from ``read_from``, and whether it is capped:
        at least one, then every next one that keeps the total within ``max_bytes``."""
        rest = self.segments[self.read_from :]
        total, count = rest[0].size, 1
        for segment in rest[1:]:
            if total + segment.size > self.max_bytes:
                return count, True
            total += segment.size
            count += 1
        return count, False

    def log(self) -> StreamLog:
        log = StreamLog(
            key=self.key,
            instance=StreamInstance(stream=STREAM, content_type=self.content_type),
            header_template=TEMPLATE,
        )
        self.record_tail(log)
        return log

    def record_tail(self, log: StreamLog) -> None:
        if self.lifetime_known:
            log.instance.learn_lifetime(None, None)
        log.observe_tail(
            self.tail, closed=self.closed, now=NOW, started=0, received=1, authoritative=True
        )

    def coverage(self) -> Coverage:
        by_start = {segment.start: segment for segment in self.segments}
        return cover(
            lambda _k, at: by_start.get(at), self.key, self.offset, max_bytes=self.max_bytes
        )


@st.composite
def worlds(draw: st.DrawFn, *, tail: str | None = None) -> World:
    """``tail``: where the log's tail fact is: at the chain's ``end``, ``beyond`` it (the edge
    lacks the bytes between: evicted, not yet fetched) or ``within`` it (a fact older than the
    bytes held)."""
    content_type = draw(st.sampled_from([JSON_TYPE, TEXT_TYPE, BINARY_TYPE]))
    count = draw(st.integers(min_value=1, max_value=5))
    gaps = draw(st.lists(st.integers(1, 900), min_size=count + 1, max_size=count + 1))
    ends = [sum(gaps[: i + 1]) for i in range(count + 1)]  # strictly increasing
    starts_empty = draw(st.booleans())  # "-1 → the first offset", a segment with no bytes
    offsets = [position(end) for end in ends]
    if starts_empty:
        offsets[0] = START
    segments: list[Segment] = []
    messages: list[tuple[Any, ...]] = []
    for index in range(count):
        values: tuple[Any, ...] = ()
        if index == 0 and starts_empty:
            body = b"[]" if content_type == JSON_TYPE else b""
        elif content_type == JSON_TYPE:
            values = tuple(draw(st.lists(json_values, min_size=1, max_size=3)))
            body = json.dumps(list(values), separators=(",", ":")).encode()
        elif content_type == TEXT_TYPE:
            body = draw(st.text(text_characters, min_size=1, max_size=12)).encode()
        else:
            body = draw(st.binary(min_size=1, max_size=12))
        segments.append(Segment(start=offsets[index], end=offsets[index + 1], body=body))
        messages.append(values)
    where = draw(st.sampled_from(["end", "beyond", "within"])) if tail is None else tail
    if where == "beyond":
        tail_offset = position(ends[-1] + 1)
    elif where == "within" and count > 1:
        tail_offset = draw(st.sampled_from([segment.end for segment in segments[:-1]]))
    else:
        tail_offset = segments[-1].end
    return World(
        content_type=content_type,
        scope=draw(st.sampled_from([PUBLIC_SCOPE, "cred-alice"])),
        segments=tuple(segments),
        messages=tuple(messages),
        read_from=draw(st.integers(min_value=0, max_value=count - 1)),
        tail=tail_offset,
        closed=draw(st.booleans()),
        lifetime_known=draw(st.booleans()),
        max_bytes=draw(st.sampled_from([1, 8, 24, 4 * MiB])),
    )


def stream_bytes(world: World, segments: tuple[Segment, ...]) -> bytes:
    """What a reader of ``segments`` is owed, built from the generated messages, not by
    ``stitch``: JSON streams as one array of every message, others as the bytes in order."""
    if world.json:
        first = world.segments.index(segments[0])
        values = [v for per in world.messages[first : first + len(segments)] for v in per]
        return json.dumps(values, separators=(",", ":")).encode()
    return b"".join(segment.body for segment in segments)


def header(answer: Answer, name: str) -> str | None:
    found = [v for n, v in answer.headers if n.lower() == name.lower()]
    assert len(found) <= 1, f"{name} repeated in {answer.headers}"
    return found[0] if found else None


def same_body(world: World, body: bytes, expected: bytes) -> bool:
    # JSON streams join arrays: the same messages, whatever the separators.
    return json.loads(body) == json.loads(expected) if world.json else body == expected


# --- the long-poll 200 ---


@given(world=worlds(), waited=st.booleans())
def test_a_long_poll_answer_holds_exactly_its_coverage(world: World, waited: bool) -> None:
    log = world.log()
    coverage = world.coverage()
    asked: list[bool] = []

    def reuse_for(*, immutable: bool) -> Reuse:
        asked.append(immutable)
        seven = Lifetime(max_age_seconds=7)
        shared = world.scope == PUBLIC_SCOPE
        return Reuse(shared=shared, immutable=immutable, browser=seven, cdn=seven)

    def age_of(verdict: Reuse, observed: TailFact | None) -> int | None:
        assert observed is log.tail
        return 3

    answer = long_poll_data(
        log, world.offset, coverage, cursor=CURSOR, waited=waited, reuse_for=reuse_for,
        age_of=age_of,
    )  # fmt: skip

    count, capped = world.expected()
    held = world.segments[world.read_from : world.read_from + count]
    end = held[-1].end
    up_to_date = world.tail == end and not capped
    closed = up_to_date and world.closed
    event(f"up_to_date={up_to_date} closed={closed} capped={capped}")
    assert answer.status == 200
    assert same_body(world, answer.body, stream_bytes(world, held))
    assert header(answer, "Stream-Next-Offset") == end
    assert header(answer, "Stream-Up-To-Date") == ("true" if up_to_date else None)
    assert header(answer, "Stream-Closed") == ("true" if closed else None)
    # A closed stream has no next request to collapse: no cursor then.
    assert header(answer, "Stream-Cursor") == (None if closed else CURSOR)
    assert header(answer, "ETag") == etag(
        STREAM, world.offset, end, digest=content_digest(held, world.content_type),
        closed=closed, encoding=None,
    )  # fmt: skip
    assert asked == [closed or not up_to_date]
    verdict = reuse_for(immutable=asked[0])
    assert header(answer, "Cache-Control") == verdict.cache_control
    shared = world.scope == PUBLIC_SCOPE
    assert header(answer, "CDN-Cache-Control") == ("max-age=7" if shared else None)
    assert header(answer, "Surrogate-Control") == header(answer, "CDN-Cache-Control")
    keys = purge_keys(STREAM, log.instance.generation)
    assert header(answer, "Surrogate-Key") == keys.surrogate_key
    assert header(answer, "Cache-Tag") == keys.cache_tag
    assert answer.age_seconds == 3
    assert header(answer, "Content-Type") == world.content_type
    assert header(answer, "Vary") is None  # never compressed
    assert answer.headers[: len(TEMPLATE)] == list(TEMPLATE)
    assert answer.cache_status == ("edge; hit; detail=waited" if waited else "edge; hit")
    assert answer.result == "live"


class Unreachable:
    """An origin no test here may reach: every answer must come from the log."""

    def __getattr__(self, name: str) -> NoReturn:
        raise AssertionError(f"the origin was asked ({name})")


def edge_holding(world: World) -> tuple[CatchupCache, LiveHub, Tail]:
    settings = Settings(
        origin=SETTINGS.origin,
        listen=SETTINGS.listen,
        admin_listen=SETTINGS.admin_listen,
        max_response_bytes=world.max_bytes,
    )
    origin = cast(OriginClient, Unreachable())
    parts = build_catchup(settings, origin, Metrics(), clock=lambda: NOW)
    cache = parts.catchup
    log = parts.local.log_for(world.key)
    log.content_type = world.content_type
    log.header_template = TEMPLATE
    world.record_tail(log)
    for segment in world.segments:
        assert parts.local.put(world.key, segment, log.instance)
    metrics = Metrics()
    hub = LiveHub(
        settings, metrics, origin, catchup=cache, fills=parts.fills, local=parts.local,
        door=parts.door, forgetter=parts.forgetter, ticket=parts.ticket, clock=lambda: NOW,
    )  # fmt: skip
    tail = Tail(
        key=world.key, offset=world.tail, credentials=(), local=parts.local, door=parts.door,
        forgetter=parts.forgetter, ticket=parts.ticket, origin=origin, settings=settings,
        metrics=metrics, listener=hub,
    )  # fmt: skip
    return cache, hub, tail


@given(world=worlds(tail="end"))
def test_a_long_poll_answer_validates_and_caches_as_the_catch_up_answer(world: World) -> None:
    """The same bytes, tag and verdict whichever way a client read the range, so a tag from
    one revalidates the other's. (With the tail past the chain, a catch-up read would ask the
    origin for the rest; here the tail is where the chain ends.)"""
    cache, hub, tail = edge_holding(world)
    live = hub.settle(world.key, tail, world.offset, cursor=CURSOR, waited=True, expired=False)
    assert isinstance(live, Answer)
    read = Read(
        stream=STREAM, offset=world.offset, live=None, cursor=None, last_event_id=None,
        scope=world.scope,
    )  # fmt: skip
    catchup = asyncio.run(
        cache.read(read, credentials=(), if_none_match=None, accept_encoding=None)
    )
    assert catchup.status == live.status == 200
    assert live.body == catchup.body
    # Header for header, in order: the long-poll's adds its cursor, the catch-up's its Vary.
    assert [h for h in live.headers if h[0] != "Stream-Cursor"] == [
        h for h in catchup.headers if h[0] != "Vary"
    ]
    assert live.age_seconds == catchup.age_seconds
    closed = header(live, "Stream-Closed") == "true"
    assert header(live, "Stream-Cursor") == (None if closed else CURSOR)
    assert live.cache_status == "edge; hit; detail=waited"


@given(world=worlds(tail="beyond"))
def test_a_long_poll_short_of_the_tail_answers_what_the_edge_has(world: World) -> None:
    """The bytes the edge holds go out at once, not up to date, open and immutable; the rest
    is the next request's."""
    _, hub, tail = edge_holding(world)
    live = hub.settle(world.key, tail, world.offset, cursor=CURSOR, waited=False, expired=False)
    assert isinstance(live, Answer)
    count, _ = world.expected()
    held = world.segments[world.read_from : world.read_from + count]
    assert same_body(world, live.body, stream_bytes(world, held))
    assert header(live, "Stream-Next-Offset") == held[-1].end
    assert header(live, "Stream-Up-To-Date") is None
    assert header(live, "Stream-Closed") is None
    assert header(live, "Stream-Cursor") == CURSOR


# --- the long-poll 204 ---


@pytest.mark.parametrize("scope", [PUBLIC_SCOPE, "cred-x"])
@pytest.mark.parametrize("closed", [False, True])
def test_nothing_new_is_a_204_at_the_offset_no_browser_keeps(closed: bool, scope: str) -> None:
    """A CDN keeps a shared scope's for a second under its cursor URL (the herd parked there
    is released at once); nobody keeps a credential's."""
    log = StreamLog(
        key=LogKey(stream=STREAM, scope=scope),
        instance=StreamInstance(stream=STREAM, content_type=JSON_TYPE, generation="g7"),
        header_template=TEMPLATE,
    )
    offset = position(12)
    answer = long_poll_empty(log, offset, cursor=CURSOR, closed=closed)
    assert answer.status == 204
    assert answer.body == b""
    last = ("Stream-Closed", "true") if closed else ("Stream-Cursor", CURSOR)
    cdn = f"max-age={LONG_POLL_CDN_SECONDS}"
    keys = purge_keys(STREAM, "g7")
    assert answer.headers == [
        *TEMPLATE,
        ("Stream-Next-Offset", offset),
        ("Stream-Up-To-Date", "true"),
        last,
        ("Cache-Control", "no-store" if scope == PUBLIC_SCOPE else "private, no-store"),
        *(
            [("CDN-Cache-Control", cdn), ("Surrogate-Control", cdn)]
            if scope == PUBLIC_SCOPE
            else []
        ),
        ("Surrogate-Key", keys.surrogate_key),
        ("Cache-Tag", keys.cache_tag),
    ]
    assert (answer.cache_status, answer.result) == ("edge; hit", "live")


def test_a_closed_stream_at_its_tail_answers_204_at_once_through_the_hub() -> None:
    segment = Segment(start=position(1), end=position(2), body=b"x")
    world = World(
        content_type=BINARY_TYPE, scope=PUBLIC_SCOPE, segments=(segment,), messages=((),),
        read_from=0, tail=segment.end, closed=True, lifetime_known=True, max_bytes=MiB,
    )  # fmt: skip
    _, hub, tail = edge_holding(world)
    answer = hub.settle(world.key, tail, segment.end, cursor=CURSOR, waited=False, expired=False)
    assert isinstance(answer, Answer)
    assert answer.status == 204
    assert header(answer, "Stream-Closed") == "true"
    open_world = replace(world, closed=False)
    _, hub, tail = edge_holding(open_world)
    waiting = hub.settle(world.key, tail, segment.end, cursor=CURSOR, waited=False, expired=False)
    assert waiting is Pending.WAIT


# --- SSE ---


def decoded_events(frames: bytes, *, chunked: bool) -> list[SseEvent]:
    if chunked:
        size, _, rest = frames.partition(b"\r\n")
        assert rest.endswith(b"\r\n")
        assert int(size, 16) == len(rest) - 2
        frames = rest[:-2]
    decoder = SseDecoder()
    events = decoder.feed(frames)
    assert decoder.feed(b"") == []  # nothing left half-framed
    return events


@given(
    world=worlds(),
    chunked=st.booleans(),
    cursor=st.integers(min_value=0, max_value=10**9).map(str),
)
def test_sse_frames_decode_to_exactly_the_bytes(world: World, chunked: bool, cursor: str) -> None:
    log = world.log()
    coverage = world.coverage()
    count, capped = world.expected()
    held = world.segments[world.read_from : world.read_from + count]
    end = held[-1].end
    up_to_date = world.tail == end and not capped
    closed = up_to_date and world.closed
    frames = sse_frames(
        log, coverage, up_to_date=up_to_date, closed=closed, cursor=cursor, chunked=chunked
    )
    data, control = decoded_events(frames, chunked=chunked)
    assert (data.event, data.id) == ("data", end)
    if sse_encoding(world.content_type) == "base64":
        received = base64.b64decode(data.data, validate=True)
    else:
        received = data.data.encode()
    assert same_body(world, received, stream_bytes(world, held))
    assert (control.event, control.id) == ("control", end)
    expected: dict[str, object] = {"streamNextOffset": end}
    if closed:
        expected["streamClosed"] = True
    else:
        expected["streamCursor"] = cursor
        if up_to_date:
            expected["upToDate"] = True
    assert json.loads(control.data) == expected


def test_a_closure_with_no_new_bytes_is_the_control_event_alone() -> None:
    log = StreamLog(
        key=LogKey(stream=STREAM, scope=PUBLIC_SCOPE),
        instance=StreamInstance(stream=STREAM, content_type=TEXT_TYPE),
    )
    end = position(3)
    frames = sse_frames(
        log, Coverage(segments=(), end=end, capped=False),
        up_to_date=True, closed=True, cursor=CURSOR, chunked=False,
    )  # fmt: skip
    assert decoded_events(frames, chunked=False) == [
        SseEvent(event="control", data=json.dumps({"streamNextOffset": end, "streamClosed": True},
                 separators=(",", ":")), id=end),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("content_type", "encoding"),
    [
        ("text/plain", "text"),
        ("Text/HTML; charset=utf-8", "text"),
        ("application/json", "text"),
        ("application/json; charset=utf-8", "text"),
        ("application/octet-stream", "base64"),
        ("application/x-ndjson", "base64"),
        (None, "base64"),
    ],
)
def test_data_events_carry_text_only_for_text_and_json(
    content_type: str | None, encoding: str
) -> None:
    assert sse_encoding(content_type) == encoding


def test_a_chunk_is_its_hex_size_and_the_bytes() -> None:
    assert chunk(b"hello, world") == b"c\r\nhello, world\r\n"
