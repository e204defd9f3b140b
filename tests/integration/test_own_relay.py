"""Reads the cache relays, served by the connection protocol itself (``edge.web.own_relay``):
HEAD misses, ``offset=now``, reads whose CORS answer is unknown for their ``Origin``, bypassed
streams, origin failures. The same bytes as the full path (an edge with ``--fast-path off``,
``Raw.comparable``), and no aiohttp handler entered (``edge_full_path_requests_total``).

The reference origin cannot be made to send ``no-store`` or to stall mid-body, so for those a
small aiohttp application stands in for it (as in ``test_hostile_origin.py``); everything else
runs against the real one.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from devstack.processes import Edge, Origin, start_edge
from tests.integration.own_reads_support import (
    READ_KINDS,
    Raw,
    edge_pair,
    exchange,
    host_port,
    make_stream,
    read_answers,
    request,
)
from tests.integration.own_reads_support import full_path_requests as entered_by_kind
from tests.integration.test_passthrough import call, metric_value

ARGS = ("--workers", "1", "--long-poll-timeout", "1")
KINDS = (*READ_KINDS, "other")
ORIGINS = itertools.count()


def fresh_origin() -> str:
    """An ``Origin`` neither edge has asked the origin about yet."""
    return f"Origin: https://app-{next(ORIGINS)}.example"


def full_path_requests(edge: Edge) -> dict[str, float]:
    return entered_by_kind(edge, KINDS)


COUNTED = [
    ("edge_requests_total", {"kind": "head", "code": "200"}),
    ("edge_requests_total", {"kind": "head", "code": "404"}),
    ("edge_requests_total", {"kind": "catchup", "code": "200"}),
    ("edge_requests_total", {"kind": "long_poll", "code": "200"}),
    ("edge_requests_total", {"kind": "long_poll", "code": "204"}),
    ("edge_requests_total", {"kind": "sse", "code": "200"}),
    ("edge_cache_requests_total", {"result": "bypass"}),
    ("edge_origin_requests_total", {"kind": "head", "code": "200"}),
    ("edge_origin_requests_total", {"kind": "head", "code": "404"}),
    ("edge_request_duration_seconds_count", {"kind": "head"}),
    ("edge_open_connections", {"kind": "sse"}),
]


def counted(edge: Edge) -> list[float]:
    text = edge.metrics_text()
    return [metric_value(text, name, **labels) for name, labels in COUNTED]


async def both(edges: tuple[Edge, Edge], payload: bytes, methods: list[str]) -> list[list[Raw]]:
    return list(await asyncio.gather(*(exchange(e.url, payload, methods) for e in edges)))


def same(answers: list[list[Raw]]) -> list[Raw]:
    fast, full = answers
    for ours, theirs in zip(fast, full, strict=True):
        assert ours.status_line == theirs.status_line
        assert ours.comparable()[1] == theirs.comparable()[1], ours.status_line
        assert ours.body == theirs.body
    return fast


@pytest.fixture(scope="module")
def edges(origin: Origin, logs_dir: Path) -> Iterator[tuple[Edge, Edge]]:
    with edge_pair(origin, logs_dir, "own-relay", *ARGS) as pair:
        yield pair


async def test_relayed_reads_are_the_full_paths_byte_for_byte_and_enter_no_handler(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    fast, _ = edges
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"one ", b"two", close=False)
    before = full_path_requests(fast)
    counted_before = [counted(edge) for edge in edges]

    # A HEAD of a stream the edge knows nothing of: the origin's answer, relayed.
    head = same(await both(edges, request(stream_path, method="HEAD"), ["HEAD"]))[0]
    assert head.status_line == b"HTTP/1.1 200 OK"
    assert head.header(b"Stream-Next-Offset") is not None
    # A HEAD of a stream the origin does not have: its 404.
    missing = request(stream_path + "-never", method="HEAD")
    assert same(await both(edges, missing, ["HEAD"]))[0].status_line.split()[1] == b"404"
    # offset=now: the origin's to answer, a GET and a long-poll.
    now = same(await both(edges, request(f"{stream_path}?offset=now"), ["GET"]))[0]
    assert now.header(b"Stream-Up-To-Date") == b"true"
    polled = request(f"{stream_path}?offset=now&live=long-poll")
    assert same(await both(edges, polled, ["GET"]))[0].status_line.split()[1] == b"204"
    status, _, _ = await call(http, "POST", url, headers={"Stream-Closed": "true"})
    assert status == 204
    # A HEAD the edge knows the answer to after all that: its own.
    assert same(await both(edges, request(stream_path, method="HEAD"), ["HEAD"]))

    assert full_path_requests(fast) == before
    # Counted as the full path counts them.
    fast_after, full_after = (counted(edge) for edge in edges)
    fast_delta = [a - b for a, b in zip(fast_after, counted_before[0], strict=True)]
    full_delta = [a - b for a, b in zip(full_after, counted_before[1], strict=True)]
    assert fast_delta[0] >= 2  # two HEADs answered 200
    assert fast_delta[6] == 1  # offset=now
    assert dict(zip(map(str, COUNTED), fast_delta, strict=True)) == dict(
        zip(map(str, COUNTED), full_delta, strict=True)
    )


async def test_a_pipelined_pair_behind_a_relay_is_answered_in_order(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    fast, _ = edges
    await make_stream(http, origin.url + stream_path, "text/plain", b"abc", close=False)
    before = full_path_requests(fast)
    payload = (
        request(f"{stream_path}?offset=now")
        + request(stream_path, method="HEAD")
        + request(f"{stream_path}?offset=-1")
        + request(f"{stream_path}?offset=now", "Connection: close")
    )
    answers = same(await both(edges, payload, ["GET", "HEAD", "GET", "GET"]))
    assert [a.body for a in answers] == [b"", b"", b"abc", b""]
    assert answers[3].header(b"Connection") == b"close"
    assert full_path_requests(fast) == before


async def test_a_half_close_after_a_head_miss_is_still_answered(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    fast, _ = edges
    await make_stream(http, origin.url + stream_path, "text/plain", b"x", close=False)
    reader, writer = await asyncio.open_connection(*host_port(fast.url))
    try:
        writer.write(request(stream_path, method="HEAD"))
        writer.write_eof()
        answer = (await asyncio.wait_for(read_answers(reader, ["HEAD"]), 10))[0]
        assert answer.status_line == b"HTTP/1.1 200 OK"
        assert await asyncio.wait_for(reader.read(), 10) == b""  # then it closes
    finally:
        writer.close()


async def test_an_origin_that_is_down_is_a_502_written_by_the_connection(
    logs_dir: Path,
) -> None:
    down = "http://127.0.0.1:9"  # nothing listens there
    fast = await asyncio.to_thread(start_edge, down, logs_dir, *ARGS, name="own-relay-down")
    try:
        full = await asyncio.to_thread(
            start_edge, down, logs_dir, *ARGS, "--fast-path", "off", name="own-relay-down-full"
        )
        try:
            pair = (fast, full)
            payload = (
                request("/v1/stream/s?offset=now")
                + request("/v1/stream/s", method="HEAD")
                + request("/v1/stream/s?offset=-1")
                + request("/v1/stream/s?offset=-1&live=long-poll")
            )
            answers = same(await both(pair, payload, ["GET", "HEAD", "GET", "GET"]))
            assert {a.status_line for a in answers} == {b"HTTP/1.1 502 Bad Gateway"}
            assert full_path_requests(fast) == dict.fromkeys(KINDS, 0.0)
        finally:
            await asyncio.to_thread(full.stop)
    finally:
        await asyncio.to_thread(fast.stop)


# --- a stand-in origin: no-store, and an answer that never ends ---


@dataclass
class StandIn:
    url: str = ""
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    # The Authorization of every request it was sent (None: none).
    authorizations: list[str | None] = field(default_factory=list)


def stand_in_app(state: StandIn) -> web.Application:
    async def read(request: web.Request) -> web.StreamResponse:
        state.authorizations.append(request.headers.get("Authorization"))
        headers = {"Content-Type": "text/plain", "Access-Control-Allow-Origin": "*"}
        if request.query.get("offset") == "now" and request.path.endswith("/endless"):
            # Headers, then a body that never ends: only a client that leaves ends it.
            response = web.StreamResponse(headers=headers)
            await response.prepare(request)
            try:
                while True:
                    await response.write(b"more ")
                    await asyncio.sleep(0.05)
            except (ConnectionError, asyncio.CancelledError):
                state.gone.set()
                raise
        if request.path.endswith("/cut"):
            # A body cut short: it says 100 bytes, and the connection ends after 7.
            response = web.StreamResponse(headers=headers)
            response.content_length = 100
            await response.prepare(request)
            await response.write(b"partial")
            assert request.transport is not None
            request.transport.close()
            return response
        if request.path.endswith("/cors"):
            # CORS by Origin: each Origin granted only itself.
            headers = {"Content-Type": "text/plain", "Vary": "Origin"}
            if "Origin" in request.headers:
                headers["Access-Control-Allow-Origin"] = request.headers["Origin"]
            headers |= {"Stream-Next-Offset": "0000_0001", "Stream-Up-To-Date": "true"}
            body = b"" if request.query.get("offset") == "now-ish" else b"granted"
            return web.Response(body=body, headers=headers | {"Stream-Closed": "true"})
        headers |= {
            "Cache-Control": "no-store",
            "Stream-Next-Offset": "0000_0001",
            "Stream-Up-To-Date": "true",
        }
        return web.Response(body=b"kept nowhere", headers=headers)

    app = web.Application()
    app.router.add_get("/{tail:.*}", read)
    return app


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    state = StandIn()
    runner = web.AppRunner(stand_in_app(state), handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield state
    await runner.cleanup()


@pytest.fixture
async def stand_in_edges(stand_in: StandIn, logs_dir: Path) -> AsyncIterator[tuple[Edge, Edge]]:
    fast = await asyncio.to_thread(start_edge, stand_in.url, logs_dir, *ARGS, name="own-no-store")
    try:
        full = await asyncio.to_thread(
            start_edge, stand_in.url, logs_dir, *ARGS, "--fast-path", "off",
            name="own-no-store-full",
        )  # fmt: skip
        try:
            yield fast, full
        finally:
            await asyncio.to_thread(full.stop)
    finally:
        await asyncio.to_thread(fast.stop)


async def test_a_stream_the_origin_forbids_keeping_is_relayed_by_the_connection(
    stand_in_edges: tuple[Edge, Edge],
) -> None:
    fast, _ = stand_in_edges
    target = request("/v1/stream/no-store?offset=-1")
    for _ in range(3):  # the first answer says no-store; those after are bypassed at once
        answer = same(await both(stand_in_edges, target, ["GET"]))[0]
        assert answer.body == b"kept nowhere"
        assert answer.header(b"Cache-Control") == b"no-store"
    bypassed = metric_value(fast.metrics_text(), "edge_cache_requests_total", result="bypass")
    assert bypassed >= 2
    assert full_path_requests(fast) == dict.fromkeys(KINDS, 0.0)


async def test_a_client_that_leaves_mid_relay_closes_the_origins_answer(
    stand_in: StandIn, stand_in_edges: tuple[Edge, Edge]
) -> None:
    fast, _ = stand_in_edges
    reader, writer = await asyncio.open_connection(*host_port(fast.url))
    writer.write(request("/v1/stream/endless?offset=now"))
    await reader.readuntil(b"\r\n\r\n")
    assert b"more " in await reader.readuntil(b"more ")
    writer.close()
    await asyncio.wait_for(stand_in.gone.wait(), 10)
    text = fast.metrics_text()
    assert metric_value(text, "edge_full_path_requests_total", kind="catchup") == 0


async def test_reads_from_an_origin_whose_cors_answer_is_unknown_are_relayed_by_the_connection(
    stand_in_edges: tuple[Edge, Edge],
) -> None:
    """Once the origin's CORS varies by ``Origin`` (learnt from a relayed answer), a read from
    an ``Origin`` it never answered is relayed: its answer teaches the edge."""
    fast, _ = stand_in_edges
    teach = request("/v1/stream/cors?offset=now", fresh_origin())
    assert same(await both(stand_in_edges, teach, ["GET"]))[0].header(b"Vary") == b"Origin"
    counted_before = [counted(edge) for edge in stand_in_edges]
    catchup = request("/v1/stream/cors?offset=-1", unknown := fresh_origin())
    answer = same(await both(stand_in_edges, catchup, ["GET"]))[0]
    assert answer.body == b"granted"
    assert b"detail=cors" in (answer.header(b"Cache-Status") or b"")
    assert answer.header(b"Access-Control-Allow-Origin") == unknown.split(": ")[1].encode()
    long_poll = request("/v1/stream/cors?offset=-1&live=long-poll", fresh_origin())
    answer = same(await both(stand_in_edges, long_poll, ["GET"]))[0]
    assert answer.body == b"granted"
    assert b"detail=cors" in (answer.header(b"Cache-Status") or b"")
    fast_after, full_after = (counted(edge) for edge in stand_in_edges)
    assert [a - b for a, b in zip(fast_after, counted_before[0], strict=True)] == [
        a - b for a, b in zip(full_after, counted_before[1], strict=True)
    ]
    assert full_path_requests(fast) == dict.fromkeys(KINDS, 0.0)


async def everything(url: str, payload: bytes) -> bytes:
    """What the edge writes for ``payload`` until it ends the connection."""
    reader, writer = await asyncio.open_connection(*host_port(url))
    writer.write(payload)
    received = b""
    try:
        while data := await asyncio.wait_for(reader.read(65536), 10):
            received += data
    except ConnectionResetError:
        pass  # aborted
    finally:
        writer.close()
    return received


def head_of(answer: bytes) -> Raw:
    """The status line and headers of the first answer in ``answer``."""
    lines = answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
    headers = [(name, value) for name, _, value in (line.partition(b": ") for line in lines[1:])]
    return Raw(lines[0], headers, b"")


async def test_a_body_the_origin_cuts_short_ends_the_connection_as_the_full_path_ends_it(
    stand_in_edges: tuple[Edge, Edge],
) -> None:
    fast, _ = stand_in_edges
    payload = request("/v1/stream/cut?offset=now") + request("/v1/stream/cut?offset=now")
    ours, theirs = await asyncio.gather(*(everything(e.url, payload) for e in stand_in_edges))
    heads = [head_of(answer) for answer in (ours, theirs)]
    assert heads[0].comparable() == heads[1].comparable()
    assert b"Content-Length: 100" in ours
    # The head and what came of the body, never the second answer: a truncated body must not
    # look complete, so the connection ends there.
    assert ours.split(b"\r\n\r\n", 1)[1] == theirs.split(b"\r\n\r\n", 1)[1]
    assert len(ours.split(b"\r\n\r\n", 1)[1]) < 100
    assert ours.count(b"HTTP/1.1 ") == 1
    assert full_path_requests(fast) == dict.fromkeys(KINDS, 0.0)


# --- an origin whose heads carry bytes that are not UTF-8, or a control character ---

ODD = b"caf\xe9 \xff\x80"  # HTTP's obs-text: bytes a header value may carry, not UTF-8


async def raw_origin(answer_for: dict[str, bytes]) -> tuple[asyncio.Server, str]:
    """A raw-socket origin: each request's path picks the head it is answered with (bytes as
    written, so a header may carry what no aiohttp server would write)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                path = head.split(b" ", 2)[1].split(b"?")[0].decode()
                body = b"body"
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                    + answer_for[path.rsplit("/", 1)[1]]
                    + b"Stream-Next-Offset: 0000_0004\r\nStream-Up-To-Date: true\r\n"
                    + b"Access-Control-Allow-Origin: *\r\n"
                    + b"Content-Length: %d\r\n\r\n" % len(body)
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_an_origin_head_with_odd_bytes_passes_as_sent_and_a_control_character_is_a_502(
    logs_dir: Path,
) -> None:
    """Bytes that are not UTF-8 in an origin's header value reach the client as the origin
    sent them, relayed (``offset=now``, a bypassed stream) or kept (a catch-up read twice);
    a header the edge cannot write (a control character) is the edge's 502, and the
    connection answers what follows."""
    server, url = await raw_origin(
        {
            "odd": b"X-Odd: " + ODD + b"\r\n",
            "oddbypass": b"X-Odd: " + ODD + b"\r\nCache-Control: no-store\r\n",
            "ctl": b"X-Ctl: a\x01b\r\nCache-Control: no-store\r\n",
        }
    )
    edge = await asyncio.to_thread(start_edge, url, logs_dir, *ARGS, name="own-odd-bytes")
    try:
        targets = [
            "/v1/stream/odd?offset=now", "/v1/stream/oddbypass?offset=-1",
            "/v1/stream/odd?offset=-1", "/v1/stream/odd?offset=-1", "/v1/stream/ctl?offset=-1",
            "/v1/stream/odd?offset=now",
        ]  # fmt: skip
        answers = await exchange(
            edge.url, b"".join(request(t) for t in targets), ["GET"] * len(targets)
        )
        for target, answer in zip(targets, answers, strict=True):
            if "ctl" in target:
                assert answer.status_line == b"HTTP/1.1 502 Bad Gateway", answer
                assert answer.body == b"origin answer cannot be relayed\n"
            else:
                assert answer.status_line == b"HTTP/1.1 200 OK", (target, answer)
                assert answer.header(b"X-Odd") == ODD, (target, answer.headers)
                assert answer.body == b"body"
        assert (
            metric_value(edge.metrics_text(), "edge_full_path_requests_total", kind="catchup") == 0
        )
    finally:
        await asyncio.to_thread(edge.stop)
        server.close()
        await server.wait_closed()
