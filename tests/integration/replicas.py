"""Helpers for tests/integration/test_never_wrong.py: a cluster of edge replicas, one-shot reads
of every kind (catch-up, long-poll, SSE), a Redis relay that can be cut, and raw Redis access."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import redis.asyncio as redis
from yarl import URL

from devstack.processes import Edge, start_edge
from edge.protocol.sse import SseDecoder
from tests.integration.live_support import View, view_sse


@dataclass
class Cluster:
    """Edge replicas in front of one origin; ``redis_url`` is None when they share nothing."""

    edges: list[Edge]
    redis_url: str | None = None

    def __iter__(self) -> Iterator[Edge]:
        return iter(self.edges)


def start_replicas(origin_url: str, logs_dir: Path, names: list[str], *extra: str) -> list[Edge]:
    """Edges started together (each start is mostly its own imports), in ``names`` order."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(names)) as pool:
        starts = [
            pool.submit(start_edge, origin_url, logs_dir, *extra, name=name) for name in names
        ]
        concurrent.futures.wait(starts)
    failed = [start.exception() for start in starts if start.exception() is not None]
    if failed:
        for start in starts:
            if start.exception() is None:
                start.result().stop()
        raise failed[0]  # type: ignore[misc]
    return [start.result() for start in starts]


def raw(url: str) -> URL:
    """A URL sent exactly as written: no dot-segment removal by the client."""
    return URL(url, encoded=True)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.headers.items():
            if key.lower() == name.lower():
                return value
        return None


async def fetch(
    http: aiohttp.ClientSession,
    method: str,
    url: str | URL,
    *,
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
) -> Answer:
    async with http.request(method, url, headers=headers, data=data) as response:
        body = await response.read()
        return Answer(response.status, dict(response.headers.items()), body)


@dataclass
class SseRead:
    """One SSE connection read until the first control event that says up-to-date or closed."""

    status: int
    body: bytearray = field(default_factory=bytearray)
    items: list[object] = field(default_factory=list)
    controls: list[dict[str, object]] = field(default_factory=list)
    error: str | None = None


async def sse_once(
    http: aiohttp.ClientSession,
    url: str | URL,
    *,
    headers: dict[str, str] | None = None,
    json_stream: bool = False,
    seconds: float = 5.0,
) -> SseRead:
    """Read one SSE connection (``url`` carries offset and ``live=sse``) until a control event
    says up-to-date or closed, or ``seconds`` pass; bytes count once their control came."""
    decoder = SseDecoder()
    pending: list[str] = []
    read = SseRead(status=-1)
    try:
        async with asyncio.timeout(seconds), http.get(url, headers=headers) as response:
            read.status = response.status
            if response.status != 200:
                read.body += await response.read()
                return read
            while True:
                chunk = await response.content.read(65536)
                if not chunk:
                    read.error = "ended"
                    return read
                for event in decoder.feed(chunk):
                    if event.event == "data":
                        pending.append(event.data)
                    elif event.event == "control":
                        control = json.loads(event.data)
                        for data in pending:
                            if json_stream:
                                read.items += json.loads(data)
                            else:
                                read.body += data.encode()
                        pending.clear()
                        read.controls.append(control)
                        if control.get("upToDate") or control.get("streamClosed"):
                            return read
    except TimeoutError:
        read.error = "timeout"
    except aiohttp.ClientError as error:
        read.error = repr(error)
    return read


async def tolerant_viewer(
    http: aiohttp.ClientSession, url: str, view: View, *, deadline: float, statuses: list[int]
) -> View:
    """``view_sse`` that survives non-200 answers (recorded in ``statuses``) by resuming from
    the last offset it was given, until the stream closes or ``deadline`` seconds pass. ``view``
    is filled in place, so what arrived is known even if the task is cancelled."""
    give_up = time.monotonic() + deadline
    while not view.closed and time.monotonic() < give_up:
        try:
            await view_sse(
                http,
                url,
                offset=view.next_offset or "-1",
                view=view,
                deadline=give_up - time.monotonic(),
            )
        except AssertionError as failure:
            statuses.append(int(failure.args[0]) if failure.args else -1)
            await asyncio.sleep(0.2)
    return view


class RedisRelay:
    """A loopback TCP relay to Redis that can be cut (every connection reset, new ones refused
    at once) and healed: a network partition between one replica and Redis."""

    def __init__(self, redis_port: int) -> None:
        self._redis_port = redis_port
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.cut_off = False
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_off:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._redis_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        pumps = [
            asyncio.ensure_future(self._pump(reader, up_writer)),
            asyncio.ensure_future(self._pump(up_reader, writer)),
        ]
        for task in pumps:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for w in (writer, up_writer):
            w.transport.abort()
            self._writers.discard(w)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while chunk := await reader.read(65536):
                if self.cut_off:
                    return
                writer.write(chunk)
                await writer.drain()

    def cut(self) -> None:
        self.cut_off = True
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def heal(self) -> None:
        self.cut_off = False

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def redis_keys(port: int, pattern: str = "edge:*") -> list[bytes]:
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        return sorted([key async for key in client.scan_iter(match=pattern)])
    finally:
        await client.aclose()


async def redis_dump(port: int, keys: list[bytes]) -> dict[bytes, bytes | None]:
    """The string value of each key (None for keys of another type)."""
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        values: dict[bytes, bytes | None] = {}
        for key in keys:
            kind = await client.type(key)
            value = await client.get(key) if kind in (b"string", "string") else None
            values[key] = value.encode() if isinstance(value, str) else value
        return values
    finally:
        await client.aclose()


async def redis_overwrite(port: int, values: dict[bytes, bytes]) -> None:
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        for key, value in values.items():
            await client.set(key, value, ex=3600)
    finally:
        await client.aclose()
