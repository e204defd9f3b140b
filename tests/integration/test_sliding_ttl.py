"""A sliding ``Stream-TTL`` is renewed when the origin takes a read up (PROTOCOL.md 5.1), not when
its body ends: a fill whose body takes a while must not make the edge believe the stream lives
longer than it does at the origin.

The reference origin cannot be made to send a body slowly, so a small aiohttp application
stands in for it: one closed JSON stream with a sliding TTL, renewed as the reference origin
renews it (``touchAccess`` when a read is taken up; a HEAD renews nothing), whose reads send
their body over ``TRICKLE_SECONDS``. The edge is the real process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from devstack.processes import Edge, start_edge

# The body takes most of the TTL: the edge's lifetime probe (HEAD, right after the fill) still
# finds the stream, and an edge counting the TTL from the body's end would trust its copy
# until half a TTL after that (``StreamLog.tail_trusted``), well past the origin's expiry.
TTL_SECONDS = 6
TRICKLE_SECONDS = 5.0
BODY = b'[{"i":1}]'
END = "0000_0001"


@dataclass
class SlidingOrigin:
    url: str = ""
    last_access: float = 0.0
    reads: int = 0
    heads: int = 0

    def expired(self) -> bool:
        return time.monotonic() >= self.last_access + TTL_SECONDS


def sliding_app(state: SlidingOrigin) -> web.Application:
    async def read(request: web.Request) -> web.StreamResponse:
        if state.expired():
            return web.Response(status=404, text="Stream not found")
        state.last_access = time.monotonic()  # renewed as the read is taken up
        state.reads += 1
        headers = {
            "Content-Type": "application/json",
            "Stream-Next-Offset": END,
            "Stream-Up-To-Date": "true",
            "Stream-Closed": "true",
        }
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        pieces = [BODY[:3], BODY[3:6], BODY[6:]]
        for piece in pieces:
            await asyncio.sleep(TRICKLE_SECONDS / len(pieces))
            await response.write(piece)
        await response.write_eof()
        return response

    async def head(request: web.Request) -> web.Response:
        state.heads += 1
        if state.expired():
            return web.Response(status=404)
        return web.Response(
            headers={"Content-Type": "application/json", "Stream-TTL": str(TTL_SECONDS)}
        )

    app = web.Application()
    app.router.add_route("HEAD", "/{tail:.*}", head)
    app.router.add_get("/{tail:.*}", read, allow_head=False)
    return app


@pytest.fixture
async def sliding() -> AsyncIterator[SlidingOrigin]:
    state = SlidingOrigin(last_access=time.monotonic())
    runner = web.AppRunner(sliding_app(state))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield state
    await runner.cleanup()


@pytest.fixture
async def edge_on_sliding(sliding: SlidingOrigin, logs_dir: Path) -> AsyncIterator[Edge]:
    edge = await asyncio.to_thread(
        start_edge, sliding.url, logs_dir, "--workers", "1", name="edge-sliding"
    )
    yield edge
    await asyncio.to_thread(edge.stop)


async def test_a_slow_fill_does_not_stretch_a_sliding_ttl(
    http: aiohttp.ClientSession, sliding: SlidingOrigin, edge_on_sliding: Edge
) -> None:
    url = f"{edge_on_sliding.url}/v1/stream/slow"
    sliding.last_access = time.monotonic()  # created now, once the edge is up
    async with http.get(url + "?offset=-1") as response:
        assert response.status == 200
        assert await response.read() == BODY
    renewed_at = sliding.last_access  # when the origin took the fill up, before its body
    for _ in range(100):  # the edge asks the lifetime once it has the body (HEAD)
        if sliding.heads:
            break
        await asyncio.sleep(0.02)
    assert sliding.heads == 1, (sliding.heads, sliding.reads)
    # Past the origin's expiry (a TTL after it took the read up), before an edge that counted
    # from the end of the body would ask the origin again.
    await asyncio.sleep(renewed_at + TTL_SECONDS + 1.0 - time.monotonic())
    async with http.head(f"{sliding.url}/v1/stream/slow") as alone:
        assert alone.status == 404, (sliding.reads, time.monotonic() - renewed_at)
    async with http.get(url + "?offset=-1") as response:
        assert response.status == 404, (response.headers.get("Cache-Status"), sliding.reads)
