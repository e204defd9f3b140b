"""A stream that expires is neither served past its end nor advertised beyond it, even when the
edge learned of it only from reads (the lifetime is set at the origin, not through the edge)."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta

import aiohttp

from devstack.processes import Edge, Origin

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
