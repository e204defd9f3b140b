"""Long-polls released together get, byte for byte, what one long-poll alone would have got.

Raw sockets (the bytes as written, every HTTP/1.x framing) against a real edge in front of the
real origin. The reference for each waiter is the same request sent again once the data is
there: the single long-poll path, serialised by aiohttp, and a plain catch-up read.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from multidict import CIMultiDict

from devstack.processes import Edge, Origin, start_edge
from edge.protocol.cursor import current_interval
from tests.integration.test_passthrough import call, metric_value

JSON = {"Content-Type": "application/json"}
MASKED = ("date", "cache-status", "stream-cursor")
MAX_JUMP = 180  # intervals: the protocol's 3600 s jitter at 20 s each


@pytest.fixture
def patient_edge(origin: Origin, logs_dir: Path) -> Iterator[Edge]:
    """An edge whose long-polls wait long enough for hundreds of raw clients to gather."""
    # One process: the waiters released together are one process's, and each answer is compared
    # with the same request answered alone, which must reach the same process.
    started = start_edge(
        origin.url, logs_dir, "--long-poll-timeout", "30", "--workers", "1", name="patient-edge"
    )
    yield started
    started.stop()


@dataclass
class Response:
    status_line: bytes
    headers: list[tuple[str, str]]
    body: bytes
    raw: bytes

    def header(self, name: str) -> str | None:
        return next((v for n, v in self.headers if n.lower() == name), None)


def parse(data: bytes) -> tuple[Response, bytes] | None:
    """One complete response from the front of ``data`` and what follows it, or None."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.split(b"\r\n")
    headers = []
    for line in lines[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        headers.append((name, value.strip()))
    length = next((int(v) for n, v in headers if n.lower() == "content-length"), 0)
    if len(rest) < length:
        return None
    raw = data[: len(head) + 4 + length]
    return Response(lines[0], headers, rest[:length], raw), rest[length:]


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.buffer = b""

    @classmethod
    async def open(cls, url: str) -> Connection:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer)

    async def response(self, within: float = 30) -> Response:
        while True:
            parsed = parse(self.buffer)
            if parsed is not None:
                response, self.buffer = parsed
                return response
            chunk = await asyncio.wait_for(self.reader.read(65536), within)
            assert chunk, f"closed before a whole response: {self.buffer!r}"
            self.buffer += chunk

    async def closed_by_server(self) -> bool:
        """Whether the server closes the connection now (bytes that arrive instead are kept)."""
        if self.buffer:
            return False
        try:
            more = await asyncio.wait_for(self.reader.read(65536), 0.5)
        except TimeoutError:
            return False
        self.buffer += more
        return more == b""

    def close(self) -> None:
        self.writer.close()


@dataclass(frozen=True)
class Variant:
    version: str
    connection: str | None
    cursor: str | None
    accept_encoding: str | None

    def request(self, path: str, offset: str) -> bytes:
        target = f"{path}?offset={offset}&live=long-poll"
        if self.cursor is not None:
            target += f"&cursor={self.cursor}"
        lines = [f"GET {target} {self.version}", "Host: edge.test"]
        if self.connection is not None:
            lines.append(f"Connection: {self.connection}")
        if self.accept_encoding is not None:
            lines.append(f"Accept-Encoding: {self.accept_encoding}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    @property
    def keeps_alive(self) -> bool:
        # HTTP/1.0 is answered as HTTP/1.1 answers it, then closed (``http10`` in http1.py).
        return self.version == "HTTP/1.1" and self.connection != "close"


def variants(current: int) -> list[Variant]:
    cursors = [None, "garbage", str(current - 3), str(current), str(current + 40)]
    cursors.append("0" + str(current + 40))  # the same value as the one before: one class
    framings = [("HTTP/1.1", None), ("HTTP/1.1", "close"), ("HTTP/1.0", None)]
    framings.append(("HTTP/1.0", "keep-alive"))
    encodings = [None, "gzip", "gzip, deflate, br", "identity"]
    return [
        Variant(version, connection, cursor, encoding)
        for (version, connection), cursor, encoding in itertools.product(
            framings, cursors, encodings
        )
    ]


def masked(response: Response) -> tuple[bytes, list[tuple[str, str]], bytes]:
    headers = [(n, "*" if n.lower() in MASKED else v) for n, v in response.headers]
    return response.status_line, headers, response.body


async def wait_for_waiters(edge: Edge, count: int) -> None:
    give_up = time.monotonic() + 30
    while metric_value(edge.metrics_text(), "edge_long_polls_waiting") < count:
        assert time.monotonic() < give_up, "the long-polls never all waited"
        await asyncio.sleep(0.1)


async def tail_of(http: aiohttp.ClientSession, url: str) -> str:
    _, headers, _ = await call(http, "GET", f"{url}?offset=-1")
    return CIMultiDict(headers)["Stream-Next-Offset"]


async def test_five_hundred_mixed_long_polls_get_exactly_the_single_answer(
    http: aiohttp.ClientSession, origin: Origin, patient_edge: Edge, stream_path: str
) -> None:
    edge = patient_edge
    url = edge.url + stream_path
    await call(http, "PUT", url, headers=JSON)
    await call(http, "POST", url, headers=JSON, data=b'[{"before":1}]')
    offset = await tail_of(http, url)
    current = current_interval(time.time())
    kinds = variants(current)
    chosen = [kinds[i % len(kinds)] for i in range(500)]
    connections = await asyncio.gather(*(Connection.open(edge.url) for _ in chosen))
    for connection, variant in zip(connections, chosen, strict=True):
        connection.writer.write(variant.request(stream_path, offset))
    # A few connections pipeline a catch-up read behind their long-poll.
    pipelined = {i for i in range(0, 500, 50) if chosen[i].keeps_alive}
    for i in pipelined:
        connections[i].writer.write(
            f"GET {stream_path}?offset={offset} HTTP/1.1\r\nHost: edge.test\r\n\r\n".encode()
        )
    await wait_for_waiters(edge, len(chosen))

    news = json.dumps([{"news": "x" * 2000}]).encode()  # over 1 KiB: catch-up would gzip it
    status, _, _ = await call(http, "POST", origin.url + stream_path, headers=JSON, data=news)
    assert status == 204
    released = await asyncio.gather(*(c.response() for c in connections))
    after = current_interval(time.time())

    # The reference: the same request once the data is there (one long-poll, served alone).
    references: dict[Variant, tuple[Response, bool]] = {}
    for variant in set(chosen):
        alone = await Connection.open(edge.url)
        alone.writer.write(variant.request(stream_path, offset))
        references[variant] = (await alone.response(), await alone.closed_by_server())
        alone.close()
    _, catchup_headers, catchup_body = await call(http, "GET", f"{url}?offset={offset}")
    catchup = CIMultiDict(catchup_headers)

    cursors_by_class: dict[int | None, set[str]] = {}
    for variant, got in zip(chosen, released, strict=True):
        reference, reference_closed = references[variant]
        assert masked(got) == masked(reference), variant
        assert got.header("cache-status") == "edge; hit; detail=waited"
        assert reference.header("cache-status") == "edge; hit"
        assert got.body == catchup_body
        assert json.loads(got.body) == json.loads(news)
        assert got.header("etag") == catchup["ETag"]
        assert got.header("stream-next-offset") == catchup["Stream-Next-Offset"]
        assert got.header("stream-up-to-date") == catchup["Stream-Up-To-Date"] == "true"
        assert got.header("content-encoding") is None  # long-poll answers are never gzipped
        # The cursor rule (§8.1): behind, absent or malformed get the interval; others jump.
        cursor = got.header("stream-cursor")
        assert cursor is not None
        client = int(variant.cursor) if variant.cursor and variant.cursor.isdigit() else None
        if client is None or client < current:
            assert current <= int(cursor) <= after
        else:
            assert client < int(cursor) <= client + MAX_JUMP
        cursors_by_class.setdefault(client, set()).add(cursor)
        assert reference_closed == (not variant.keeps_alive)

    async def goes_on(i: int, connection: Connection, variant: Variant) -> None:
        """The connection goes on exactly as aiohttp's own answer left it."""
        assert await connection.closed_by_server() == (not variant.keeps_alive), variant
        if i in pipelined:
            behind = await connection.response()
            assert behind.status_line == b"HTTP/1.1 200 OK"
            assert behind.body == catchup_body
        if variant.keeps_alive:
            connection.writer.write(
                f"GET {stream_path}?offset={offset} HTTP/1.1\r\nHost: edge.test\r\n\r\n".encode()
            )
            again = await connection.response()
            assert again.status_line == b"HTTP/1.1 200 OK"
            assert again.body == catchup_body
        connection.close()

    await asyncio.gather(
        *(goes_on(i, c, v) for i, (c, v) in enumerate(zip(connections, chosen, strict=True)))
    )
    # One cursor drawn per class of client cursor, shared by every waiter in it.
    assert all(len(drawn) == 1 for drawn in cursors_by_class.values()), cursors_by_class
    assert metric_value(edge.metrics_text(), "edge_long_polls_waiting") == 0


async def test_a_closure_releases_waiters_with_the_single_closed_answer(
    http: aiohttp.ClientSession, origin: Origin, patient_edge: Edge, stream_path: str
) -> None:
    edge = patient_edge
    url = edge.url + stream_path
    await call(http, "PUT", url, headers=JSON)
    await call(http, "POST", url, headers=JSON, data=b"[1]")
    offset = await tail_of(http, url)
    chosen = variants(current_interval(time.time()))
    connections = await asyncio.gather(*(Connection.open(edge.url) for _ in chosen))
    for connection, variant in zip(connections, chosen, strict=True):
        connection.writer.write(variant.request(stream_path, offset))
    await wait_for_waiters(edge, len(chosen))
    close = {**JSON, "Stream-Closed": "true"}
    status, _, _ = await call(http, "POST", origin.url + stream_path, headers=close)
    assert status == 204
    released = await asyncio.gather(*(c.response() for c in connections))
    closes = await asyncio.gather(*(c.closed_by_server() for c in connections))
    for connection, variant, got, closed in zip(connections, chosen, released, closes, strict=True):
        alone = await Connection.open(edge.url)
        alone.writer.write(variant.request(stream_path, offset))
        reference = await alone.response()
        alone.close()
        assert got.status_line.endswith(b" 204 No Content")
        assert got.header("stream-closed") == "true"
        assert got.header("stream-cursor") is None  # a closed stream's answer has none
        assert got.raw.split(b"\r\n")[0] == reference.raw.split(b"\r\n")[0]
        assert masked(got) == masked(reference), variant
        assert closed == (not variant.keeps_alive)
        connection.close()


async def test_each_long_poll_times_out_at_its_own_deadline(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    edge = start_edge(origin.url, logs_dir, "--long-poll-timeout", "2", name="timeout-edge")
    try:
        url = edge.url + stream_path
        await call(http, "PUT", url, headers=JSON)
        offset = await tail_of(http, url)
        request = f"GET {stream_path}?offset={offset}&live=long-poll HTTP/1.1\r\nHost: e\r\n\r\n"

        async def one() -> tuple[float, Response]:
            connection = await Connection.open(edge.url)
            started = time.monotonic()
            connection.writer.write(request.encode())
            got = await connection.response()
            connection.close()
            return time.monotonic() - started, got

        early = [asyncio.create_task(one()) for _ in range(50)]
        await asyncio.sleep(1.0)
        late = [asyncio.create_task(one()) for _ in range(50)]  # the same group, a second on
        results = await asyncio.gather(*early, *late)
    finally:
        edge.stop()
    for elapsed, got in results:
        assert got.status_line == b"HTTP/1.1 204 No Content"
        assert got.header("stream-next-offset") == offset
        assert got.header("stream-up-to-date") == "true"
        assert got.header("cache-control") == "no-store"
        assert got.header("stream-cursor") is not None
        # Never before its own timeout: a later one released with the first would show ~1 s.
        # Late by the shared timer's 50 ms and whatever a busy machine adds (bounded loosely).
        assert 2.0 <= elapsed < 4.0, elapsed
