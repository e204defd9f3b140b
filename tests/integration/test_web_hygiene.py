"""What the edge says and to whom: request targets, stream aliases, scopes, error answers."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import BaseTestServer, TestServer
from multidict import CIMultiDict

from devstack.processes import Edge, Origin, free_port, start_edge, workers_under_test
from edge.config import Address, Settings
from edge.metrics import Metrics
from edge.origin import (
    OriginBroken,
    OriginClient,
    OriginTimeout,
    OriginUnreachable,
    translate,
)
from edge.web import app as stream_app
from edge.web import live_reads
from edge.web.proxy import OriginCors, origin_error_response
from tests.integration.test_passthrough import call, metric_value

CORS_NAMES = (
    "access-control-allow-origin",
    "access-control-allow-methods",
    "access-control-allow-headers",
    "access-control-expose-headers",
    "x-content-type-options",
    "cross-origin-resource-policy",
)
ORIGIN_CORS = [
    ("access-control-allow-origin", "*"),
    ("access-control-expose-headers", "Stream-Next-Offset"),
    ("x-content-type-options", "nosniff"),
    ("cross-origin-resource-policy", "cross-origin"),
]


# --- pure: what errors say, and the CORS record ---


@pytest.mark.parametrize(
    ("error", "status", "text"),
    [
        (OriginUnreachable("origin unreachable: connect to ('10.1.2.3', 4437) failed"), 502,
         b"origin unreachable\n"),
        (translate(TimeoutError()), 504, b"origin timed out\n"),
        (translate(aiohttp.ServerDisconnectedError("at 10.1.2.3:4437")), 502,
         b"origin connection failed\n"),
        (translate(aiohttp.ClientPayloadError("bad chunk length at 10.1.2.3")), 502,
         b"origin connection failed\n"),
    ],
)  # fmt: skip
def test_origin_errors_tell_the_client_a_fixed_text(
    error: Exception, status: int, text: bytes
) -> None:
    assert isinstance(error, OriginUnreachable | OriginTimeout | OriginBroken)
    response = origin_error_response(error, OriginCors(), None)
    assert (response.status, response.body) == (status, text)
    assert "10.1.2.3" in str(error) or isinstance(error, OriginTimeout)  # kept for the log


def test_cors_record_follows_the_origin_and_adds_only_what_is_missing() -> None:
    cors = OriginCors()
    answer: CIMultiDict[str] = CIMultiDict()
    cors.add_missing(answer, None)
    assert list(answer.items()) == []  # no origin answer seen yet: nothing is invented

    cors.remember(None, [("content-type", "text/plain"), *ORIGIN_CORS])
    cors.remember(None, [("content-type", "text/plain")])  # an answer without any: says nothing
    answer = CIMultiDict([("Access-Control-Allow-Origin", "https://app.example")])
    cors.add_missing(answer, "https://app.example")
    assert answer.getall("access-control-allow-origin") == ["https://app.example"]
    assert [(n.lower(), v) for n, v in answer.items()][1:] == ORIGIN_CORS[1:]
    assert not cors.varies  # "*" for everyone: one policy


def test_cors_that_varies_by_origin_is_given_per_origin_and_never_guessed() -> None:
    cors = OriginCors()
    cors.remember(None, ORIGIN_CORS)
    evil = [
        ("access-control-allow-origin", "https://evil.example"),
        ("access-control-allow-credentials", "true"),
        ("vary", "Origin"),
    ]
    cors.remember("https://evil.example", evil)
    assert cors.varies
    assert cors.for_request("https://evil.example") == tuple(evil[:2])
    # Another Origin is never given evil's grant: unknown until the origin says.
    assert cors.for_request("https://good.example") is None
    assert cors.unknown_for("https://good.example")
    answer: CIMultiDict[str] = CIMultiDict()
    cors.add_missing(answer, "https://good.example")
    assert "access-control-allow-origin" not in answer
    assert answer.getall("vary") == ["Origin"]
    good = [("access-control-allow-origin", "https://good.example")]
    cors.remember("https://good.example", good)
    assert cors.for_request("https://good.example") == tuple(good)
    assert cors.for_request(None) == tuple(ORIGIN_CORS)  # no Origin: what fills were told


# --- helpers ---


def raw_request(base_url: str, head: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One request written byte for byte (no client library normalises the target)."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    header_block, _, payload = received.partition(b"\r\n\r\n")
    status_line, *lines = header_block.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), value.strip())
    if headers.get("transfer-encoding") == "chunked":
        payload = dechunked(payload)
    return int(status_line.split()[1]), headers, payload


def dechunked(payload: bytes) -> bytes:
    out = b""
    while payload:
        size_line, _, payload = payload.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out, payload = out + payload[:size], payload[size + 2 :]
    return out


def get(base_url: str, target: str, *headers: str) -> tuple[int, dict[str, str], bytes]:
    host = base_url.removeprefix("http://")
    lines = "".join(f"{header}\n" for header in headers)
    return raw_request(base_url, f"GET {target} HTTP/1.1\nHost: {host}\n{lines}Connection: close\n")


def catchup_reads(origin: Origin, path: str) -> int:
    return sum(
        r["count"]
        for r in origin.counts(path)["requests"]
        if r["method"] == "GET" and r["live"] is None
    )


async def closed_stream(http: aiohttp.ClientSession, url: str, body: bytes) -> None:
    status, _, _ = await call(
        http,
        "PUT",
        url,
        data=body,
        headers={"Content-Type": "text/plain", "Stream-Closed": "true"},
    )
    assert status == 201


# --- request targets ---


async def test_absolute_form_uses_only_path_and_query(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    await closed_stream(http, origin.url + stream_path, b"absolute")
    # An authority that would fail if the edge used it: a closed port, and a name that does
    # not resolve.
    for authority in (f"127.0.0.1:{free_port()}", "evil.invalid"):
        status, headers, body = await asyncio.to_thread(
            get, edge.url, f"http://{authority}{stream_path}?offset=-1"
        )
        assert (status, body) == (200, b"absolute"), body
        assert headers["stream-closed"] == "true"
    # One stream, one fill (per worker process: each read here is its own connection), then hits.
    assert 1 <= catchup_reads(origin, stream_path) <= int(workers_under_test())

    # A create by absolute-form: the origin's Location names the Host, never the authority.
    edge_host = edge.url.removeprefix("http://")
    status, headers, _ = await asyncio.to_thread(
        raw_request,
        edge.url,
        f"PUT http://evil.invalid{stream_path}-created HTTP/1.1\nHost: {edge_host}\n"
        "Content-Type: text/plain\nContent-Length: 0\nConnection: close\n",
    )
    assert status == 201
    assert headers["location"] == f"{edge.url}{stream_path}-created"


async def test_targets_the_edge_refuses_never_reach_the_origin(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    await closed_stream(http, edge.url + stream_path, b"x")  # the edge has seen the origin
    before = origin.counts()["total"]
    for target in (f"ftp://h{stream_path}", f"/..//{stream_path}", f"//[::1]{stream_path}"):
        status, headers, body = await asyncio.to_thread(get, edge.url, target)
        assert status == 400, target
        assert b"request target" in body, body
        assert headers["access-control-allow-origin"] == "*"
    host = edge.url.removeprefix("http://")
    status, headers, _ = await asyncio.to_thread(
        raw_request, edge.url, f"OPTIONS * HTTP/1.1\nHost: {host}\nConnection: close\n"
    )
    assert status == 204
    assert headers["access-control-allow-methods"]
    assert origin.counts()["total"] == before


async def test_aliases_of_a_path_are_one_stream(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    await closed_stream(http, origin.url + stream_path, b"one stream")
    # Each read is a new connection; enough of them reach every worker process (one by
    # default), and each worker's cache then holds the stream.
    workers = int(workers_under_test())
    for _ in range(1 if workers == 1 else 40):
        status, headers, body = await asyncio.to_thread(get, edge.url, f"{stream_path}?offset=-1")
        assert (status, body) == (200, b"one stream")
    parent, _, name = stream_path.rpartition("/")
    for alias in (
        f"{parent}/./{name}",
        f"{parent}/elsewhere/../{name}",
        f"{parent}/%2e/{name}",
        f"{parent}/x/%2E%2e/{name}",
        f"{parent}\\{name}",
    ):
        status, headers, body = await asyncio.to_thread(get, edge.url, f"{alias}?offset=-1")
        assert (status, body) == (200, b"one stream"), alias
        assert headers["cache-status"] == "edge; hit", alias
    assert 1 <= catchup_reads(origin, stream_path) <= workers


# --- edge-made answers ---


async def test_edge_made_answers_carry_cors_and_no_origin_address(
    http: aiohttp.ClientSession, own_origin: Origin, logs_dir: Path
) -> None:
    # One process: the --max-viewers refusal below needs both viewers on one worker.
    edge = start_edge(
        own_origin.url, logs_dir, "--workers", "1", "--max-viewers", "1", name="edge-hygiene-cors"
    )
    try:
        url = edge.url + "/v1/stream/cors"
        status, _, _ = await call(http, "PUT", url, headers={"Content-Type": "text/plain"})
        assert status == 201

        # --max-viewers: the second viewer is refused, in a way a browser can read.
        async with http.get(url + "?offset=-1&live=sse") as first:
            assert first.status == 200
            # No answer names the software and version serving it, streamed or on the admin port.
            assert "Server" not in first.headers
            for path in ("/healthz", "/metrics", "/readyz"):
                async with http.get(edge.admin_url + path) as admin:
                    assert "Server" not in admin.headers, path
            status, headers, body = await call(http, "GET", url + "?offset=-1&live=sse")
            assert status == 503
            assert {n.lower() for n, _ in headers} >= set(CORS_NAMES)
            assert ("Retry-After", "5") in headers

        own_origin.stop()
        origin_address = own_origin.url.removeprefix("http://")
        port = origin_address.rsplit(":", 1)[1]
        for method, target in (
            ("GET", "/v1/stream/cors-unread?offset=-1"),  # a cache fill
            ("GET", "/v1/stream/cors?offset=-1&x=1"),  # relayed
            ("PUT", "/v1/stream/cors-2"),
            # One the edge does not know all of (a HEAD of a stream it knows is its own answer).
            ("HEAD", "/v1/stream/cors-unread"),
        ):
            status, headers, body = await call(http, method, edge.url + target)
            assert status == 502, target
            names = {n.lower() for n, _ in headers}
            assert names >= set(CORS_NAMES), target
            assert {n.lower(): v for n, v in headers}["access-control-allow-origin"] == "*"
            if method != "HEAD":
                assert body == b"origin unreachable\n"
            assert port.encode() not in body
        assert "Connect call failed" in edge.process.log.read_text()
    finally:
        edge.stop()


# --- scopes ---


async def test_configured_headers_split_scopes(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    await closed_stream(http, origin.url + stream_path, b"keyed")
    edge = start_edge(origin.url, logs_dir, "--scope-headers", "X-Api-Key", name="edge-api-key")
    try:
        url = edge.url + stream_path + "?offset=-1"
        statuses = []
        for key in ("a", "b", "a", "b"):
            status, headers, body = await call(http, "GET", url, headers={"X-Api-Key": key})
            assert (status, body) == (200, b"keyed")
            statuses.append(dict(headers)["Cache-Status"])
            assert "private" in dict(headers)["Cache-Control"]
        assert [s.startswith("edge; hit") for s in statuses] == [False, False, True, True]
        assert catchup_reads(origin, stream_path) == 2  # one per key
    finally:
        edge.stop()


@pytest.fixture
async def tapped_origin(origin: Origin) -> AsyncIterator[tuple[str, list[CIMultiDict[str]]]]:
    """The real origin behind a tap that records the headers of every request it forwards."""
    seen: list[CIMultiDict[str]] = []

    async def forward(request: web.Request) -> web.Response:
        seen.append(CIMultiDict(request.headers))
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        data = await request.read()
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.request(
                request.method,
                origin.url + request.raw_path,
                headers=headers,
                data=data,
                allow_redirects=False,
            ) as answer,
        ):
            body = await answer.read()
            kept = [
                (k, v)
                for k, v in answer.headers.items()
                if k.lower() not in ("transfer-encoding", "content-length", "connection")
            ]
            return web.Response(status=answer.status, body=body, headers=CIMultiDict(kept))

    tap = web.Application()
    tap.router.add_route("*", "/{tail:.*}", forward)
    async with TestServer(tap, host="127.0.0.1") as server:
        yield f"http://127.0.0.1:{server.port}", seen


async def test_only_configured_cookies_split_scopes_and_travel_upstream(
    http: aiohttp.ClientSession,
    origin: Origin,
    logs_dir: Path,
    stream_path: str,
    tapped_origin: tuple[str, list[CIMultiDict[str]]],
) -> None:
    tap_url, seen = tapped_origin
    await closed_stream(http, origin.url + stream_path, b"cookied")
    edge = await asyncio.to_thread(
        start_edge, tap_url, logs_dir, "--scope-cookies", "session", name="edge-cookies"
    )
    try:
        url = edge.url + stream_path + "?offset=-1"
        results = []
        for cookie in ("_ga=GA1.2.111; session=s1", "session=s1; _ga=GA1.2.222", "session=s2"):
            status, headers, body = await call(http, "GET", url, headers={"Cookie": cookie})
            assert (status, body) == (200, b"cookied")
            results.append(dict(headers)["Cache-Status"])
        assert results[1] == "edge; hit"  # another _ga, the same session: the same scope
        assert not results[2].startswith("edge; hit")  # another session: its own scope
        # Whatever the edge asks the origin for these reads, only the session cookie goes along.
        assert seen
        assert {tuple(h.getall("Cookie")) for h in seen} == {("session=s1",), ("session=s2",)}
        assert catchup_reads(origin, stream_path) == 2
    finally:
        await asyncio.to_thread(edge.stop)


# --- a viewer that leaves before its headers are written ---


@pytest.fixture
async def in_process_edge(origin: Origin) -> AsyncIterator[tuple[BaseTestServer, web.Application]]:
    settings = Settings(
        origin=origin.url,
        listen=Address.parse("127.0.0.1:0"),
        admin_listen=Address.parse("127.0.0.1:0"),
    )
    app = stream_app.create_app(settings, Metrics(), OriginClient(settings))
    async with TestServer(app, host="127.0.0.1") as server:
        yield server, app


async def test_a_viewer_leaving_before_its_headers_is_counted_as_gone_not_as_an_error(
    http: aiohttp.ClientSession,
    origin: Origin,
    stream_path: str,
    in_process_edge: tuple[BaseTestServer, web.Application],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, app = in_process_edge
    await closed_stream(http, origin.url + stream_path, b"gone")
    hub = app[stream_app.HUB]
    requests: list[web.Request] = []
    real_start_offset, real_known_from = live_reads.start_offset, hub.known_from

    async def start_offset(request: web.Request, *args: object) -> object:
        requests.append(request)
        return await real_start_offset(request, *args)  # type: ignore[arg-type]

    async def known_from(*args: object) -> object:
        known = await real_known_from(*args)  # type: ignore[arg-type]
        # The client hangs up just as the viewer is about to be answered: its transport is
        # closing, and the handler has not been cancelled yet.
        transport = requests[0].transport
        assert transport is not None
        transport.close()
        return known

    monkeypatch.setattr(live_reads, "start_offset", start_offset)
    monkeypatch.setattr(hub, "known_from", known_from)
    caplog.set_level(logging.DEBUG, logger="edge")
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(f"GET {stream_path}?offset=-1&live=sse HTTP/1.1\r\nHost: e\r\n\r\n".encode())
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed without an answer
    writer.close()
    await asyncio.sleep(0.2)
    metrics = app[stream_app.METRICS].render().decode()
    assert metric_value(metrics, "edge_clients_gone_total", kind="sse") == 1
    assert metric_value(metrics, "edge_requests_total", kind="sse", code="499") == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "client left" in caplog.text
