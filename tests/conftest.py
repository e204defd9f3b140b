"""Fixtures that start the real processes: the reference origin and the edge in front of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin, Redis, start_edge, start_origin, start_redis
from devstack.redis_sets import (
    RedisClusterSet,
    SentinelSet,
    start_redis_cluster,
    start_sentinel_set,
)

# Short enough that long-poll tests finish quickly, long enough to observe a wait.
ORIGIN_LONG_POLL_MS = 3000


@pytest.fixture(scope="session")
def logs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def origin(logs_dir: Path) -> Iterator[Origin]:
    started = start_origin(logs_dir, long_poll_timeout_ms=ORIGIN_LONG_POLL_MS)
    yield started
    started.stop()


@pytest.fixture(scope="session")
def edge(origin: Origin, logs_dir: Path) -> Iterator[Edge]:
    started = start_edge(
        origin.url, logs_dir, "--long-poll-timeout", str(ORIGIN_LONG_POLL_MS / 1000)
    )
    yield started
    started.stop()


@pytest.fixture
def own_origin(logs_dir: Path) -> Iterator[Origin]:
    """An origin of this test's own, which it may stop or kill."""
    started = start_origin(logs_dir, long_poll_timeout_ms=ORIGIN_LONG_POLL_MS, name="own-origin")
    yield started
    started.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client that shows bytes as sent (no decompression) and adds no headers of its own."""
    async with aiohttp.ClientSession(
        auto_decompress=False,
        skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent"),
        timeout=aiohttp.ClientTimeout(total=30),
    ) as session:
        yield session


@pytest.fixture
async def crowd() -> AsyncIterator[aiohttp.ClientSession]:
    """A client able to hold thousands of connections at once."""
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=120)
    ) as session:
        yield session


_counter = iter(range(1_000_000))


@pytest.fixture
def stream_path(request: pytest.FixtureRequest) -> str:
    """A stream path no other test uses."""
    return f"/v1/stream/{request.node.name.replace('[', '-').replace(']', '')}-{next(_counter)}"


# --- Redis in each --redis-mode, shared by the whole session (each takes seconds to form) ---


@pytest.fixture(scope="session")
def redis_cluster_set(logs_dir: Path) -> Iterator[RedisClusterSet]:
    """Three primaries with a replica each (``redis-cli --cluster create``)."""
    started = start_redis_cluster(logs_dir / "redis-cluster")
    yield started
    started.stop()


@pytest.fixture(scope="session")
def sentinel_set(logs_dir: Path) -> Iterator[SentinelSet]:
    """A primary, its replica and three sentinels."""
    started = start_sentinel_set(logs_dir / "redis-sentinel")
    yield started
    started.stop()


@dataclass(frozen=True)
class SharedRedis:
    """A Redis in one ``--redis-mode``, as the edge's flags name it."""

    mode: str
    url: str
    service: str | None = None

    @property
    def edge_args(self) -> tuple[str, ...]:
        args = ("--redis-url", self.url, "--redis-mode", self.mode)
        if self.service is not None:
            args += ("--redis-sentinel-service", self.service)
        return args


@pytest.fixture(scope="session")
def standalone_redis(logs_dir: Path) -> Iterator[Redis]:
    started = start_redis(logs_dir, name="standalone-redis")
    yield started
    started.stop()


REDIS_MODES = ("standalone", "cluster", "sentinel")


def shared_redis_in(mode: str, request: pytest.FixtureRequest) -> SharedRedis:
    """The session's Redis of ``mode`` (started on first use)."""
    if mode == "cluster":
        cluster: RedisClusterSet = request.getfixturevalue("redis_cluster_set")
        cluster.settle()
        return SharedRedis(mode="cluster", url=cluster.seeds)
    if mode == "sentinel":
        sentinels: SentinelSet = request.getfixturevalue("sentinel_set")
        sentinels.settle()
        return SharedRedis(mode="sentinel", url=sentinels.urls, service=sentinels.service)
    standalone: Redis = request.getfixturevalue("standalone_redis")
    return SharedRedis(mode="standalone", url=standalone.url)
