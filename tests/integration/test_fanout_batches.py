"""Batches that pile up while the SSE fan-out is busy reach a viewer at the tail in one write.

When the edge's upstream tail reads several batches at once (the origin wrote them while the
fan-out was still writing the last one), the fan-out writes them to each viewer at the tail as one
data event and one control event, not one pair per batch (``edge.live.tail``, ``TailListener``).
The reference origin cannot be made to put three batches in one write on demand, so a small
aiohttp application stands in for it here, as in ``test_hostile_origin.py``; the edge is the
real process.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from devstack.processes import Edge, start_edge
from edge.protocol.sse import SseDecoder

PATH = "/v1/stream/piled"
START = "0000_0000"
JSON = {"Content-Type": "application/json", "Access-Control-Allow-Origin": "*"}


@dataclass
class Origin:
    url: str = ""
    upstream_open: asyncio.Event = field(default_factory=asyncio.Event)
    write_now: asyncio.Event = field(default_factory=asyncio.Event)
    sse_requests: int = 0


def event(kind: str, data: object, event_id: str | None = None) -> str:
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {kind}\ndata: {text}\n\n"


def piled_app(origin: Origin) -> web.Application:
    async def read(request: web.Request) -> web.StreamResponse:
        if request.query.get("live") != "sse":
            # Every catch-up read (and long-poll) finds the stream empty at START.
            headers = {**JSON, "Stream-Next-Offset": START, "Stream-Up-To-Date": "true"}
            return web.Response(body=b"[]", headers=headers)
        origin.sse_requests += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        origin.upstream_open.set()
        await origin.write_now.wait()
        piled = "".join(
            event("data", [{"i": i}]) + event("control", {"streamNextOffset": f"0000_000{i}"})
            for i in (1, 2, 3)
        )
        await response.write(piled.encode())  # three batches in one write
        await asyncio.sleep(30)
        return response

    async def head(request: web.Request) -> web.Response:
        return web.Response(headers=JSON)

    app = web.Application()
    app.router.add_route("HEAD", "/{tail:.*}", head)
    app.router.add_get("/{tail:.*}", read, allow_head=False)
    return app


@pytest.fixture
async def piled() -> AsyncIterator[Origin]:
    state = Origin()
    runner = web.AppRunner(piled_app(state), shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield state
    state.write_now.set()
    await runner.cleanup()


@pytest.fixture
async def edge_on_piled(piled: Origin, logs_dir: Path) -> AsyncIterator[Edge]:
    edge = await asyncio.to_thread(
        start_edge, piled.url, logs_dir, "--tail-mode", "sse", name="edge-piled"
    )
    yield edge
    await asyncio.to_thread(edge.stop)


async def test_batches_read_together_reach_a_viewer_at_the_tail_in_one_write(
    piled: Origin, edge_on_piled: Edge, http: aiohttp.ClientSession
) -> None:
    url = f"{edge_on_piled.url}{PATH}?offset={START}&live=sse"
    decoder = SseDecoder()
    events = []
    async with http.get(url) as response, asyncio.timeout(30):
        assert response.status == 200
        # The viewer is at the tail once the edge's upstream tail is open (it parks before
        # the tail's request leaves).
        await piled.upstream_open.wait()
        piled.write_now.set()
        async for chunk in response.content.iter_any():
            events += decoder.feed(chunk)
            if any(e.event == "control" and e.id == "0000_0003" for e in events):
                break
    assert piled.sse_requests == 1
    data = [(e.id, json.loads(e.data)) for e in events if e.event == "data"]
    assert data == [("0000_0003", [{"i": 1}, {"i": 2}, {"i": 3}])]
    controls = [json.loads(e.data) for e in events if e.event == "control"]
    assert [c["streamNextOffset"] for c in controls] == ["0000_0003"]
