"""Everything the edge derives is served only in the context it was derived for (issue 16).

* A gzip body being made while its stream is deleted and recreated is never stored for, or
  served as, the new stream (the real origin, the real edge with its pre-serialised hit path).
* With an origin whose CORS grants each requesting ``Origin`` its own (with credentials), one
  requester's grant never appears on another's answer, and a legitimate ``Origin`` is granted on
  cached answers too. The reference origin grants ``*`` to everyone, so a small pass-through in
  front of it rewrites only its CORS headers as such an origin would; bytes and Stream-* headers
  are the real origin's.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from devstack.processes import Edge, Origin, start_edge
from tests.integration.test_fast_path import fast_answers, get, make_stream, request
from tests.integration.test_passthrough import call

ONE = ("--workers", "1")
GOOD = "https://good.example"
EVIL = "https://evil.example"
ALLOWED = {GOOD, EVIL}


@pytest.fixture
async def edge(origin: Origin, logs_dir: Path) -> AsyncIterator[Edge]:
    started = await asyncio.to_thread(start_edge, origin.url, logs_dir, *ONE, name="derived")
    yield started
    await asyncio.to_thread(started.stop)


async def test_a_gzip_body_made_while_the_stream_is_recreated_is_never_the_new_streams(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    lines = [b"old line %07d of a long answer\n" % i for i in range(100_000)]  # ~3.3 MB
    old = b"".join(lines)
    chunk = 1000
    parts = [b"".join(lines[i : i + chunk]) for i in range(0, len(lines), chunk)]  # < 1 MiB each
    await make_stream(http, origin.url + stream_path, "text/plain", *parts, close=True)
    target = f"{stream_path}?offset=-1"
    for _ in range(3):  # learned, lifetime asked, immutable
        assert (await get(edge.url, target)).body == old
    gzip_request = request(target, "Accept-Encoding: gzip")
    reader, writer = await asyncio.open_connection(*edge.url.split("//")[1].rsplit(":", 1))
    writer.write(gzip_request)
    await writer.drain()
    await asyncio.sleep(0.002)  # the compression (in a thread, from 128 KiB) is under way
    status, _, _ = await call(http, "DELETE", edge.url + stream_path)
    assert status == 204
    status, _, _ = await call(
        http,
        "PUT",
        edge.url + stream_path,
        headers={"Content-Type": "text/plain", "Stream-Closed": "true"},
        data=b"NEW",
    )
    assert status == 201
    await asyncio.wait_for(reader.read(1), 30)  # the racing read was answered (either way)
    writer.close()
    for _ in range(6):  # fresh connections, as a browser's would be
        answer = await get(edge.url, target, "Accept-Encoding: gzip")
        body = answer.body
        if answer.header(b"Content-Encoding") == b"gzip":
            body = gzip.decompress(body)
        assert body == b"NEW", (answer.status_line, answer.header(b"Cache-Status"), len(body))
        await asyncio.sleep(0.05)


# --- an origin whose CORS is per requesting Origin ---


@pytest.fixture
async def per_origin_cors(origin: Origin) -> AsyncIterator[str]:
    """The real origin, with CORS as a credentialed, per-Origin origin sends it."""
    session = aiohttp.ClientSession(
        auto_decompress=False, skip_auto_headers=("Accept-Encoding", "Accept", "User-Agent")
    )

    async def forward(request: web.Request) -> web.StreamResponse:
        headers = [(n, v) for n, v in request.headers.items() if n.lower() not in ("host",)]
        async with session.request(
            request.method,
            origin.url + request.path_qs,
            headers=headers,
            data=await request.read(),
            allow_redirects=False,
        ) as answer:
            body = await answer.read()
            out = web.Response(status=answer.status, body=body)
            for name, value in answer.headers.items():
                lowered = name.lower()
                if lowered.startswith("access-control-") or lowered in (
                    "content-length",
                    "transfer-encoding",
                    "connection",
                    "date",
                    "server",
                ):
                    continue
                out.headers.add(name, value)
            asked = request.headers.get("Origin")
            if asked in ALLOWED:
                out.headers["Access-Control-Allow-Origin"] = asked
                out.headers["Access-Control-Allow-Credentials"] = "true"
                out.headers["Access-Control-Expose-Headers"] = "Stream-Next-Offset, ETag"
            out.headers.add("Vary", "Origin")
            return out

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()
    await session.close()


@pytest.fixture
async def cors_edge(per_origin_cors: str, logs_dir: Path) -> AsyncIterator[Edge]:
    started = await asyncio.to_thread(
        start_edge, per_origin_cors, logs_dir, *ONE, name="per-origin-cors"
    )
    yield started
    await asyncio.to_thread(started.stop)


async def test_one_requesters_cors_grant_is_never_stamped_on_anothers_answer(
    http: aiohttp.ClientSession,
    origin: Origin,
    cors_edge: Edge,
    stream_path: str,
) -> None:
    body = b"secret-ish " * 200
    await make_stream(http, origin.url + stream_path, "text/plain", body, close=True)
    target = f"{stream_path}?offset=-1"
    # The attacker's page reads first, many times: its grant is what the edge hears first.
    for _ in range(4):
        evil = await get(cors_edge.url, target, f"Origin: {EVIL}")
        assert evil.body == body
        assert evil.header(b"Access-Control-Allow-Origin") == EVIL.encode()
    served_before = fast_answers(cors_edge)
    for _ in range(4):
        victim = await get(cors_edge.url, target, f"Origin: {GOOD}")
        assert victim.body == body
        # The legitimate page is granted on cached answers, and only its own grant.
        assert victim.header(b"Access-Control-Allow-Origin") == GOOD.encode()
        vary = b", ".join(v for n, v in victim.headers if n.lower() == b"vary").lower()
        assert b"origin" in vary
        plain = await get(cors_edge.url, target)
        assert plain.body == body
        assert plain.header(b"Access-Control-Allow-Origin") is None
        stranger = await get(cors_edge.url, target, "Origin: https://stranger.example")
        assert stranger.header(b"Access-Control-Allow-Origin") is None
        assert stranger.header(b"Access-Control-Allow-Credentials") is None
    # The good page's reads became stored hits of their own (keyed by Origin).
    assert fast_answers(cors_edge) > served_before
    # The edge's own answers (a 400 here) grant nobody else's Origin either.
    refused = await get(cors_edge.url, f"ftp://h{stream_path}", f"Origin: {GOOD}")
    assert refused.status_line.startswith(b"HTTP/1.1 400")
    assert refused.header(b"Access-Control-Allow-Origin") in (None, GOOD.encode())
