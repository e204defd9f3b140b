"""``--auth jwt`` against the real origin: signed-in viewers share one scope, refusals cost the
origin nothing, keys rotate, and live reads end when their token does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin, start_edge, start_redis, workers_under_test
from tests.auth_support import (
    claims_for,
    hs_key,
    jwks,
    key_confusion,
    rsa_key,
    sign,
    token,
    unsigned,
)
from tests.integration.auth_services import JwksEndpoint
from tests.integration.live_support import View, append_all, view_sse
from tests.integration.test_passthrough import metric_value

EDGE_SECRET = "Bearer edge-secret"
HS = hs_key("hs-1")
RSA = rsa_key("rsa-1")

# The edge processes each launched edge runs (make test-workers2: 2).
WORKERS = int(workers_under_test())


def writer_headers() -> dict[str, str]:
    grant = sign(HS, claims_for("/v1/stream/", sub="agent", scope="read write"))
    return {"Authorization": f"Bearer {grant}"}


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


@pytest.fixture(scope="module")
def jwt_edge(
    origin: Origin, logs_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Edge]:
    keys = tmp_path_factory.mktemp("jwks") / "jwks.json"
    keys.write_bytes(jwks(HS, RSA))
    started = start_edge(
        origin.url,
        logs_dir,
        "--auth", "jwt",
        "--jwt-jwks", str(keys),
        "--jwt-leeway", "1",
        "--origin-header", f"Authorization: {EDGE_SECRET}",
        "--long-poll-timeout", "10",
        name="edge-jwt",
    )  # fmt: skip
    yield started
    started.stop()


async def create(http: aiohttp.ClientSession, url: str, content_type: str = "text/plain") -> None:
    async with http.put(url, headers={**writer_headers(), "Content-Type": content_type}) as r:
        assert r.status in (200, 201), r.status


def origin_reads(origin: Origin, path: str, method: str = "GET") -> int:
    return sum(r["count"] for r in origin.counts(path)["requests"] if r["method"] == method)


async def test_a_thousand_viewers_with_their_own_tokens_share_one_origin_tail(
    crowd: aiohttp.ClientSession, origin: Origin, jwt_edge: Edge, stream_path: str
) -> None:
    url = jwt_edge.url + stream_path
    await create(crowd, url)
    tokens = [token(HS, stream_path, sub=f"viewer-{i}") for i in range(1000)]
    assert len(set(tokens)) == 1000
    # Half send the token as a header, half as ?token= (as a browser EventSource must).
    viewers = [
        asyncio.create_task(
            view_sse(crowd, url, headers=bearer(t))
            if i % 2
            else view_sse(crowd, url, query=f"&token={t}")
        )
        for i, t in enumerate(tokens)
    ]
    await asyncio.sleep(1.0)
    parts = [f" tok{i}".encode() for i in range(40)]
    await append_all(crowd, url, parts, rate_per_second=30, headers=writer_headers())
    views = await asyncio.wait_for(asyncio.gather(*viewers), timeout=90)

    written = b"".join(parts)
    assert all(bytes(v.body) == written and v.closed for v in views)
    counts = origin.counts(stream_path)
    assert counts["peak_open_live"] <= WORKERS  # one per edge process
    upstream = set(counts["credentials"])
    # Reads reached the origin with the edge's credential only; writes with the writer's.
    assert {c for c in upstream if c.startswith(("GET", "HEAD"))} == {
        f"GET authorization: {EDGE_SECRET}"
    }
    assert not any("token=" in c for c in upstream)
    assert not any(t in c for c in upstream for t in tokens)
    print(
        f"\njwt: {len(views)} SSE viewers, {len(set(tokens))} distinct tokens, origin peak live "
        f"connections {counts['peak_open_live']}, origin reads {origin_reads(origin, stream_path)}"
    )


async def test_cold_reads_with_distinct_tokens_cost_one_origin_read(
    crowd: aiohttp.ClientSession, origin: Origin, jwt_edge: Edge, stream_path: str
) -> None:
    # Written at the origin, behind the edge's back: the edge has nothing of it.
    async with crowd.put(origin.url + stream_path, headers={"Content-Type": "text/plain"}):
        pass
    body = b"".join(f"line {i}\n".encode() for i in range(500))
    async with crowd.post(
        origin.url + stream_path,
        data=body,
        headers={"Content-Type": "text/plain", "Stream-Closed": "true"},
    ) as response:
        assert response.status in (200, 204)
    before = origin_reads(origin, stream_path)
    tokens = [token(HS, stream_path, sub=f"reader-{i}") for i in range(500)]

    async def read(value: str) -> tuple[bytes, str]:
        async with crowd.get(f"{jwt_edge.url}{stream_path}?offset=-1", headers=bearer(value)) as r:
            assert r.status == 200
            return await r.read(), r.headers["Cache-Control"]

    answers = await asyncio.gather(*(read(t) for t in tokens))
    assert all(got == body for got, _ in answers)
    # The shared copy is the edge's to share, never a downstream cache's.
    assert all(cache_control.startswith("private") for _, cache_control in answers)
    reads = origin_reads(origin, stream_path) - before
    assert 1 <= reads <= WORKERS  # one per edge process (collapsing is per worker)
    # The edge asks once, in the background, how long a stream it only read lives.
    assert origin_reads(origin, stream_path, "HEAD") <= WORKERS
    print(
        f"\njwt: {len(tokens)} cold catch-up reads, {len(set(tokens))} tokens, origin reads "
        f"{reads} (+{origin_reads(origin, stream_path, 'HEAD')} lifetime HEAD)"
    )


REFUSALS = [
    # (case, how the request is made, expected status)
    ("no token", lambda path: ({}, ""), 401),
    ("token for another stream", lambda path: (bearer(token(HS, "/v1/stream/other")), ""), 403),
    (
        "prefix of another tree",
        lambda path: (bearer(sign(HS, claims_for("/v1/streams/"))), ""),
        403,
    ),
    ("expired", lambda path: (bearer(token(HS, path, lifetime=-120)), ""), 401),
    ("not yet valid", lambda path: (bearer(token(HS, path, nbf=time.time() + 120)), ""), 401),
    ("unknown key", lambda path: (bearer(token(hs_key("hs-9"), path)), ""), 401),
    ("wrong key, known kid", lambda path: (bearer(token(hs_key("hs-1"), path)), ""), 401),
    ("alg none", lambda path: (bearer(unsigned(claims_for(path), kid="hs-1")), ""), 401),
    ("HS/RS key confusion", lambda path: (bearer(key_confusion(RSA, claims_for(path))), ""), 401),
    ("truncated", lambda path: (bearer(token(HS, path)[:-12]), ""), 401),
    ("sent twice", lambda path: (bearer(token(HS, path)), f"&token={token(HS, path)}"), 401),
    ("no read scope", lambda path: (bearer(token(HS, path, scope="write")), ""), 403),
]


async def test_refusals_cost_the_origin_nothing(
    http: aiohttp.ClientSession, origin: Origin, jwt_edge: Edge, stream_path: str
) -> None:
    url = jwt_edge.url + stream_path
    await create(http, url)
    async with http.get(f"{url}?offset=-1", headers=bearer(token(HS, stream_path))) as r:
        assert r.status == 200  # the edge has seen the origin's CORS policy
    table = []
    for case, make, expected in REFUSALS:
        headers, extra = make(stream_path)
        before = origin.counts(stream_path)["total"]
        for query in (f"offset=-1{extra}", f"offset=-1&live=sse{extra}"):
            async with http.get(f"{url}?{query}", headers=headers) as response:
                body = await response.read()
                assert response.status == expected, (case, body)
                if expected == 401:
                    assert response.headers["WWW-Authenticate"].startswith('Bearer realm="edge"')
                assert "access-control-allow-origin" in {h.lower() for h in response.headers}
                assert response.headers["Cache-Control"] == "no-store"
                assert len(body) < 80
                assert b"eyJ" not in body  # nothing of any token or key
        spent = origin.counts(stream_path)["total"] - before
        assert spent == 0, case
        table.append((case, expected, spent))
    # A read token may not write.
    before = origin.counts(stream_path)["total"]
    async with http.post(
        url, data=b"x", headers={**bearer(token(HS, stream_path)), "Content-Type": "text/plain"}
    ) as r:
        assert r.status == 403
    assert origin.counts(stream_path)["total"] == before
    table.append(("write with a read token", 403, 0))
    print("\ncase | status | origin requests")
    for case, status, spent in table:
        print(f"{case} | {status} | {spent}")


async def test_writes_carry_the_writers_own_token(
    http: aiohttp.ClientSession, origin: Origin, jwt_edge: Edge, stream_path: str
) -> None:
    url = jwt_edge.url + stream_path
    await create(http, url)
    grant = sign(HS, claims_for(stream_path, sub="agent-2", scope="write"))
    async with http.post(
        f"{url}?token={grant}", data=b"hi", headers={"Content-Type": "text/plain"}
    ) as r:
        assert r.status in (200, 204)
    upstream = origin.counts(stream_path)["credentials"]
    assert f"POST authorization: Bearer {grant}" in upstream
    assert not any("token=" in c for c in upstream)


async def test_a_viewer_ends_when_its_token_expires_and_resumes_with_a_new_one(
    crowd: aiohttp.ClientSession, origin: Origin, jwt_edge: Edge, stream_path: str
) -> None:
    url = jwt_edge.url + stream_path
    await create(crowd, url)
    parts = [f" t{i}".encode() for i in range(60)]
    writer = asyncio.create_task(
        append_all(crowd, url, parts, rate_per_second=10, headers=writer_headers())
    )
    short = token(HS, stream_path, lifetime=3)
    started = time.monotonic()
    view = await view_sse(crowd, url, headers=bearer(short), resume=False)
    ended = time.monotonic() - started
    assert not view.closed
    assert 1.5 < ended < 6.5  # at exp + the edge's 1 s leeway, not at the stream's end
    async with crowd.get(f"{url}?offset={view.next_offset}&live=sse", headers=bearer(short)) as r:
        assert r.status == 401  # the same token is not let back in
    assert view.next_offset is not None
    fresh = token(HS, stream_path, lifetime=300)
    view = await view_sse(crowd, url, offset=view.next_offset, view=view, headers=bearer(fresh))
    await writer
    assert view.closed
    assert bytes(view.body) == b"".join(parts)  # no gap, no duplicate


async def test_a_long_poll_never_outlives_its_token(
    http: aiohttp.ClientSession, jwt_edge: Edge, stream_path: str
) -> None:
    url = jwt_edge.url + stream_path
    await create(http, url)
    async with http.get(f"{url}?offset=-1", headers=bearer(token(HS, stream_path))) as r:
        tail = r.headers["Stream-Next-Offset"]
    short = token(HS, stream_path, lifetime=1)
    started = time.monotonic()
    async with http.get(f"{url}?offset={tail}&live=long-poll", headers=bearer(short)) as r:
        assert r.status == 204
    assert time.monotonic() - started < 5  # --long-poll-timeout is 10


async def test_keys_rotate_while_viewers_watch_and_unknown_kids_do_not_flood_the_jwks(
    crowd: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    old, new = hs_key("2026-a"), hs_key("2026-b")
    endpoint = JwksEndpoint(document=jwks(old)).start()
    edge = start_edge(
        origin.url,
        logs_dir,
        "--auth", "jwt",
        "--jwt-jwks", endpoint.url,
        "--jwt-jwks-min-refresh", "2",
        "--origin-header", f"Authorization: {EDGE_SECRET}",
        name="edge-jwks-url",
    )  # fmt: skip
    try:
        url = edge.url + stream_path
        writer = {
            "Authorization": f"Bearer {sign(old, claims_for(stream_path, scope='read write'))}"
        }
        async with crowd.put(url, headers={**writer, "Content-Type": "text/plain"}) as r:
            assert r.status == 201
        early = [
            asyncio.create_task(
                view_sse(crowd, url, headers=bearer(token(old, stream_path, sub=f"a{i}")))
            )
            for i in range(50)
        ]
        parts = [f" p{i}".encode() for i in range(30)]
        writing = asyncio.create_task(
            append_all(crowd, url, parts, rate_per_second=6, headers=writer)
        )
        await asyncio.sleep(1.0)
        endpoint.document = jwks(old, new)  # the issuer rotates: new tokens name the new kid
        await asyncio.sleep(2.2)  # past --jwt-jwks-min-refresh since the start-up load
        late = [
            asyncio.create_task(
                view_sse(crowd, url, headers=bearer(token(new, stream_path, sub=f"b{i}")))
            )
            for i in range(50)
        ]
        await writing
        views: list[View] = await asyncio.wait_for(asyncio.gather(*early, *late), timeout=60)
        assert all(bytes(v.body) == b"".join(parts) and v.closed for v in views)
        assert origin.counts(stream_path)["peak_open_live"] <= WORKERS

        before = endpoint.hits
        flood = [token(hs_key(f"made-up-{i}"), stream_path) for i in range(300)]

        async def refused(value: str) -> int:
            async with crowd.get(f"{url}?offset=-1", headers=bearer(value)) as r:
                return r.status

        statuses = await asyncio.gather(*(refused(t) for t in flood))
        assert set(statuses) == {401}
        fetched = endpoint.hits - before
        assert (
            fetched <= 2 * WORKERS
        )  # one per --jwt-jwks-min-refresh (2 s) per worker, not per kid
        print(f"\njwks: 300 unknown kids cost the JWKS endpoint {fetched} fetch(es)")
    finally:
        edge.stop()
        assert endpoint.server is not None
        endpoint.server.close()


@pytest.mark.parametrize("fast_path", ["on", "off"])
async def test_tokens_never_reach_the_logs(
    http: aiohttp.ClientSession,
    origin: Origin,
    logs_dir: Path,
    tmp_path: Path,
    stream_path: str,
    fast_path: str,
) -> None:
    """With ``--fast-path off`` the reads are aiohttp's, whose access log names them; with it
    on, the connections serve them (and log no request at all)."""
    keys = tmp_path / "jwks.json"
    keys.write_bytes(jwks(HS))
    edge = start_edge(
        origin.url, logs_dir, "--auth", "jwt", "--jwt-jwks", str(keys), "--log-level", "DEBUG",
        "--fast-path", fast_path, name=f"edge-jwt-debug-{fast_path}",
    )  # fmt: skip
    try:
        url = edge.url + stream_path
        await create(http, url)
        good = token(HS, stream_path)
        expired = token(HS, stream_path, lifetime=-600)
        async with http.get(f"{url}?offset=-1&token={good}") as r:
            assert r.status == 200
        async with http.get(f"{url}?token={expired}&offset=-1") as r:
            assert r.status == 401
    finally:
        edge.stop()
    text = edge.process.log.read_text()
    if fast_path == "off":
        assert f'"GET {stream_path}?offset=-1" 200' in text
        assert f'"GET {stream_path}?offset=-1" 401' in text
    for secret in (good, expired, good.split(".")[2], expired.split(".")[2]):
        assert secret not in text


async def test_a_closed_stream_read_many_times_is_never_answered_without_a_token(
    crowd: aiohttp.ClientSession, origin: Origin, jwt_edge: Edge, stream_path: str
) -> None:
    """Immutable hits are what the fast path stores; with --auth jwt it answers only what the
    gate allows, so a read with no token (or another stream's) is refused however often the
    stream was read with one."""
    async with crowd.put(origin.url + stream_path, headers={"Content-Type": "text/plain"}):
        pass
    async with crowd.post(
        origin.url + stream_path,
        data=b"closed and immutable",
        headers={"Content-Type": "text/plain", "Stream-Closed": "true"},
    ) as response:
        assert response.status in (200, 204)
    url = f"{jwt_edge.url}{stream_path}?offset=-1"
    for _ in range(5):
        async with crowd.get(url, headers=bearer(token(HS, stream_path))) as r:
            assert r.status == 200
            assert await r.read() == b"closed and immutable"
    for headers in ({}, bearer(token(HS, "/v1/stream/other"))):
        async with crowd.get(url, headers=headers) as r:
            assert r.status in (401, 403)
            assert await r.read() != b"closed and immutable"
    refusals = sum(
        metric_value(jwt_edge.metrics_text(), "edge_auth_decisions_total", result=result)
        for result in ("missing", "forbidden")
    )
    assert refusals >= 2


async def test_replicas_with_different_auth_policies_never_share_through_redis(
    http: aiohttp.ClientSession,
    origin: Origin,
    logs_dir: Path,
    tmp_path: Path,
    stream_path: str,
) -> None:
    """A rollout of --auth: one replica reads with the edge's own credential, another (still
    --auth none) serves anonymous readers; both on one Redis. The credentialed bytes must never
    reach an anonymous reader from Redis, while replicas of one policy still share."""
    keys = tmp_path / "jwks.json"
    keys.write_bytes(jwks(HS))
    redis_server = start_redis(logs_dir, name="redis-auth-rollout")
    jwt_args = (
        "--auth", "jwt",
        "--jwt-jwks", str(keys),
        "--origin-header", f"Authorization: {EDGE_SECRET}",
        "--redis-url", redis_server.url,
    )  # fmt: skip
    edges: list[Edge] = []
    try:
        edges.append(start_edge(origin.url, logs_dir, *jwt_args, name="edge-rollout-jwt"))
        edges.append(
            start_edge(
                origin.url, logs_dir, "--redis-url", redis_server.url, name="edge-rollout-none"
            )
        )
        edges.append(start_edge(origin.url, logs_dir, *jwt_args, name="edge-rollout-jwt-2"))
        authorized, anonymous, sibling = edges
        async with http.put(
            origin.url + stream_path,
            data=b"for token holders",
            headers={"Content-Type": "text/plain", "Stream-Closed": "true"},
        ) as r:
            assert r.status == 201
        read = f"{stream_path}?offset=-1"
        async with http.get(authorized.url + read, headers=bearer(token(HS, stream_path))) as r:
            assert (r.status, await r.read()) == (200, b"for token holders")
            assert r.headers["Cache-Control"].startswith("private")
        assert origin_reads(origin, stream_path) == 1
        await asyncio.sleep(0.5)  # the shared write happens in the background
        async with http.get(anonymous.url + read) as r:
            assert r.status == 200  # this origin lets anyone read: it says so itself
            assert "shared" not in r.headers["Cache-Status"]
            assert r.headers["Cache-Control"].startswith("public")
        assert origin_reads(origin, stream_path) == 2  # asked the origin, not Redis
        async with http.get(sibling.url + read, headers=bearer(token(HS, stream_path))) as r:
            assert (r.status, await r.read()) == (200, b"for token holders")
            assert r.headers["Cache-Status"] == "edge; hit; detail=shared"
            assert r.headers["Cache-Control"].startswith("private")
        assert origin_reads(origin, stream_path) == 2
    finally:
        for edge in edges:
            edge.stop()
        redis_server.stop()
