"""Faults degrade service with a clear status, and the edge adds nothing the client did not send."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from devstack.processes import Edge, Origin, start_edge
from tests.integration.test_passthrough import call, metric_value


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def readyz(edge: Edge) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(edge.admin_url + "/readyz", timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


async def test_origin_down_answers_502_and_not_ready(
    http: aiohttp.ClientSession, own_origin: Origin, logs_dir: Path
) -> None:
    edge = start_edge(own_origin.url, logs_dir, name="edge-origin-down")
    try:
        status, _, _ = await call(
            http, "PUT", edge.url + "/s", headers={"Content-Type": "text/plain"}
        )
        assert status == 201
        assert readyz(edge)[0] == 200

        own_origin.stop()
        status, headers, body = await call(http, "GET", edge.url + "/s?offset=-1")
        assert status == 502
        assert dict(headers)["Content-Type"].startswith("text/plain")
        assert b"origin unreachable" in body
        assert metric_value(edge.metrics_text(), "edge_origin_errors_total", reason="connect") >= 1
        await asyncio.sleep(1.1)  # readiness answers are cached for a second
        code, report = readyz(edge)
        assert code == 503
        assert report["ready"] is False
        assert edge.process.alive()
    finally:
        edge.stop()


async def test_origin_too_slow_answers_504(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    edge = start_edge(origin.url, logs_dir, "--upstream-headers-timeout", "0.5", name="edge-504")
    try:
        url = edge.url + stream_path
        _, headers, _ = await call(http, "PUT", url, headers={"Content-Type": "text/plain"})
        tail = dict(headers)["Stream-Next-Offset"]
        # The origin holds this long-poll for 3 s; the edge gives it half a second. (An extra
        # parameter makes it a pass-through, not one the edge answers from its own tail.)
        status, _, body = await call(http, "GET", f"{url}?offset={tail}&live=long-poll&x=1")
        assert status == 504
        assert b"in time" in body
        assert metric_value(edge.metrics_text(), "edge_origin_errors_total", reason="timeout") == 1
    finally:
        edge.stop()


async def test_origin_dying_mid_stream_is_never_a_clean_end(
    http: aiohttp.ClientSession, own_origin: Origin, logs_dir: Path
) -> None:
    edge = start_edge(own_origin.url, logs_dir, name="edge-mid-stream")
    try:
        url = edge.url + "/dying"
        await call(http, "PUT", url, headers={"Content-Type": "text/plain"})
        await call(http, "POST", url, headers={"Content-Type": "text/plain"}, data=b"partial")
        # A relayed SSE read (extra parameter): the edge's own viewers would instead wait for
        # the origin to come back, which the live tests cover.
        async with http.get(url + "?offset=-1&live=sse&via=relay") as response:
            assert response.status == 200
            await response.content.readany()
            own_origin.process.kill()
            with pytest.raises(aiohttp.ClientPayloadError):
                await asyncio.wait_for(response.read(), 5)
    finally:
        edge.stop()


async def test_upstream_request_carries_only_what_the_client_sent(logs_dir: Path) -> None:
    """A recording peer stands in the origin's place to show exactly what the edge sends."""
    seen: list[web.Request] = []
    bodies: list[bytes] = []

    async def record(request: web.Request) -> web.StreamResponse:
        seen.append(request)
        bodies.append(await request.read())
        return web.Response(status=204, headers={"X-Peer": "1"})

    peer_app = web.Application()
    peer_app.router.add_route("*", "/{tail:.*}", record)
    async with TestServer(peer_app, host="127.0.0.1") as peer:
        peer_host = f"127.0.0.1:{peer.port}"
        origin_url = f"http://{peer_host}"
        edge = start_edge(origin_url, logs_dir, name="edge-hygiene")
        try:
            async with aiohttp.ClientSession(
                skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
            ) as client:
                async with client.post(
                    edge.url + "/v1/s?b=2&a=1&offset=-1",
                    data=b"payload",
                    headers={
                        "Host": "public.example",
                        "Connection": "keep-alive, X-Hop",
                        "X-Hop": "secret",
                        "Keep-Alive": "timeout=9",
                        "Producer-Id": "p",
                        "X-Forwarded-For": "203.0.113.9",
                    },
                ) as response:
                    assert response.status == 204
                    assert response.headers["X-Peer"] == "1"
                async with client.get(edge.url + "/v1/s?offset=now") as response:
                    assert response.status == 204  # not cacheable: relayed as is
                async with client.get(
                    edge.url + "/v1/s?offset=-1", headers={"X-Trace": "t", "Cookie": "c=1"}
                ) as response:
                    assert response.status == 204  # a cache fill, answered by the peer
        finally:
            edge.stop()

    post, get, fill = seen
    assert post.method == "POST"
    assert post.raw_path == "/v1/s?b=2&a=1&offset=-1"  # the query string exactly as sent
    assert bodies[0] == b"payload"
    assert post.headers["Host"] == peer_host
    assert post.headers["Producer-Id"] == "p"
    assert post.headers["X-Forwarded-For"] == "203.0.113.9, 127.0.0.1"
    assert post.headers["X-Forwarded-Proto"] == "http"
    assert post.headers["Via"] == "1.1 edge"
    assert 'host="public.example"' in post.headers["Forwarded"]
    for hop in ("X-Hop", "Keep-Alive"):
        assert hop not in post.headers
    for never_added in ("Content-Type", "Accept-Encoding", "User-Agent", "Accept"):
        assert never_added not in post.headers, never_added
        assert never_added not in get.headers, never_added
    assert "Content-Length" not in get.headers
    assert "Transfer-Encoding" not in get.headers

    # The edge's own fill asks for identity bytes, with only the credentials of the scope.
    assert fill.raw_path == "/v1/s?offset=-1"
    assert sorted(fill.headers) == ["Accept-Encoding", "Cookie", "Host", "Via"]
    assert fill.headers["Accept-Encoding"] == "identity"
    assert fill.headers["Cookie"] == "c=1"


async def test_long_poll_says_502_not_nothing_new_when_the_origin_is_gone(
    http: aiohttp.ClientSession, own_origin: Origin, logs_dir: Path
) -> None:
    edge = start_edge(own_origin.url, logs_dir, "--long-poll-timeout", "2", name="edge-lp-down")
    try:
        url = edge.url + "/lp"
        _, headers, _ = await call(http, "PUT", url, headers={"Content-Type": "text/plain"})
        tail = dict(headers)["Stream-Next-Offset"]
        waiting = asyncio.create_task(call(http, "GET", f"{url}?offset={tail}&live=long-poll"))
        await asyncio.sleep(0.5)
        own_origin.process.kill()  # a crash: connections reset, nothing answers any more
        status, _, body = await asyncio.wait_for(waiting, 10)
        assert status == 502
        assert b"origin unavailable" in body
    finally:
        edge.stop()
