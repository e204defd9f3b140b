"""``edge serve --workers 2`` against the real origin: worker processes on one port, restarted
when they die, drained together, one /metrics and one /purge for all of them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devstack.processes import REPO, Edge, Origin, start_edge
from tests.integration.test_cache import create
from tests.integration.test_passthrough import call, metric_value

# Enough fresh connections that the kernel's 4-tuple hash gives each worker some: the chance
# that 40 all land on one of two workers is 2 / 2**40.
CONNECTIONS = 40


@pytest.fixture
def workers_edge(origin: Origin, logs_dir: Path, request: pytest.FixtureRequest) -> Iterator[Edge]:
    started = start_edge(
        origin.url,
        logs_dir,
        "--workers",
        "2",
        "--drain-seconds",
        "3",
        name=f"edge-{request.node.name}",
    )
    yield started
    started.stop()


@pytest.fixture
async def fresh() -> AsyncIterator[aiohttp.ClientSession]:
    """A new TCP connection for every request, so the kernel spreads them over the workers."""
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True),
        timeout=aiohttp.ClientTimeout(total=15),
    ) as session:
        yield session


async def readiness(http: aiohttp.ClientSession, edge: Edge) -> tuple[int, dict[str, Any]]:
    async with http.get(edge.admin_url + "/readyz") as response:
        return response.status, await response.json()


async def per_worker_metric(http: aiohttp.ClientSession, edge: Edge, name: str) -> list[float]:
    """``name`` as each worker alone reports it (its private admin listener)."""
    _, report = await readiness(http, edge)
    values = []
    for worker in report["per_worker"]:
        status, _, body = await call(http, "GET", worker["admin"] + "/metrics")
        assert status == 200
        values.append(metric_value(body.decode(), name))
    return values


async def test_the_edge_listens_once_with_every_worker_ready(
    http: aiohttp.ClientSession, workers_edge: Edge
) -> None:
    assert workers_edge.process.ready["workers"] == 2
    status, report = await readiness(http, workers_edge)
    assert status == 200
    assert report["ready"] is True
    assert report["workers_up"] == 2
    assert "204 to OPTIONS /" in report["origin"]
    pids = {worker["pid"] for worker in report["per_worker"]}
    assert len(pids) == 2
    assert workers_edge.process.pid not in pids


async def test_a_killed_worker_is_restarted_and_the_port_keeps_answering(
    http: aiohttp.ClientSession, fresh: aiohttp.ClientSession, workers_edge: Edge, stream_path: str
) -> None:
    url = workers_edge.url + stream_path
    await create(http, url, b"still here", close=True)
    _, report = await readiness(http, workers_edge)
    victim = report["per_worker"][0]["pid"]
    os.kill(victim, signal.SIGKILL)

    # Every request on a new connection from now on is answered: the dead worker's socket went
    # with it, so the kernel gives its share to the survivor until the restart.
    deadline = time.monotonic() + 15
    restarted: dict[str, Any] = {}
    answered = 0
    while time.monotonic() < deadline:
        status, _, body = await call(fresh, "GET", url + "?offset=-1")
        assert (status, body) == (200, b"still here")
        answered += 1
        _, now = await readiness(http, workers_edge)
        pids = {worker["pid"] for worker in now["per_worker"]}
        if now["workers_up"] == 2 and victim not in pids:
            restarted = now
            break
        await asyncio.sleep(0.05)
    assert restarted, "the killed worker was not restarted"
    assert answered >= 1
    assert restarted["ready"] is True
    text = workers_edge.metrics_text()
    assert metric_value(text, "edge_worker_restarts_total") == 1
    assert metric_value(text, "edge_workers") == 2
    # And the new worker serves too.
    for _ in range(CONNECTIONS):
        status, _, body = await call(fresh, "GET", url + "?offset=-1")
        assert (status, body) == (200, b"still here")


async def test_sigterm_drains_every_worker_and_the_edge_exits_0(
    http: aiohttp.ClientSession, workers_edge: Edge, stream_path: str
) -> None:
    _, report = await readiness(http, workers_edge)
    worker_pids = [worker["pid"] for worker in report["per_worker"]]
    url = workers_edge.url + stream_path
    await create(http, url, b"x")
    # Live viewers on both workers: they end cleanly when the workers drain.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as viewers:
        responses = [
            await viewers.get(url + "?offset=-1&live=sse", timeout=aiohttp.ClientTimeout(total=20))
            for _ in range(8)
        ]
        assert all(response.status == 200 for response in responses)
        started = time.monotonic()
        workers_edge.process.signal(signal.SIGTERM)
        try:
            code = await asyncio.to_thread(workers_edge.process.proc.wait, 15)
        except subprocess.TimeoutExpired:
            pytest.fail("the supervisor did not exit after SIGTERM")
        took = time.monotonic() - started
        for response in responses:
            response.close()
    assert code == 0
    assert took < 3 + 5  # --drain-seconds plus the supervisor's slack
    for pid in worker_pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_metrics_sum_requests_across_workers(
    http: aiohttp.ClientSession, fresh: aiohttp.ClientSession, workers_edge: Edge, stream_path: str
) -> None:
    url = workers_edge.url + stream_path
    await create(http, url, b"counted", close=True)
    before = workers_edge.metrics_text()
    for _ in range(CONNECTIONS):
        assert (await call(fresh, "GET", url + "?offset=-1"))[0] == 200
    after = workers_edge.metrics_text()
    name, labels = "edge_requests_total", {"kind": "catchup", "code": "200"}
    assert metric_value(after, name, **labels) - metric_value(before, name, **labels) == CONNECTIONS
    # Both workers served some of them: the sum above really is across processes.
    each = await per_worker_metric(http, workers_edge, "edge_served_bytes_total")
    assert len(each) == 2
    assert all(value > 0 for value in each), each
    # Scrape-time values are the workers' sum too (each worker's cache holds the stream).
    assert metric_value(after, "edge_cache_segments") >= 2
    assert metric_value(after, "process_cpu_seconds_total") > 0
    assert metric_value(after, "edge_workers") == 2


async def test_purge_reaches_every_worker_without_redis(
    http: aiohttp.ClientSession,
    fresh: aiohttp.ClientSession,
    origin: Origin,
    workers_edge: Edge,
    stream_path: str,
) -> None:
    url = workers_edge.url + stream_path
    await create(http, url, b"doomed", close=True)
    for _ in range(CONNECTIONS):
        assert (await call(fresh, "GET", url + "?offset=-1"))[2] == b"doomed"
    held = await per_worker_metric(http, workers_edge, "edge_cache_segments")
    assert all(segments >= 1 for segments in held), held  # cached in both workers

    # Deleted behind the edge's back: closed streams are served from the cache until purged.
    assert (await call(http, "DELETE", origin.url + stream_path))[0] == 204
    for _ in range(CONNECTIONS):
        assert (await call(fresh, "GET", url + "?offset=-1"))[2] == b"doomed"

    status, _, body = await call(http, "POST", f"{workers_edge.admin_url}/purge?path={stream_path}")
    assert status == 200
    report = json.loads(body)
    assert report["durable"] is True
    assert [w["status"] for w in report["workers"]] == [200, 200]
    assert all(w["segments"] >= 1 for w in report["workers"]), report
    for _ in range(CONNECTIONS):
        assert (await call(fresh, "GET", url + "?offset=-1"))[0] == 404
    assert (await call(http, "POST", f"{workers_edge.admin_url}/purge"))[0] == 400


async def test_read_after_write_is_exact_on_every_worker(
    http: aiohttp.ClientSession, fresh: aiohttp.ClientSession, workers_edge: Edge, stream_path: str
) -> None:
    """A write through one worker is known to every worker before its answer: the next read,
    on any connection, sees it (not up to --tail-freshness later, as on another replica)."""
    url = workers_edge.url + stream_path
    await create(http, url, b"a")
    written = b"a"
    for part in (b"b", b"c", b"d"):
        # Every worker now holds the tail as fresh as can be...
        for _ in range(CONNECTIONS // 2):
            assert (await call(fresh, "GET", url + "?offset=-1"))[2] == written
        # ...and a write through whichever worker this connection reaches reaches them all.
        status, _, _ = await call(
            fresh, "POST", url, headers={"Content-Type": "text/plain"}, data=part
        )
        assert status == 204
        written += part
        for _ in range(CONNECTIONS // 2):
            assert (await call(fresh, "GET", url + "?offset=-1"))[2] == written
    # A DELETE through one worker: no worker serves the stream after its answer.
    assert (await call(fresh, "DELETE", url))[0] == 204
    for _ in range(CONNECTIONS // 2):
        assert (await call(fresh, "GET", url + "?offset=-1"))[0] == 404


async def test_purge_keeps_its_token_with_workers(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path
) -> None:
    edge = start_edge(
        origin.url, logs_dir, "--workers", "2", "--purge-token", "s3cret", name="edge-w-token"
    )
    try:
        url = edge.admin_url + "/purge?path=/v1/stream/x"
        async with http.post(url, headers={"Authorization": "Bearer wrong"}) as response:
            assert response.status == 401
        async with http.post(url, headers={"Authorization": "Bearer s3cret"}) as response:
            assert response.status == 200
        # The workers' own admin listeners do not take the operator's token: only the
        # supervisor's private one, so a local user cannot go around the supervisor's check.
        _, report = await readiness(http, edge)
        worker_url = report["per_worker"][0]["admin"] + "/purge?path=/v1/stream/x"
        for headers in ({}, {"Authorization": "Bearer s3cret"}):
            async with http.post(worker_url, headers=headers) as response:
                assert response.status == 401
    finally:
        edge.stop()


def test_a_port_another_edge_serves_is_refused(origin: Origin, logs_dir: Path) -> None:
    """SO_REUSEPORT would let a second edge of the same user share the port silently."""
    first = start_edge(origin.url, logs_dir, "--workers", "2", name="edge-w-first")
    try:
        port = first.url.rsplit(":", 1)[1]
        result = subprocess.run(
            [
                *first.process.proc.args[:3],  # type: ignore[index]
                "serve",
                "--origin",
                origin.url,
                "--listen",
                f"127.0.0.1:{port}",
                "--admin-listen",
                "127.0.0.1:0",
                "--workers",
                "2",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("EDGE_")},
                "PYTHONPATH": str(REPO),
            },
        )
        assert result.returncode == 2
        assert result.stderr == f"edge: error: --listen 127.0.0.1:{port}: address already in use\n"
    finally:
        first.stop()


async def test_workers_exit_when_their_supervisor_is_killed(
    http: aiohttp.ClientSession, workers_edge: Edge
) -> None:
    """SIGKILL leaves no orphan serving the port: each worker's pipe from the supervisor closes
    and the worker exits at once (a restarted edge would otherwise share the port with it)."""
    _, report = await readiness(http, workers_edge)
    pids = [worker["pid"] for worker in report["per_worker"]]
    workers_edge.process.kill()
    deadline = time.monotonic() + 10
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        for pid in list(alive):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                alive.discard(pid)
        await asyncio.sleep(0.1)
    assert not alive, f"workers {alive} outlived their supervisor"
    with pytest.raises(aiohttp.ClientError):
        await call(http, "GET", workers_edge.url + "/v1/stream/anything?offset=-1")


async def test_every_worker_answers_stored_hits_and_the_edge_counts_them_once(
    http: aiohttp.ClientSession, fresh: aiohttp.ClientSession, workers_edge: Edge, stream_path: str
) -> None:
    url = workers_edge.url + stream_path
    await create(http, url, b"stored " * 50, close=True)
    answers = []
    for _ in range(4):  # each worker learns the lifetime, then stores the answer
        for _ in range(CONNECTIONS):
            status, headers, body = await call(fresh, "GET", url + "?offset=-1")
            assert (status, body) == (200, b"stored " * 50)
            answers.append({n: v for n, v in headers if n != "Date"})
    stable = answers[-CONNECTIONS:]
    assert all(answer == stable[0] for answer in stable)  # whichever worker answered
    each = await per_worker_metric(http, workers_edge, "edge_fast_path_answers_total")
    assert len(each) == 2
    assert all(value > 0 for value in each), each
    total = metric_value(workers_edge.metrics_text(), "edge_fast_path_answers_total")
    assert total == sum(await per_worker_metric(http, workers_edge, "edge_fast_path_answers_total"))


# Inside the first segment of b"deleted bytes": no worker holds a segment starting here, so a
# read at it is a cache fill whichever worker takes it.
MID_OFFSET = "0000000000000000_0000000000000002"


@pytest.mark.parametrize("change", ["deleted", "recreated-as-json"])
async def test_an_instance_change_one_worker_fills_reaches_every_worker(
    http: aiohttp.ClientSession,
    fresh: aiohttp.ClientSession,
    origin: Origin,
    workers_edge: Edge,
    stream_path: str,
    change: str,
) -> None:
    """A 404 (or a content type no longer the stream's) seen by one worker's fill is known to
    every worker before that fill's answer: no worker serves the old stream afterwards."""
    url = workers_edge.url + stream_path
    await create(http, url, b"deleted bytes", close=True)
    for _ in range(CONNECTIONS):
        assert (await call(fresh, "GET", url + "?offset=-1"))[2] == b"deleted bytes"
    held = await per_worker_metric(http, workers_edge, "edge_cache_segments")
    assert all(segments >= 1 for segments in held), held  # closed: served from cache for good

    # Behind the edge's back, at the origin itself.
    assert (await call(http, "DELETE", origin.url + stream_path))[0] == 204
    if change == "deleted":
        expected: tuple[int, bytes] = (404, b"")
    else:
        json_type = {"Content-Type": "application/json"}
        assert (await call(http, "PUT", origin.url + stream_path, headers=json_type))[0] == 201
        data = b'[1, 2, 3, "a new stream"]'
        assert (await call(http, "POST", origin.url + stream_path, headers=json_type, data=data))[
            0
        ] == 204
        expected = (200, b'[1,2,3,"a new stream"]')

    # One fill, on whichever worker this connection reaches, learns of it...
    status, _, body = await call(fresh, "GET", f"{url}?offset={MID_OFFSET}")
    assert b"bytes" not in body
    assert status in (404, 200, 400), status
    # ...and no worker serves the old stream afterwards, on any connection.
    served = []
    for _ in range(24):
        status, _, body = await call(fresh, "GET", url + "?offset=-1")
        served.append((status, body if status == 200 else b""))
    assert b"deleted bytes" not in {body for _, body in served}, served
    assert [status for status, _ in served] == [expected[0]] * 24, served
    if change != "deleted":
        assert all(json.loads(body) == json.loads(expected[1]) for _, body in served)


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def _threads(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next(int(line.split()[1]) for line in status.splitlines() if line[:8] == "Threads:")


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports ``pid`` listens on (its sockets in state LISTEN, from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


async def _until(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.005)


async def test_a_restarted_worker_takes_no_connection_before_its_siblings_can_reach_it(
    http: aiohttp.ClientSession, fresh: aiohttp.ClientSession, workers_edge: Edge, stream_path: str
) -> None:
    """A restarted worker listens on the stream port only once the supervisor has its admin URL
    (so writes its siblings relay reach it); frozen supervisors are the slow case made wide."""
    url = workers_edge.url + stream_path
    port = int(workers_edge.url.rsplit(":", 1)[1])
    await create(http, url, b"old bytes", close=True)
    _, report = await readiness(http, workers_edge)
    before = {worker["pid"] for worker in report["per_worker"]}
    supervisor = workers_edge.process.pid
    os.kill(report["per_worker"][0]["pid"], signal.SIGKILL)

    def started() -> set[int]:
        # Its bootstrap read (the orphan watch is its second thread): it needs the supervisor
        # for nothing else to start.
        return {pid for pid in _children(supervisor) - before if _threads(pid) >= 2}

    await _until(started, 15, "the killed worker was not restarted")
    (restarted,) = started()
    os.kill(supervisor, signal.SIGSTOP)
    try:
        # The worker goes as far as it can on its own: its admin listener (its stdout line to
        # the supervisor waits in the pipe), but not the stream port.
        await _until(lambda: _listening_ports(restarted), 20, "the worker never listened")
        for _ in range(20):
            assert port not in _listening_ports(restarted), "listening before the supervisor knew"
            await asyncio.sleep(0.025)
    finally:
        os.kill(supervisor, signal.SIGCONT)

    await _until(lambda: port in _listening_ports(restarted), 15, "the worker never took the port")
    # At once: the new worker holds the stream (some of these reach it), then a write relayed
    # by whichever worker takes it reaches the other.
    for _ in range(CONNECTIONS):
        assert (await call(fresh, "GET", url + "?offset=-1"))[2] == b"old bytes"
    assert (await call(fresh, "DELETE", url))[0] == 204
    for _ in range(CONNECTIONS):
        assert (await call(fresh, "GET", url + "?offset=-1"))[0] == 404
    _, after = await readiness(http, workers_edge)
    assert after["workers_up"] == 2
    assert restarted in {worker["pid"] for worker in after["per_worker"]}
