"""Knowledge that cannot be confirmed is trusted for a bounded time (``edge.log.trust``), against
real processes: a shared Redis stopped while another replica deletes and recreates a stream,
and a memory-store origin that restarts (losing every stream) while the edge follows one."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import aiohttp

from devstack.processes import Edge, Origin, start_edge, start_origin, start_redis
from edge.log.trust import UNCONFIRMED_TRUST_SECONDS
from tests.integration.replicas import Answer, fetch, start_replicas
from tests.integration.test_never_wrong import EDGE_ARGS, PURGE_BOUND, _port, write

# After Redis stops, a replica serves what it holds for UNCONFIRMED_TRUST_SECONDS after its last
# confirmation (a read just before the pause), plus one generation check against the stopped
# Redis timing out before its breaker opens, plus slack.
TRUST_BOUND = UNCONFIRMED_TRUST_SECONDS + 2.0
# How long Redis stays stopped, and how long replica B is read meanwhile.
PAUSE_SECONDS = 12.0
OLD = b"the old stream"
NEW = b"the new stream, other and longer bytes"


async def test_a_replica_that_cannot_reach_a_stopped_redis_serves_what_it_holds_only_so_long(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    """Replicas A and B share Redis; B holds a closed stream. Redis is stopped (SIGSTOP); the
    stream is deleted through A, recreated and written with other bytes (A's purge cannot reach
    B). From TRUST_BOUND after the pause, every read through B is the new stream's bytes or an
    error status, never the old bytes; and so once Redis is back."""
    redis_server = start_redis(logs_dir, name="trust-redis")
    edges: list[Edge] = []
    try:
        edges = start_replicas(
            origin.url, logs_dir, ["trust-a", "trust-b"], "--redis-url", redis_server.url,
            *EDGE_ARGS,
        )  # fmt: skip
        a, b = edges
        await write(http, a.url + stream_path, [OLD], close=True)
        first = await fetch(http, "GET", f"{b.url}{stream_path}?offset=-1")
        assert (first.status, first.body) == (200, OLD)
        await asyncio.sleep(0.5)  # shared writes happen in the background

        read_b = f"{b.url}{stream_path}?offset=-1"
        assert (await fetch(http, "GET", read_b)).body == OLD  # B's last confirmation
        paused = time.monotonic()
        os.kill(redis_server.pid, signal.SIGSTOP)
        seen: list[tuple[float, Answer]] = []
        try:
            assert (await fetch(http, "DELETE", a.url + stream_path)).status == 204
            await write(http, a.url + stream_path, [NEW])
            while time.monotonic() < paused + PAUSE_SECONDS:
                seen.append((time.monotonic() - paused, await fetch(http, "GET", read_b)))
                await asyncio.sleep(0.2)
        finally:
            os.kill(redis_server.pid, signal.SIGCONT)
        resumed = time.monotonic()

        late = [(at, answer) for at, answer in seen if at >= TRUST_BOUND]
        assert late, "the premise: B was read past the bound while Redis was stopped"
        for at, answer in late:
            assert answer.body != OLD, f"B served the deleted stream {at:.1f} s into the pause"
            assert answer.status >= 500 or (answer.status, answer.body) == (200, NEW), (
                at, answer.status, answer.body,
            )  # fmt: skip
        assert (late[-1][1].status, late[-1][1].body) == (200, NEW)

        await asyncio.sleep(max(0.0, resumed + PURGE_BOUND - time.monotonic()))
        for edge in edges:
            answer = await fetch(http, "GET", f"{edge.url}{stream_path}?offset=-1")
            assert (answer.status, answer.body) == (200, NEW), edge.process.name
    finally:
        for edge in edges:
            edge.stop()
        redis_server.stop()


async def test_a_restarted_memory_origin_never_has_its_lost_stream_joined_to_the_new_one(
    http: aiohttp.ClientSession, logs_dir: Path, stream_path: str
) -> None:
    """The edge holds a stream of a memory-store origin and follows it live (a long-poll at its
    tail). The origin is killed and restarted on the same port (every stream lost); a writer
    recreates the stream there and appends past the old tail before the edge's tail is back.
    A fresh read from -1 through the edge is exactly the new stream's bytes."""
    own = start_origin(logs_dir, long_poll_timeout_ms=3000, name="trust-memory-origin")
    edge: Edge | None = None
    waiting: asyncio.Task[Answer] | None = None
    try:
        edge = start_edge(own.url, logs_dir, *EDGE_ARGS, name="trust-memory-edge")
        url = edge.url + stream_path
        offsets = await write(http, url, [OLD])
        held = await fetch(http, "GET", f"{url}?offset=-1")
        assert (held.status, held.body) == (200, OLD)
        # A live reader at the tail: the edge follows the stream upstream.
        waiting = asyncio.create_task(
            fetch(http, "GET", f"{url}?offset={offsets[-1]}&live=long-poll")
        )
        await asyncio.sleep(0.5)
        assert not waiting.done(), "the premise: the long-poll waits at the tail"

        own.process.kill()
        own = start_origin(
            logs_dir, long_poll_timeout_ms=3000, port=_port(own), name="trust-memory-origin"
        )
        # The writer reaches the restarted origin first (the edge's tail is backing off).
        direct = own.url + stream_path
        assert (await fetch(http, "GET", f"{direct}?offset=-1")).status == 404  # the premise
        await write(http, direct, [NEW])
        truth = await fetch(http, "GET", f"{direct}?offset=-1")
        assert truth.body == NEW

        answer = await fetch(http, "GET", f"{url}?offset=-1")
        assert (answer.status, answer.body) == (200, NEW), answer.header("Cache-Status")
        again = await fetch(http, "GET", f"{url}?offset=-1")
        assert (again.status, again.body) == (200, NEW), again.header("Cache-Status")
    finally:
        if waiting is not None:
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        if edge is not None:
            edge.stop()
        own.stop()
