"""Issue 27, outside attack: slowloris bodies. Request heads that trickle are cut by
``--header-timeout``; these connections send a whole head at once and then trickle a write's
body, a byte at a time, for as long as they like.

Real processes only: the reference origin and the edge with a small ``--max-connections``.
What a normal reader gets is compared with what the origin alone gives it meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin, start_edge
from tests.integration.replicas import fetch
from tests.integration.test_never_wrong import write

MAX_CONNECTIONS = 20
# More than the cap and the descriptors kept for short requests past it.
TRICKLERS = 3 * MAX_CONNECTIONS
TRICKLE_PAUSE_SECONDS = 0.2


@pytest.fixture
def capped(origin: Origin, logs_dir: Path) -> Iterator[Edge]:
    edge = start_edge(
        origin.url, logs_dir, "--max-connections", str(MAX_CONNECTIONS), "--header-timeout", "2",
        "--body-timeout", "0.5", name="slow-bodies",
    )  # fmt: skip
    yield edge
    edge.stop()


async def _trickle(url: str, path: str, started: asyncio.Event, count: list[int]) -> None:
    """A POST whose head is whole and whose body (of a declared length) comes a byte at a time."""
    host, _, port = url.removeprefix("http://").partition(":")
    with contextlib.suppress(OSError):
        reader, writer = await asyncio.open_connection(host, int(port))
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: text/plain\r\n"
            "Content-Length: 100000\r\n\r\n"
        )
        writer.write(head.encode())
        count[0] += 1
        if count[0] == TRICKLERS:
            started.set()
        try:
            while not reader.at_eof():
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(TRICKLE_PAUSE_SECONDS)
        finally:
            writer.close()


@pytest.mark.parametrize("target", ["origin", "edge"])
async def test_writes_whose_bodies_trickle_do_not_keep_readers_out(
    http: aiohttp.ClientSession, origin: Origin, capped: Edge, stream_path: str, target: str
) -> None:
    """TRICKLERS connections each send a POST head and then its body a byte every
    TRICKLE_PAUSE_SECONDS. Meanwhile a reader of the stream is answered 200 with its bytes, as
    the origin alone answers it (parametrized: the origin itself, then the edge)."""
    base = origin.url if target == "origin" else capped.url
    await write(http, origin.url + stream_path, [b"readable"])
    started = asyncio.Event()
    count = [0]
    tricklers = [
        asyncio.create_task(_trickle(base, stream_path, started, count)) for _ in range(TRICKLERS)
    ]
    try:
        await asyncio.wait_for(started.wait(), 10)
        await asyncio.sleep(TRICKLE_PAUSE_SECONDS * 5)  # every trickler has sent body bytes
        answer = await fetch(http, "GET", f"{base}{stream_path}?offset=-1")
        assert (answer.status, answer.body) == (200, b"readable")
    finally:
        for trickler in tricklers:
            trickler.cancel()
        await asyncio.gather(*tricklers, return_exceptions=True)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_write_whose_body_stalls_is_answered_408_and_never_applied(
    http: aiohttp.ClientSession, origin: Origin, capped: Edge, stream_path: str, framing: str
) -> None:
    """A POST whose body stops half-way past --body-timeout is answered 408 and closed, and the
    part of it that came is not appended: the edge relays bodies as they arrive, so the cut must
    reach the origin as an incomplete body, never as a whole one."""
    await write(http, origin.url + stream_path, [b"before"])
    host, _, port = capped.url.removeprefix("http://").partition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        framing_header = (
            "Content-Length: 100\r\n"
            if framing == "content-length"
            else "Transfer-Encoding: chunked\r\n"
        )
        part = b"partial"
        sent = part if framing == "content-length" else b"%x\r\n%s\r\n" % (len(part), part)
        writer.write(
            f"POST {stream_path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: text/plain\r\n"
            f"{framing_header}\r\n".encode()
            + sent
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)  # the edge closes: read to EOF
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    after = await fetch(http, "GET", f"{origin.url}{stream_path}?offset=-1")
    assert (after.status, after.body) == (200, b"before")
