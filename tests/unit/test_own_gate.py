"""The gate glue of the connections' own reads (``edge.web.own_gate``), without the edge: a
refusal written by a connection is what aiohttp writes for the full path's
``refusal_response``, byte for byte (a real aiohttp server answers the same refusal); the
gate's decision on a parsed head; the ``Host`` re-read from a raw head; and the live targets
of admitted heads (``LiveTargets.admitted``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from edge.auth.gate import Gate, RequestAdmission
from edge.auth.policy import MISSING, UNAVAILABLE, Refusal, forbidden
from edge.metrics import Metrics
from edge.protocol.http1 import HeadParser, RequestHead, header_value
from edge.protocol.paths import Target
from edge.web.fast_polls import LiveTargets
from edge.web.gatekeeper import refusal_response
from edge.web.own_gate import BAD_HEAD, UNDECIDED, OwnGate
from edge.web.proxy import OriginCors
from tests.auth_support import claims_for, hs_key, jwks, sign
from tests.unit.test_gate import settings
from tests.unit.test_wire import raw_exchange, serving, without_date

STREAM = "/v1/stream/run"
KEY = hs_key("own")
CORS = OriginCors()
CORS.remember(None, [("Access-Control-Allow-Origin", "*")])

REFUSALS = {
    "missing": MISSING,
    "forbidden": forbidden("not your stream"),
    "unavailable": UNAVAILABLE,
    "relayed": Refusal(
        status=401,
        reason="please log in",
        result="denied",
        headers=(("Content-Type", "text/html"), ("WWW-Authenticate", 'Cookie realm="site"')),
        body=b"<p>please log in</p>",
    ),
}


def own_gate(tmp_path: Path) -> OwnGate:
    (tmp_path / "jwks.json").write_bytes(jwks(KEY))
    return OwnGate(Gate(settings(tmp_path / "jwks.json"), Metrics()), CORS)


def parsed(raw: bytes, *credential_headers: str) -> RequestHead:
    head = HeadParser(("authorization", *credential_headers)).parse(raw)
    assert isinstance(head, RequestHead)
    return head


async def refusing(request: web.Request) -> web.StreamResponse:
    return refusal_response(
        REFUSALS[request.match_info["name"]], CORS, request.headers.get("Origin")
    )


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, int]]:
    app = web.Application()
    app.router.add_get("/{name}", refusing)  # (and HEAD)
    async with serving(app) as address:
        yield address


@pytest.mark.parametrize("keep_alive", [True, False])
@pytest.mark.parametrize("origin", [None, "https://app.example"])
@pytest.mark.parametrize("name", REFUSALS)
async def test_a_refusal_written_by_the_connection_is_what_aiohttp_writes(
    server: tuple[str, int], tmp_path: Path, name: str, origin: str | None, keep_alive: bool
) -> None:
    lines = [f"GET /{name} HTTP/1.1", "Host: x"]
    lines += [f"Origin: {origin}"] if origin else []
    lines += [] if keep_alive else ["Connection: close"]
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode()
    from_aiohttp, closed = await raw_exchange(*server, raw)
    gate = own_gate(tmp_path)
    direct = gate.refusal(REFUSALS[name], parsed(raw), counted=False)
    assert direct is not None
    assert without_date(direct) == without_date(from_aiohttp)
    assert closed == (not keep_alive)
    assert sum(gate.refused.values()) == 1


async def test_a_refused_head_is_what_aiohttp_writes(
    server: tuple[str, int], tmp_path: Path
) -> None:
    """The GET's head, its Content-Length included, and no body."""
    raw = b"HEAD /missing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    host, port = server
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(raw)
    from_aiohttp = await asyncio.wait_for(reader.read(), 5)  # to the close
    writer.close()
    direct = own_gate(tmp_path).refusal(MISSING, parsed(raw), counted=False)
    assert direct is not None
    assert without_date(direct) == without_date(from_aiohttp)
    assert b"Content-Length: 27\r\n" in direct


def test_the_gate_decides_a_parsed_head_as_the_full_path_would(tmp_path: Path) -> None:
    gate = own_gate(tmp_path)
    grant = sign(KEY, claims_for(STREAM))

    def head(target: str, *lines: str) -> RequestHead:
        return parsed("\r\n".join([f"GET {target} HTTP/1.1", "Host: x", *lines, "", ""]).encode())

    # No key set loaded yet (the gate has not started): only a wait decides a token.
    assert gate.decide_now(head(f"{STREAM}?offset=-1", f"Authorization: Bearer {grant}")) is (
        UNDECIDED
    )
    assert gate.decide_now(head(f"{STREAM}?offset=-1")) == MISSING  # no token: at once
    # A target the edge refuses (the parser hands such heads on; the gate never judges one).
    fragment = RequestHead(f"{STREAM}#x", "offset=-1", None, None, True, None, (), False, None)
    assert gate.decide_now(fragment) is BAD_HEAD


async def test_a_token_is_decided_at_once_once_the_keys_are_loaded(tmp_path: Path) -> None:
    gate = own_gate(tmp_path)
    await gate._gate.start()
    try:
        grant = sign(KEY, claims_for(STREAM))
        raw = f"GET {STREAM}?offset=-1&token={grant}&live=sse HTTP/1.1\r\nHost: x\r\n\r\n"
        decided = gate.decide_now(parsed(raw.encode()))
        assert isinstance(decided, RequestAdmission)
        assert decided.target.query == "offset=-1&live=sse"  # no token goes further
        assert decided.scope is not None
        other = sign(KEY, claims_for(STREAM + "-other"))
        raw = f"GET {STREAM}?offset=-1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {other}\r\n\r\n"
        refused = gate.decide_now(parsed(raw.encode()))
        assert isinstance(refused, Refusal)
        assert refused.status == 403
    finally:
        await gate._gate.close()


def test_the_host_is_read_from_the_raw_head_as_aiohttp_reads_it() -> None:
    raw = b"GET / HTTP/1.1\r\nAccept: */*\r\nhOsT:  edge.example:8080 \r\n\r\n"
    assert header_value(raw, b"host") == "edge.example:8080"
    assert header_value(raw, b"origin") is None
    # The request line is never a field, whatever it contains.
    assert header_value(b"GET /host:x HTTP/1.1\r\nHost: y\r\n\r\n", b"get /host") is None


def admission(
    query: str, *, scope: str = "auth:jwt:abc", upstream: str = "/v1/stream/run"
) -> RequestAdmission:
    return RequestAdmission(
        target=Target(upstream=f"{upstream}?{query}", query=query, stream=STREAM),
        scope=scope, upstream=(("Authorization", "Bearer edge"),),
        drop=frozenset({"authorization"}), expires_at=2e9,
    )  # fmt: skip


def test_an_admitted_live_target_is_the_admissions_not_the_heads() -> None:
    targets = LiveTargets(settings(Path("/nowhere"), scope_headers=("authorization", "cookie")))
    raw = f"GET {STREAM}?offset=5&live=long-poll&token=t HTTP/1.1\r\nHost: x\r\nCookie: a=b\r\n\r\n"
    head = parsed(raw.encode(), "cookie")
    target = targets.admitted(head, "long-poll", admission("offset=5&live=long-poll"))
    assert target is not None
    assert target.key.scope == "auth:jwt:abc"  # the policy's scope, not the cookie's
    assert target.credentials == (("Authorization", "Bearer edge"),)  # the edge's own
    assert target.framing.reader_only  # an answer for its reader alone
    assert target.offset == "5"
    # Another admission of the same head is another target: no memo crosses decisions.
    other = targets.admitted(head, "long-poll", admission("offset=5&live=long-poll", scope="x"))
    assert other is not None
    assert other.key.scope == "x"
    # Not a plain read in this mode: the full path's.
    assert targets.admitted(head, "sse", admission("offset=5&live=long-poll")) is None
    # A path the origin normalises reads the stream it names, as the full path classifies it.
    dotted = admission("offset=5&live=long-poll", upstream="/v1/stream/./run")
    served = targets.admitted(head, "long-poll", dotted)
    assert served is not None
    assert served.key.stream == dotted.target.stream
