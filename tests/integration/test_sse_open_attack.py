"""The SSE open the connection serves (``edge.web.fast_sse``) from outside: its head is sent
with the feed's first frame (one send) and its status line and headers come from a memo keyed
by what they are made of (``sse_head_start``). Real processes only: the reference origin (behind
a forwarder whose CORS the test switches, where the CORS policy is the point), an edge with the
connection's own path and one with ``--fast-path off`` (the reference for bytes), raw sockets.

* Whatever the origin's CORS policy becomes between opens (one grant for all, a grant per
  ``Origin`` with ``Vary: Origin``, none) and whatever the stream becomes (deleted and made
  again as JSON, text, binary: a base64 header), every SSE head is the full path's byte for
  byte (``Date`` aside), for HTTP/1.1 and 1.0, keep-alive and close, with a ``Last-Event-ID``,
  behind the tail, at it and at ``now``, of open and closed streams.
* A viewer at the tail of a quiet stream gets its head (EventSource's ``onopen``) before any
  data exists, not with the first data.
* SSE reads pipelined between catch-ups are answered in order as the full path answers them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin, start_edge
from tests.integration.own_reads_support import (
    append,
    edge_pair,
    exchange,
    full_path_requests,
    host_port,
    make_stream,
    read_answers,
    request,
    settled,
    tail_of,
)
from tests.integration.test_passthrough import call
from tests.integration.test_remembered_heads_attack import (
    GRANTED,
    no_tracebacks,
)
from tests.integration.test_remembered_heads_attack import (
    cors_switch as cors_switch,  # the fixture: the origin behind a CORS switch
)

ONE = ("--workers", "1")
LAST_CHUNK = b"\r\n0\r\n\r\n"  # a chunked answer's end, after its last chunk's
# What an open stream's SSE answer is read to: the catch-up from the start, else the first frame.
CAUGHT_UP = b'"upToDate":true}'
RETRY = b"retry: 1000\n\n"
ORIGINS = ((), (f"Origin: {GRANTED}",), ("Origin: https://other.example",))
# Ways of asking for one SSE read: (extra header lines, HTTP version).
ASKED = {
    "plain": ((), "1.1"),
    "close": (("Connection: close",), "1.1"),
    "http10": ((), "1.0"),
    "http10-keep-alive": (("Connection: keep-alive",), "1.0"),
    "last-event-id-start": (("Last-Event-ID: -1",), "1.1"),
    "last-event-id-junk": (("Last-Event-ID: zzzz",), "1.1"),
}


@pytest.fixture(scope="module")
def edges(origin: Origin, logs_dir: Path) -> Iterator[tuple[Edge, Edge]]:
    with edge_pair(origin, logs_dir, "sse-open", *ONE) as pair:
        yield pair
        no_tracebacks(*pair)


@pytest.fixture
async def switched_edges(
    cors_switch: tuple[str, dict[str, str]], logs_dir: Path
) -> AsyncIterator[tuple[Edge, Edge, dict[str, str]]]:
    """Both edges in front of the origin behind the CORS switch, and the switch."""
    url, mode = cors_switch
    fast = await asyncio.to_thread(start_edge, url, logs_dir, *ONE, name="sse-cors-fast")
    try:
        full = await asyncio.to_thread(
            start_edge, url, logs_dir, *ONE, "--fast-path", "off", name="sse-cors-full"
        )
    except BaseException:
        await asyncio.to_thread(fast.stop)
        raise
    try:
        yield fast, full, mode
    finally:
        await asyncio.to_thread(full.stop)
        await asyncio.to_thread(fast.stop)
    no_tracebacks(fast, full)


def sse_head(target: str, *headers: str, version: str = "1.1") -> bytes:
    lines = [f"GET {target} HTTP/{version}", "Host: edge.test", *headers, "", ""]
    return "\r\n".join(lines).encode()


async def opening(url: str, payload: bytes, until: bytes | None) -> tuple[bytes, bytes]:
    """An SSE answer's head (its ``Date`` line dropped) and its body: to its end (a closed
    stream's, a refusal's), or to the end of ``until`` (an open stream's feed never ends). Each
    wait is bounded only against a hang: the head must come, and the bytes asked for."""
    reader, writer = await asyncio.open_connection(*host_port(url))
    try:
        writer.write(payload)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")]
        length = next(
            (
                int(line.split(b":")[1])
                for line in lines
                if line.lower().startswith(b"content-length:")
            ),
            None,
        )
        if length is not None:
            return b"\r\n".join(lines), await asyncio.wait_for(reader.readexactly(length), 10)
        body = b""
        while not (until is not None and until in body) and not body.endswith(LAST_CHUNK):
            data = await asyncio.wait_for(reader.read(65536), 10)
            if not data:
                break  # written to the close
            body += data
        if until is not None and until in body:
            body = body[: body.index(until) + len(until)]
        return b"\r\n".join(lines), body
    finally:
        writer.close()


def cursorless(frames: bytes) -> bytes:
    """Frames up to the first cursor (a cursor follows the clock, read at two moments)."""
    return frames.split(b"streamCursor")[0]


async def same_openings(
    edges: tuple[Edge, Edge], path: str, tail: str, closed: bool,
    asked: dict[str, tuple[tuple[str, ...], str]], *headers: str,
) -> None:  # fmt: skip
    """An SSE read of ``path`` from the start, at its ``tail`` and at ``now``, each way it is
    ``asked``: the fast edge's head is the full path's, and so are the frames it begins with
    (all of a ``closed`` stream's)."""
    fast, full = edges
    for offset in ("-1", tail, "now"):
        until = None if closed else CAUGHT_UP if offset == "-1" else RETRY
        for way, (extra, version) in asked.items():
            payload = sse_head(f"{path}?offset={offset}&live=sse", *headers, *extra,
                               version=version)  # fmt: skip
            mine = await opening(fast.url, payload, until)
            theirs = await opening(full.url, payload, until)
            where = (path, offset, way, headers)
            assert mine[0] == theirs[0], (where, mine[0], theirs[0])
            assert cursorless(mine[1]) == cursorless(theirs[1]), (where, mine[1], theirs[1])


async def test_every_sse_head_is_the_full_paths_as_the_origins_cors_changes(
    http: aiohttp.ClientSession,
    origin: Origin,
    stream_path: str,
    switched_edges: tuple[Edge, Edge, dict[str, str]],
) -> None:
    """One grant for all, then a grant per ``Origin`` (``Vary: Origin``), then none (which
    teaches nothing), and back: each edge learns the policy from reads that reach the origin,
    and every SSE open after is the full path's, for a request with no ``Origin``, the
    granted one and another (that one relayed while the edge has no word on it)."""
    fast, full, mode = switched_edges
    closed, open_ = stream_path + "-closed", stream_path + "-open"
    await make_stream(http, origin.url + closed, "text/plain", b"c" * 50, close=True)
    await make_stream(http, origin.url + open_, "text/plain", b"o" * 50, close=False)
    tails = {path: await tail_of(http, origin.url + path) for path in (closed, open_)}
    plain = {"plain": ASKED["plain"]}
    for step in ("star", "per-origin", "star", "none", "per-origin", "star"):
        mode["cors"] = step
        for edge in (fast, full):
            for headers in ORIGINS:
                learn = f"{closed}?offset=-1&learn={time.monotonic()}"
                await exchange(edge.url, request(learn, *headers), ["GET"])
        for path, tail in tails.items():
            for headers in ORIGINS:
                await same_openings((fast, full), path, tail, path == closed, plain, *headers)


@pytest.mark.parametrize("through", ["edge", "origin"])
async def test_every_sse_head_is_the_full_paths_as_the_stream_is_made_again(
    http: aiohttp.ClientSession,
    origin: Origin,
    edges: tuple[Edge, Edge],
    stream_path: str,
    through: str,
) -> None:
    """The stream deleted (through the edges, or at the origin where they do not see it) and
    made again as another type, closed and open: each SSE open, each way it can be asked, is
    the full path's (the base64 header comes and goes with the type)."""
    url = origin.url + stream_path
    kinds = [
        ("text/plain", b"hello"),
        ("application/json", b'{"a":1}'),
        ("application/octet-stream", bytes(range(40))),
        ("text/plain", b"again"),
    ]
    made = False
    for content_type, body in kinds:
        for closed in (True, False):
            if made:
                deleting = [e.url + stream_path for e in edges] if through == "edge" else [url]
                for target in deleting:
                    status, _, _ = await call(http, "DELETE", target)
                    assert status in (204, 404), status
            await make_stream(http, url, content_type, body, close=closed)
            made = True
            tail = await tail_of(http, url)
            await same_openings(edges, stream_path, tail, closed, ASKED)
            fast_head, _ = await opening(
                edges[0].url,
                sse_head(f"{stream_path}?offset=-1&live=sse"),
                None if closed else CAUGHT_UP,
            )
            based = b"stream-sse-data-encoding: base64" in fast_head
            assert based == (content_type == "application/octet-stream"), fast_head


@pytest.mark.parametrize("offset", ["tail", "now"])
async def test_a_viewer_at_the_tail_of_a_quiet_stream_gets_its_head_before_any_data(
    http: aiohttp.ClientSession,
    origin: Origin,
    edges: tuple[Edge, Edge],
    stream_path: str,
    offset: str,
) -> None:
    """EventSource's ``onopen`` comes with the head: at the tail of a stream nobody writes to,
    the head (and the ``retry:`` frame it is sent with) comes while there is no data, the
    first time the edge sees the stream and once it knows it; the data, once written, follows
    on the same answer."""
    fast, _ = edges
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"before", close=False)
    before = full_path_requests(fast)
    for turn in range(2):  # unknown to the edge (its task waits first), then known
        tail = await tail_of(http, url)
        target = f"{stream_path}?offset={tail if offset == 'tail' else 'now'}&live=sse"
        reader, writer = await asyncio.open_connection(*host_port(fast.url))
        try:
            writer.write(sse_head(target))
            # Nothing is written to the stream until the head is here: a head held back
            # for the first data never comes, and the bound against a hang fails the test.
            answer = await asyncio.wait_for(read_head_and_retry(reader), 10)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
            written = f"after{turn}".encode()
            await append(http, url, written)
            data = await asyncio.wait_for(reader.readuntil(b"\n\n"), 10)
            assert b"\r\nevent: data\ndata:" + written + b"\nid: " in data, data
        finally:
            writer.close()
    assert full_path_requests(fast) == before


async def read_head_and_retry(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    return head + await reader.readuntil(RETRY + b"\r\n")


async def test_sse_reads_pipelined_between_catch_ups_are_the_full_paths_in_order(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    """Catch-ups and SSE reads of a closed stream on one connection (from the start, at the
    tail with a ``Last-Event-ID`` behind it, with an ``Origin``, at ``now``): every answer the
    full path's, in order; and an SSE read of an open stream after a catch-up on one
    connection begins after that catch-up's answer."""
    fast, full = edges
    closed, open_ = stream_path + "-closed", stream_path + "-open"
    await make_stream(http, origin.url + closed, "application/json", b'{"a":1}', b'[{"b":2}]',
                      close=True)  # fmt: skip
    await make_stream(http, origin.url + open_, "application/octet-stream", b"\x00\x01",
                      close=False)  # fmt: skip
    await settled(edges, f"{closed}?offset=-1")  # its lifetime learnt: Cache-Control settled
    tail = await tail_of(http, origin.url + closed)
    payload = (
        request(f"{closed}?offset=-1")
        + request(f"{closed}?offset=-1&live=sse")
        + request(f"{closed}?offset={tail}&live=sse", "Last-Event-ID: -1")
        + request(f"{closed}?offset=-1")
        + request(f"{closed}?offset=-1&live=sse", "Origin: https://x.example")
        + request(f"{closed}?offset=now&live=sse")
        + request(f"{closed}?offset=-1", "Connection: close")
    )
    methods = ["GET"] * 7
    for _ in range(3):  # met, stored, remembered
        mine = await exchange(fast.url, payload, methods)
        theirs = await exchange(full.url, payload, methods)
        for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            assert a.comparable() == b.comparable(), (index, a, b)
    open_tail = await tail_of(http, origin.url + open_)
    pipelined = request(f"{open_}?offset=-1") + request(f"{open_}?offset={open_tail}&live=sse")
    for edge in edges:
        reader, writer = await asyncio.open_connection(*host_port(edge.url))
        try:
            writer.write(pipelined)
            first = (await asyncio.wait_for(read_answers(reader, ["GET"]), 10))[0]
            assert first.body == b"\x00\x01"
            head = await asyncio.wait_for(read_head_and_retry(reader), 10)
            assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
            assert b"stream-sse-data-encoding: base64\r\n" in head
        finally:
            writer.close()
