"""Two replicas behind HAProxy (``make cluster``): losing one loses no viewer's byte."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from devstack.cluster import Cluster, start_cluster
from devstack.processes import Edge
from tests.integration.live_support import append_all, view_sse
from tests.integration.test_passthrough import call, metric_value

TEXT = {"Content-Type": "text/plain"}


@pytest.fixture
def cluster(logs_dir: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    started = start_cluster(
        logs_dir / request.node.name, edge_args=("--drain-seconds", "3", "--tail-linger", "1")
    )
    yield started
    started.stop()


def viewers_on(cluster: Cluster) -> list[float]:
    return [metric_value(e.metrics_text(), "edge_sse_viewers") for e in cluster.edges]


async def wait_for_viewers(cluster: Cluster, total: int) -> list[float]:
    for _ in range(100):
        counts = viewers_on(cluster)
        if sum(counts) >= total:
            return counts
        await asyncio.sleep(0.1)
    raise AssertionError(f"viewers never all connected: {viewers_on(cluster)}")


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
async def test_losing_a_replica_mid_stream_loses_no_byte(
    cluster: Cluster, crowd: aiohttp.ClientSession, how: str
) -> None:
    url = cluster.url + f"/v1/stream/cluster-{how}"
    await call(crowd, "PUT", url, headers=TEXT)
    parts = [f" tok{i}".encode() for i in range(80)]
    # Viewers reconnect through HAProxy from their last offset, as the official clients do.
    viewers = [asyncio.create_task(view_sse(crowd, url, deadline=90)) for _ in range(500)]
    before = await wait_for_viewers(cluster, 500)
    assert all(count > 0 for count in before), before  # leastconn spread them over both

    writer = asyncio.create_task(append_all(crowd, url, parts, rate_per_second=40))
    await asyncio.sleep(0.7)
    victim, survivor = cluster.edges
    if how == "sigkill":
        victim.process.signal(signal.SIGKILL)
    else:
        victim.process.signal(signal.SIGTERM)
    code = await asyncio.get_running_loop().run_in_executor(None, victim.process.proc.wait, 10)
    victim.stop()  # reaps and releases pipes; the process is already gone
    if how == "sigterm":
        assert code == 0  # drained and exited within --drain-seconds (3 s; waited up to 10)
    moved = await wait_for_viewers_on(survivor, 500)
    assert moved >= 500 > before[1]  # the survivor took the reconnects

    await writer
    views = await asyncio.wait_for(asyncio.gather(*viewers), timeout=90)
    written = b"".join(parts)
    assert all(bytes(v.body) == written and v.closed for v in views)
    assert sum(v.connections for v in views) >= 500 + int(before[0])


async def wait_for_viewers_on(edge: Edge, total: int) -> float:
    seen = 0.0
    for _ in range(150):
        seen = metric_value(edge.metrics_text(), "edge_sse_viewers")
        if seen >= total:
            return seen
        await asyncio.sleep(0.1)
    return seen
