"""Issue 27, outside attack: deletes through the edge while a Redis primary is killed.

Real processes only: the reference origin, the session's Redis Cluster (three primaries with a
replica each) or Sentinel set (a primary, a replica, three sentinels), and two edge replicas
sharing it. A primary is killed (SIGKILL) and, while its replica is promoted, streams are
deleted through replica A at once. What a user sees is compared with what the origin alone
answers: every DELETE is answered as the origin answers it, and no replica serves a deleted
stream once the failover is over. A test that kills a node starts it again before it ends, so
the session's sets stay whole.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Origin
from devstack.redis_sets import RedisClusterSet, SentinelSet
from edge.store.shared_codec import generation_key
from tests.conftest import SharedRedis, shared_redis_in
from tests.integration.replicas import fetch, start_replicas
from tests.integration.test_never_wrong import until_status, write
from tests.integration.test_redis_modes import PURGE_AFTER_PROMOTION, _until_redis

# Enough deletes in flight at once that some meet the cluster client while it drops the dead
# node's connections (redis-py closes every connection of a node it re-initializes).
STREAMS = 24


async def _delete_once(url: str) -> str:
    """A DELETE on a connection of its own, never retried (aiohttp retries an idempotent
    request once on a reused connection the server closed: a retried DELETE of a stream the
    first one deleted is answered 404): its status, or how the connection ended."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as one:
        try:
            async with one.delete(url) as response:
                await response.read()
                return str(response.status)
        except aiohttp.ClientError as error:
            return type(error).__name__


@pytest.mark.parametrize("mode", ["cluster", "sentinel"])
async def test_deletes_while_a_redis_primary_is_killed_are_all_answered_and_kept(
    http: aiohttp.ClientSession,
    origin: Origin,
    logs_dir: Path,
    stream_path: str,
    mode: str,
    request: pytest.FixtureRequest,
) -> None:
    """Replicas A and B hold closed streams (which nothing but a purge makes them forget). The
    primary serving the first stream's slot is killed, and every stream is deleted through A
    at once. Each DELETE is answered 204, as the origin alone answers it (none is cut off
    without an answer: its client would retry and be told 404). From the promotion on, within
    PURGE_AFTER_PROMOTION, B answers 404 for every one of them, as the origin does."""
    shared: SharedRedis = shared_redis_in(mode, request)
    topology: RedisClusterSet | SentinelSet = request.getfixturevalue(
        "redis_cluster_set" if mode == "cluster" else "sentinel_set"
    )
    a, b = await asyncio.to_thread(
        start_replicas, origin.url, logs_dir, [f"fd-{mode}-a", f"fd-{mode}-b"], *shared.edge_args
    )
    paths = [f"{stream_path}-{i}" for i in range(STREAMS)]
    killed: int | None = None
    try:
        for edge in (a, b):
            assert await _until_redis(http, edge, "up", 5.0) == "up"
        for i, path in enumerate(paths):
            await write(http, a.url + path, [f"deleted {i}".encode()], close=True)
        for edge in (a, b):
            for i, path in enumerate(paths):
                answer = await fetch(http, "GET", f"{edge.url}{path}?offset=-1")
                assert (answer.status, answer.body) == (200, f"deleted {i}".encode())
        await asyncio.sleep(0.5)  # shared writes happen in the background

        if isinstance(topology, RedisClusterSet):
            primary = topology.primary_of(generation_key(paths[0]))
        else:
            primary = topology.primary_port()
        topology.kill(primary)
        killed = primary
        statuses = await asyncio.gather(*(_delete_once(a.url + path) for path in paths))
        assert statuses == ["204"] * STREAMS

        if isinstance(topology, RedisClusterSet):
            await asyncio.to_thread(topology.wait_promoted, generation_key(paths[0]), primary)
        else:
            await asyncio.to_thread(topology.wait_promoted, primary)
        served = {}
        for path in paths:
            answer = await until_status(
                http, f"{b.url}{path}?offset=-1", 404, PURGE_AFTER_PROMOTION
            )
            served[path] = (answer.status, answer.body[:12])
        assert served == dict.fromkeys(paths, (404, b"Stream not f"))
    finally:
        a.stop()
        b.stop()
        if killed is not None:
            topology.restart(killed)
            topology.settle()
