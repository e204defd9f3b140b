"""Issue 27, outside attack: a DELETE through the edge is answered, whatever happens to the stream
while the edge waits for its purge to be durable.

Real processes only: the reference origin, a redis-server of the test's own (stopped with
SIGSTOP, so the purge cannot be written and the DELETE waits up to PURGE_WAIT_SECONDS) and the
edge. Raw sockets, so no client retries a DELETE its connection lost (aiohttp retries an
idempotent request once; the retry of a DELETE the origin applied is answered 404).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin, Redis, start_edge, start_redis
from tests.integration.replicas import fetch
from tests.integration.test_never_wrong import until_status, write

# Longer than the edge's wait for a purge (PURGE_WAIT_SECONDS, 2 s): a DELETE is answered by then.
ANSWER_BOUND = 10.0


@pytest.fixture
def own_redis(logs_dir: Path) -> Iterator[Redis]:
    started = start_redis(logs_dir, name="delete-answers-redis")
    yield started
    os.kill(started.pid, signal.SIGCONT)
    started.stop()


@pytest.fixture
def shared_edge(origin: Origin, logs_dir: Path, own_redis: Redis) -> Iterator[Edge]:
    edge = start_edge(origin.url, logs_dir, "--redis-url", own_redis.url, name="delete-answers")
    yield edge
    edge.stop()


async def _exchange(url: str, request: bytes) -> bytes:
    """Send ``request`` on a connection of its own and read until the edge closes it: the
    status line, or b"" when the connection closed without an answer."""
    host, _, port = url.removeprefix("http://").partition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(ANSWER_BOUND):
            answer = await reader.read()
        return answer.split(b"\r\n", 1)[0]
    finally:
        writer.close()


@pytest.mark.parametrize("meanwhile", ["read", "recreate"])
async def test_a_delete_is_answered_when_the_stream_is_read_or_recreated_while_its_purge_waits(
    http: aiohttp.ClientSession,
    origin: Origin,
    stream_path: str,
    own_redis: Redis,
    shared_edge: Edge,
    meanwhile: str,
) -> None:
    """Redis stalls (SIGSTOP), so a DELETE through the edge waits for its purge. Meanwhile
    another client reads the stream through the edge (the origin answers 404) or creates it
    again (201): each is another purge of the stream. The DELETE is answered 204, as the origin
    alone answers it, never cut off without an answer (the origin applied it: a client that
    retries is told 404)."""
    await write(http, shared_edge.url + stream_path, [b"to be deleted"])
    held = await fetch(http, "GET", f"{shared_edge.url}{stream_path}?offset=-1")
    assert (held.status, held.body) == (200, b"to be deleted")

    os.kill(own_redis.pid, signal.SIGSTOP)
    head = f"DELETE {stream_path} HTTP/1.1\r\nHost: edge\r\nConnection: close\r\n\r\n"
    deleting = asyncio.create_task(_exchange(shared_edge.url, head.encode()))
    # Once the origin has applied the DELETE, the edge waits for its purge.
    gone = await until_status(http, f"{origin.url}{stream_path}?offset=-1", 404, ANSWER_BOUND)
    assert gone.status == 404
    if meanwhile == "read":
        other = await fetch(http, "GET", f"{shared_edge.url}{stream_path}?offset=-1")
        assert other.status == 404
    else:
        other = await fetch(
            http, "PUT", shared_edge.url + stream_path, headers={"Content-Type": "text/plain"}
        )
        assert other.status == 201
    assert await deleting == b"HTTP/1.1 204 No Content"
