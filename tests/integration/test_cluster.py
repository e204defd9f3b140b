"""Replicas behind HAProxy (``make cluster``, routed as ``deploy/haproxy/haproxy.cfg`` routes):
the origin holds one live tail per stream across the fleet, a hot stream spreads, and losing a
replica loses no viewer's byte."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from devstack.cluster import Cluster, start_cluster
from devstack.processes import Edge
from tests.integration.live_support import View, append_all, view_sse
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
    # One stream: the bounded load (no replica over 150% of the mean) spread it over both.
    assert all(count > 0 for count in before), before

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


# --- one origin tail per stream across the fleet (issue 19) ---

JSON = {"Content-Type": "application/json"}
FLEET_STREAMS = 12
VIEWERS_PER_STREAM = 5
HOT_VIEWERS = 300
# HAProxy's hash-balance-factor in deploy/haproxy/haproxy.cfg: no replica over 150% of the mean.
BALANCE_FACTOR = 1.5
# How long the origin's live connections may take to settle at one per stream: viewers connect
# (or, after a kill, reconnect with backoff) and each replica opens its tail once.
SETTLE_SECONDS = 8.0


@pytest.fixture(scope="module")
def fleet(logs_dir: Path) -> Iterator[Cluster]:
    started = start_cluster(
        logs_dir / "fleet",
        replicas=3,
        # One process per replica: each worker of an edge follows the streams its own viewers
        # watch, so with --workers N a replica may hold up to N tails of a stream.
        edge_args=("--tail-linger", "1", "--drain-seconds", "3", "--workers", "1"),
    )
    yield started
    started.stop()


def alive(cluster: Cluster) -> list[Edge]:
    return [edge for edge in cluster.edges if edge.process.alive()]


def tails_on(edges: list[Edge]) -> list[float]:
    return [metric_value(e.metrics_text(), "edge_live_tails") for e in edges]


def origin_live(cluster: Cluster, path: str | None = None) -> int:
    open_now = cluster.origin.counts(path)["open"]
    return int(open_now["sse"] + open_now["long-poll"])


async def placed_evenly(
    http: aiohttp.ClientSession, cluster: Cluster, per_replica: int, prefix: str
) -> list[str]:
    """Stream paths that the balancer's hash gives ``per_replica`` to each replica (asked one
    at a time, with nothing else in flight, so the load bound plays no part): what many streams
    make of a consistent hash, with a handful."""
    placed: dict[str, list[str]] = {}
    for i in range(60 * per_replica):
        path = f"{prefix}-{i}"
        async with http.get(f"{cluster.url}{path}?offset=now") as answer:
            replica = answer.headers["X-Edge-Replica"]
        if len(placed.setdefault(replica, [])) < per_replica:
            placed[replica].append(path)
        if len(placed) == len(cluster.edges) and all(
            len(paths) == per_replica for paths in placed.values()
        ):
            return [path for paths in zip(*placed.values(), strict=True) for path in paths]
    raise AssertionError(f"the hash never placed {per_replica} streams on each: {placed}")


def replicas_serving(streams: list[str], viewers: list[asyncio.Task[View]]) -> dict[str, int]:
    """How many replicas serve each stream's viewers now (viewer ``i`` reads ``streams[i %
    len(streams)]``; a finished viewer serves nobody)."""
    serving: dict[str, set[str]] = {path: set() for path in streams}
    for index, task in enumerate(viewers):
        view = VIEWS.get(task)
        if view is not None and view.replica is not None and not view.closed:
            serving[streams[index % len(streams)]].add(view.replica)
    return {path: len(replicas) for path, replicas in serving.items()}


# Each viewer task's View, filled while it reads (the task's result only once it ends).
VIEWS: dict[asyncio.Task[View], View] = {}


def viewer_task(http: aiohttp.ClientSession, url: str) -> asyncio.Task[View]:
    view = View()
    task = asyncio.create_task(view_sse(http, url, view=view, deadline=90))
    VIEWS[task] = view
    return task


async def until_tails(
    cluster: Cluster, streams: list[str], viewers: list[asyncio.Task[View]], bound: float
) -> tuple[dict[str, int], dict[str, int]]:
    """Wait up to ``bound`` seconds for the origin to hold exactly one live connection per
    stream and replica serving its viewers (and the edges to count as many tails); the
    origin's count per stream and the replicas serving each."""
    give_up = time.monotonic() + bound
    while True:
        per_stream = {path: origin_live(cluster, path) for path in streams}
        serving = replicas_serving(streams, viewers)
        settled = per_stream == serving and sum(tails_on(alive(cluster))) == sum(serving.values())
        if settled or time.monotonic() >= give_up:
            return per_stream, serving
        await asyncio.sleep(0.2)


async def test_a_hot_stream_spreads_over_replicas_within_the_load_bound(
    fleet: Cluster, crowd: aiohttp.ClientSession
) -> None:
    """300 viewers of one stream through HAProxy: no replica takes more than 150% of the mean
    (plus one), so the stream spreads over several replicas, each following it upstream once:
    the origin holds one live connection per replica that has its viewers."""
    url = fleet.url + f"/v1/stream/fleet-hot-{time.monotonic_ns()}"
    await call(crowd, "PUT", url, headers=JSON)
    edges = alive(fleet)
    before = [metric_value(e.metrics_text(), "edge_sse_viewers") for e in edges]
    viewers = [asyncio.create_task(view_sse(crowd, url, deadline=60)) for _ in range(HOT_VIEWERS)]
    try:
        for _ in range(100):
            now = [metric_value(e.metrics_text(), "edge_sse_viewers") for e in edges]
            if sum(now) - sum(before) >= HOT_VIEWERS:
                break
            await asyncio.sleep(0.1)
        shares = [int(a - b) for a, b in zip(now, before, strict=True)]
        assert sum(shares) == HOT_VIEWERS, shares
        bound = math.ceil(BALANCE_FACTOR * sum(now) / len(edges)) + 1
        assert all(now_one <= bound for now_one in now), (now, bound)
        serving = sum(1 for share in shares if share > 0)
        assert serving >= 2, shares
        path = url.removeprefix(fleet.url)
        assert origin_live(fleet, path) == serving, (shares, fleet.origin.counts(path)["open"])
        await call(crowd, "POST", url, headers={"Stream-Closed": "true"})
        views = await asyncio.wait_for(asyncio.gather(*viewers), timeout=30)
        assert all(v.closed and v.items == [] for v in views)
    finally:
        for task in viewers:
            task.cancel()
        await asyncio.gather(*viewers, return_exceptions=True)


async def test_one_origin_tail_per_stream_across_the_fleet_and_exact_bytes_through_a_kill(
    fleet: Cluster, crowd: aiohttp.ClientSession
) -> None:
    """12 JSON streams with 5 SSE viewers each, through HAProxy in front of 3 replicas (4
    streams hashed to each, as the hash spreads many): the viewers are on every replica, and
    the origin holds exactly one live connection per stream and replica serving its viewers:
    12 when the hash keeps each stream's viewers together, where a balancer that spreads them
    would cost up to 36 (the load bound may spill a stream's viewer onto a second replica when
    a burst of joins lands unevenly, and that replica then follows the stream too, once). A
    replica is killed (SIGKILL) while every stream is written to: its viewers reconnect
    through HAProxy from their last offset, the origin again holds one live connection per
    stream and serving replica, and every viewer gets every item once. Uses up one of the
    fleet's replicas."""
    streams = await placed_evenly(
        crowd, fleet, FLEET_STREAMS // 3, f"/v1/stream/fleet-{time.monotonic_ns()}"
    )
    for path in streams:
        await call(crowd, "PUT", fleet.url + path, headers=JSON)
    viewers: list[asyncio.Task[View]] = []
    # The load bound is tight only for a fleet's first connections (each replica may always take
    # one; docs/scaling.md): the first viewer of each stream joins one at a time, as into a
    # fleet already carrying load. The rest join at once, interleaved over the streams (and so
    # over the replicas), as many runs' viewers arrive: every replica's load grows alike.
    already = int(sum(viewers_on(fleet)))
    for index, path in enumerate(streams):
        viewers.append(viewer_task(crowd, fleet.url + path))
        await wait_for_viewers(fleet, already + index + 1)
    for _ in range(VIEWERS_PER_STREAM - 1):
        viewers += [viewer_task(crowd, fleet.url + path) for path in streams]
    try:
        total = FLEET_STREAMS * VIEWERS_PER_STREAM
        spread = await wait_for_viewers(fleet, total)
        assert all(count > 0 for count in spread), spread
        per_stream, serving = await until_tails(fleet, streams, viewers, SETTLE_SECONDS)
        assert per_stream == serving, (per_stream, serving)
        assert sum(tails_on(fleet.edges)) == sum(serving.values()) == origin_live(fleet)
        # the hash keeps streams together: a spreading balancer would follow each ~3 times
        assert sum(serving.values()) < 2 * FLEET_STREAMS, serving

        items = [[{"stream": i, "n": n} for n in range(20)] for i in range(FLEET_STREAMS)]
        writers = [
            asyncio.create_task(
                append_all(
                    crowd,
                    fleet.url + path,
                    [json.dumps([item]).encode() for item in written],
                    content_type="application/json",
                    rate_per_second=20,
                    close=False,
                )
            )
            for path, written in zip(streams, items, strict=True)
        ]
        await asyncio.sleep(0.4)
        victim = max(fleet.edges, key=lambda e: metric_value(e.metrics_text(), "edge_sse_viewers"))
        victim.process.signal(signal.SIGKILL)
        await asyncio.get_running_loop().run_in_executor(None, victim.process.proc.wait, 10)
        victim.stop()
        await asyncio.gather(*writers)

        per_stream, serving = await until_tails(fleet, streams, viewers, SETTLE_SECONDS)
        assert per_stream == serving, (per_stream, serving)
        assert sum(tails_on(alive(fleet))) == sum(serving.values())

        for path in streams:
            await call(crowd, "POST", fleet.url + path, headers={"Stream-Closed": "true"})
        views = await asyncio.wait_for(asyncio.gather(*viewers), timeout=60)
        for index, view in enumerate(views):
            assert view.closed, index
            assert view.items == items[index % FLEET_STREAMS], index
        assert sum(v.connections for v in views) > total  # the victim's viewers came back
    finally:
        for task in viewers:
            task.cancel()
        await asyncio.gather(*viewers, return_exceptions=True)
