"""Issue 27, outside attack: a shared Redis killed (SIGKILL) and restarted empty under replicas.

Real processes only: the reference origin, a redis-server of the test's own (so it can be killed
and restarted on its port with nothing in it) and two edge replicas sharing it. What is
compared is what the origin alone answers at the same moment.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aredis

from devstack.processes import Edge, Origin, Redis, start_redis
from tests.integration.replicas import fetch, start_replicas
from tests.integration.test_never_wrong import until_status

TEXT = {"Content-Type": "text/plain"}
# A purge published through Redis reaches the other replicas in milliseconds, and a replica
# that missed it confirms the stream's generation within 1 s (GENERATION_CHECK_SECONDS); slack.
PURGE_PROPAGATION = 3.0
# The replicas find Redis again within this after it listens (breaker probe every second,
# after a 5 s cooldown), plus slack.
REDIS_BACK = 8.0
# A replica's write to the shared tier lands within this after its answer.
SHARED_WRITE_BOUND = 5.0


class RestartableRedis:
    """A redis-server the test owns: killed with SIGKILL, started again empty on its port."""

    def __init__(self, logs_dir: Path) -> None:
        self._logs_dir = logs_dir
        self.server: Redis = start_redis(logs_dir, name="restart-redis")
        self.port = self.server.port

    @property
    def url(self) -> str:
        return self.server.url

    def kill_and_restart_empty(self) -> None:
        self.server.proc.send_signal(signal.SIGKILL)
        self.server.proc.wait()
        self.server = start_redis(self._logs_dir, port=self.port, name="restart-redis-again")

    async def evict_all(self) -> None:
        """What ``maxmemory`` eviction or the keys' TTL (``--redis-ttl``) does to a stream's
        keys while a replica still holds the stream in its own memory."""
        client = aredis.Redis(host="127.0.0.1", port=self.port)
        try:
            # The replica's shared write happens in the background, after its answer.
            give_up = time.monotonic() + SHARED_WRITE_BOUND
            names = [name async for name in client.scan_iter(match="edge:*")]
            while not names and time.monotonic() < give_up:
                await asyncio.sleep(0.05)
                names = [name async for name in client.scan_iter(match="edge:*")]
            assert names, "the replica never shared what it read"
            await client.delete(*names)
        finally:
            await client.aclose()

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture
def restartable_redis(logs_dir: Path) -> Iterator[RestartableRedis]:
    started = RestartableRedis(logs_dir)
    yield started
    started.stop()


@pytest.fixture
def pair(
    origin: Origin, logs_dir: Path, restartable_redis: RestartableRedis
) -> Iterator[list[Edge]]:
    edges = start_replicas(
        origin.url, logs_dir, ["rr-a", "rr-b"], "--redis-url", restartable_redis.url
    )
    yield edges
    for edge in edges:
        edge.stop()


async def _redis_up(http: aiohttp.ClientSession, edge: Edge, bound: float) -> bool:
    give_up = time.monotonic() + bound
    while time.monotonic() < give_up:
        answer = await fetch(http, "GET", edge.admin_url + "/readyz")
        if json.loads(answer.body)["redis"] == "up":
            return True
        await asyncio.sleep(0.2)
    return False


@pytest.mark.parametrize("loss", ["restarted_empty", "evicted"])
async def test_a_stream_deleted_after_redis_lost_its_keys_is_not_served_by_the_replica_that_held_it(
    loss: str,
    http: aiohttp.ClientSession,
    origin: Origin,
    stream_path: str,
    pair: list[Edge],
    restartable_redis: RestartableRedis,
) -> None:
    """Replica B holds a closed stream (created at the origin, never purged through an edge).
    Redis loses every key of it: killed and restarted empty (both replicas find it again), or
    its keys evicted (``maxmemory``) or expired (``--redis-ttl``) while B still holds the
    stream in its own memory. The stream is deleted
    at the origin; a read through replica A, which never held it, is answered 404 by the
    origin. From then on, within PURGE_PROPAGATION, B answers 404 too, as the origin does,
    never the deleted bytes (with Redis never restarted, it does: A's purge finds B's shared
    segments and is published)."""
    a, b = pair
    created = await fetch(
        http, "PUT", origin.url + stream_path, headers={**TEXT, "Stream-Closed": "true"},
        data=b"deleted-bytes",
    )  # fmt: skip
    assert created.status == 201
    held = await fetch(http, "GET", f"{b.url}{stream_path}?offset=-1")
    assert (held.status, held.body) == (200, b"deleted-bytes")

    if loss == "restarted_empty":
        await asyncio.to_thread(restartable_redis.kill_and_restart_empty)
        assert await _redis_up(http, a, REDIS_BACK)
        assert await _redis_up(http, b, REDIS_BACK)
    else:
        await restartable_redis.evict_all()
    # B confirms what it holds against the empty tier before serving it.
    again = await fetch(http, "GET", f"{b.url}{stream_path}?offset=-1")
    assert (again.status, again.body) == (200, b"deleted-bytes")

    assert (await fetch(http, "DELETE", origin.url + stream_path)).status == 204
    assert (await fetch(http, "GET", f"{a.url}{stream_path}?offset=-1")).status == 404
    answer = await until_status(http, f"{b.url}{stream_path}?offset=-1", 404, PURGE_PROPAGATION)
    alone = await fetch(http, "GET", f"{origin.url}{stream_path}?offset=-1")
    assert (answer.status, answer.body) == (alone.status, alone.body) == (404, alone.body)
