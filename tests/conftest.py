"""Fixtures that start the real processes: the reference origin and the edge in front of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin, start_edge, start_origin

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
