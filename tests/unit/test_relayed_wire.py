"""The heads aiohttp writes its own way, framed by ``edge.protocol.http1`` byte for byte: a
relayed answer (``relayed_answer_head``, as aiohttp writes the relay's ``RelayedResponse``)
and an edge answer carrying the origin's ``Date`` (``dated_answer_head``, as aiohttp writes
such an ``EdgeResponse``), to GETs and HEADs, kept alive or closing.

A real aiohttp server (in-process, on a loopback port) writes each; the connection's own relay
must write the same bytes. An aiohttp upgrade that frames them differently fails here.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import hdrs, web
from multidict import CIMultiDict

from edge.protocol.http1 import (
    LAST_CHUNK,
    BodyFraming,
    chunk,
    dated_answer_head,
    relayed_answer_head,
)
from edge.web.proxy import EdgeResponse, RelayedResponse
from tests.unit.test_wire import raw_exchange, serving, without_date

ORIGIN_DATE = ("Date", "Thu, 03 Dec 2026 04:00:00 GMT")
RELAYED = {
    "chunked": (200, "OK", [("Content-Type", "text/plain"), ("Stream-Next-Offset", "7")]),
    "sized": (200, "OK", [("Content-Length", "9"), ORIGIN_DATE, ("Server", "origin/1")]),
    "no-type": (200, "OK", [("Stream-Up-To-Date", "true"), ("Cache-Status", "edge; fwd=bypass")]),
    "not-found": (404, "Not Found", [("Content-Type", "text/plain"), ("Content-Length", "9")]),
    "no-content": (204, "No Content", [("Content-Length", "0"), ("Stream-Cursor", "1")]),
    "own-reason": (200, "Fine", [("Content-Type", "application/json")]),
}
BODY = [b"some ", b"byte", b"s"]  # 9 bytes, in three writes
DATED = {
    "not-found": (404, [("Content-Type", "text/plain"), ORIGIN_DATE, ("Via", "1.1 edge")], b"gone"),
    "error": (502, [("Cache-Control", "no-store"), ("Content-Type", "text/plain")], b"bad\n"),
    "empty": (200, [ORIGIN_DATE, ("Stream-Next-Offset", "7")], b""),
}


async def relayed(request: web.Request) -> web.StreamResponse:
    status, reason, headers = RELAYED[request.match_info["name"]]
    omit = frozenset(
        name for name in (hdrs.CONTENT_TYPE, hdrs.SERVER) if name not in CIMultiDict(headers)
    )
    response = RelayedResponse(status=status, reason=reason, omit_defaults=omit)
    response.headers.extend(headers)
    await response.prepare(request)
    for part in BODY if request.method != "HEAD" else ():  # an origin sends a HEAD none
        await response.write(part)
    await response.write_eof()
    return response


async def dated(request: web.Request) -> web.StreamResponse:
    status, headers, body = DATED[request.match_info["name"]]
    return EdgeResponse(status=status, body=body, headers=CIMultiDict(headers))


async def exchange(host: str, port: int, method: str, request: bytes) -> bytes:
    """The server's bytes for one request (a HEAD's: its head, whatever it says of a body)."""
    if method != "HEAD":
        return (await raw_exchange(host, port, request))[0]
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    finally:
        writer.close()


def ask(method: str, target: str, keep_alive: bool) -> bytes:
    close = b"" if keep_alive else b"Connection: close\r\n"
    return f"{method} {target} HTTP/1.1\r\nHost: x\r\n".encode() + close + b"\r\n"


@pytest.mark.parametrize("keep_alive", [True, False])
@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("name", RELAYED)
async def test_a_relayed_answer_is_framed_as_aiohttp_frames_it(
    name: str, method: str, keep_alive: bool
) -> None:
    app = web.Application()
    app.router.add_route(method, "/{name}", relayed)
    async with serving(app) as (host, port):
        written = await exchange(host, port, method, ask(method, f"/{name}", keep_alive))
    status, reason, headers = RELAYED[name]
    head, framing = relayed_answer_head(
        status, reason, headers, head=method == "HEAD", keep_alive=keep_alive, now_seconds=0
    )
    match framing:
        case BodyFraming.CHUNKED:
            body = b"".join(chunk(part) for part in BODY) + LAST_CHUNK
        case BodyFraming.LENGTH:
            body = b"".join(BODY)
        case BodyFraming.NONE:
            body = b""
    ours = without_date(head + body) if ("Date", ORIGIN_DATE[1]) not in headers else head + body
    theirs = without_date(written) if ("Date", ORIGIN_DATE[1]) not in headers else written
    # raw_exchange stops at the head and Content-Length's bytes: a chunked body may be partial.
    assert ours.startswith(theirs)
    assert ours.partition(b"\r\n\r\n")[0] == theirs.partition(b"\r\n\r\n")[0]


@pytest.mark.parametrize("keep_alive", [True, False])
@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("name", DATED)
async def test_an_answer_with_the_origins_date_is_framed_as_aiohttp_frames_it(
    name: str, method: str, keep_alive: bool
) -> None:
    app = web.Application()
    app.router.add_route(method, "/{name}", dated)
    async with serving(app) as (host, port):
        written = await exchange(host, port, method, ask(method, f"/{name}", keep_alive))
    status, headers, body = DATED[name]
    head = dated_answer_head(
        status, headers, len(body), keep_alive=keep_alive, now_seconds=0, head=method == "HEAD"
    )
    ours = head + (b"" if method == "HEAD" else body)
    if ORIGIN_DATE in headers:
        assert ours == written
    else:
        assert without_date(ours) == without_date(written)
