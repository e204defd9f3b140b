"""Resume routes under faults (issue 30), real processes: the reference origin (the session's,
or one of the test's own that it stops), a redis-server of the test's own shared by two edges,
and a raw SSE backend (``devstack/mcp_upstream.py``'s ``/raw/paced``).

Degrade, never lose, duplicate or misplace, never hang. Redis down (stopped or frozen before a
call; killed, restarted empty or frozen mid-call): the answer's own client on one edge and a
resume on the other each get every event once, in order, then the result; the answer's stream
holds each event once. A slow backend (a trickle slower than a third of the lease; headers,
then silence longer than the lease, before the first event or after it): every reader waits for
it and gets everything, never a lapse while the pump is alive. The origin away while two
readers are attached: within the pump's write retries, the whole answer; past them, what was
kept and the error; the same for both."""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin
from edge.protocol.sse import SseDecoder, SseEvent
from edge.resume.ids import parse_id
from tests.integration.resume_support import (
    CALL,
    MCP_HEADERS,
    RESULT,
    Backend,
    RestartableOrigin,
    kept_at,
    messages,
    read_resume,
    read_until_cut,
    sse_events,
    start_backend,
    steps_and_end,
    two_edges,
)
from tests.integration.test_redis_restart import RestartableRedis

pytestmark = pytest.mark.timeout(180)

# A bound on every wait here: a fault may slow an answer, never hang it.
ANSWER_BOUND = 60.0


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    started = start_backend(tmp_path_factory.mktemp("resume-faults"), name="paced-upstream")
    yield started
    started.stop()


@pytest.fixture
def shared_redis(tmp_path: Path) -> Iterator[RestartableRedis]:
    started = RestartableRedis(tmp_path)
    yield started
    if started.server.proc.poll() is None:
        started.server.proc.send_signal(signal.SIGCONT)  # a frozen one is thawed to be stopped
    started.stop()


PAIR = ("resume-a", "resume-b")


@pytest.fixture
def redis_pair(
    origin: Origin, backend: Backend, shared_redis: RestartableRedis, tmp_path: Path
) -> Iterator[tuple[Edge, Edge]]:
    redis = ("--redis-url", shared_redis.url)
    with two_edges(origin.url, tmp_path, PAIR, *backend.raw_route(), *redis) as pair:
        yield pair


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    timeout = aiohttp.ClientTimeout(total=ANSWER_BOUND)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        yield session


def redis_failed(edge: Edge) -> bool:
    """Did an operation of ``edge`` on Redis fail (or was one skipped, its breaker open)?"""
    failed = re.compile(
        r'^edge_redis_operations_total\{op="\w+",result="(error|skipped)"\} [1-9]', re.MULTILINE
    )
    return failed.search(edge.metrics_text()) is not None


N = 12


@pytest.mark.parametrize(
    "fault",
    ["stopped_before", "frozen_before", "killed_midway", "restarted_empty_midway", "frozen_midway"],
)
async def test_an_answer_and_its_resume_elsewhere_survive_redis_down(
    fault: str,
    origin: Origin,
    shared_redis: RestartableRedis,
    redis_pair: tuple[Edge, Edge],
    client: aiohttp.ClientSession,
) -> None:
    """Degrade, never lose, duplicate or misplace, never hang: the answer's own client reads
    it whole on edge A; a resume on edge B from the third event, begun while the answer is
    still running and Redis is down, gets the rest once each."""
    a, b = redis_pair
    match fault:
        case "stopped_before":
            shared_redis.stop()
        case "frozen_before":  # accepts connections, answers nothing: a hung Redis
            shared_redis.server.proc.send_signal(signal.SIGSTOP)
    url = f"{a.url}/raw/paced?n={N}&every=0.25&tag=redis-{fault}"
    decoder = SseDecoder()
    async with client.post(url, json=CALL, headers=MCP_HEADERS) as answer:
        assert answer.status == 200
        path = answer.headers["Edge-Resume-Stream"]
        first = await sse_events(answer, decoder, 3)
        match fault:
            case "killed_midway":
                shared_redis.server.proc.send_signal(signal.SIGKILL)
                shared_redis.server.proc.wait()
            case "restarted_empty_midway":
                await asyncio.to_thread(shared_redis.kill_and_restart_empty)
            case "frozen_midway":
                shared_redis.server.proc.send_signal(signal.SIGSTOP)
        third = first[2].id
        assert third is not None
        resumed = asyncio.ensure_future(resume_on(client, b, third))
        whole = first + await sse_events(answer, decoder)
    steps, final = steps_and_end(whole)
    assert steps == list(range(1, N + 1))
    assert final == RESULT
    assert all(event.id is not None and parse_id(event.id) is not None for event in whole)
    rest = await asyncio.wait_for(resumed, ANSWER_BOUND)
    # The same events once each (their ids may differ: an id names where its read's batch began).
    assert [e.data for e in rest] == [e.data for e in whole[3:]]
    assert all(event.id is not None and parse_id(event.id) is not None for event in rest)
    # A resume after the end, from the first event, on B and on A: the same again.
    for edge in (b, a):
        again = await resume_on(client, edge, whole[0].id or "")
        assert [e.data for e in again] == [e.data for e in whole[1:]]
    kept, closed = await kept_at(origin, path)
    assert closed
    assert len(kept) == N + 1  # each event once
    if fault != "restarted_empty_midway":  # back at once, empty: lost keys, no outage
        # The fault was on the answers' way: the edges met it (and went on without Redis).
        assert any(redis_failed(edge) for edge in (a, b))


# Short, so a test waits through whole leases; the backend's gaps are set against it.
LEASE = 4


@pytest.fixture
def lease_pair(origin: Origin, backend: Backend, tmp_path: Path) -> Iterator[tuple[Edge, Edge]]:
    lease = ("--resume-lease", str(LEASE))
    with two_edges(origin.url, tmp_path, PAIR, *backend.raw_route(), *lease) as pair:
        yield pair


@pytest.mark.parametrize(
    ("pace", "n"),
    [
        ("every=2", 5),  # a trickle: each gap longer than a third of the lease
        ("silent=9", 2),  # headers, then nothing for more than two leases
        ("silent=9&at=1", 3),  # one event, then that silence: a resume elsewhere waits in it
    ],
)
async def test_a_slow_upstream_is_waited_for_on_every_replica(
    pace: str,
    n: int,
    origin: Origin,
    lease_pair: tuple[Edge, Edge],
    client: aiohttp.ClientSession,
) -> None:
    """The quiet pump's leases keep every reader waiting, the answer's own client on A and a
    resume on B from the first event: nobody ends the answer as lapsed while its pump is
    alive, and each gets every event once, then the result."""
    a, b = lease_pair
    url = f"{a.url}/raw/paced?n={n}&{pace}&tag=slow-{pace}"
    decoder = SseDecoder()
    async with client.post(url, json=CALL, headers=MCP_HEADERS) as answer:
        assert answer.status == 200
        path = answer.headers["Edge-Resume-Stream"]
        own = await sse_events(answer, decoder, 1)
        first = own[0].id
        assert first is not None
        resumed = asyncio.ensure_future(resume_on(client, b, first))
        own += await sse_events(answer, decoder)
    steps, final = steps_and_end(own)
    assert steps == list(range(1, n + 1))
    assert final == RESULT
    rest = await asyncio.wait_for(resumed, ANSWER_BOUND)
    assert [e.data for e in rest] == [e.data for e in own[1:]]
    kept, closed = await kept_at(origin, path)
    assert closed
    assert len(kept) == n + 1
    for edge in (a, b):
        assert not re.search(
            r"^edge_resume_lapsed_total\{.*\} [1-9]", edge.metrics_text(), re.MULTILINE
        )


async def resume_on(client: aiohttp.ClientSession, edge: Edge, last_id: str) -> list[SseEvent]:
    return await read_resume(client, f"{edge.url}/raw", last_id)


@pytest.fixture
def away_origin(tmp_path: Path) -> Iterator[RestartableOrigin]:
    started = RestartableOrigin(tmp_path, "away-origin")
    yield started
    started.stop()


@pytest.mark.parametrize("outage", [12, 22])
async def test_readers_wait_through_an_origin_outage_while_pumping(
    outage: int,
    backend: Backend,
    away_origin: RestartableOrigin,
    tmp_path: Path,
    client: aiohttp.ClientSession,
) -> None:
    """The origin goes away mid-answer while the answer's own client on A and a resume on B
    are reading. Within the pump's write retries (~16 s), both wait and get every event once,
    in order, then the result. Past them, the pump gives up on the upstream and, the origin
    back, ends the answer: both get what was kept, then the error, then the end. Either way
    the stream holds each event once and both readers the same."""
    names = ("outage-a", "outage-b")
    with two_edges(away_origin.url, tmp_path, names, *backend.raw_route()) as (a, b):
        url = f"{a.url}/raw/paced?n={N}&every=0.5&tag=outage-{outage}"
        decoder = SseDecoder()
        async with client.post(url, json=CALL, headers=MCP_HEADERS) as answer:
            path = answer.headers["Edge-Resume-Stream"]
            own = await sse_events(answer, decoder, 2)
            second = own[1].id
            assert second is not None
            resumed = asyncio.ensure_future(resume_on(client, b, second))
            await asyncio.sleep(0.2)  # the resume is reading (a wait, not a measurement)
            away_origin.stop()
            await asyncio.sleep(outage)  # events go on upstream; the pump waits, or gives up
            away_origin.start_again()
            own += await sse_events(answer, decoder)
        rest = await asyncio.wait_for(resumed, ANSWER_BOUND)
        assert [e.data for e in rest] == [e.data for e in own[2:]]
        steps, final = steps_and_end(own)
        kept, closed = await kept_at(away_origin.origin, path)
        assert closed
        assert len(kept) == len(own)  # each event once, and the end
        if outage < 16:
            assert steps == list(range(1, N + 1))
            assert final == RESULT
        else:
            assert 2 <= len(steps) < N
            assert steps == list(range(1, len(steps) + 1))
            assert final["id"] == 42
            assert final["error"]["code"] == -32000


async def test_readers_that_cannot_read_the_log_are_cut_short_never_told_an_error(
    backend: Backend,
    away_origin: RestartableOrigin,
    tmp_path: Path,
    client: aiohttp.ClientSession,
) -> None:
    """A lease shorter than an origin outage: readers find it lapsed while the log cannot be
    read, so they cannot tell a lost pump from one waiting out the same outage. They end
    nothing and tell their clients nothing (an error there would contradict the result the log
    goes on to hold): each client is cut short, and resuming with its last id once the origin
    is back gets the rest of the answer, then the result, once."""
    names, lease = ("unreadable-a", "unreadable-b"), ("--resume-lease", str(LEASE))
    with two_edges(away_origin.url, tmp_path, names, *backend.raw_route(), *lease) as (a, b):
        url = f"{a.url}/raw/paced?n={N}&every=0.5&tag=unreadable"
        decoder = SseDecoder()
        async with client.post(url, json=CALL, headers=MCP_HEADERS) as answer:
            path = answer.headers["Edge-Resume-Stream"]
            own = await sse_events(answer, decoder, 2)
            assert own[1].id is not None
            async with client.get(f"{b.url}/raw", headers={"Last-Event-ID": own[1].id}) as other:
                assert other.status == 200
                away_origin.stop()  # away for longer than a lease, within the pump's write retries
                (more, own_cut), (elsewhere, other_cut) = await asyncio.gather(
                    read_until_cut(answer, decoder), read_until_cut(other, SseDecoder())
                )
        assert own_cut
        assert other_cut
        own += more
        told = messages([*own, *elsewhere])
        assert all("method" in message for message in told)  # progress only: no error, no end
        away_origin.start_again()
        await until_closed(away_origin.origin, path)
        last_own, last_other = own[-1].id, (elsewhere or own[1:2])[-1].id
        assert last_own is not None
        assert last_other is not None
        for edge, last, seen in ((b, last_own, own), (a, last_other, [*own[:2], *elsewhere])):
            rest = await resume_on(client, edge, last)
            steps, final = steps_and_end([*seen, *rest])
            assert steps == list(range(1, N + 1))
            assert final == RESULT
        kept, _ = await kept_at(away_origin.origin, path)
        assert len(kept) == N + 1
        for edge in (a, b):
            assert 'edge_resume_lapsed_total{result="unreadable"} 1.0' in edge.metrics_text()
            assert 'edge_resume_lapsed_total{result="fenced"} 1.0' not in edge.metrics_text()


async def until_closed(origin: Origin, path: str) -> None:
    """Wait until the answer's stream is closed at the origin (the pump went on and ended it)."""
    deadline = asyncio.get_running_loop().time() + ANSWER_BOUND
    while not (await kept_at(origin, path))[1]:
        assert asyncio.get_running_loop().time() < deadline, "the answer never ended"
        await asyncio.sleep(0.2)
