"""Issue 27, outside attack: a write whose origin connection breaks after the origin took it.

The reference origin cannot be made to apply a request and then break its connection before
answering (a crash, a reset on the way back), so a small stand-in does: it counts each write,
breaks the connection on the first of a path, and answers later ones as the reference origin
answers a repeated DELETE (404) or a repeated creating PUT (200). The edge itself is the real
process. A client of the origin alone sees its connection break: the outcome unknown. Through
the edge it must not be told a wrong outcome.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, start_edge
from tests.integration.replicas import fetch

REPEATED = {
    "DELETE": b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 16\r\n\r\n"
    b"Stream not found",
    "PUT": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
    b"Stream-Next-Offset: 0000000000000000_0000000000000000\r\nContent-Length: 0\r\n\r\n",
}
OTHER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nStream-Up-To-Date: true\r\n"
    b"Stream-Next-Offset: 0000000000000000_0000000000000000\r\nContent-Length: 0\r\n\r\n"
)


@dataclass
class Breaking:
    """The stand-in origin: how many times each (method, path) write reached it."""

    url: str = ""
    writes: dict[tuple[str, str], int] = field(default_factory=dict)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, target = head.decode("latin-1").split(" ", 2)[:2]
                length = re.search(r"(?i)content-length: *(\d+)", head.decode("latin-1"))
                if length is not None:
                    await reader.readexactly(int(length.group(1)))
                if method not in REPEATED:
                    writer.write(OTHER)
                    await writer.drain()
                    continue
                seen = self.writes.get((method, target), 0)
                self.writes[(method, target)] = seen + 1
                if seen == 0:
                    writer.transport.abort()  # applied, and the answer never leaves
                    return
                writer.write(REPEATED[method])
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass


@pytest.fixture
async def breaking() -> AsyncIterator[Breaking]:
    stand_in = Breaking()
    server = await asyncio.start_server(stand_in.serve, "127.0.0.1", 0)
    stand_in.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    yield stand_in
    server.close()
    await server.wait_closed()


@pytest.fixture
async def edge_on_breaking(breaking: Breaking, logs_dir: Path) -> AsyncIterator[Edge]:
    edge = await asyncio.to_thread(start_edge, breaking.url, logs_dir, name="edge-breaking")
    yield edge
    await asyncio.to_thread(edge.stop)


@pytest.mark.parametrize("method", ["DELETE", "PUT"])
async def test_a_write_whose_answer_was_lost_is_never_answered_as_its_repetition(
    http: aiohttp.ClientSession,
    breaking: Breaking,
    edge_on_breaking: Edge,
    stream_path: str,
    method: str,
) -> None:
    """The origin takes a DELETE (or a creating PUT) and its connection breaks before the
    answer. The edge sends it once, and says it failed (502): never the origin's answer to a
    second copy it sent on its own (404 to a DELETE that deleted the stream, 200 to a PUT that
    created it, after which the edge would not forget what it held of the path)."""
    answer = await fetch(
        http, method, edge_on_breaking.url + stream_path, headers={"Content-Type": "text/plain"}
    )
    assert breaking.writes == {(method, stream_path): 1}
    assert answer.status == 502
