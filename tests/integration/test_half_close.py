"""A client's half-close ends its sending, not its answer (issue 27, case 5).

A client that sends a complete request and then shuts its sending side (``shutdown(SHUT_WR)``,
as ``nc -N``, some proxies and HTTP/1.0-style clients do) is answered everything it sent, on the
edge's own connection path (``--fast-path on``: the connection answers hits and hands the rest to
aiohttp one request at a time, or for good after a body) and on aiohttp's alone (``--fast-path
off``), and the connection is closed after the last answer. The reference origin alone does the
same. A live reader (SSE, long-poll) that half-closes is taken as gone, as the origin takes it;
a client that half-closes and then goes away for real frees everything.

Each test talks raw sockets to the real edge in front of the real reference origin; streams are
made and checked at the origin directly, so every read through the edge starts as a miss.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devstack.processes import Edge, Origin, start_edge
from tests.conftest import ORIGIN_LONG_POLL_MS
from tests.integration.test_passthrough import metric_value, wait_until

# The edge's live readers end within this after their client is gone (a heartbeat, a timeout).
SSE_HEARTBEAT_SECONDS = "0.5"
TAIL_LINGER_SECONDS = "0.5"
# A raw read waits at most this for the edge to close (a hang fails instead of stalling the run).
READ_LIMIT_SECONDS = 20.0


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]  # lower-cased names (each appears once in these answers)
    body: bytes


@pytest.fixture(
    scope="module",
    params=[("on", "1"), ("off", "1"), ("on", "2")],
    ids=["fast-path-workers1", "full-path-workers1", "fast-path-workers2"],
)
def half_edge(request: pytest.FixtureRequest, origin: Origin, logs_dir: Path) -> Iterator[Edge]:
    fast, workers = request.param
    started = start_edge(
        origin.url,
        logs_dir,
        *("--fast-path", fast, "--workers", workers),
        *("--long-poll-timeout", str(ORIGIN_LONG_POLL_MS / 1000)),
        *("--sse-heartbeat", SSE_HEARTBEAT_SECONDS, "--tail-linger", TAIL_LINGER_SECONDS),
        name=f"edge-half-close-{fast}-{workers}",
    )
    yield started
    started.stop()


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _connect(edge: Edge) -> socket.socket:
    sock = socket.create_connection(_address(edge.url), timeout=READ_LIMIT_SECONDS)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_to_eof(sock: socket.socket) -> bytes:
    received = bytearray()
    while chunk := sock.recv(65536):
        received += chunk
    return bytes(received)


def _exchange(edge: Edge, sent: bytes) -> bytes:
    """Send ``sent``, half-close, and read everything until the edge closes."""
    return _exchange_with(_address(edge.url), sent)


def _exchange_with(address: tuple[str, int], sent: bytes) -> bytes:
    with socket.create_connection(address, timeout=READ_LIMIT_SECONDS) as sock:
        sock.sendall(sent)
        sock.shutdown(socket.SHUT_WR)
        return _read_to_eof(sock)


def _request(
    method: str, target: str, *, headers: dict[str, str] | None = None, body: bytes = b""
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: edge.test"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body or method in {"POST", "PUT"}:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _replies(data: bytes, methods: list[str]) -> list[Reply]:
    """The answers in ``data``, one per request method sent, in order; the rest must be empty."""
    replies = []
    for method in methods:
        head, separator, data = data.partition(b"\r\n\r\n")
        assert separator, f"an answer is missing: {head[:200]!r}"
        status_line, *fields = head.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ")[1])
        headers = {}
        for field in fields:
            name, _, value = field.partition(":")
            headers[name.strip().lower()] = value.strip()
        if method == "HEAD" or status in (204, 304):
            body = b""
        elif "content-length" in headers:
            length = int(headers["content-length"])
            body, data = data[:length], data[length:]
            assert len(body) == length, "the body was cut short"
        else:
            assert headers.get("transfer-encoding") == "chunked", headers
            body, data = _dechunk(data)
        replies.append(Reply(status=status, headers=headers, body=body))
    assert data == b"", f"bytes after the last answer: {data[:200]!r}"
    return replies


def _dechunk(data: bytes) -> tuple[bytes, bytes]:
    body = bytearray()
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            _, _, data = data.partition(b"\r\n")  # no trailers in these answers
            return bytes(body), data
        body += data[:size]
        assert data[size : size + 2] == b"\r\n", "a chunk was cut short"
        data = data[size + 2 :]


def _origin_call(
    origin: Origin, method: str, path: str, body: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    return _call(origin.url, method, path, body)


def _call(
    base: str, method: str, path: str, body: bytes | None = None, **headers: str
) -> tuple[int, dict[str, str], bytes]:
    """One request on a connection of its own (urllib sends ``Connection: close``)."""
    if method in {"PUT", "POST"}:
        headers.setdefault("Content-Type", "text/plain")
    request = urllib.request.Request(base + path, data=body, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()


def _new_stream(origin: Origin, path: str, data: bytes = b"") -> str:
    """Made at the origin directly; its tail offset."""
    _, headers, _ = _origin_call(origin, "PUT", path)
    if data:
        _, headers, _ = _origin_call(origin, "POST", path, data)
    return headers["stream-next-offset"]


def _held(edge: Edge) -> dict[str, float]:
    text = edge.metrics_text()
    names = ("edge_client_connections", "edge_live_readers", "edge_sse_viewers")
    held = {name: metric_value(text, name) for name in names}
    held["edge_long_polls_waiting"] = metric_value(text, "edge_long_polls_waiting")
    held["edge_open_connections"] = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("edge_open_connections{")
    )
    return held


async def _freed(edge: Edge, *, tails: bool = False) -> None:
    """The edge holds nothing for the clients of these tests any more: no connection, no live
    reader, no viewer, no request in progress (and, with ``tails``, no live tail)."""

    def nothing_held() -> bool:
        held = _held(edge)
        if tails:
            held["edge_live_tails"] = metric_value(edge.metrics_text(), "edge_live_tails")
        return not any(held.values())

    await wait_until(nothing_held, within=READ_LIMIT_SECONDS)


async def test_a_miss_is_answered_after_a_half_close(
    half_edge: Edge, origin: Origin, stream_path: str
) -> None:
    tail = _new_stream(origin, stream_path, b"first bytes")
    sent = _request("GET", f"{stream_path}?offset=-1")
    (reply,) = _replies(await asyncio.to_thread(_exchange, half_edge, sent), ["GET"])
    assert (reply.status, reply.body) == (200, b"first bytes")
    assert reply.headers["stream-next-offset"] == tail
    await _freed(half_edge)


async def test_a_post_is_answered_and_applied_once(
    half_edge: Edge, origin: Origin, stream_path: str
) -> None:
    _new_stream(origin, stream_path)
    sent = _request("POST", stream_path, headers={"Content-Type": "text/plain"}, body=b"once")
    (reply,) = _replies(await asyncio.to_thread(_exchange, half_edge, sent), ["POST"])
    assert reply.status in (200, 204)
    status, headers, body = _origin_call(origin, "GET", f"{stream_path}?offset=-1")
    assert (status, body) == (200, b"once")
    assert reply.headers["stream-next-offset"] == headers["stream-next-offset"]
    await _freed(half_edge)


async def test_a_head_is_answered_after_a_half_close(
    half_edge: Edge, origin: Origin, stream_path: str
) -> None:
    tail = _new_stream(origin, stream_path, b"some bytes")
    (reply,) = _replies(
        await asyncio.to_thread(_exchange, half_edge, _request("HEAD", stream_path)), ["HEAD"]
    )
    assert reply.status == 200
    assert reply.headers["stream-next-offset"] == tail
    await _freed(half_edge)


@pytest.mark.parametrize("first", ["GET", "POST"])
async def test_a_pipelined_pair_is_answered_in_order(
    half_edge: Edge, origin: Origin, stream_path: str, first: str
) -> None:
    """Two requests sent at once, then the half-close: a read of another stream (a miss) or an
    append (a body: aiohttp takes the connection for good), then a read of this one."""
    other = stream_path + "-other"
    _new_stream(origin, other, b"other bytes")
    tail = _new_stream(origin, stream_path, b"a")
    if first == "GET":
        sent = _request("GET", f"{other}?offset=-1")
        expected_first = (200, b"other bytes")
    else:
        sent = _request("POST", stream_path, headers={"Content-Type": "text/plain"}, body=b"b")
        expected_first = (204, b"")
    sent += _request("GET", f"{stream_path}?offset=-1")
    replies = _replies(await asyncio.to_thread(_exchange, half_edge, sent), [first, "GET"])
    assert (replies[0].status, replies[0].body) == expected_first
    assert replies[1].status == 200
    assert replies[1].body == (b"a" if first == "GET" else b"ab")
    if first == "GET":
        assert replies[1].headers["stream-next-offset"] == tail
    _, _, body = _origin_call(origin, "GET", f"{stream_path}?offset=-1")
    assert body == replies[1].body
    await _freed(half_edge)


def _reset(sock: socket.socket) -> None:
    """Close with an RST, as a client that truly goes away does (no FIN, nothing more read)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _tasks(edge: Edge) -> float:
    return metric_value(edge.metrics_text(), "edge_event_loop_tasks")


@pytest.mark.parametrize("live", ["long-poll", "sse"])
async def test_a_live_reader_that_half_closes_is_taken_as_gone(
    half_edge: Edge, origin: Origin, stream_path: str, live: str
) -> None:
    """As at the origin: TCP cannot tell a half-close from a client that closed and left, and a
    live reader that left frees its slot, its upstream and its tail at once (the module rules
    of ``edge.protocol.half_close``). Nothing appended after the half-close reaches it."""
    tail = _new_stream(origin, stream_path)
    sent = _request("GET", f"{stream_path}?offset={tail}&live={live}")
    from_origin = await asyncio.to_thread(_exchange_with, _address(origin.url), sent)
    from_edge = await asyncio.to_thread(_exchange, half_edge, sent)
    _origin_call(origin, "POST", stream_path, b"after the half-close")
    for received in (from_origin, from_edge):
        assert not received.startswith(b"HTTP/1.1 2") or live == "sse", received
        assert b"after the half-close" not in received
    await _freed(half_edge, tails=True)


async def test_a_half_closed_client_that_resets_frees_everything(
    half_edge: Edge, origin: Origin, stream_path: str
) -> None:
    """A miss in flight when its client half-closes and then resets: the edge answers into a
    reset socket and holds nothing after it, not a task more than before."""
    await _freed(half_edge, tails=True)
    tasks = _tasks(half_edge)
    _new_stream(origin, stream_path, b"never read")
    sock = _connect(half_edge)
    try:
        sock.sendall(_request("GET", f"{stream_path}?offset=-1"))
        sock.shutdown(socket.SHUT_WR)
    finally:
        _reset(sock)
    await _freed(half_edge, tails=True)
    await wait_until(lambda: _tasks(half_edge) <= tasks, within=READ_LIMIT_SECONDS)


async def test_a_request_cut_short_by_the_half_close_is_closed_at_once(
    half_edge: Edge, origin: Origin, stream_path: str
) -> None:
    """A body that can never arrive whole: nothing to answer, nothing applied, nothing held
    (the handler is not left waiting for the rest)."""
    _new_stream(origin, stream_path)
    sent = _request("POST", stream_path, headers={"Content-Type": "text/plain"}, body=b"whole")
    cut = sent.replace(b"Content-Length: 5", b"Content-Length: 50")
    received = await asyncio.to_thread(_exchange, half_edge, cut)
    assert not received.startswith(b"HTTP/1.1 2")
    _, _, body = _origin_call(origin, "GET", f"{stream_path}?offset=-1")
    assert body == b""
    await _freed(half_edge)


async def test_pipelined_hits_past_the_socket_buffers_are_all_answered(
    half_edge: Edge, origin: Origin, stream_path: str
) -> None:
    """More hits than the sockets hold: the connection answers until its writes back up, and
    waits with its reading paused; the half-close behind the last head ends nothing until every
    head before it is answered."""
    data = b"x" * 16384
    _new_stream(origin, stream_path, data)
    _call(origin.url, "POST", stream_path, **{"Stream-Closed": "true"})
    hit = _request("GET", f"{stream_path}?offset=-1")
    assert _call(half_edge.url, "GET", f"{stream_path}?offset=-1")[::2] == (200, data)
    count = 300
    replies = _replies(await asyncio.to_thread(_exchange, half_edge, hit * count), ["GET"] * count)
    assert [(r.status, r.body) for r in replies] == [(200, data)] * count
    await _freed(half_edge)
