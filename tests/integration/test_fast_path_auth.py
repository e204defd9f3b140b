"""The pre-serialised hit path for authorized reads (``--auth jwt|forward``), against the real
origin: byte for byte the full path's answer (an edge with ``--fast-path off`` beside it), and
never an answer the full path would refuse: tokens that expire mid-way, tokens for another
stream, a forward verdict that is revoked."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin
from tests.auth_support import claims_for, hs_key, jwks, sign, token
from tests.integration.auth_services import AuthService
from tests.integration.test_fast_path import (
    edge_pair,
    fast_answers,
    get,
    make_stream,
    stored_hit,
)
from tests.integration.test_passthrough import metric_value

HS = hs_key("hs-fast")
EDGE_SECRET = "Bearer edge-secret"
ONE = ("--workers", "1")  # what one process stored is read on fresh connections
VERDICT_SECONDS = 2.0


def bearer(value: str) -> str:
    return f"Authorization: Bearer {value}"


def writer() -> dict[str, str]:
    grant = sign(HS, claims_for("/v1/stream/", sub="agent", scope="read write"))
    return {"Authorization": f"Bearer {grant}"}


@pytest.fixture(scope="module")
def jwt_edges(
    origin: Origin, logs_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Edge, Edge]]:
    keys = tmp_path_factory.mktemp("jwks-fast") / "jwks.json"
    keys.write_bytes(jwks(HS))
    args = (
        "--auth", "jwt", "--jwt-jwks", str(keys), "--jwt-leeway", "0",
        "--origin-header", f"Authorization: {EDGE_SECRET}", *ONE,
    )  # fmt: skip
    with edge_pair(origin, logs_dir, "jwt", *args) as pair:
        yield pair


async def closed_stream(http: aiohttp.ClientSession, origin: Origin, path: str) -> None:
    await make_stream(http, origin.url + path, "text/plain", b"signed in " * 200, close=True)


async def test_jwt_reads_are_the_full_paths_answers_and_distinct_tokens_share_them(
    http: aiohttp.ClientSession, origin: Origin, jwt_edges: tuple[Edge, Edge], stream_path: str
) -> None:
    fast, full = jwt_edges
    await closed_stream(http, origin, stream_path)
    target = f"{stream_path}?offset=-1"
    alice = bearer(token(HS, stream_path, sub="alice"))
    want = None
    for _ in range(50):  # until the lifetime is known and the answer immutable
        want = await get(full.url, target, alice)
        if (want.header(b"Cache-Control") or b"").endswith(b"immutable"):
            break
        await asyncio.sleep(0.05)
    assert want is not None
    assert want.status_line == b"HTTP/1.1 200 OK"
    got = await stored_hit(fast, target, alice)
    assert got.comparable() == want.comparable()
    # Every other reader with a good token of their own gets the same stored answer.
    before = fast_answers(fast)
    for i in range(20):
        reader = bearer(token(HS, stream_path, sub=f"reader-{i}"))
        assert (await get(fast.url, target, reader)).comparable() == want.comparable()
    assert fast_answers(fast) == before + 20
    allowed = metric_value(fast.metrics_text(), "edge_auth_decisions_total", result="allowed")
    assert allowed >= 21  # the hit path's admissions are counted where the full path's are


async def test_the_hit_path_never_answers_what_the_gate_refuses(
    http: aiohttp.ClientSession, origin: Origin, jwt_edges: tuple[Edge, Edge], stream_path: str
) -> None:
    fast, full = jwt_edges
    await closed_stream(http, origin, stream_path)
    target = f"{stream_path}?offset=-1"
    await stored_hit(fast, target, bearer(token(HS, stream_path, sub="alice")))
    expiring = bearer(sign(HS, claims_for(stream_path, sub="brief", lifetime=2.0)))
    assert (await get(fast.url, target, expiring)).status_line == b"HTTP/1.1 200 OK"
    other_stream = bearer(token(HS, stream_path + "-other", sub="mallory"))
    write_only = bearer(token(HS, stream_path, sub="writer", scope="write"))
    refused = {
        "no token": (),
        "another stream's token": (other_stream,),
        "no read scope": (write_only,),
        "a bad signature": (bearer(token(HS, stream_path)[:-4] + "AAAA"),),
        "two tokens": (bearer(token(HS, stream_path)), bearer(token(HS, stream_path))),
    }
    for why, headers in refused.items():
        before = fast_answers(fast)
        got = await get(fast.url, target, *headers)
        want = await get(full.url, target, *headers)
        assert got.status_line in (b"HTTP/1.1 401 Unauthorized", b"HTTP/1.1 403 Forbidden"), why
        assert got.comparable() == want.comparable(), why
        assert fast_answers(fast) == before, why
    # The token expires while its reads were being answered by the hit path.
    await asyncio.sleep(2.2)
    before = fast_answers(fast)
    late = await get(fast.url, target, expiring)
    assert late.status_line == b"HTTP/1.1 401 Unauthorized"
    assert fast_answers(fast) == before


@pytest.fixture
def service() -> Iterator[AuthService]:
    started = AuthService(sessions={"writer": "/v1/stream/"}, writers={"writer"}).start()
    yield started
    assert started.server is not None
    started.server.close()


@pytest.fixture
def forward_edges(
    origin: Origin, logs_dir: Path, service: AuthService
) -> Iterator[tuple[Edge, Edge]]:
    args = (
        "--auth", "forward", "--auth-url", service.url,
        "--auth-cache-seconds", str(VERDICT_SECONDS),
        "--origin-header", f"Authorization: {EDGE_SECRET}", *ONE,
    )  # fmt: skip
    with edge_pair(origin, logs_dir, "forward", *args) as pair:
        yield pair


async def test_a_remembered_forward_verdict_serves_stored_answers_until_it_is_revoked(
    http: aiohttp.ClientSession,
    origin: Origin,
    service: AuthService,
    forward_edges: tuple[Edge, Edge],
    stream_path: str,
) -> None:
    fast, full = forward_edges
    await closed_stream(http, origin, stream_path)
    target = f"{stream_path}?offset=-1"
    service.sessions["reader"] = stream_path
    service.max_age = 3600  # the service would let the edge keep its yes for an hour
    cookie = "Cookie: session=reader"
    want = await get(full.url, target, cookie)
    for _ in range(50):
        want = await get(full.url, target, cookie)
        if (want.header(b"Cache-Control") or b"").endswith(b"immutable"):
            break
        await asyncio.sleep(0.05)
    got = await stored_hit(fast, target, cookie)
    assert got.comparable() == want.comparable()
    asked = len(service.asked)
    for _ in range(10):
        assert (await get(fast.url, target, cookie)).comparable() == want.comparable()
    assert len(service.asked) == asked  # the remembered verdict: nobody was asked
    # Someone the service never allowed is refused by the full path, never served.
    before = fast_answers(fast)
    stranger = await get(fast.url, target, "Cookie: session=stranger")
    assert stranger.status_line == b"HTTP/1.1 401 Unauthorized"
    assert fast_answers(fast) == before
    del service.sessions["reader"]  # revoked
    await asyncio.sleep(VERDICT_SECONDS + 0.5)
    before = fast_answers(fast)
    revoked = await get(fast.url, target, cookie)
    assert revoked.status_line == b"HTTP/1.1 401 Unauthorized"
    assert fast_answers(fast) == before
