"""The catch-up cache against the real origin: what reaches the origin; never a wrong byte."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from multidict import CIMultiDict

from devstack.processes import Edge, Origin, Redis, start_edge, start_redis, workers_under_test
from edge.protocol.purge_keys import purge_keys
from tests.conftest import REDIS_MODES, shared_redis_in
from tests.integration.replicas import start_replicas
from tests.integration.test_faults import closed_port
from tests.integration.test_passthrough import call, metric_value

TEXT = {"Content-Type": "text/plain"}


def origin_reads(origin: Origin, path: str) -> list[str | None]:
    """The offsets of every catch-up GET the origin served for ``path``, with repeats."""
    offsets: list[str | None] = []
    for entry in origin.counts(path)["requests"]:
        if entry["method"] == "GET" and entry["live"] is None:
            offsets += [entry["offset"]] * entry["count"]
    return offsets


async def create(http: aiohttp.ClientSession, url: str, *parts: bytes, close: bool = False) -> str:
    status, headers, _ = await call(http, "PUT", url, headers=TEXT)
    assert status == 201
    tail = CIMultiDict(headers)["Stream-Next-Offset"]
    for part in parts:
        status, headers, _ = await call(http, "POST", url, headers=TEXT, data=part)
        assert status == 204
        tail = CIMultiDict(headers)["Stream-Next-Offset"]
    if close:
        status, _, _ = await call(http, "POST", url, headers={"Stream-Closed": "true"})
        assert status == 204
    return tail


@pytest.fixture
async def herd() -> Iterator[aiohttp.ClientSession]:
    """A client able to hold hundreds of connections at once."""
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=60),
    ) as session:
        yield session


async def test_a_herd_costs_the_origin_one_read(
    http: aiohttp.ClientSession,
    herd: aiohttp.ClientSession,
    origin: Origin,
    edge: Edge,
    stream_path: str,
) -> None:
    url = edge.url + stream_path
    payload = [f"token-{i} ".encode() for i in range(50)]
    await create(http, url, *payload, close=True)
    written = b"".join(payload)

    cold = await asyncio.gather(*(call(herd, "GET", url + "?offset=-1") for _ in range(500)))
    assert {(status, body) for status, _, body in cold} == {(200, written)}
    # One read per worker process at most (each has its own cache; one process by default).
    reads = origin_reads(origin, stream_path)
    assert reads == ["-1"] * len(reads)
    assert 1 <= len(reads) <= int(workers_under_test())
    statuses = [CIMultiDict(headers)["Cache-Status"] for _, headers, _ in cold]
    assert sum("collapsed" in s for s in statuses) + sum("hit" in s for s in statuses) == 500 - len(
        reads
    )

    warm = await asyncio.gather(*(call(herd, "GET", url + "?offset=-1") for _ in range(1000)))
    assert {(status, body) for status, _, body in warm} == {(200, written)}
    assert {CIMultiDict(headers)["Cache-Status"] for _, headers, _ in warm} == {"edge; hit"}
    assert origin_reads(origin, stream_path) == reads

    headers = CIMultiDict(warm[0][1])
    assert headers["Stream-Closed"] == "true"
    assert headers["ETag"].endswith(':c"')
    assert headers["Cache-Control"] == "public, max-age=60, stale-if-error=60, immutable"
    revalidated = await asyncio.gather(
        *(
            call(herd, "GET", url + "?offset=-1", headers={"If-None-Match": headers["ETag"]})
            for _ in range(200)
        )
    )
    assert [status for status, _, _ in revalidated] == [304] * 200
    not_modified = CIMultiDict(revalidated[0][1])
    assert not_modified["ETag"] == headers["ETag"]
    assert not_modified["Stream-Next-Offset"] == headers["Stream-Next-Offset"]
    assert revalidated[0][2] == b""
    # PUT, 50 appends, close, one read (per worker)
    assert origin.counts(stream_path)["total"] == 52 + len(reads)


async def test_a_growing_stream_costs_only_deltas(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    url = edge.url + stream_path
    ends = [await create(http, url, b"a")]
    written = b"a"
    for part in (b"bb", b"ccc", b"dddd"):
        status, _, body = await call(http, "GET", url + "?offset=-1")
        assert (status, body) == (200, written)
        _, headers, _ = await call(http, "POST", url, headers=TEXT, data=part)
        ends.append(CIMultiDict(headers)["Stream-Next-Offset"])
        written += part
    status, headers, body = await call(http, "GET", url + "?offset=-1")
    assert (status, body) == (200, written)
    assert CIMultiDict(headers)["Cache-Status"].startswith("edge; fwd=partial")
    # After the first read the origin is only asked from the end the edge already had.
    assert origin_reads(origin, stream_path) == ["-1", *ends[:-1]]
    # Any offset the edge has seen is a read it can answer from the log too.
    status, _, body = await call(http, "GET", f"{url}?offset={ends[1]}")
    assert (status, body) == (200, b"cccdddd")
    assert origin_reads(origin, stream_path) == ["-1", *ends[:-1]]


async def test_read_after_write_through_the_edge_is_never_stale(
    http: aiohttp.ClientSession, edge: Edge, stream_path: str
) -> None:
    url = edge.url + stream_path
    await create(http, url)
    written = b""
    for i in range(30):
        part = f"<{i}>".encode()
        await call(http, "POST", url, headers=TEXT, data=part)
        written += part
        status, _, body = await call(http, "GET", url + "?offset=-1")
        assert (status, body) == (200, written)


async def test_delete_purges_and_a_vanished_stream_is_not_served(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    url = edge.url + stream_path
    await create(http, url, b"secret", close=True)
    assert (await call(http, "GET", url + "?offset=-1"))[2] == b"secret"
    status, _, _ = await call(http, "DELETE", url)
    assert status == 204
    status, _, body = await call(http, "GET", url + "?offset=-1")
    assert status == 404
    assert b"secret" not in body

    # Deleted behind the edge's back: the admin purge is how an operator makes it forget.
    other = edge.url + stream_path + "-2"
    await create(http, other, b"kept", close=True)
    assert (await call(http, "GET", other + "?offset=-1"))[2] == b"kept"
    status, _, _ = await call(http, "DELETE", origin.url + stream_path + "-2")
    assert status == 204
    assert (await call(http, "GET", other + "?offset=-1"))[2] == b"kept"  # closed: still cached
    status, _, body = await call(http, "POST", f"{edge.admin_url}/purge?path={stream_path}-2")
    assert status == 200
    assert json.loads(body)["segments"] >= 1
    assert (await call(http, "GET", other + "?offset=-1"))[0] == 404
    assert (await call(http, "POST", f"{edge.admin_url}/purge"))[0] == 400


async def test_credentials_never_share_bytes(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    url = edge.url + stream_path
    await create(http, url, b"for alice", close=True)
    alice = {"Authorization": "Bearer alice"}
    status, headers, body = await call(http, "GET", url + "?offset=-1", headers=alice)
    assert (status, body) == (200, b"for alice")
    assert CIMultiDict(headers)["Cache-Control"].startswith("private")
    assert origin_reads(origin, stream_path) == ["-1"]
    # Alice again: from her scope.
    _, headers, _ = await call(http, "GET", url + "?offset=-1", headers=alice)
    assert CIMultiDict(headers)["Cache-Status"] == "edge; hit"
    assert origin_reads(origin, stream_path) == ["-1"]
    # Nobody, Bob, and Alice's cookie-bearing twin: each asks the origin for itself.
    for headers_ in ({}, {"Authorization": "Bearer bob"}, {**alice, "Cookie": "s=1"}):
        _, headers, _ = await call(http, "GET", url + "?offset=-1", headers=headers_)
        assert "fwd=uri-miss" in CIMultiDict(headers)["Cache-Status"]
    assert origin_reads(origin, stream_path) == ["-1"] * 4
    _, headers, _ = await call(http, "GET", url + "?offset=-1")
    assert CIMultiDict(headers)["Cache-Control"].startswith("public")


async def test_compression_at_the_edge(
    http: aiohttp.ClientSession, edge: Edge, stream_path: str
) -> None:
    url = edge.url + stream_path
    payload = b"0123456789" * 300
    await create(http, url, payload, close=True)
    status, identity_headers, identity = await call(http, "GET", url + "?offset=-1")
    status_gz, gz_headers, compressed = await call(
        http, "GET", url + "?offset=-1", headers={"Accept-Encoding": "gzip, deflate"}
    )
    assert (status, status_gz) == (200, 200)
    identity_h, gz_h = CIMultiDict(identity_headers), CIMultiDict(gz_headers)
    assert identity == payload
    assert "Content-Encoding" not in identity_h
    assert gz_h["Content-Encoding"] == "gzip"
    assert gzip.decompress(compressed) == payload
    assert len(compressed) < len(payload)
    assert identity_h["ETag"] != gz_h["ETag"]
    assert identity_h["Vary"] == gz_h["Vary"] == "Accept-Encoding"
    status, _, _ = await call(
        http,
        "GET",
        url + "?offset=-1",
        headers={"Accept-Encoding": "gzip", "If-None-Match": gz_h["ETag"]},
    )
    assert status == 304
    small = edge.url + stream_path + "-small"
    await create(http, small, b"tiny", close=True)
    _, headers, body = await call(
        http, "GET", small + "?offset=-1", headers={"Accept-Encoding": "gzip"}
    )
    assert body == b"tiny"
    assert "Content-Encoding" not in CIMultiDict(headers)


async def test_json_streams_stitch_as_one_array(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    url = edge.url + stream_path
    json_headers = {"Content-Type": "application/json"}
    await call(http, "PUT", url, headers=json_headers)
    for batch in ([{"t": 1}, {"t": 2}], [{"t": 3}]):
        await call(http, "POST", url, headers=json_headers, data=json.dumps(batch).encode())
        _, _, body = await call(http, "GET", url + "?offset=-1")
    assert json.loads(body) == [{"t": 1}, {"t": 2}, {"t": 3}]
    _, _, direct = await call(http, "GET", origin.url + stream_path + "?offset=-1")
    assert json.loads(direct) == json.loads(body)
    assert len(origin_reads(origin, stream_path)) == 3  # two via the edge (-1, delta), one direct


async def test_capped_answers_are_immutable_and_resume(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    edge = start_edge(origin.url, logs_dir, "--max-response-bytes", "10", name="edge-capped")
    try:
        url = edge.url + stream_path
        await create(http, url, b"aaaaaa")
        await call(http, "GET", url + "?offset=-1")  # learn [-1, a)
        await call(http, "POST", url, headers=TEXT, data=b"bbbbbb")
        await call(http, "GET", url + "?offset=-1")  # learn [a, b) as a delta
        status, headers, body = await call(http, "GET", url + "?offset=-1")
        h = CIMultiDict(headers)
        assert (status, body) == (200, b"aaaaaa")
        assert "Stream-Up-To-Date" not in h
        assert h["Cache-Control"] == "public, max-age=60, stale-if-error=60, immutable"
        status, headers, body = await call(http, "GET", f"{url}?offset={h['Stream-Next-Offset']}")
        assert (status, body) == (200, b"bbbbbb")
        assert CIMultiDict(headers)["Stream-Up-To-Date"] == "true"
    finally:
        edge.stop()


async def test_a_relayed_read_carries_no_validator_of_the_origins(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    """A read the edge relays (here: too large to keep) hands out no ETag of the origin's, whose
    tags are the path and offsets, the same for a recreated stream; and a client's If-None-Match
    with such a tag does not earn a 304 for the deleted stream's bytes (found by the property
    machine: tests/unit/test_properties.py)."""
    edge = start_edge(origin.url, logs_dir, "--max-segment-bytes", "4", name="edge-relaying")
    try:
        url = edge.url + stream_path
        await create(http, url, b"aaaaaa")
        _, headers, _ = await call(http, "GET", origin.url + stream_path + "?offset=-1")
        origins_tag = CIMultiDict(headers)["ETag"]
        status, headers, body = await call(http, "GET", url + "?offset=-1")
        h = CIMultiDict(headers)
        assert (status, body) == (200, b"aaaaaa")
        assert "fwd=bypass" in h["Cache-Status"]
        assert "ETag" not in h
        status, _, _ = await call(http, "DELETE", url)
        assert status == 204
        await create(http, url, b"bbbbbb")  # the same offsets: the origin's tag again
        status, _, body = await call(
            http, "GET", url + "?offset=-1", headers={"If-None-Match": origins_tag}
        )
        assert (status, body) == (200, b"bbbbbb")
    finally:
        edge.stop()


async def test_cache_metrics(http: aiohttp.ClientSession, edge: Edge, stream_path: str) -> None:
    url = edge.url + stream_path
    await create(http, url, b"m", close=True)
    before = edge.metrics_text()
    await call(http, "GET", url + "?offset=-1")
    await call(http, "GET", url + "?offset=-1")
    await call(http, "GET", url + "?offset=now")
    after = edge.metrics_text()
    for result, delta in (("miss", 1), ("hit", 1), ("bypass", 1)):
        change = metric_value(after, "edge_cache_requests_total", result=result) - metric_value(
            before, "edge_cache_requests_total", result=result
        )
        assert change == delta, result
    assert metric_value(after, "edge_cache_segments") >= 1
    assert metric_value(after, "edge_cache_bytes") > 0
    for name in (
        "edge_collapsed_requests_total",
        "edge_cache_evictions_total",
        "edge_origin_bytes_total",
        "edge_served_bytes_total",
        "edge_redis_up",
    ):
        assert name in after


# --- the shared tier ---


@pytest.mark.parametrize("mode", REDIS_MODES)
async def test_a_replica_serves_what_another_fetched(
    http: aiohttp.ClientSession,
    origin: Origin,
    logs_dir: Path,
    stream_path: str,
    mode: str,
    request: pytest.FixtureRequest,
) -> None:
    """In every ``--redis-mode``: what replica A fetched, replica B serves from Redis; a DELETE
    through A ends it on B (which holds it) and on a replica C started afterwards."""
    shared = shared_redis_in(mode, request).edge_args
    a, b = start_replicas(origin.url, logs_dir, [f"edge-a-{mode}", f"edge-b-{mode}"], *shared)
    try:
        for edge in (a, b):  # its start-up ping may have been too slow: the probe finds it
            for _ in range(50):
                _, _, ready = await call(http, "GET", edge.admin_url + "/readyz")
                if json.loads(ready)["redis"] == "up":
                    break
                await asyncio.sleep(0.1)
            assert json.loads(ready)["redis"] == "up", mode
        await create(http, a.url + stream_path, b"shared ", b"bytes", close=True)
        _, from_a, body = await call(http, "GET", a.url + stream_path + "?offset=-1")
        assert body == b"shared bytes"
        assert origin_reads(origin, stream_path) == ["-1"]
        await asyncio.sleep(0.3)  # the shared write happens in the background
        status, headers, body = await call(http, "GET", b.url + stream_path + "?offset=-1")
        assert (status, body) == (200, b"shared bytes")
        assert CIMultiDict(headers)["Cache-Status"] == "edge; hit; detail=shared"
        assert CIMultiDict(headers)["Stream-Closed"] == "true"
        # Both replicas name the stream and its instance (the shared tier's generation) alike,
        # so one purge by either key reaches what a CDN holds of either's answers.
        keys = CIMultiDict(headers)["Surrogate-Key"].split(" ")
        assert CIMultiDict(from_a)["Surrogate-Key"].split(" ") == keys
        assert CIMultiDict(headers)["Cache-Tag"] == ",".join(keys)
        assert len(keys) == 2
        assert keys[0] == purge_keys(stream_path).surrogate_key
        assert keys[1].startswith(keys[0] + "-")
        assert origin_reads(origin, stream_path) == ["-1"]
        assert (
            metric_value(b.metrics_text(), "edge_redis_operations_total", op="get", result="hit")
            >= 2
        )
        # DELETE through one replica purges the shared tier and every replica's local copy:
        # B, which holds the closed stream locally, stops serving it too.
        await call(http, "DELETE", a.url + stream_path)
        for _ in range(40):
            status, _, body = await call(http, "GET", b.url + stream_path + "?offset=-1")
            if status == 404:
                break
            await asyncio.sleep(0.05)
        assert status == 404
        assert b"shared bytes" not in body
        # Recreated: the same stream key, another instance's.
        await create(http, a.url + stream_path, b"new bytes", close=True)
        for replica in (a, b):
            status, headers, body = await call(
                http, "GET", replica.url + stream_path + "?offset=-1"
            )
            assert (status, body) == (200, b"new bytes")
            renewed = CIMultiDict(headers)["Surrogate-Key"].split(" ")
            assert renewed[0] == keys[0]
            assert renewed[1] != keys[1]
        await call(http, "DELETE", a.url + stream_path)
        c = start_edge(origin.url, logs_dir, *shared, name=f"edge-c-{mode}")
        try:
            assert (await call(http, "GET", c.url + stream_path + "?offset=-1"))[0] == 404
        finally:
            c.stop()
    finally:
        a.stop()
        b.stop()


async def test_redis_down_degrades_without_client_errors_and_recovers(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    redis_server = start_redis(logs_dir, name="redis-flaky")
    edge = start_edge(
        origin.url,
        logs_dir,
        "--redis-url",
        redis_server.url,
        "--redis-timeout",
        "0.2",
        name="edge-flaky",
    )
    try:
        url = edge.url + stream_path
        await create(http, url, b"still served", close=True)
        redis_server.stop()
        for i in range(10):
            status, _, body = await call(http, "GET", f"{url}-{i}?offset=-1")
            assert status == 404  # unknown streams: the origin's answer, not an error of ours
            status, _, body = await call(http, "GET", url + "?offset=-1")
            assert (status, body) == (200, b"still served")
        assert metric_value(edge.metrics_text(), "edge_redis_up") == 0
        assert (
            metric_value(
                edge.metrics_text(), "edge_redis_operations_total", op="get", result="skipped"
            )
            > 0
        )
        _, _, ready = await call(http, "GET", edge.admin_url + "/readyz")
        assert json.loads(ready)["redis"] == "down"

        restarted = start_redis(logs_dir, port=redis_server.port, name="redis-flaky")
        try:
            await asyncio.sleep(5.5)  # the breaker's cooldown
            for i in range(3):
                await call(http, "GET", f"{url}-again-{i}?offset=-1")
            assert metric_value(edge.metrics_text(), "edge_redis_up") == 1
        finally:
            restarted.stop()
    finally:
        edge.stop()
        redis_server.stop()


async def test_an_unreachable_redis_is_down_from_the_start_and_nothing_waits_for_it(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    port = closed_port()
    edge = start_edge(
        origin.url, logs_dir, "--redis-url", f"redis://127.0.0.1:{port}/0", name="edge-no-redis"
    )
    restarted: Redis | None = None
    try:
        # The first answers already know: Redis never answered, so it is not up.
        _, _, ready = await call(http, "GET", edge.admin_url + "/readyz")
        assert json.loads(ready)["redis"] == "down"
        assert metric_value(edge.metrics_text(), "edge_redis_up") == 0
        # A creating PUT starts a durable purge; with Redis away it does not wait for it.
        loop = asyncio.get_running_loop()
        started = loop.time()
        status, _, _ = await call(http, "PUT", edge.url + stream_path, headers=TEXT)
        assert status == 201
        assert loop.time() - started < 1.0
        # Redis appears on that port: the tier finds it without any traffic (probe, breaker).
        restarted = start_redis(logs_dir, port=port, name="redis-late")
        for _ in range(150):
            _, _, ready = await call(http, "GET", edge.admin_url + "/readyz")
            if json.loads(ready)["redis"] == "up":
                break
            await asyncio.sleep(0.1)
        assert json.loads(ready)["redis"] == "up"
        assert metric_value(edge.metrics_text(), "edge_redis_up") == 1
    finally:
        edge.stop()
        if restarted is not None:
            restarted.stop()
