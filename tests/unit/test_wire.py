"""``edge.web.wire.encode`` writes what aiohttp writes for the same answer, byte for byte.

A real aiohttp server (in-process, on a loopback port) answers raw HTTP/1.x requests with the
handler path's response (``client_headers`` + ``EdgeResponse``); the direct-write encoding of
the same answer must equal it, ``Date`` aside. An aiohttp upgrade that frames answers
differently fails here rather than on a client.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from edge.answer import Answer
from edge.live.polls import AlreadyWritten, Framing
from edge.web.proxy import EdgeResponse, OriginCors
from edge.web.wire import AlreadyWrittenResponse, client_headers, encode

CORS = OriginCors()
CORS.remember(None, [("Access-Control-Allow-Origin", "*"), ("Access-Control-Expose-Headers", "*")])

ANSWERS = {
    "data": Answer(
        status=200,
        headers=[
            ("Content-Type", "application/json"),
            ("Stream-Next-Offset", "0000_0042"),
            ("Stream-Cursor", "12345"),
            ("Stream-Up-To-Date", "true"),
            ("ETag", '"abc:1:2:d"'),
            ("Cache-Control", "public, max-age=1"),
        ],
        body=b'[{"a":1}]',
        cache_status="edge; hit; detail=waited",
        result="live",
    ),
    "at-tail": Answer(
        status=200,
        headers=[
            ("Content-Type", "text/plain"),
            ("Stream-Next-Offset", "0000_0043"),
            ("Stream-Up-To-Date", "true"),
            ("ETag", '"abc:1:3:d"'),
            ("Cache-Control", "public, max-age=30"),
            ("CDN-Cache-Control", "max-age=30"),
            ("Surrogate-Control", "max-age=30"),
            ("Surrogate-Key", "ds-aa ds-aa-bb"),
            ("Cache-Tag", "ds-aa,ds-aa-bb"),
        ],
        body=b"tail bytes",
        cache_status="edge; hit",
        result="hit",
        age_seconds=3,
    ),
    "no-content-type": Answer(
        status=200,
        headers=[("Stream-Next-Offset", "7"), ("Server", "origin/1")],
        body=b"raw bytes",
        cache_status="edge; hit",
        result="live",
    ),
    "empty-200": Answer(
        status=200,
        headers=[("Content-Type", "text/plain"), ("Stream-Next-Offset", "7")],
        body=b"",
        cache_status="edge; hit",
        result="live",
    ),
    "timeout-204": Answer(
        status=204,
        headers=[
            ("Stream-Next-Offset", "7"),
            ("Stream-Up-To-Date", "true"),
            ("Stream-Cursor", "99"),
            ("Cache-Control", "no-store"),
            ("CDN-Cache-Control", "max-age=1"),
            ("Surrogate-Control", "max-age=1"),
            ("Surrogate-Key", "ds-aa"),
            ("Cache-Tag", "ds-aa"),
        ],
        body=b"",
        cache_status="edge; hit",
        result="live",
    ),
    "failing-502": Answer(
        status=502,
        headers=[("Content-Type", "text/plain")],
        body=b"origin unavailable: the live upstream is failing\n",
        cache_status="edge; fwd=request; detail=upstream-failing",
        result="live",
    ),
}

KEEP_ALIVE = Framing(version=(1, 1), keep_alive=True)

FRAMINGS = {
    "1.1": (b"HTTP/1.1", b"", (1, 1), True),
    "1.1-close": (b"HTTP/1.1", b"Connection: close\r\n", (1, 1), False),
    "1.0": (b"HTTP/1.0", b"", (1, 0), False),
    "1.0-keep-alive": (b"HTTP/1.0", b"Connection: keep-alive\r\n", (1, 0), True),
}


async def handler(request: web.Request) -> web.StreamResponse:
    answer = ANSWERS[request.match_info["name"]]
    private = request.query.get("private") == "1"  # an authorized reader's copy
    headers = client_headers(answer, CORS, None, reader_only=private)
    return EdgeResponse(status=answer.status, body=answer.body, headers=headers)


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[tuple[str, int]]:
    """``app`` on a real loopback socket (a port the kernel picks)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    try:
        yield sock.getsockname()[:2]
    finally:
        await runner.cleanup()
        sock.close()


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, int]]:
    app = web.Application()
    app.router.add_get("/{name}", handler)
    async with serving(app) as address:
        yield address


async def raw_exchange(host: str, port: int, request: bytes) -> tuple[bytes, bool]:
    """The server's bytes for one request, and whether it then closed the connection."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request)
    data = b""
    closed = False
    try:
        while True:
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                lengths = [
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ]
                if len(body) >= (lengths[0] if lengths else 0):
                    break
            chunk = await asyncio.wait_for(reader.read(65536), 5)
            if not chunk:
                closed = True
                break
            data += chunk
        if not closed:
            try:
                closed = await asyncio.wait_for(reader.read(1), 0.3) == b""
            except TimeoutError:
                closed = False
    finally:
        writer.close()
    return data, closed


def without_date(response: bytes) -> bytes:
    head, _, body = response.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")]
    assert len(lines) == len(head.split(b"\r\n")) - 1, "exactly one Date header"
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@pytest.mark.parametrize("private", [False, True])
@pytest.mark.parametrize("framing", FRAMINGS)
@pytest.mark.parametrize("name", ANSWERS)
async def test_encode_is_what_aiohttp_writes(
    server: tuple[str, int], name: str, framing: str, private: bool
) -> None:
    host, port = server
    version, extra, parsed, keep_alive = FRAMINGS[framing]
    target = b"/" + name.encode() + (b"?private=1" if private else b"")
    request = b"GET " + target + b" " + version + b"\r\nHost: x\r\n" + extra + b"\r\n"
    from_aiohttp, closed = await raw_exchange(host, port, request)
    direct = encode(
        ANSWERS[name],
        Framing(version=parsed, keep_alive=keep_alive, reader_only=private),
        cors=CORS,
    )
    assert without_date(direct) == without_date(from_aiohttp)
    assert closed == (not keep_alive)
    if private and name == "data":
        assert b"Cache-Control: private, max-age=1\r\n" in direct
    if private:  # a reader's own copy: no lifetime a CDN would take over Cache-Control
        assert b"CDN-Cache-Control" not in direct
        assert b"Surrogate-Control" not in direct
    if name == "at-tail":  # last of the answer's headers, where the hit path splices it too
        assert b"Via: 1.1 edge\r\nAge: 3\r\nContent-Length: 10\r\n" in direct


def test_header_injection_is_refused() -> None:
    bad = Answer(
        status=200,
        headers=[("Stream-Next-Offset", "1\r\nX-Evil: 1")],
        body=b"",
        cache_status="edge; hit",
        result="live",
    )
    with pytest.raises(ValueError, match="control character"):
        encode(bad, KEEP_ALIVE, cors=CORS)


async def test_a_written_response_writes_nothing_and_keeps_the_connection_as_written(
    server: tuple[str, int],
) -> None:
    """A handler returning AlreadyWrittenResponse after writing the answer itself: the client sees
    exactly those bytes, then the next pipelined request's answer (keep-alive), or the end."""
    frame = encode(ANSWERS["data"], KEEP_ALIVE, cors=CORS)

    async def direct(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.write(frame)
        return AlreadyWrittenResponse(AlreadyWritten(status=200, keep_alive=request.keep_alive))

    app = web.Application()
    app.router.add_get("/direct", direct)
    app.router.add_get("/{name}", handler)
    async with serving(app) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        # Two pipelined requests: the direct answer first, then aiohttp's own, in order.
        writer.write(
            b"GET /direct HTTP/1.1\r\nHost: x\r\n\r\nGET /empty-200 HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        expected_second = encode(ANSWERS["empty-200"], KEEP_ALIVE, cors=CORS)
        data = b""
        while len(data) < len(frame) + len(expected_second) - 40:
            data += await asyncio.wait_for(reader.read(65536), 5)
        await asyncio.sleep(0.1)
        assert data.startswith(frame)
        assert without_date(data[len(frame) :]) == without_date(expected_second)
        # Still open (keep-alive) and answering.
        writer.write(b"GET /direct HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        rest = await asyncio.wait_for(reader.read(), 5)  # until the server closes
        assert rest == frame
        writer.close()
