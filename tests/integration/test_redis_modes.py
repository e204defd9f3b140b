"""Issue 19: the shared tier on a real Redis Cluster and a real Sentinel set, through failover.

The session's cluster (three primaries with a replica each) and sentinel set (a primary, a
replica, three sentinels) come from ``tests/conftest.py``; the tests that run in every
``--redis-mode`` (sharing, purges, alias paths, recreated streams) are parametrized where they
live. Here: what only a failover shows, and reachability at start-up. A test that kills a node
starts it again before it ends, so the session's sets stay whole.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aredis

from devstack.processes import Edge, Origin, start_edge
from devstack.redis_sets import RedisClusterSet, SentinelSet
from devstack.sse_viewer import view_sse
from edge.instances.forgetting import PURGE_WAIT_SECONDS
from edge.store.shared_codec import generation_key
from tests.conftest import SharedRedis, shared_redis_in
from tests.integration.live_support import append_all
from tests.integration.replicas import Answer, fetch, start_replicas
from tests.integration.test_faults import closed_port
from tests.integration.test_never_wrong import until_status, write
from tests.integration.test_passthrough import metric_value

# From the promotion on, every replica must answer 404 for a stream deleted during the failover
# within this: the purging replica retries at least every 2 s (PURGE_RETRY_MAX_SECONDS), each
# try bounded by 1 s, and a replica whose breaker opened meanwhile trusts what it holds until
# its probe finds Redis again (5 s cooldown, probed every second), plus slack.
PURGE_AFTER_PROMOTION = 9.0
STREAMS_READ_DURING_FAILOVER = 12
# Filler that backs up a stopped replica's replication link: socket buffers on loopback are a
# few MiB (tcp_rmem autotunes up to 32 MiB only while the reader reads).
BACKLOG_CHUNK_BYTES = 4 * 1024 * 1024
BACKLOG_CHUNKS = 16
JSON = {"Content-Type": "application/json"}


async def _redis_state(http: aiohttp.ClientSession, edge: Edge) -> str:
    answer = await fetch(http, "GET", edge.admin_url + "/readyz")
    return str(json.loads(answer.body)["redis"])


async def _until_redis(http: aiohttp.ClientSession, edge: Edge, state: str, bound: float) -> str:
    give_up = time.monotonic() + bound
    seen = await _redis_state(http, edge)
    while seen != state and time.monotonic() < give_up:
        await asyncio.sleep(0.2)
        seen = await _redis_state(http, edge)
    return seen


async def _back_up_replication(port: int, key: str) -> int:
    """With the replica stopped, write filler (in ``key``'s slot: the primary's) until the
    kernel's socket buffers to the replica are full and the primary holds replication bytes in
    its own memory (``omem`` of its replica client): whatever it writes next dies with it. The
    bytes so held."""
    client = aredis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    try:
        for chunk in range(BACKLOG_CHUNKS):
            await client.set(f"{key}:{chunk}", b"x" * BACKLOG_CHUNK_BYTES, ex=60)
            replicas = await client.client_list(_type="replica")
            held = sum(int(entry.get("omem", 0)) for entry in replicas)
            if held > 0:
                return held
        return 0
    finally:
        await client.aclose()


async def _read_each(
    http: aiohttp.ClientSession, edge: Edge, streams: dict[str, bytes], pace: float
) -> list[str]:
    """Read every stream through ``edge`` once, ``pace`` seconds apart: what was wrong."""
    wrong: list[str] = []
    for path, written in streams.items():
        answer: Answer = await fetch(http, "GET", f"{edge.url}{path}?offset=-1")
        if (answer.status, answer.body) != (200, written):
            wrong.append(f"{path}: {answer.status} {answer.body[:60]!r}")
        await asyncio.sleep(pace)
    return wrong


@pytest.mark.parametrize("mode", ["cluster", "sentinel"])
async def test_a_purge_during_a_failover_is_kept_and_reads_stay_exact(
    http: aiohttp.ClientSession,
    origin: Origin,
    logs_dir: Path,
    stream_path: str,
    mode: str,
    request: pytest.FixtureRequest,
) -> None:
    """Replicas A and B share a Redis whose primary P (for a cluster, the one serving the
    stream's slot) has one replica R. A closed stream is held by A, B and Redis. R is frozen
    (SIGSTOP) and its replication link backed up (filler written to P until P itself holds
    bytes for R), the stream is deleted through A, P is killed (SIGKILL) and R thawed, so R is
    promoted without ever having seen the purge. Meanwhile B serves streams it never read,
    each one exactly (from Redis or, while the tier is away, the origin), never an error.

    The purge was not durable while only P had it: A answers the DELETE after its 2 s wait,
    not at once, and keeps retrying. From the promotion on, within PURGE_AFTER_PROMOTION, A, B
    and a replica C started then all answer 404, never the deleted bytes; both A and B find
    the tier up again. (Were a purge durable on P alone, R would come up with the old
    generation and C would serve the deleted bytes from it for as long as Redis keeps them.)"""
    shared: SharedRedis = shared_redis_in(mode, request)
    topology: RedisClusterSet | SentinelSet = request.getfixturevalue(
        "redis_cluster_set" if mode == "cluster" else "sentinel_set"
    )
    edges = await asyncio.to_thread(
        start_replicas, origin.url, logs_dir, [f"fo-{mode}-a", f"fo-{mode}-b"], *shared.edge_args
    )
    a, b = edges
    killed: int | None = None
    try:
        for edge in edges:
            assert await _until_redis(http, edge, "up", 5.0) == "up"
        await write(http, a.url + stream_path, [b"deleted ", b"bytes"], close=True)
        others: dict[str, bytes] = {}
        for i in range(STREAMS_READ_DURING_FAILOVER):
            path = f"{stream_path}-other-{i}"
            await write(http, a.url + path, [f"other {i};".encode()], close=True)
            others[path] = f"other {i};".encode()
            assert (await fetch(http, "GET", f"{a.url}{path}?offset=-1")).body == others[path]
        for edge in edges:
            answer = await fetch(http, "GET", f"{edge.url}{stream_path}?offset=-1")
            assert (answer.status, answer.body) == (200, b"deleted bytes")
        await asyncio.sleep(0.5)  # shared writes happen in the background

        if isinstance(topology, RedisClusterSet):
            primary = topology.primary_of(generation_key(stream_path))
            replica = topology.replica_of(primary)
        else:
            primary = topology.primary_port()
            replica = topology.data[1].port if topology.data[0].port == primary else None
            replica = replica or topology.data[0].port
        assert replica is not None, "the premise: the primary has a replica"
        replica_pid = topology.node(replica).pid

        reads = asyncio.create_task(_read_each(http, b, others, pace=0.3))
        os.kill(replica_pid, signal.SIGSTOP)
        try:
            queued = await _back_up_replication(primary, generation_key(stream_path) + ":backlog")
            assert queued > 0, "the premise: what the primary writes next stays in its memory"
            started = time.monotonic()
            deleted = await fetch(http, "DELETE", a.url + stream_path)
            answered_in = time.monotonic() - started
            assert deleted.status == 204
            topology.kill(primary)
            killed = primary
        finally:
            os.kill(replica_pid, signal.SIGCONT)
        # Not durable while only the primary had it: answered after the wait, not at once.
        assert answered_in >= PURGE_WAIT_SECONDS * 0.9, answered_in
        unreplicated = metric_value(
            a.metrics_text(), "edge_redis_operations_total", op="purge", result="unreplicated"
        )
        assert unreplicated >= 1

        if isinstance(topology, RedisClusterSet):
            promoted = topology.wait_promoted(generation_key(stream_path), away_from=primary)
        else:
            promoted = topology.wait_promoted(away_from=primary)
        assert promoted == replica
        fresh = asyncio.ensure_future(
            asyncio.to_thread(
                start_edge, origin.url, logs_dir, *shared.edge_args, name=f"fo-{mode}-c"
            )
        )
        for edge in edges:
            answer = await until_status(
                http, f"{edge.url}{stream_path}?offset=-1", 404, PURGE_AFTER_PROMOTION
            )
            assert answer.status == 404, (edge.process.name, answer.status, answer.body)
        edges.append(await fresh)
        answer = await fetch(http, "GET", f"{edges[2].url}{stream_path}?offset=-1")
        assert answer.status == 404, (answer.status, answer.body)
        for edge in edges:
            answer = await fetch(http, "GET", f"{edge.url}{stream_path}?offset=-1")
            assert answer.status == 404, edge.process.name
            assert b"deleted" not in answer.body

        assert await reads == []
        for edge in edges:
            assert await _until_redis(http, edge, "up", PURGE_AFTER_PROMOTION) == "up"
        assert await _read_each(http, edges[2], others, pace=0) == []
    finally:
        for edge in edges:
            edge.stop()
        if killed is not None:
            topology.restart(killed)


@pytest.mark.parametrize("mode", ["cluster", "sentinel"])
async def test_an_unreachable_cluster_or_sentinel_set_is_down_and_nothing_waits_for_it(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str, mode: str
) -> None:
    """Seeds (or sentinels) that do not answer: ``/readyz`` says ``"redis": "down"`` and
    ``edge_redis_up`` is 0 from the first answer; a creating PUT does not wait for its purge;
    reads are served from the origin."""
    ports = [closed_port(), closed_port()]
    urls = ",".join(f"redis://127.0.0.1:{port}" for port in ports)
    args = ["--redis-url", urls, "--redis-mode", mode]
    if mode == "sentinel":
        args += ["--redis-sentinel-service", "nobody"]
    edge = start_edge(origin.url, logs_dir, *args, name=f"edge-unreachable-{mode}")
    try:
        assert await _redis_state(http, edge) == "down"
        assert metric_value(edge.metrics_text(), "edge_redis_up") == 0
        started = time.monotonic()
        await write(http, edge.url + stream_path, [b"served anyway"], close=True)
        assert time.monotonic() - started < PURGE_WAIT_SECONDS  # a PUT, an append, a close
        answer = await fetch(http, "GET", f"{edge.url}{stream_path}?offset=-1")
        assert (answer.status, answer.body) == (200, b"served anyway")
        assert "does not answer" in edge.process.log.read_text()
    finally:
        edge.stop()


@pytest.mark.parametrize("mode", ["standalone", "cluster", "sentinel"])
async def test_viewers_cut_off_mid_answer_resume_on_another_replica_with_every_byte_once(
    mode: str,
    request: pytest.FixtureRequest,
    origin: Origin,
    logs_dir: Path,
    stream_path: str,
) -> None:
    """The lift: viewers of a live JSON stream on one replica lose their connection mid-answer
    and come back through another replica sharing the tier (as a balancer that lost the first
    sends them), each from its last offset: every item once, in order, in every mode; the
    second replica reads through the shared tier of that mode (whether a resume finds a stored
    segment depends on where its offset falls, so only the bytes are asserted)."""
    shared = shared_redis_in(mode, request)
    first, second = start_replicas(
        origin.url, logs_dir, [f"lift-a-{mode}", f"lift-b-{mode}"], *shared.edge_args
    )
    items = [{"n": n, "pad": "x" * 200} for n in range(60)]
    parts = [json.dumps(item).encode() for item in items]
    connector = aiohttp.TCPConnector(limit=0)
    try:
        async with aiohttp.ClientSession(connector=connector) as crowd:
            async with crowd.put(first.url + stream_path, headers=JSON) as created:
                assert created.status == 201
            cut_off = [
                asyncio.create_task(
                    view_sse(crowd, first.url + stream_path, stop_after_events=8, resume=False)
                )
                for _ in range(10)
            ]
            writer = asyncio.create_task(
                append_all(crowd, first.url + stream_path, parts, content_type="application/json",
                           rate_per_second=30)
            )  # fmt: skip
            views = await asyncio.gather(*cut_off)
            # Back, through the other replica, while the writer is still appending.
            rests = await asyncio.gather(
                *(
                    view_sse(crowd, second.url + stream_path, offset=view.next_offset or "-1")
                    for view in views
                )
            )
            await writer
            for view, rest in zip(views, rests, strict=True):
                assert view.next_offset is not None
                assert not view.closed
                assert view.items + rest.items == items
                assert rest.closed
    finally:
        first.stop()
        second.stop()
