"""Issue 8: the edge never serves a byte the origin would not have served.

Real processes only: the reference origin (with a data dir where it must survive a crash), a real
redis-server and several edge replicas sharing it. Each test states what a user could check
with their own client; none looks inside the edge. Time bounds are module constants below, each
with the reason it is what it is.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
from yarl import URL

from devstack.processes import Edge, Origin, Redis, start_edge, start_origin, start_redis
from tests.conftest import ORIGIN_LONG_POLL_MS, REDIS_MODES, shared_redis_in
from tests.integration.live_support import View, append_all
from tests.integration.replicas import (
    Answer,
    Cluster,
    RedisRelay,
    fetch,
    raw,
    redis_dump,
    redis_keys,
    redis_overwrite,
    sse_once,
    start_replicas,
    tolerant_viewer,
)

TEXT = {"Content-Type": "text/plain"}
JSON = {"Content-Type": "application/json"}

# The edge's default --tail-freshness: an at-tail answer may be reused this long without asking
# the origin, so a replica that was not told of a change may say the old tail for this long.
TAIL_FRESHNESS = 1.0
# A purge published through Redis reaches the other replicas in milliseconds; this is slack.
PURGE_PROPAGATION = 2.0
# After Redis comes back (SIGCONT, or a partition heals), every replica must have forgotten a
# stream deleted meanwhile within this many seconds: the shared tier's circuit breaker cools
# down for 5 s before the edge talks to Redis again, plus one second.
PURGE_BOUND = 6.0
# After a restarted origin listens again, an edge with live viewers must have noticed its tail
# went backward within this many seconds (its tail reconnects with backoff ≤ 1.6 s by then).
NOTICE_BOUND = 3.0
EDGE_ARGS = ("--long-poll-timeout", "3")
# A replica that follows a stream live trusts its upstream's word on the tail while the upstream
# keeps speaking (the origin sends at least a keep-alive every long-poll timeout). For a stream
# deleted behind every replica's back the reference origin still answers a long-poll that was
# waiting with "nothing new" (204 at its timeout), and keeps an SSE answer open and silent; so the
# edge notices once that last word is older than the long-poll timeout plus slack: at worst one
# timeout for the waiting answer plus one timeout and slack (3 + 3 + 1 s here; ~67 s by default),
# then the next read asks the origin and gets the 404.
ORIGIN_LIVE_TIMEOUT = ORIGIN_LONG_POLL_MS / 1000
ORIGIN_DELETE_NOTICED = 2 * ORIGIN_LIVE_TIMEOUT + 1.0


# --- fixtures: one Redis and three replicas sharing it, two replicas sharing nothing ---


@pytest.fixture(scope="module")
def module_redis(logs_dir: Path) -> Iterator[Redis]:
    started = start_redis(logs_dir, name="nw-redis")
    yield started
    started.stop()


@pytest.fixture(scope="module")
def redis_cluster(origin: Origin, logs_dir: Path, module_redis: Redis) -> Iterator[Cluster]:
    edges = start_replicas(
        origin.url,
        logs_dir,
        ["nw-shared-a", "nw-shared-b", "nw-shared-c"],
        "--redis-url",
        module_redis.url,
        *EDGE_ARGS,
    )
    yield Cluster(edges, module_redis.url)
    for edge in edges:
        edge.stop()


@pytest.fixture(scope="module")
def moded_cluster(
    request: pytest.FixtureRequest, origin: Origin, logs_dir: Path
) -> Iterator[Cluster]:
    """``redis_cluster`` in the ``--redis-mode`` it is parametrized with (indirectly): for a
    cluster or sentinel set, three replicas sharing the session's."""
    mode: str = request.param
    if mode == "standalone":
        yield request.getfixturevalue("redis_cluster")
        return
    shared = shared_redis_in(mode, request)
    names = [f"nw-{mode}-{name}" for name in "abc"]
    edges = start_replicas(origin.url, logs_dir, names, *shared.edge_args, *EDGE_ARGS)
    yield Cluster(edges, shared.url)
    for edge in edges:
        edge.stop()


@pytest.fixture(scope="module")
def local_cluster(origin: Origin, logs_dir: Path) -> Iterator[Cluster]:
    edges = start_replicas(origin.url, logs_dir, ["nw-local-a", "nw-local-b"], *EDGE_ARGS)
    yield Cluster(edges)
    for edge in edges:
        edge.stop()


# --- helpers ---


async def write(
    http: aiohttp.ClientSession,
    url: str,
    parts: list[bytes],
    *,
    headers: dict[str, str] = TEXT,
    close: bool = False,
    create: bool = True,
) -> list[str]:
    """PUT (when ``create``), append ``parts``, optionally close: the Stream-Next-Offset after
    each step, in order."""
    offsets: list[str] = []
    if create:
        created = await fetch(http, "PUT", url, headers=headers)
        assert created.status == 201, (created.status, created.body)
        offsets.append(str(created.header("Stream-Next-Offset")))
    for part in parts:
        appended = await fetch(http, "POST", url, headers=headers, data=part)
        assert appended.status == 204, (appended.status, appended.body)
        offsets.append(str(appended.header("Stream-Next-Offset")))
    if close:
        closed = await fetch(http, "POST", url, headers={"Stream-Closed": "true"})
        assert closed.status == 204, (closed.status, closed.body)
        offsets.append(str(closed.header("Stream-Next-Offset")))
    return offsets


async def until_status(
    http: aiohttp.ClientSession, url: str | URL, status: int, bound: float
) -> Answer:
    """Ask ``url`` every 0.1 s until it answers ``status`` or ``bound`` seconds pass; the last
    answer."""
    give_up = time.monotonic() + bound
    while True:
        answer = await fetch(http, "GET", url)
        if answer.status == status or time.monotonic() >= give_up:
            return answer
        await asyncio.sleep(0.1)


def items(body: bytes) -> object:
    return json.loads(body) if body else None


# --- 1. a read past the tail poisons nothing ---


@pytest.mark.parametrize("poison", ["catch-up", "sse-last-event-id"])
@pytest.mark.parametrize("tier", ["redis", "local"])
async def test_a_read_past_the_tail_never_poisons_later_reads(
    request: pytest.FixtureRequest,
    http: aiohttp.ClientSession,
    origin: Origin,
    stream_path: str,
    poison: str,
    tier: str,
) -> None:
    """A client asks replica A for a well-formed offset the stream has not reached yet (by URL,
    or by a future ``Last-Event-ID`` on an ``offset=now`` SSE request). The origin answers 200
    with its real, smaller tail. Once the stream really passes that offset, every replica serves
    exactly the bytes written, once each, from -1 and from that offset, by catch-up, long-poll
    and SSE."""
    cluster: Cluster = request.getfixturevalue(f"{tier}_cluster")
    a = cluster.edges[0]
    url = a.url + stream_path
    parts = [f"m{i:02d};".encode() for i in range(15)]
    # The same appends on a scratch stream at the origin tell where the real one will be.
    ruler = await write(http, origin.url + stream_path + "-ruler", parts)
    offsets = await write(http, url, parts[:3])
    assert offsets == ruler[:4]
    future = ruler[10]  # after message 10: seven messages past today's tail
    assert future > offsets[-1]

    if poison == "catch-up":
        for _ in range(2):
            answer = await fetch(http, "GET", f"{url}?offset={future}")
            # The edge relays what the origin says: nothing there, the tail is behind you.
            assert (answer.status, answer.body) == (200, b"")
            assert answer.header("Stream-Next-Offset") == offsets[-1]
    else:
        read = await sse_once(
            http, f"{url}?offset=now&live=sse", headers={"Last-Event-ID": future}, seconds=2
        )
        assert read.status in (200, -1), read.status
        assert bytes(read.body) == b"", read

    written = b"".join(parts[:3])
    for i in range(3, len(parts)):
        await write(http, url, [parts[i]], create=False)
        written += parts[i]
        # A reader polling through A after every append: read-after-write is exact.
        answer = await fetch(http, "GET", f"{url}?offset=-1")
        assert (answer.status, answer.body) == (200, written), f"after message {i}"

    await asyncio.sleep(TAIL_FRESHNESS + 0.3)  # every replica's tail knowledge is now stale
    after_future = b"".join(parts[10:])
    for edge in cluster:
        base = edge.url + stream_path
        answer = await fetch(http, "GET", f"{base}?offset=-1")
        assert (answer.status, answer.body) == (200, written), edge.url
        answer = await fetch(http, "GET", f"{base}?offset={future}")
        assert (answer.status, answer.body) == (200, after_future), edge.url
        answer = await fetch(http, "GET", f"{base}?offset={future}&live=long-poll")
        assert (answer.status, answer.body) == (200, after_future), edge.url
        read = await sse_once(http, f"{base}?offset=-1&live=sse")
        assert (read.status, bytes(read.body)) == (200, written), (edge.url, read)
        read = await sse_once(http, f"{base}?offset={future}&live=sse")
        assert (read.status, bytes(read.body)) == (200, after_future), (edge.url, read)


# --- 2. alias paths are one stream ---


@pytest.mark.parametrize("moded_cluster", REDIS_MODES, indirect=True)
async def test_alias_paths_are_one_stream_for_reads_deletes_and_recreates(
    http: aiohttp.ClientSession, moded_cluster: Cluster, stream_path: str
) -> None:
    """``/v1/stream/x``, ``/v1/stream/./x`` and ``/v1/stream/a/../x`` name one stream at the
    origin. A DELETE through an alias ends every spelling on every replica (within the purge's
    propagation); the stream recreated with other content is read as such under every
    spelling, on every replica, by catch-up, long-poll and SSE. In every ``--redis-mode``."""
    a = moded_cluster.edges[0]
    head, name = stream_path.rsplit("/", 1)
    spellings = [stream_path, f"{head}/./{name}", f"{head}/a/../{name}"]
    await write(http, a.url + stream_path, [b"first version"], close=True)
    for edge in moded_cluster:
        for path in spellings:
            answer = await fetch(http, "GET", raw(f"{edge.url}{path}?offset=-1"))
            assert (answer.status, answer.body) == (200, b"first version"), (edge.url, path)

    deleted = await fetch(http, "DELETE", raw(a.url + spellings[2]))
    assert deleted.status == 204

    for edge in moded_cluster:
        for path in spellings:
            answer = await until_status(
                http, raw(f"{edge.url}{path}?offset=-1"), 404, PURGE_PROPAGATION
            )
            assert answer.status == 404, (edge.url, path, answer.status, answer.body)
            assert b"first version" not in answer.body

    second = b"second, longer version"
    await write(http, a.url + stream_path, [second], close=True)
    for edge in moded_cluster:
        for path in spellings:
            base = f"{edge.url}{path}"
            answer = await fetch(http, "GET", raw(f"{base}?offset=-1"))
            assert (answer.status, answer.body) == (200, second), (edge.url, path)
            answer = await fetch(http, "GET", raw(f"{base}?offset=-1&live=long-poll"))
            assert (answer.status, answer.body) == (200, second), (edge.url, path)
            read = await sse_once(http, raw(f"{base}?offset=-1&live=sse"))
            assert (read.status, bytes(read.body)) == (200, second), (edge.url, path, read)


# --- 3. delete and recreate with the same length ---


@pytest.mark.parametrize("via", ["edge", "origin"])
async def test_a_stream_recreated_with_the_same_length_is_read_as_new(
    http: aiohttp.ClientSession,
    origin: Origin,
    redis_cluster: Cluster,
    stream_path: str,
    via: str,
) -> None:
    """JSON stream ``[{"v":"old"}]`` is deleted and recreated as ``[{"v":"new"}]``: the same
    offsets, the same origin ETag, only the bytes differ. Deleted through replica A (``edge``)
    or at the origin behind every replica's back (``origin``).

    Bounds: through the edge, every replica answers 404 within the purge propagation; at the
    origin, within ``ORIGIN_DELETE_NOTICED`` + the tail freshness + 2 s of being asked (a
    replica whose tail follows the stream live trusts that tail while it speaks; otherwise the
    stream is open, so it asks the origin once its tail knowledge is stale). Once a replica has
    answered 404, every catch-up, long-poll and SSE read of the recreated stream on it says
    ``new``, and a client revalidating with the old stream's ETag gets the new body, never a
    304."""
    a = redis_cluster.edges[0]
    writer = (a.url if via == "edge" else origin.url) + stream_path
    old_offsets = await write(http, writer, [b'[{"v":"old"}]'], headers=JSON)
    old_etags: dict[str, str | None] = {}
    for edge in redis_cluster:
        base = edge.url + stream_path
        answer = await fetch(http, "GET", f"{base}?offset=-1")
        assert (answer.status, items(answer.body)) == (200, [{"v": "old"}])
        old_etags[edge.url] = answer.header("ETag")
        answer = await fetch(http, "GET", f"{base}?offset=-1&live=long-poll")
        assert (answer.status, items(answer.body)) == (200, [{"v": "old"}])
        read = await sse_once(http, f"{base}?offset=-1&live=sse", json_stream=True)
        assert (read.status, read.items) == (200, [{"v": "old"}]), read

    assert (await fetch(http, "DELETE", writer)).status == 204
    bound = PURGE_PROPAGATION if via == "edge" else ORIGIN_DELETE_NOTICED + TAIL_FRESHNESS + 2.0
    for edge in redis_cluster:
        answer = await until_status(http, f"{edge.url}{stream_path}?offset=-1", 404, bound)
        assert answer.status == 404, (edge.url, answer.status, answer.body)

    new_offsets = await write(http, writer, [b'[{"v":"new"}]'], headers=JSON)
    assert new_offsets == old_offsets  # the premise: nothing but the bytes tells them apart
    for edge in redis_cluster:
        base = edge.url + stream_path
        answer = await fetch(http, "GET", f"{base}?offset=-1")
        assert (answer.status, items(answer.body)) == (200, [{"v": "new"}]), edge.url
        etag = old_etags[edge.url]
        assert etag is not None
        answer = await fetch(http, "GET", f"{base}?offset=-1", headers={"If-None-Match": etag})
        assert (answer.status, items(answer.body)) == (200, [{"v": "new"}]), edge.url
        answer = await fetch(http, "GET", f"{base}?offset=-1&live=long-poll")
        assert (answer.status, items(answer.body)) == (200, [{"v": "new"}]), edge.url
        read = await sse_once(http, f"{base}?offset=-1&live=sse", json_stream=True)
        assert (read.status, read.items) == (200, [{"v": "new"}]), (edge.url, read)


# --- 4. the origin crashes and restarts from its data dir ---


def _port(origin: Origin) -> int:
    return int(origin.url.rsplit(":", 1)[1])


async def test_origin_crash_restart_viewers_end_with_exactly_the_origin_bytes(
    http: aiohttp.ClientSession,
    crowd: aiohttp.ClientSession,
    logs_dir: Path,
    tmp_path: Path,
    stream_path: str,
) -> None:
    """SSE viewers on replica A while a writer appends; the origin is killed with SIGKILL and
    restarted on the same port from its data dir. Every viewer ends (the stream closes) with
    exactly the items the origin holds afterwards; so do fresh catch-up and SSE reads on A and
    B."""
    data_dir = tmp_path / "origin-data"
    own = start_origin(logs_dir, long_poll_timeout_ms=3000, data_dir=data_dir, name="nw-crash")
    edges: list[Edge] = []
    try:
        edges = start_replicas(own.url, logs_dir, ["nw-crash-a", "nw-crash-b"], *EDGE_ARGS)
        url = edges[0].url + stream_path
        assert (await fetch(http, "PUT", url, headers=JSON)).status == 201
        parts = [json.dumps([{"i": i, "pad": "x" * i}]).encode() for i in range(40)]
        statuses: list[int] = []
        views = [View() for _ in range(10)]
        viewers = [
            asyncio.create_task(tolerant_viewer(crowd, url, v, deadline=30, statuses=statuses))
            for v in views
        ]
        writer = asyncio.create_task(
            append_all(http, url, parts, content_type="application/json", rate_per_second=20)
        )
        await asyncio.sleep(1.0)
        own.process.kill()
        await asyncio.sleep(0.5)
        own = start_origin(
            logs_dir,
            long_poll_timeout_ms=3000,
            data_dir=data_dir,
            port=_port(own),
            name="nw-crash",
        )
        await asyncio.wait_for(writer, timeout=30)
        await asyncio.wait_for(asyncio.gather(*viewers), timeout=35)
        truth = await fetch(http, "GET", f"{own.url}{stream_path}?offset=-1")
        assert truth.status == 200
        held = json.loads(truth.body)
        for view in views:
            assert view.closed, (len(view.items), len(held))
            assert view.items == held
        for edge in edges:
            base = edge.url + stream_path
            answer = await fetch(http, "GET", f"{base}?offset=-1")
            assert (answer.status, items(answer.body)) == (200, held), edge.url
            read = await sse_once(http, f"{base}?offset=-1&live=sse", json_stream=True)
            assert (read.status, read.items) == (200, held), edge.url
    finally:
        for edge in edges:
            edge.stop()
        own.stop()


async def test_an_origin_that_lost_its_last_appends_is_believed(
    http: aiohttp.ClientSession,
    crowd: aiohttp.ClientSession,
    logs_dir: Path,
    tmp_path: Path,
    stream_path: str,
) -> None:
    """Five appends reach the origin, replica A and its SSE viewers, then the origin crashes
    and comes back without them (its stream file is cut back to the tenth item: the tail went
    backward). Different items are then appended in their place and the stream closed.

    Asserted: once the origin has been back for NOTICE_BOUND, every new catch-up and SSE read
    on A and B gets exactly what the origin holds (never a lost item); viewers that join then
    end with exactly the origin's final items; and viewers that were live across the crash
    never receive a byte that splices the two histories: after the lost items they get either
    nothing more (an error, a reconnect) or the new items from the origin's own tail, as a
    client reading the origin directly would."""
    data_dir = tmp_path / "origin-data"
    own = start_origin(logs_dir, long_poll_timeout_ms=3000, data_dir=data_dir, name="nw-lossy")
    edges: list[Edge] = []
    early: list[asyncio.Task[View]] = []
    late: list[asyncio.Task[View]] = []
    try:
        edges = start_replicas(own.url, logs_dir, ["nw-lossy-a", "nw-lossy-b"], *EDGE_ARGS)
        a = edges[0]
        url = a.url + stream_path
        kept = [{"i": i} for i in range(10)]
        lost = [{"i": i, "lost": "x" * i} for i in range(10, 15)]
        new = [{"i": i, "new": "y" * (i + 3)} for i in range(10, 22)]
        assert (await fetch(http, "PUT", url, headers=JSON)).status == 201
        statuses: list[int] = []
        early_views = [View() for _ in range(5)]
        early = [
            asyncio.create_task(tolerant_viewer(crowd, url, v, deadline=30, statuses=statuses))
            for v in early_views
        ]
        await asyncio.sleep(0.3)
        offsets = await write(
            http, url, [json.dumps([item]).encode() for item in kept], headers=JSON, create=False
        )
        kept_tail = offsets[-1]
        await write(
            http, url, [json.dumps([item]).encode() for item in lost], headers=JSON, create=False
        )
        for _ in range(200):  # at most 10 s
            if all(len(v.items) >= 15 for v in early_views):
                break
            await asyncio.sleep(0.05)
        assert all(v.items == kept + lost for v in early_views)

        own.process.kill()
        logs = list((data_dir / "streams").glob("*.log"))
        assert len(logs) == 1, logs
        with logs[0].open("r+b") as stream_file:
            stream_file.truncate(int(kept_tail.rsplit("_", 1)[1]))
        own = start_origin(
            logs_dir,
            long_poll_timeout_ms=3000,
            data_dir=data_dir,
            port=_port(own),
            name="nw-lossy",
        )
        restarted = time.monotonic()
        direct = await fetch(http, "GET", f"{own.url}{stream_path}?offset=-1")
        assert (direct.status, items(direct.body)) == (200, kept)  # the premise
        assert direct.header("Stream-Next-Offset") == kept_tail

        await asyncio.sleep(max(0.0, restarted + NOTICE_BOUND - time.monotonic()))
        for edge in edges:
            base = edge.url + stream_path
            answer = await fetch(http, "GET", f"{base}?offset=-1")
            assert (answer.status, items(answer.body)) == (200, kept), edge.url
            read = await sse_once(http, f"{base}?offset=-1&live=sse", json_stream=True)
            assert (read.status, read.items) == (200, kept), (edge.url, read)

        late_views = [View() for _ in range(3)]
        late = [
            asyncio.create_task(tolerant_viewer(crowd, url, v, deadline=20, statuses=statuses))
            for v in late_views
        ]
        await asyncio.sleep(0.3)
        await write(
            http,
            url,
            [json.dumps([item]).encode() for item in new],
            headers=JSON,
            create=False,
            close=True,
        )
        truth = await fetch(http, "GET", f"{own.url}{stream_path}?offset=-1")
        assert items(truth.body) == kept + new
        await asyncio.wait(late, timeout=20)
        for view in late_views:
            assert view.closed, view.items
            assert view.items == kept + new
        await asyncio.wait(early, timeout=3)
        for view in early_views:
            assert view.items[:15] == kept + lost
            assert view.items[15:] in ([], new), view.items[15:]
    finally:
        for task in early + late:
            task.cancel()
        await asyncio.gather(*early, *late, return_exceptions=True)
        for edge in edges:
            edge.stop()
        own.stop()


# --- 5. Redis unavailable while a stream is deleted ---


async def _read_all(http: aiohttp.ClientSession, edges: list[Edge], path: str) -> list[Answer]:
    return [await fetch(http, "GET", f"{edge.url}{path}?offset=-1") for edge in edges]


async def test_a_delete_while_redis_is_paused_is_not_forgotten(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    """A closed stream is held by replicas A and B and by Redis. Redis is paused (SIGSTOP), the
    stream is deleted through A, Redis resumes 2 s later. From PURGE_BOUND after the resume,
    A, B and a replica C started then all answer 404 and never the deleted bytes."""
    redis_server = start_redis(logs_dir, name="nw-redis-paused")
    edges: list[Edge] = []
    try:
        edges = start_replicas(
            origin.url,
            logs_dir,
            ["nw-paused-a", "nw-paused-b"],
            "--redis-url",
            redis_server.url,
            *EDGE_ARGS,
        )
        a = edges[0]
        await write(http, a.url + stream_path, [b"deleted ", b"bytes"], close=True)
        for answer in await _read_all(http, edges, stream_path):
            assert (answer.status, answer.body) == (200, b"deleted bytes")
        await asyncio.sleep(0.5)  # shared writes happen in the background
        assert await redis_keys(redis_server.port), "the premise: Redis holds the stream"

        paused = time.monotonic()
        os.kill(redis_server.pid, signal.SIGSTOP)
        try:
            deleted = await fetch(http, "DELETE", a.url + stream_path)
            assert deleted.status == 204
            await asyncio.sleep(max(0.0, paused + 2.0 - time.monotonic()))
        finally:
            os.kill(redis_server.pid, signal.SIGCONT)
        resumed = time.monotonic()

        await asyncio.sleep(max(0.0, resumed + PURGE_BOUND - time.monotonic()))
        edges.append(
            start_edge(
                origin.url,
                logs_dir,
                "--redis-url",
                redis_server.url,
                *EDGE_ARGS,
                name="nw-paused-c",
            )
        )
        for _ in range(2):
            for edge, answer in zip(edges, await _read_all(http, edges, stream_path), strict=True):
                assert answer.status == 404, (edge.process.name, answer.status, answer.body)
                assert b"deleted" not in answer.body
            await asyncio.sleep(0.5)
    finally:
        for edge in edges:
            edge.stop()
        redis_server.stop()


async def test_a_replica_cut_off_from_redis_during_a_delete_forgets_it_once_back(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    """Replica B reaches Redis through a relay. B holds a closed stream; the relay is cut
    (B's connections reset, new ones refused); the stream is deleted through A, whose purge
    reaches Redis but not B; the relay heals 1.5 s later. From PURGE_BOUND after the heal, B
    answers 404, never the pre-purge bytes."""
    redis_server = start_redis(logs_dir, name="nw-redis-cut")
    relay = RedisRelay(redis_server.port)
    await relay.start()
    edges: list[Edge] = []
    try:
        edges.append(
            start_edge(
                origin.url, logs_dir, "--redis-url", redis_server.url, *EDGE_ARGS, name="nw-cut-a"
            )
        )
        # In a thread: the relay runs on this event loop, and B talks to Redis as it starts.
        edges.append(
            await asyncio.to_thread(
                start_edge,
                origin.url,
                logs_dir,
                "--redis-url",
                relay.url,
                *EDGE_ARGS,
                name="nw-cut-b",
            )
        )
        a = edges[0]
        await write(http, a.url + stream_path, [b"pre-purge ", b"bytes"], close=True)
        for answer in await _read_all(http, edges, stream_path):
            assert (answer.status, answer.body) == (200, b"pre-purge bytes")
        await asyncio.sleep(0.5)

        relay.cut()
        assert (await fetch(http, "DELETE", a.url + stream_path)).status == 204
        await asyncio.sleep(1.5)
        relay.heal()
        healed = time.monotonic()

        await asyncio.sleep(max(0.0, healed + PURGE_BOUND - time.monotonic()))
        for _ in range(2):
            for edge, answer in zip(edges, await _read_all(http, edges, stream_path), strict=True):
                assert answer.status == 404, (edge.process.name, answer.status, answer.body)
                assert b"pre-purge" not in answer.body
            await asyncio.sleep(0.5)
    finally:
        for edge in edges:
            edge.stop()
        await relay.close()
        redis_server.stop()


# --- 6. custom credential headers ---


async def test_a_404_to_a_credential_never_purges_the_public_copy(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    """With ``--scope-headers X-Api-Key,Authorization``, a read carrying ``X-Api-Key`` is its own
    scope. The stream is deleted at the origin behind the edge's back. A 404 answered to a
    client with some (bad) key is about that key: the public copy and another key's copy are
    still served. A 404 answered to a public read is about the public scope: from then on the
    public read of the stream is 404 too."""
    edge = start_edge(
        origin.url, logs_dir, "--scope-headers", "X-Api-Key,Authorization", name="nw-scoped"
    )
    try:
        url = edge.url + stream_path
        offsets = await write(http, url, [b"public ", b"bytes"], close=True)
        answer = await fetch(http, "GET", f"{url}?offset=-1")
        assert (answer.status, answer.body) == (200, b"public bytes")
        assert str(answer.header("Cache-Control")).startswith("public")
        good = {"X-Api-Key": "good"}
        answer = await fetch(http, "GET", f"{url}?offset=-1", headers=good)
        assert (answer.status, answer.body) == (200, b"public bytes")
        assert str(answer.header("Cache-Control")).startswith("private")

        assert (await fetch(http, "DELETE", origin.url + stream_path)).status == 204
        answer = await fetch(http, "GET", f"{url}?offset=-1", headers={"X-Api-Key": "bad"})
        assert answer.status == 404
        answer = await fetch(http, "GET", f"{url}?offset=-1")
        assert (answer.status, answer.body) == (200, b"public bytes")
        answer = await fetch(http, "GET", f"{url}?offset=-1", headers=good)
        assert (answer.status, answer.body) == (200, b"public bytes")

        # A public read the edge cannot answer from what it holds reaches the origin: 404.
        answer = await fetch(http, "GET", f"{url}?offset={offsets[1]}")
        assert answer.status == 404
        answer = await fetch(http, "GET", f"{url}?offset=-1")
        assert answer.status == 404, answer.body
    finally:
        edge.stop()


# --- 7. malformed values in Redis ---


def _wrong_start(value: bytes | None, wrong: str, end: str) -> bytes:
    """The stored value with another start in its JSON header (a made-up one when the value
    has none)."""
    if value is not None:
        header, sep, body = value.partition(b"\n")
        try:
            meta = json.loads(header)
        except ValueError:
            meta = None
        if sep and isinstance(meta, dict) and "start" in meta:
            meta["start"] = wrong if meta["start"] != wrong else "-1"
            return json.dumps(meta).encode() + b"\n" + body
    return json.dumps({"start": wrong, "end": end, "ct": "text/plain"}).encode() + b"\nbogus"


async def test_malformed_redis_values_are_misses_never_errors(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    """Replica A stores a closed stream's segments in Redis. Every ``edge:*`` key is then
    overwritten with ``[1]``, ``null``, a JSON header with a wrong start, or random bytes; a
    fresh replica reading the stream gets exactly its bytes (catch-up from -1 and from a middle
    offset, SSE), with the right tail, never a 5xx."""
    redis_server = start_redis(logs_dir, name="nw-redis-malformed")
    a = start_edge(
        origin.url, logs_dir, "--redis-url", redis_server.url, *EDGE_ARGS, name="nw-mal-a"
    )
    try:
        url = a.url + stream_path
        parts = [b"alpha;", b"beta;", b"gamma;"]
        offsets = await write(http, url, parts[:1])
        assert (await fetch(http, "GET", f"{url}?offset=-1")).body == b"alpha;"
        offsets += await write(http, url, parts[1:], close=True, create=False)
        written = b"".join(parts)
        assert (await fetch(http, "GET", f"{url}?offset=-1")).body == written
        assert (await fetch(http, "GET", f"{url}?offset={offsets[1]}")).body == written[6:]
        await asyncio.sleep(0.5)
        assert await redis_keys(redis_server.port), "the premise: A stored the stream in Redis"

        rng = random.Random(8)
        variants: dict[str, Callable[[bytes | None], bytes]] = {
            "[1]": lambda _value: b"[1]",
            "null": lambda _value: b"null",
            "wrong start": lambda value: _wrong_start(value, offsets[2], offsets[-1]),
            "random": lambda _value: rng.randbytes(24) + b"\n" + rng.randbytes(24),
        }
        failures: list[str] = []
        for index, (variant, corrupt) in enumerate(variants.items()):
            keys = await redis_keys(redis_server.port)
            values = await redis_dump(redis_server.port, keys)
            await redis_overwrite(redis_server.port, {k: corrupt(v) for k, v in values.items()})
            fresh = start_edge(
                origin.url,
                logs_dir,
                "--redis-url",
                redis_server.url,
                *EDGE_ARGS,
                name=f"nw-mal-{index}",
            )
            try:
                base = fresh.url + stream_path
                answer = await fetch(http, "GET", f"{base}?offset=-1")
                got = (answer.status, answer.body, answer.header("Stream-Next-Offset"))
                if got != (200, written, offsets[-1]):
                    failures.append(f"{variant}: -1 -> {got}")
                answer = await fetch(http, "GET", f"{base}?offset={offsets[1]}")
                if (answer.status, answer.body) != (200, written[6:]):
                    failures.append(f"{variant}: mid -> {(answer.status, answer.body)}")
                read = await sse_once(http, f"{base}?offset=-1&live=sse")
                if (read.status, bytes(read.body)) != (200, written):
                    failures.append(f"{variant}: sse -> {(read.status, bytes(read.body))}")
            finally:
                fresh.stop()
        assert not failures, failures
    finally:
        a.stop()
        redis_server.stop()


async def test_a_write_through_the_edge_below_the_known_tail_starts_a_new_instance(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    """The edge knows a JSON stream far along; behind its back the stream is deleted and
    recreated shorter, as text. The first append through the edge reports a tail before the
    one the edge knew, for a request that started after it knew it: another instance. Found
    by the property machine (tests/unit/test_properties.py): the edge kept serving the old
    JSON bytes."""
    base = edge.url + stream_path
    await write(http, origin.url + stream_path, [b'[{"v":"old, and long: ' + b"x" * 200 + b'"}]'],
                headers=JSON, close=True)  # fmt: skip
    first = await fetch(http, "GET", f"{base}?offset=-1")
    assert first.status == 200
    assert (await fetch(http, "DELETE", origin.url + stream_path)).status == 204
    await write(http, origin.url + stream_path, [], headers=TEXT)
    assert (await fetch(http, "POST", base, headers=TEXT, data=b"new")).status == 204
    answer = await fetch(http, "GET", f"{base}?offset=-1")
    assert (answer.status, answer.body) == (200, b"new")
    assert answer.header("Content-Type") == "text/plain"


@pytest.fixture
def capped_edge(origin: Origin, logs_dir: Path) -> Iterator[Edge]:
    """Answers capped at 16 bytes: a read from -1 is served from the first segments alone. No
    tail freshness: each read of an open stream's tail asks the origin."""
    started = start_edge(
        origin.url,
        logs_dir,
        *("--max-response-bytes", "16", "--tail-freshness", "0", "--workers", "1"),
        name="capped",
    )
    yield started
    started.stop()


async def test_an_append_of_another_content_type_through_the_edge_starts_a_new_instance(
    http: aiohttp.ClientSession, origin: Origin, capped_edge: Edge, stream_path: str
) -> None:
    """The edge holds a text stream in small segments; behind its back it is deleted and
    recreated as JSON, and an append through the edge brings it to the tail the edge knew, so
    no tail contradicts the old instance, and a capped read never asks the origin. The append
    itself does: the origin appends only bytes of the stream's own content type (409
    otherwise). Found by the property machine: the edge served the old text."""
    base = capped_edge.url + stream_path
    await write(http, origin.url + stream_path, [], headers=TEXT)
    offset = "-1"
    for part in (b"a" * 10, b"b" * 10, b"c" * 10):  # one segment per read
        await write(http, origin.url + stream_path, [part], headers=TEXT, create=False)
        answer = await fetch(http, "GET", f"{base}?offset={offset}")
        assert answer.status == 200
        offset = str(answer.header("Stream-Next-Offset"))
    assert (await fetch(http, "DELETE", origin.url + stream_path)).status == 204
    await write(http, origin.url + stream_path, [b'{"n":"x"}', b'{"n":"y"}'], headers=JSON)
    appended = await fetch(http, "POST", base, headers=JSON, data=b'{"n":"z"}')
    assert appended.status == 204
    assert appended.header("Stream-Next-Offset") == offset  # the tail the edge knew
    answer = await fetch(http, "GET", f"{base}?offset=-1")
    assert answer.status == 200
    assert answer.header("Content-Type") == "application/json"
    assert json.loads(answer.body)[0] == {"n": "x"}


async def test_a_close_without_a_body_is_not_an_append_of_another_type(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    """Clients send a default Content-Type on an empty close (aiohttp: octet-stream), which the
    origin takes whatever the stream's type: that is the same stream, still the edge's to
    serve (forgetting it ended every SSE viewer of the demo once). The close's answer names no
    instance (another one, recreated behind the edge, may have reached the same offset), so
    the next read asks the origin, and only for what follows the bytes held; then it is a hit."""
    base = edge.url + stream_path
    await write(http, base, [b'{"n":1}'], headers=JSON)
    assert (await fetch(http, "GET", f"{base}?offset=-1")).status == 200
    closed = await fetch(
        http,
        "POST",
        base,
        headers={"Content-Type": "application/octet-stream", "Stream-Closed": "true"},
        data=b"",
    )
    assert closed.status == 204
    answer = await fetch(http, "GET", f"{base}?offset=-1")
    assert answer.status == 200
    assert answer.header("Stream-Closed") == "true"
    assert str(answer.header("Cache-Status")).startswith("edge; fwd=partial;")
    again = await fetch(http, "GET", f"{base}?offset=-1")
    assert (again.status, again.body) == (200, answer.body)
    assert again.header("Stream-Closed") == "true"
    assert again.header("Cache-Status") == "edge; hit"


@pytest.fixture(scope="module")
def shared_trio(origin: Origin, logs_dir: Path, module_redis: Redis) -> Iterator[Cluster]:
    """Three replicas sharing ``module_redis``: one with answers capped at 16 bytes, two not."""
    capped = start_replicas(
        origin.url, logs_dir, ["nw-trio-capped"], "--redis-url", module_redis.url,
        "--max-response-bytes", "16", *EDGE_ARGS,
    )  # fmt: skip
    whole = start_replicas(
        origin.url, logs_dir, ["nw-trio-whole", "nw-trio-sharer"], "--redis-url",
        module_redis.url, *EDGE_ARGS,
    )  # fmt: skip
    yield Cluster([*capped, *whole], module_redis.url)
    for edge in [*capped, *whole]:
        edge.stop()


@pytest.mark.parametrize("reader", ["capped, from the shared offset", "whole, from the start"])
async def test_a_shared_segment_of_another_content_type_is_never_joined_to_the_bytes_held(
    http: aiohttp.ClientSession, origin: Origin, shared_trio: Cluster, stream_path: str,
    reader: str,
) -> None:  # fmt: skip
    """A replica holds a text stream ten bytes long; behind its back the stream is recreated as
    JSON reaching the same offset and beyond, and another replica shares the JSON segments that
    start there (its clients read from those offsets). A segment is of the instance it was
    fetched for, whose content type it carries: joined to the text held, a capped read served
    the JSON bytes as text; and once that was refused, a read from the start joined the text
    held to what the origin said of the JSON stream (the plan made before the refusal)."""
    capped, whole, sharer = shared_trio.edges
    replica = capped if reader.startswith("capped") else whole
    x = (await write(http, origin.url + stream_path, [b"0123456789"], headers=TEXT))[-1]
    held = await fetch(http, "GET", f"{replica.url}{stream_path}?offset=-1")
    assert (held.status, held.body) == (200, b"0123456789")
    assert (await fetch(http, "DELETE", origin.url + stream_path)).status == 204
    last = b'"' + b"z" * 40 + b'"'
    recreated = await write(http, origin.url + stream_path, [b'"abcdefg"', last], headers=JSON)
    assert recreated[1] == x  # the same offset, another instance
    # Two shared segments from there, [x, y) and [y, end): a capped read needs no origin.
    shared = await fetch(http, "GET", f"{sharer.url}{stream_path}?offset={x}")
    assert json.loads(shared.body) == ["z" * 40]
    y = recreated[2]
    await write(http, origin.url + stream_path, [b'"w"'], headers=JSON, create=False)
    await asyncio.sleep(1.2)  # past the sharer's --tail-freshness at y
    shared = await fetch(http, "GET", f"{sharer.url}{stream_path}?offset={y}")
    assert json.loads(shared.body) == ["w"]
    await asyncio.sleep(1.2)  # the shared writes land; past --tail-freshness for ``replica``
    offset = x if replica is capped else "-1"
    answer = await fetch(http, "GET", f"{replica.url}{stream_path}?offset={offset}")
    assert answer.status == 200
    assert answer.header("Content-Type") == "application/json"
    stream = ["abcdefg", "z" * 40, "w"]
    items_read = json.loads(answer.body)
    if replica is capped:  # from x: the origin's answer, or the first shared segment alone
        assert items_read in (stream[1:], stream[1:2])
    else:
        assert items_read == stream


@pytest.mark.parametrize("then", ["nothing", "a refused write"])
@pytest.mark.parametrize("recreated_as", ["text/plain", "application/json"])
async def test_a_shared_closure_of_another_instance_never_closes_the_bytes_held(
    http: aiohttp.ClientSession, origin: Origin, redis_cluster: Cluster, stream_path: str,
    recreated_as: str, then: str,
) -> None:  # fmt: skip
    """Replica A reads a closed text stream at its final offset X and shares the closure. Behind
    every replica's back the stream is recreated (as text, or as JSON) reaching X again, open;
    replica B, which never saw the old one, reads the new one from the origin. Once B's word on
    its tail is stale, a read at X found the old instance's closure in the shared tier (it named
    neither the content type nor when it was seen) and answered closed: the closed answer the
    origin never gave, kept as immutable from then on. A write through B makes its tail stale
    (a refused one too: any write may have raced one that moved it), which must not erase that
    B heard the stream open there after the closure was seen."""
    a, b = redis_cluster.edges[:2]
    x = (await write(http, origin.url + stream_path, [b"0123456789"], close=True))[-1]
    final = await fetch(http, "GET", f"{a.url}{stream_path}?offset={x}")
    assert (final.status, final.header("Stream-Closed")) == (200, "true")
    await asyncio.sleep(0.5)  # A's closure lands in the shared tier
    assert (await fetch(http, "DELETE", origin.url + stream_path)).status == 204
    body = b"abcdefghij" if recreated_as == "text/plain" else b'"abcdefg"'
    recreated = await write(http, origin.url + stream_path, [body], headers={
        "Content-Type": recreated_as})  # fmt: skip
    assert recreated[-1] == x  # the premise: the new instance reaches the same offset, open
    held = await fetch(http, "GET", f"{b.url}{stream_path}?offset=-1")
    assert (held.status, held.header("Stream-Closed")) == (200, None)
    await asyncio.sleep(TAIL_FRESHNESS + 0.3)  # B's tail is stale: it must ask someone
    if then == "a refused write":
        refused = await fetch(
            http, "POST", b.url + stream_path, headers={"Content-Type": "image/png"}, data=b"x"
        )
        assert refused.status == 409
    for offset in (x, "-1"):
        truth = await fetch(http, "GET", f"{origin.url}{stream_path}?offset={offset}")
        answer = await fetch(http, "GET", f"{b.url}{stream_path}?offset={offset}")
        assert truth.header("Stream-Closed") is None
        assert (answer.status, answer.body) == (truth.status, truth.body), offset
        assert answer.header("Stream-Closed") is None, (offset, answer.headers)
        assert answer.header("Content-Type") == recreated_as


@pytest.mark.parametrize("tier", ["redis", "local"])
async def test_a_stream_recreated_with_another_charset_is_another_instance(
    http: aiohttp.ClientSession, origin: Origin, request: pytest.FixtureRequest,
    stream_path: str, tier: str,
) -> None:  # fmt: skip
    """A ``text/plain`` stream is held; behind the edge's back it is recreated as ``text/plain;
    charset=iso-8859-1`` reaching the same offset, and appended to (the origin takes appends of
    any parameters, but answers every read with the stream's own Content-Type, exactly as it was
    created). Compared by media type only, the origin's answer for the delta was taken as the
    same instance's: the old bytes were served joined to the new ones, under the new charset."""
    edge = request.getfixturevalue(f"{tier}_cluster").edges[0]
    x = (await write(http, origin.url + stream_path, [b"0123456789"]))[-1]
    held = await fetch(http, "GET", f"{edge.url}{stream_path}?offset=-1")
    assert (held.status, held.body) == (200, b"0123456789")
    assert (await fetch(http, "DELETE", origin.url + stream_path)).status == 204
    latin = {"Content-Type": "text/plain; charset=iso-8859-1"}
    recreated = await write(http, origin.url + stream_path, [b"abcdefghij"], headers=latin)
    assert recreated[-1] == x  # the premise: the same offset, another instance
    await write(http, origin.url + stream_path, [b"KLM"], create=False)  # plain text/plain
    await asyncio.sleep(TAIL_FRESHNESS + 0.3)  # the edge asks the origin for the delta
    for offset in (x, "-1"):
        truth = await fetch(http, "GET", f"{origin.url}{stream_path}?offset={offset}")
        answer = await fetch(http, "GET", f"{edge.url}{stream_path}?offset={offset}")
        assert truth.header("Content-Type") == latin["Content-Type"]
        assert (answer.status, answer.body) == (truth.status, truth.body), offset
        assert answer.header("Content-Type") == truth.header("Content-Type")


async def test_a_shared_segment_of_another_instance_is_never_joined_to_the_bytes_held(
    http: aiohttp.ClientSession, origin: Origin, redis_cluster: Cluster, stream_path: str
) -> None:
    """Replica A reads a text stream from offset X and shares the segment [X, Y) (``OLD``).
    Behind every replica's back the stream is recreated as text reaching X, and replica B reads
    the new one from the origin: open at X. It is appended to (``NEW``). Once B's tail is
    stale, a read at X found A's segment of the old instance in the shared tier (the
    generation is unchanged) and joined it to the new bytes held, though B had heard the
    stream end at X after that segment showed it past X (a tail never goes back)."""
    a, b = redis_cluster.edges[:2]
    x = (await write(http, origin.url + stream_path, [b"0123456789", b"OLD"]))[1]
    shared = await fetch(http, "GET", f"{a.url}{stream_path}?offset={x}")
    assert (shared.status, shared.body) == (200, b"OLD")
    await asyncio.sleep(0.5)  # A's segment lands in the shared tier
    assert (await fetch(http, "DELETE", origin.url + stream_path)).status == 204
    assert (await write(http, origin.url + stream_path, [b"abcdefghij"]))[-1] == x
    held = await fetch(http, "GET", f"{b.url}{stream_path}?offset=-1")
    assert (held.status, held.body) == (200, b"abcdefghij")
    await write(http, origin.url + stream_path, [b"NEW"], create=False)
    await asyncio.sleep(TAIL_FRESHNESS + 0.3)
    for offset in (x, "-1"):
        truth = await fetch(http, "GET", f"{origin.url}{stream_path}?offset={offset}")
        answer = await fetch(http, "GET", f"{b.url}{stream_path}?offset={offset}")
        assert (answer.status, answer.body) == (truth.status, truth.body), offset


async def test_a_replica_reading_only_the_shared_tier_tells_a_shared_closure_of_another_instance(
    http: aiohttp.ClientSession, origin: Origin, redis_cluster: Cluster, stream_path: str
) -> None:
    """As above, A shares the old instance's closure at X; B reads the recreated stream, open
    at X, from the origin and shares it. C never asks the origin: it pulls B's segment and then
    finds the closure at its end. B's segment says the stream was open at X when B had it,
    after the closure was seen, so C asks the origin instead of answering closed."""
    a, b, c = redis_cluster.edges[:3]
    x = (await write(http, origin.url + stream_path, [b"0123456789"], close=True))[-1]
    final = await fetch(http, "GET", f"{a.url}{stream_path}?offset={x}")
    assert (final.status, final.header("Stream-Closed")) == (200, "true")
    await asyncio.sleep(0.5)
    assert (await fetch(http, "DELETE", origin.url + stream_path)).status == 204
    assert (await write(http, origin.url + stream_path, [b"abcdefghij"]))[-1] == x
    held = await fetch(http, "GET", f"{b.url}{stream_path}?offset=-1")
    assert (held.status, held.header("Stream-Closed")) == (200, None)
    await asyncio.sleep(0.5)  # B's segment lands in the shared tier
    answer = await fetch(http, "GET", f"{c.url}{stream_path}?offset=-1")
    assert (answer.status, answer.body) == (200, b"abcdefghij")
    assert answer.header("Stream-Closed") is None, answer.headers


# --- 8. a 404 or 410 to a write is the stream's end on every replica (issue 27) ---


@pytest.mark.parametrize("gone", [404, 410])
async def test_a_write_answered_gone_ends_the_stream_on_every_replica(
    http: aiohttp.ClientSession, origin: Origin, redis_cluster: Cluster, stream_path: str,
    gone: int,
) -> None:  # fmt: skip
    """A closed stream every replica serves from what it holds is deleted at the origin (for
    410: while it has a fork, so it is soft-deleted); an append through replica A is answered
    404 or 410, and from then on (within the purge's propagation) every replica answers what
    the origin does, for good."""
    a = redis_cluster.edges[0]
    offsets = await write(http, origin.url + stream_path, [b"old ", b"bytes"], close=True)
    if gone == 410:
        fork = {**TEXT, "Stream-Forked-From": stream_path, "Stream-Fork-Offset": offsets[1]}
        forked = await fetch(http, "PUT", f"{origin.url}{stream_path}-fork", headers=fork)
        assert forked.status == 201
    for edge in redis_cluster:
        answer = await fetch(http, "GET", f"{edge.url}{stream_path}?offset=-1")
        assert (answer.status, answer.body) == (200, b"old bytes")
    assert (await fetch(http, "DELETE", origin.url + stream_path)).status == 204
    appended = await fetch(http, "POST", a.url + stream_path, headers=TEXT, data=b"!")
    assert appended.status == gone
    for edge in redis_cluster:
        answer = await until_status(
            http, f"{edge.url}{stream_path}?offset=-1", gone, PURGE_PROPAGATION
        )
        assert answer.status == gone, (edge.url, answer.status, answer.body)
        for offset in ("-1", *offsets):
            answer = await fetch(http, "GET", f"{edge.url}{stream_path}?offset={offset}")
            assert answer.status == gone, (edge.url, offset, answer.status, answer.body)
