"""What the edge keeps outside its cache budget follows what is alive, not what was ever seen
(issue 27, case 8: a soak grew). Against real processes: the reference origin, redis-server and
one edge process (``--workers 1``: these are one process's containers)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aredis

from devstack.processes import Edge, Origin, Redis, start_edge, start_redis
from edge.config import RedisTarget
from edge.metrics import Metrics
from edge.store.shared import SharedTier
from edge.store.shared_access import MAX_REDIS_COMMANDS

# Streams read at once: each first read asks the shared tier for the stream's generation.
BURST = 400
PAUSE_MS = 3000
PURGES = 200


@pytest.fixture
def own_redis(logs_dir: Path) -> Iterator[Redis]:
    started = start_redis(logs_dir, name="growth-redis")
    yield started
    started.stop()


async def _redis_clients(redis: Redis) -> int:
    """Connections Redis holds open, this question's own excepted."""
    client = aredis.Redis(host="127.0.0.1", port=redis.port, socket_timeout=5)
    try:
        return len(await client.client_list()) - 1
    finally:
        await client.aclose()


async def test_a_burst_of_reads_leaves_no_more_redis_connections_than_the_bound(
    origin: Origin, own_redis: Redis, logs_dir: Path, crowd: aiohttp.ClientSession
) -> None:
    """redis-py's pool never closes a connection: without a bound on the commands in flight,
    every burst left the pool as large as the busiest moment so far (a soak's descriptors grew
    step by step). ``BURST`` first reads of distinct streams at once each ask Redis for their
    stream's generation while Redis is paused; afterwards Redis holds at most
    ``MAX_REDIS_COMMANDS`` data connections of the edge, plus its purge subscription."""
    edge: Edge = start_edge(
        origin.url,
        logs_dir,
        "--workers",
        "1",
        "--redis-url",
        own_redis.url,
        "--redis-timeout",
        "10",
        name="growth-edge",
    )
    try:
        paths = [f"/v1/stream/growth-burst-{n}" for n in range(BURST)]

        async def create(path: str) -> None:
            async with crowd.put(
                origin.url + path, data=b"x", headers={"Content-Type": "text/plain"}
            ) as answer:
                assert answer.status == 201

        await asyncio.gather(*(create(path) for path in paths))

        # Redis answers nobody for a while (``CLIENT PAUSE``), as a busy Redis or a stalled
        # event loop would: every read's question is in flight at once.
        pauser = aredis.Redis(host="127.0.0.1", port=own_redis.port, socket_timeout=5)
        await pauser.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
        await pauser.aclose()

        async def read(path: str) -> int:
            async with crowd.get(f"{edge.url}{path}?offset=-1") as answer:
                await answer.read()
                return answer.status

        statuses = await asyncio.gather(*(read(path) for path in paths))
        assert set(statuses) == {200}
        held = await _redis_clients(own_redis)
        assert held <= MAX_REDIS_COMMANDS + 1
    finally:
        edge.stop()


async def test_purges_leave_nothing_behind_in_the_shared_tier(own_redis: Redis) -> None:
    """A 404 for a path this replica never held purges the shared tier only if it holds
    anything of the path, and notes whether it did for whoever asks (the CDN purger, when one
    is configured); every purge issues a generation, kept so the replica knows its own purge
    message when it comes back. Nobody asks about most, a purge that found nothing sends no
    message, and a message is heard once: the tier kept a note and a generation per purge (up
    to 10,000 each; the soak reads deleted streams). After ``PURGES`` purges of paths nobody
    held and ``PURGES`` of paths Redis holds, heard back, every container the tier keeps per
    stream or per purge is empty again."""
    tier = SharedTier(
        RedisTarget(mode="standalone", urls=(own_redis.url,)),
        Metrics(),
        ttl_seconds=60,
        timeout_seconds=5,
    )
    await tier.start()
    heard: list[str] = []
    subscribed, all_heard = asyncio.Event(), asyncio.Event()

    def hear(stream: str, _: str) -> None:
        heard.append(stream)
        if len(heard) == PURGES:
            all_heard.set()

    tier.listen_for_purges(hear, subscribed.set)
    try:
        await asyncio.wait_for(subscribed.wait(), 10)
        never_held = [f"/v1/stream/growth-never-held-{n}" for n in range(PURGES)]
        held = [f"/v1/stream/growth-held-{n}" for n in range(PURGES)]
        for path in never_held:
            tier.purge(path, only_if_known=True)
        for path in held:
            tier.purge(path)
        for path in never_held + held:
            assert await tier.purged(path, 10)
        await asyncio.wait_for(all_heard.wait(), 10)
        assert sorted(heard) == sorted(held)
        kept = {
            name: len(value)
            for name, value in vars(tier).items()
            if isinstance(value, dict | set | collections.deque)
        }
        assert kept == dict.fromkeys(kept, 0)
    finally:
        await tier.close()
