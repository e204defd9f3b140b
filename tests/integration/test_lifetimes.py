"""A stream that expires is neither served past its end nor advertised beyond it, even when the
edge learned of it only from reads (the lifetime is set at the origin, not through the edge)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin, Redis
from tests.integration.replicas import start_replicas

TEXT = {"Content-Type": "text/plain"}


def max_age(cache_control: str) -> int:
    found = re.search(r"max-age=(\d+)", cache_control)
    assert found is not None, cache_control
    return int(found.group(1))


async def create_at_origin(
    http: aiohttp.ClientSession, origin: Origin, path: str, headers: dict[str, str]
) -> None:
    async with http.put(origin.url + path, headers={**TEXT, **headers}) as response:
        assert response.status == 201
    async with http.post(origin.url + path, headers=TEXT, data=b"hello") as response:
        assert response.status in (200, 204)
    async with http.post(origin.url + path, headers={**TEXT, "Stream-Closed": "true"}) as response:
        assert response.status in (200, 204)


async def test_an_absolute_expiry_caps_max_age_and_ends_service(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    expires = datetime.now(UTC) + timedelta(seconds=4)
    await create_at_origin(
        http, origin, stream_path, {"Stream-Expires-At": expires.isoformat().replace("+00:00", "Z")}
    )
    async with http.get(f"{edge.url}{stream_path}?offset=-1") as response:
        assert response.status == 200
        assert await response.read() == b"hello"
        # The lifetime is not known yet: no year-long promise.
        assert max_age(response.headers["Cache-Control"]) <= 4
    await asyncio.sleep(0.5)  # the edge asks the origin (HEAD) once
    async with http.get(f"{edge.url}{stream_path}?offset=-1") as response:
        assert response.status == 200
        assert "edge; hit" in response.headers["Cache-Status"]
        assert max_age(response.headers["Cache-Control"]) <= 4
        assert "immutable" not in response.headers["Cache-Control"]
    await asyncio.sleep(4.0)
    async with http.get(f"{edge.url}{stream_path}?offset=-1") as response:
        assert response.status == 404


async def test_a_sliding_ttl_learned_from_reads_caps_max_age_and_ends_service(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    await create_at_origin(http, origin, stream_path, {"Stream-TTL": "3"})
    async with http.get(f"{edge.url}{stream_path}?offset=-1") as response:
        assert response.status == 200
    await asyncio.sleep(0.5)
    async with http.get(f"{edge.url}{stream_path}?offset=-1") as response:
        assert response.status == 200
        assert max_age(response.headers["Cache-Control"]) <= 3
    # Nobody touches the origin: it expires the stream, and the edge stops serving it too.
    await asyncio.sleep(4.0)
    async with http.get(f"{edge.url}{stream_path}?offset=-1") as response:
        assert response.status == 404


async def test_a_stream_without_a_lifetime_is_immutable_once_known(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    await create_at_origin(http, origin, stream_path, {})
    async with http.get(f"{edge.url}{stream_path}?offset=-1") as response:
        assert response.status == 200
    await asyncio.sleep(0.5)
    async with http.get(f"{edge.url}{stream_path}?offset=-1") as response:
        assert (
            response.headers["Cache-Control"] == "public, max-age=60, stale-if-error=60, immutable"
        )


@pytest.fixture
def replicas(origin: Origin, logs_dir: Path, standalone_redis: Redis) -> Iterator[list[Edge]]:
    """Two replicas sharing one Redis: what one fills, the other is given by the shared tier."""
    edges = start_replicas(
        origin.url, logs_dir, ["life-a", "life-b"], "--redis-url", standalone_redis.url,
        "--workers", "1",
    )  # fmt: skip
    yield edges
    for edge in edges:
        edge.stop()


@pytest.mark.parametrize("lifetime", ["ttl", "expires-at"])
async def test_a_replica_given_a_stream_by_the_shared_tier_stops_when_the_origin_expires_it(
    http: aiohttp.ClientSession,
    origin: Origin,
    replicas: list[Edge],
    stream_path: str,
    lifetime: str,
) -> None:
    """Replica B never asked the origin for the stream: its bytes came from the shared tier,
    where replica A put them. B must not serve them past the origin's expiry."""
    a, b = replicas
    ends = (
        {"Stream-TTL": "3"}
        if lifetime == "ttl"
        else {
            "Stream-Expires-At": (datetime.now(UTC) + timedelta(seconds=3))
            .isoformat()
            .replace("+00:00", "Z")
        }
    )
    await create_at_origin(http, origin, stream_path, ends)
    async with http.get(f"{a.url}{stream_path}?offset=-1") as response:
        assert response.status == 200
        assert await response.read() == b"hello"
    async with http.get(f"{b.url}{stream_path}?offset=-1") as response:
        assert response.status == 200
        assert await response.read() == b"hello"
        assert max_age(response.headers["Cache-Control"]) <= 3
    # Nobody reads at the origin: it expires the stream (3 s after A's read or its creation).
    await asyncio.sleep(4.0)
    async with http.head(f"{origin.url}{stream_path}") as response:
        assert response.status == 404  # what the origin alone says
    for _ in range(2):
        async with http.get(f"{b.url}{stream_path}?offset=-1") as response:
            assert response.status == 404, response.headers.get("Cache-Status")


async def test_a_fork_created_through_the_edge_lives_as_long_as_its_source_says(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    """A fork created without a lifetime of its own inherits its source's (the reference
    origin's ``resolveForkExpiry``): its creating PUT does not state its whole lifetime, as
    another creating PUT does, so the edge neither promises it for a year nor serves it past
    the source's expiry."""
    expires = datetime.now(UTC) + timedelta(seconds=4)
    await create_at_origin(
        http, origin, stream_path, {"Stream-Expires-At": expires.isoformat().replace("+00:00", "Z")}
    )
    fork = f"{stream_path}-fork"
    forked = {**TEXT, "Stream-Forked-From": stream_path, "Stream-Closed": "true"}
    async with http.put(edge.url + fork, headers=forked) as response:
        assert response.status == 201
    for _ in range(2):
        async with http.get(f"{edge.url}{fork}?offset=-1") as response:
            assert response.status == 200
            assert await response.read() == b"hello"
            assert max_age(response.headers["Cache-Control"]) <= 4
            assert "immutable" not in response.headers["Cache-Control"]
        await asyncio.sleep(0.5)  # the edge asks the origin (HEAD) once
    await asyncio.sleep(4.0)
    async with http.get(f"{edge.url}{fork}?offset=-1") as response:
        assert response.status == 404
