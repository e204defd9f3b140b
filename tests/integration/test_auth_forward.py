"""``--auth forward`` against the real origin and a small real auth service started here:
session cookies are verified by the service, verdicts are cached and collapsed, the service
failing fails closed, and signed-in viewers still share one origin tail."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin, start_edge, workers_under_test
from edge.protocol.paths import normalise_path
from tests.integration.auth_services import AuthService
from tests.integration.live_support import append_all, view_sse
from tests.integration.replicas import raw

EDGE_SECRET = "Bearer edge-secret"
# The auth service here is a Python thread inside the test process, sharing its two cores
# with a thousand clients, the edge and the origin: a herd takes it seconds, not milliseconds.
HERD_AUTH_TIMEOUT = 10.0
AUTH_TIMEOUT = 1.0

# The edge processes each launched edge runs (make test-workers2: 2).
WORKERS = int(workers_under_test())


@pytest.fixture
def auth() -> Iterator[AuthService]:
    service = AuthService(sessions={"writer": "/v1/stream/"}, writers={"writer"}).start()
    yield service
    assert service.server is not None
    service.server.close()


def start_forward_edge(origin: Origin, logs_dir: Path, auth: AuthService, timeout: float) -> Edge:
    return start_edge(
        origin.url,
        logs_dir,
        "--auth", "forward",
        "--auth-url", auth.url,
        "--auth-timeout", str(timeout),
        "--origin-header", f"Authorization: {EDGE_SECRET}",
        name="edge-forward",
    )  # fmt: skip


@pytest.fixture
def forward_edge(origin: Origin, logs_dir: Path, auth: AuthService) -> Iterator[Edge]:
    started = start_forward_edge(origin, logs_dir, auth, HERD_AUTH_TIMEOUT)
    yield started
    started.stop()


# A verdict may be kept this long at most, whatever the service's max-age says.
VERDICT_SECONDS = 2.0


@pytest.fixture
def strict_edge(origin: Origin, logs_dir: Path, auth: AuthService) -> Iterator[Edge]:
    """One process (verdicts are per worker), verdicts kept ``VERDICT_SECONDS`` at most."""
    started = start_edge(
        origin.url,
        logs_dir,
        "--workers", "1",
        "--auth", "forward",
        "--auth-url", auth.url,
        "--auth-cache-seconds", str(VERDICT_SECONDS),
        "--origin-header", f"Authorization: {EDGE_SECRET}",
        name="edge-forward-strict",
    )  # fmt: skip
    yield started
    started.stop()


@pytest.fixture
def impatient_edge(origin: Origin, logs_dir: Path, auth: AuthService) -> Iterator[Edge]:
    started = start_forward_edge(origin, logs_dir, auth, AUTH_TIMEOUT)
    yield started
    started.stop()


def session(name: str) -> dict[str, str]:
    return {"Cookie": f"session={name}; theme=dark"}


async def create(http: aiohttp.ClientSession, url: str) -> None:
    async with http.put(url, headers={**session("writer"), "Content-Type": "text/plain"}) as r:
        assert r.status == 201


async def test_a_thousand_signed_in_viewers_share_one_origin_tail(
    crowd: aiohttp.ClientSession,
    origin: Origin,
    auth: AuthService,
    forward_edge: Edge,
    stream_path: str,
) -> None:
    url = forward_edge.url + stream_path
    await create(crowd, url)
    names = [f"viewer-{i}" for i in range(1000)]
    auth.sessions.update(dict.fromkeys(names, stream_path))
    viewers = [asyncio.create_task(view_sse(crowd, url, headers=session(n))) for n in names]
    await asyncio.sleep(1.0)
    parts = [f" tok{i}".encode() for i in range(40)]
    await append_all(crowd, url, parts, rate_per_second=30, headers=session("writer"))
    views = await asyncio.wait_for(asyncio.gather(*viewers), timeout=90)

    written = b"".join(parts)
    assert all(bytes(v.body) == written and v.closed for v in views)
    counts = origin.counts(stream_path)
    assert counts["peak_open_live"] <= WORKERS  # one per edge process
    reads = {c for c in counts["credentials"] if c.startswith(("GET", "HEAD"))}
    assert reads == {f"GET authorization: {EDGE_SECRET}"}  # no viewer's cookie went upstream
    asked = [cookie for cookie, _, _ in auth.asked if cookie in set(names)]
    assert set(asked) == set(names)
    assert len(asked) == len(names)  # a viewer that reconnects is answered from the cache
    origin_reads = sum(r["count"] for r in counts["requests"] if r["method"] == "GET")
    print(
        f"\nforward: {len(views)} SSE viewers, {len(set(names))} distinct session cookies, "
        f"origin peak live connections {counts['peak_open_live']}, origin reads {origin_reads}, "
        f"auth service questions {len(asked)}"
    )


async def test_cold_reads_with_distinct_sessions_cost_one_origin_read_and_verdicts_collapse(
    crowd: aiohttp.ClientSession,
    origin: Origin,
    auth: AuthService,
    forward_edge: Edge,
    stream_path: str,
) -> None:
    async with crowd.put(origin.url + stream_path, headers={"Content-Type": "text/plain"}):
        pass
    body = b"".join(f"line {i}\n".encode() for i in range(500))
    async with crowd.post(
        origin.url + stream_path,
        data=body,
        headers={"Content-Type": "text/plain", "Stream-Closed": "true"},
    ) as response:
        assert response.status in (200, 204)
    names = [f"reader-{i}" for i in range(500)]
    auth.sessions.update(dict.fromkeys(names, stream_path))

    async def read(headers: dict[str, str]) -> bytes:
        async with crowd.get(f"{forward_edge.url}{stream_path}?offset=-1", headers=headers) as r:
            assert r.status == 200
            return await r.read()

    answers = await asyncio.gather(*(read(session(n)) for n in names))
    assert all(answer == body for answer in answers)
    gets = sum(r["count"] for r in origin.counts(stream_path)["requests"] if r["method"] == "GET")
    assert 1 <= gets <= WORKERS  # one per edge process (collapsing is per worker)
    # 200 identical questions at once (one viewer's browser tabs) are asked once.
    auth.sessions["tabs"] = stream_path
    before = len(auth.asked)
    same = await asyncio.gather(*(read(session("tabs")) for _ in range(200)))
    assert all(answer == body for answer in same)
    assert 1 <= len(auth.asked) - before <= WORKERS  # verdicts are per worker
    print(
        f"\nforward: {len(names)} cold catch-up reads, {len(names)} sessions, origin reads {gets}; "
        f"200 concurrent reads of one session: 1 auth question"
    )


async def test_refusals_are_relayed_and_cost_the_origin_nothing(
    http: aiohttp.ClientSession,
    origin: Origin,
    auth: AuthService,
    forward_edge: Edge,
    stream_path: str,
) -> None:
    url = forward_edge.url + stream_path
    await create(http, url)
    auth.sessions["elsewhere"] = "/v1/stream/someone-else"
    auth.sessions["reader"] = stream_path
    before = origin.counts(stream_path)["total"]
    cases = [
        ("no session", {}, "GET", 401, b"please log in"),
        ("unknown session", session("stranger"), "GET", 401, b"please log in"),
        ("another stream's session", session("elsewhere"), "GET", 403, b"not your stream"),
        ("reader writing", session("reader"), "POST", 403, b"not your stream"),
    ]
    for case, headers, method, status, text in cases:
        async with http.request(
            method, f"{url}?offset=-1", headers={**headers, "Content-Type": "text/plain"}
        ) as r:
            assert r.status == status, case
            assert await r.read() == text
            if status == 401:
                assert r.headers["WWW-Authenticate"] == 'Cookie realm="site"'
    assert origin.counts(stream_path)["total"] == before
    # The auth service saw the request without any token parameter, and the method.
    async with http.get(f"{url}?offset=-1&token=abc", headers=session("reader")) as r:
        assert r.status == 200
    assert auth.asked[-1] == ("reader", "GET", f"{stream_path}?offset=-1")


@pytest.mark.parametrize("failure", ["down", "slow", "broken"])
async def test_the_auth_service_failing_fails_closed(
    http: aiohttp.ClientSession,
    origin: Origin,
    auth: AuthService,
    impatient_edge: Edge,
    stream_path: str,
    failure: str,
) -> None:
    url = impatient_edge.url + stream_path
    await create(http, url)
    auth.sessions["reader"] = stream_path
    assert auth.server is not None
    if failure == "down":
        auth.server.stop()
    else:
        auth.mode = failure
        auth.delay = AUTH_TIMEOUT + 1  # answers, but too late
    before = origin.counts(stream_path)["total"]
    started = time.monotonic()
    async with http.get(f"{url}?offset=-1", headers=session("reader")) as r:
        assert r.status == 503
        assert "access-control-allow-origin" in {h.lower() for h in r.headers}
        assert b"auth" in await r.read()
    assert time.monotonic() - started < AUTH_TIMEOUT + 1.5
    assert origin.counts(stream_path)["total"] == before
    # Nothing was cached: once the service answers again, the same session is asked afresh.
    if failure == "down":
        auth.server.restart()
    auth.mode = "ok"
    asked = len(auth.asked)
    async with http.get(f"{url}?offset=-1", headers=session("reader")) as r:
        assert r.status == 200
    assert len(auth.asked) == asked + 1


async def write_closed(http: aiohttp.ClientSession, url: str, body: bytes) -> None:
    async with http.put(
        url,
        data=body,
        headers={**session("writer"), "Content-Type": "text/plain", "Stream-Closed": "true"},
    ) as r:
        assert r.status == 201


async def get(http: aiohttp.ClientSession, url: str, who: str) -> tuple[int, bytes]:
    async with http.get(raw(url), headers=session(who)) as r:
        return r.status, await r.read()


async def test_the_service_is_asked_about_the_stream_that_is_served(
    http: aiohttp.ClientSession, auth: AuthService, strict_edge: Edge, stream_path: str
) -> None:
    base = strict_edge.url + stream_path
    await write_closed(http, f"{base}/bob/secret", b"bob's secret")
    await write_closed(http, f"{base}/alice/mine", b"alice's own")
    auth.sessions["alice"] = f"{stream_path}/alice/"
    # Dot segments (plain and percent-encoded) name bob's stream: the origin routes them there.
    for target in (
        f"{base}/alice/../bob/secret?offset=-1",
        f"{base}/alice/%2e%2e/bob/secret?offset=-1",
        f"{base}/alice/.%2E/bob/secret?offset=-1",
        f"{base}/bob/secret?offset=-1",
    ):
        status, body = await get(http, target, "alice")
        assert status == 403, target
        assert b"bob" not in body, target
    assert ("alice", "GET", f"{stream_path}/bob/secret?offset=-1") in auth.asked
    for _, _, uri in auth.asked:
        path = uri.partition("?")[0]
        assert normalise_path(path) == path, uri
        assert "%2e" not in path.lower(), uri
    # And a path through bob's prefix that the origin routes to alice's stream is alice's.
    assert await get(http, f"{base}/bob/../alice/mine?offset=-1", "alice") == (200, b"alice's own")
    assert auth.asked[-1] == ("alice", "GET", f"{stream_path}/alice/mine?offset=-1")


async def test_a_verdict_for_one_method_is_not_used_for_another(
    http: aiohttp.ClientSession,
    origin: Origin,
    auth: AuthService,
    strict_edge: Edge,
    stream_path: str,
) -> None:
    auth.sessions["appender"] = stream_path
    auth.appenders.add("appender")
    first, second = f"{strict_edge.url}{stream_path}-a", f"{strict_edge.url}{stream_path}-b"
    for url in (first, second):
        await create(http, url)
    append = {**session("appender"), "Content-Type": "text/plain"}
    # Allowed to append, so allowed to append, not to delete.
    async with http.post(first, data=b"one", headers=append) as r:
        assert r.status in (200, 204)
    async with http.delete(first, headers=session("appender")) as r:
        assert r.status == 403
    # Refused a delete, so refused a delete, not an append.
    async with http.delete(second, headers=session("appender")) as r:
        assert r.status == 403
    async with http.post(second, data=b"two", headers=append) as r:
        assert r.status in (200, 204)
    for url, body in ((first, b"one"), (second, b"two")):
        async with http.get(url.replace(strict_edge.url, origin.url) + "?offset=-1") as r:
            assert (r.status, await r.read()) == (200, body)
    asked = [(method, uri) for who, method, uri in auth.asked if who == "appender"]
    assert [method for method, _ in asked] == ["POST", "DELETE", "DELETE", "POST"]


async def test_a_verdict_is_never_kept_longer_than_auth_cache_seconds(
    http: aiohttp.ClientSession, auth: AuthService, strict_edge: Edge, stream_path: str
) -> None:
    url = f"{strict_edge.url}{stream_path}?offset=-1"
    await write_closed(http, strict_edge.url + stream_path, b"until revoked")
    auth.sessions["leaving"] = stream_path
    auth.max_age = 3600  # the service would let the edge keep its yes for an hour
    assert await get(http, url, "leaving") == (200, b"until revoked")
    del auth.sessions["leaving"]  # revoked
    assert await get(http, url, "leaving") == (200, b"until revoked")  # kept, for a while
    await asyncio.sleep(VERDICT_SECONDS + 0.5)
    status, body = await get(http, url, "leaving")
    assert (status, body) == (401, b"please log in")
