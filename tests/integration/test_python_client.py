"""The official Python client (PyPI ``durable-streams``, pinned in pyproject.toml) through the
edge, beside the origin alone: catch-up, long-poll, resume from an offset, and SSE. Its SSE
reader (0.1.0) never reconnects: the edge's rotation of an SSE connection (``--sse-max-seconds``,
PROTOCOL.md 10.2's SHOULD) ends its iteration without an error, where the origin, which never
rotates, keeps it going. These tests pin that, so a client version that resumes is noticed;
``docs/clients.md`` says what to set (``live="long-poll"``, or ``--sse-max-seconds 0``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from durable_streams import astream

from devstack.processes import Edge, Origin, start_edge

JSON = {"Content-Type": "application/json"}
ROTATE_SECONDS = 5  # the least --sse-max-seconds the edge takes


@pytest.fixture(scope="module")
def rotating_edge(origin: Origin, logs_dir: Path) -> Iterator[Edge]:
    edge = start_edge(
        origin.url, logs_dir / "pyclient-rotating", "--sse-max-seconds", str(ROTATE_SECONDS),
        name="pyclient-rotating",
    )  # fmt: skip
    yield edge
    edge.stop()


@pytest.fixture(scope="module")
def unrotating_edge(origin: Origin, logs_dir: Path) -> Iterator[Edge]:
    edge = start_edge(
        origin.url, logs_dir / "pyclient-unrotating", "--sse-max-seconds", "0",
        name="pyclient-unrotating",
    )  # fmt: skip
    yield edge
    edge.stop()


def base_of(target: str, origin: Origin, edge: Edge) -> str:
    return origin.url if target == "origin" else edge.url


async def make_stream(http: aiohttp.ClientSession, url: str, items: list[object]) -> None:
    async with http.put(url, headers=JSON) as created:
        assert created.status == 201
    if items:
        await append(http, url, items)


async def append(http: aiohttp.ClientSession, url: str, items: list[object]) -> None:
    async with http.post(url, data=json.dumps(items), headers=JSON) as appended:
        assert appended.status == 204, await appended.text()


async def write_slowly(
    http: aiohttp.ClientSession, url: str, items: list[object], every: float
) -> None:
    for item in items:
        await asyncio.sleep(every)
        await append(http, url, [item])


@pytest.mark.parametrize("target", ["origin", "edge"])
async def test_catch_up_and_resume_from_an_offset(
    origin: Origin, edge: Edge, http: aiohttp.ClientSession, stream_path: str, target: str
) -> None:
    url = base_of(target, origin, edge) + stream_path
    items = [{"n": n, "text": f"item {n}"} for n in range(30)]
    await make_stream(http, url, items[:20])
    async with astream(url, live=False) as first:
        assert await first.read_json() == items[:20]
        resume_at = first.offset
    await append(http, url, items[20:])
    async with astream(url, offset=resume_at, live=False) as rest:
        assert await rest.read_json() == items[20:]


@pytest.mark.parametrize("target", ["origin", "edge"])
async def test_long_poll_follows_every_item_once_in_order(
    origin: Origin, edge: Edge, http: aiohttp.ClientSession, stream_path: str, target: str
) -> None:
    url = base_of(target, origin, edge) + stream_path
    items = [{"n": n} for n in range(40)]
    await make_stream(http, url, items[:5])
    writer = asyncio.create_task(write_slowly(http, url, items[5:], every=0.05))
    got: list[object] = []
    async with astream(url, offset="-1", live="long-poll") as following:
        async for item in following.iter_json():
            got.append(item)
            if len(got) == len(items):
                break
    await writer
    assert got == items


async def read_sse(url: str, wanted: int, give_up_after: float) -> tuple[list[object], float]:
    """Items the client's SSE iteration yields until it ends by itself or has ``wanted``
    (then stops), and when its iteration ended (monotonic)."""
    got: list[object] = []

    async def follow() -> None:
        async with astream(url, offset="-1", live="sse") as following:
            async for item in following.iter_json():
                got.append(item)
                if len(got) == wanted:
                    return

    await asyncio.wait_for(follow(), give_up_after)
    return got, time.monotonic()


@pytest.mark.parametrize(
    ("target", "ends_early"),
    [("origin", False), ("rotating", True), ("unrotating", False)],
)
async def test_sse_ends_silently_at_the_edges_rotation_and_follows_without_it(
    origin: Origin,
    rotating_edge: Edge,
    unrotating_edge: Edge,
    http: aiohttp.ClientSession,
    stream_path: str,
    target: str,
    ends_early: bool,
) -> None:
    """One item every half second for 1.5 rotations: behind an edge that rotates SSE
    connections the client's iteration ends at the rotation, without an error and without the
    rest; the origin alone, and an edge with ``--sse-max-seconds 0``, give every item."""
    base = {"origin": origin.url, "rotating": rotating_edge.url, "unrotating": unrotating_edge.url}
    url = base[target] + stream_path
    items = [{"n": n} for n in range(3 * ROTATE_SECONDS)]
    await make_stream(http, url, items[:1])
    started = time.monotonic()
    writer = asyncio.create_task(write_slowly(http, url, items[1:], every=0.5))
    try:
        got, ended = await read_sse(url, len(items), give_up_after=4 * ROTATE_SECONDS)
    finally:
        await writer
    if ends_early:
        assert ROTATE_SECONDS - 1 <= ended - started <= ROTATE_SECONDS + 2
        assert 1 <= len(got) < len(items)
        assert got == items[: len(got)]  # what it had was exact, in order, once
    else:
        assert got == items
