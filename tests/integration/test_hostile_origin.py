"""An origin that says what the reference origin never would: the edge relays it to the one client
that asked and stores nothing of it.

The reference origin cannot be made to send ``no-store``, ``private``, or an offset with a newline
or a quote in it, so a small aiohttp application stands in for such an origin here (every other
test runs against the real one). The edge itself is the real process.
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
from edge.protocol.purge_keys import purge_keys
from edge.protocol.reads import is_offset_token
from edge.protocol.sse import SseDecoder

START = "0000_0000"
FIRST = "0000_0001"


@dataclass
class Hostile:
    """What the stand-in origin answers, per path, and how often it was asked."""

    url: str = ""
    reads: dict[str, int] = field(default_factory=dict)


def catchup_app(hostile: Hostile) -> web.Application:
    async def read(request: web.Request) -> web.StreamResponse:
        path = request.path
        hostile.reads[path] = hostile.reads.get(path, 0) + 1
        live = request.query.get("live")
        headers = {"Content-Type": "application/json", "Access-Control-Allow-Origin": "*"}
        # An origin that speaks to CDNs itself: its lifetimes and keys are not the edge's.
        headers |= {"CDN-Cache-Control": "max-age=3600", "Surrogate-Control": "max-age=3600"}
        headers["Surrogate-Key"] = "origin-own"
        if path.endswith("/injected") and live == "sse":
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            evil = json.dumps({"streamNextOffset": f'{FIRST}\nevent: data\ndata: ["evil"]'})
            await response.write(
                f'event: data\ndata: ["evil"]\n\nevent: control\ndata: {evil}\n\n'.encode()
            )
            await asyncio.sleep(3)
            return response
        if path.endswith("/injected"):
            headers.update({"Stream-Next-Offset": START, "Stream-Up-To-Date": "true"})
            return web.Response(body=b"[]", headers=headers)
        if path.endswith("/no-store"):
            headers["Cache-Control"] = "no-store"
        elif path.endswith("/private"):
            headers["Cache-Control"] = "private, max-age=60"
        elif path.endswith("/quoted"):
            headers.update({"Stream-Next-Offset": '0000_0001"evil', "Stream-Up-To-Date": "true"})
            return web.Response(body=b'[{"i":1}]', headers=headers)
        headers.update(
            {"Stream-Next-Offset": FIRST, "Stream-Up-To-Date": "true", "Stream-Closed": "true"}
        )
        return web.Response(body=b'[{"i":1}]', headers=headers)

    async def head(request: web.Request) -> web.Response:
        return web.Response(headers={"Content-Type": "application/json"})

    app = web.Application()
    app.router.add_route("HEAD", "/{tail:.*}", head)
    app.router.add_get("/{tail:.*}", read, allow_head=False)
    return app


@pytest.fixture
async def hostile() -> AsyncIterator[Hostile]:
    state = Hostile()
    runner = web.AppRunner(catchup_app(state))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    state.url = f"http://127.0.0.1:{port}"
    yield state
    await runner.cleanup()


@pytest.fixture
async def edge_on_hostile(hostile: Hostile, logs_dir: Path) -> AsyncIterator[Edge]:
    edge = await asyncio.to_thread(start_edge, hostile.url, logs_dir, name="edge-hostile")
    yield edge
    await asyncio.to_thread(edge.stop)


@pytest.mark.parametrize("path", ["/v1/stream/no-store", "/v1/stream/private"])
async def test_answers_the_origin_forbids_storing_are_relayed_not_stored(
    hostile: Hostile, edge_on_hostile: Edge, http: aiohttp.ClientSession, path: str
) -> None:
    for _ in range(3):
        async with http.get(f"{edge_on_hostile.url}{path}?offset=-1") as response:
            assert response.status == 200
            assert await response.read() == b'[{"i":1}]'
            control = response.headers.get("Cache-Control", "")
            assert "immutable" not in control
            assert "public" not in control
            assert control.split(",")[0] in ("no-store", "private")
            # Relayed to this client only: no tier keeps it, by any header a CDN would heed.
            assert response.headers.getall("Cache-Control") == ["no-store"]
            assert "CDN-Cache-Control" not in response.headers
            assert "Surrogate-Control" not in response.headers
    assert hostile.reads[path] == 3  # every read went to the origin


async def test_a_well_behaved_answer_is_still_cached(
    hostile: Hostile, edge_on_hostile: Edge, http: aiohttp.ClientSession
) -> None:
    path = "/v1/stream/fine"
    for _ in range(3):
        async with http.get(f"{edge_on_hostile.url}{path}?offset=-1") as response:
            assert response.status == 200
            assert await response.read() == b'[{"i":1}]'
            # The edge's own lifetimes and keys, never the origin's replayed beside them.
            assert response.headers.getall("Surrogate-Key") == [purge_keys(path).surrogate_key]
            for name in ("Cache-Control", "CDN-Cache-Control", "Surrogate-Control"):
                values = response.headers.getall(name)
                assert len(values) == 1, (name, values)
                assert values != ["max-age=3600"], name
    assert hostile.reads[path] == 1


async def test_an_offset_that_could_break_a_header_is_relayed_not_stored(
    hostile: Hostile, edge_on_hostile: Edge, http: aiohttp.ClientSession
) -> None:
    path = "/v1/stream/quoted"
    for _ in range(2):
        async with http.get(f"{edge_on_hostile.url}{path}?offset=-1") as response:
            assert response.status == 200
            etag = response.headers.get("ETag", "")
            assert "evil" not in etag  # the edge made no validator out of it
    assert hostile.reads[path] == 2


async def test_an_offset_with_a_newline_never_reaches_an_sse_frame(
    hostile: Hostile, edge_on_hostile: Edge, http: aiohttp.ClientSession
) -> None:
    url = f"{edge_on_hostile.url}/v1/stream/injected?offset=-1&live=sse"
    decoder = SseDecoder()
    events = []
    async with http.get(url) as response:
        assert response.status == 200
        try:
            async with asyncio.timeout(2.0):
                async for chunk in response.content.iter_any():
                    events += decoder.feed(chunk)
        except TimeoutError:
            pass
    for event in events:
        assert "evil" not in event.data
        assert event.id is None or is_offset_token(event.id)
    # What reaches viewers is only what the origin said validly: the empty start of the stream.
    assert [event.data for event in events if event.event == "data"] in ([], ["[]"])
