"""Connection bounds on the stream listener, against real processes on loopback: the request-head
deadline, the keep-alive timeout, the cap with eviction and 503, a flood of 20,000 idle and
half-sent connections, and the admin listener's /readyz and /purge hygiene."""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from devstack.processes import Edge, Origin, start_edge
from edge.config import Address, Settings
from edge.lifecycle import StreamLifecycle
from edge.metrics import Metrics
from edge.web.admin import ReadinessProbe, add_admin_routes
from edge.web.bounded_site import BoundedSite
from edge.web.connection_table import Limits, Phase
from edge.web.connection_tracker import ConnectionTracker
from edge.web.descriptors import budget

HALF_SENT = b"GET /x HTTP/1.1\r\nHo"

# A process that opens COUNT connections to HOST:PORT from its own source address (so the test
# process's descriptors and the ephemeral ports of 127.0.0.1 are untouched), every other one
# sending half a request head, prints one JSON line when all attempts are made, and holds the
# sockets until its stdin closes.
FLOOD = r"""
import json, os, selectors, socket, sys, time
host, port, count, source = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
selector = selectors.DefaultSelector()
held, connected, failed, in_flight, started = [], 0, 0, 0, time.monotonic()
def settle(timeout):
    global connected, failed, in_flight
    for key, _ in selector.select(timeout):
        sock, half = key.fileobj, key.data
        selector.unregister(sock)
        in_flight -= 1
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            failed += 1
            sock.close()
            continue
        connected += 1
        if half:
            try:
                sock.send(b"GET /x HTTP/1.1\r\nHo")
            except OSError:
                pass
        held.append(sock)
for i in range(count):
    while in_flight >= 512:
        settle(1.0)
    sock = socket.socket()
    sock.setblocking(False)
    sock.bind((source, 0))
    sock.connect_ex((host, port))
    selector.register(sock, selectors.EVENT_WRITE, i % 2 == 1)
    in_flight += 1
    settle(0)
deadline = time.monotonic() + 20
while in_flight and time.monotonic() < deadline:
    settle(1.0)
print(json.dumps({"connected": connected, "failed": failed + in_flight,
                  "seconds": round(time.monotonic() - started, 2)}), flush=True)
sys.stdin.read()
"""


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    return parts.hostname, parts.port


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def get(url: str, *, method: str = "GET", timeout: float = 10, **headers: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def create_stream(edge: Edge, path: str, body: bytes) -> str:
    """Creates a text stream holding ``body``; returns its tail offset."""
    request = urllib.request.Request(
        edge.url + path, method="PUT", data=body, headers={"Content-Type": "text/plain"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201
        return str(response.headers["Stream-Next-Offset"])


def seconds_until_closed(sock: socket.socket, limit: float) -> float:
    """Reads (and discards) until the peer closes; how long that took from now."""
    started = time.monotonic()
    sock.settimeout(limit)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return float("inf")
    return time.monotonic() - started


def read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """One HTTP/1.1 response with a Content-Length: (head, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response head: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return head, body


def is_open(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return True
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except ConnectionResetError:
        return False


@pytest.fixture
def bounded_edge(origin: Origin, logs_dir: Path, request: pytest.FixtureRequest) -> Iterator[Edge]:
    """An edge of its own, started with the flags the test passes as its (indirect) parameter."""
    args: list[str] = request.param
    started = start_edge(origin.url, logs_dir, *args, name=f"edge-{request.node.name}")
    yield started
    started.stop()


# -- the aiohttp contract BoundedSite relies on -----------------------------------------------


async def test_bounded_site_serves_tracks_and_stops_like_an_aiohttp_site() -> None:
    """Pins what BoundedSite takes from aiohttp: BaseSite's ``_server`` (runner.addresses reads
    it, BaseSite.stop closes it) and that ``request.transport`` is the transport the protocol
    factory's connection was given (the request hook keys on it)."""

    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application()
    tracker = ConnectionTracker(
        Limits(header_timeout_seconds=5, keepalive_timeout_seconds=5, max_connections=10)
    )
    app.middlewares.insert(0, tracker.middleware)
    app.router.add_get("/", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = BoundedSite(runner, "127.0.0.1", 0, tracker, backlog=16)
    await site.start()
    try:
        (address,) = runner.addresses
        port = address[1]
        assert port != 0
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        assert await reader.readexactly(5) == b"hello"
        assert tracker.open == 1
        (transport,) = tracker.table._phase  # the one connection, after its request: idle
        assert tracker.table.phase(transport) is Phase.IDLE
        writer.close()
        await writer.wait_closed()
        for _ in range(50):
            if tracker.open == 0:
                break
            await asyncio.sleep(0.02)
        assert tracker.open == 0
    finally:
        await runner.cleanup()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


# -- deadlines --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bounded_edge",
    [["--header-timeout", "1", "--keepalive-timeout", "2", "--long-poll-timeout", "3"]],
    indirect=True,
)
def test_header_deadline_and_keepalive_timeout(bounded_edge: Edge, stream_path: str) -> None:
    edge = bounded_edge
    address = host_port(edge.url)
    tail = create_stream(edge, stream_path, b"hello")

    def idle() -> float:
        with socket.create_connection(address) as sock:
            return seconds_until_closed(sock, 10)

    def half_sent() -> float:
        with socket.create_connection(address) as sock:
            sock.sendall(HALF_SENT)
            return seconds_until_closed(sock, 10)

    def trickle() -> float:
        """A byte every 0.3 s: the deadline counts from the first one, not the last."""
        with socket.create_connection(address) as sock:
            started = time.monotonic()
            sock.settimeout(0.3)
            for byte in HALF_SENT:
                try:
                    sock.sendall(bytes([byte]))
                    if sock.recv(1) == b"":
                        return time.monotonic() - started
                except TimeoutError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    return time.monotonic() - started
            return float("inf")

    def keepalive() -> tuple[float, float]:
        """Served twice on one connection (the second request 1.2 s after the first, past the
        header timeout), then closed once idle for the keep-alive timeout."""
        request = f"GET {stream_path}?offset=-1 HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        with socket.create_connection(address) as sock:
            sock.settimeout(10)
            sock.sendall(request)
            assert read_response(sock)[1] == b"hello"
            time.sleep(1.2)
            sock.sendall(request)
            assert read_response(sock)[1] == b"hello"
            started = time.monotonic()
            closed_after = seconds_until_closed(sock, 10)
        return closed_after, started

    def long_poll() -> tuple[bytes, float]:
        """A request in progress outlives both timeouts."""
        with socket.create_connection(address) as sock:
            sock.settimeout(10)
            started = time.monotonic()
            query = f"offset={tail}&live=long-poll"
            sock.sendall(f"GET {stream_path}?{query} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(65536)
                assert chunk, "the long-poll was cut"
                data += chunk
            return data.split(b"\r\n", 1)[0], time.monotonic() - started

    with ThreadPoolExecutor(max_workers=5) as pool:
        timers = [pool.submit(check) for check in (idle, half_sent, trickle)]
        kept = pool.submit(keepalive)
        polled = pool.submit(long_poll)
        for timer in timers:
            assert 0.8 <= timer.result() <= 2.5
        closed_after, _ = kept.result()
        assert 1.8 <= closed_after <= 3.5
        status_line, waited = polled.result()
        assert status_line == b"HTTP/1.1 204 No Content"
        assert waited >= 2.8


# -- the cap ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bounded_edge",
    # One process: the cap is one connection table's (with workers, each has its own share of
    # the cap and the kernel picks which worker a connection reaches). --max-connections 20:
    # 12 live readers, 8 kept for short requests, 4 heads read past the cap.
    [
        [
            "--workers",
            "1",
            "--max-connections",
            "20",
            "--header-timeout",
            "30",
            "--long-poll-timeout",
            "8",
        ]
    ],
    indirect=True,
)
def test_at_the_cap_the_longest_idle_makes_room_and_when_all_are_busy_503(
    bounded_edge: Edge, stream_path: str
) -> None:
    edge = bounded_edge
    address = host_port(edge.url)
    tail = create_stream(edge, stream_path, b"hello")
    uploads_path = stream_path + "-uploads"
    create_stream(edge, uploads_path, b"")

    def kept_alive() -> socket.socket:
        """A connection that was answered and stays open between requests."""
        sock = socket.create_connection(address)
        sock.settimeout(5)
        sock.sendall(f"GET {stream_path}?offset=-1 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert read_response(sock)[1] == b"hello"
        return sock

    # A normal reader at the cap: served; the keep-alive connection idle the longest made room.
    oldest = kept_alive()
    time.sleep(0.2)
    idle = [kept_alive() for _ in range(19)]
    time.sleep(0.2)
    assert get(f"{edge.url}{stream_path}?offset=-1") == (200, b"hello")
    assert wait_until(lambda: not is_open(oldest), 5)
    assert all(is_open(sock) for sock in idle[1:])
    for sock in [oldest, *idle]:
        sock.close()
    time.sleep(0.3)

    # Silent connections (no head yet) are let in past the cap until its heads are full too;
    # then a newcomer evicts the oldest of them.
    silent = [socket.create_connection(address) for _ in range(24)]
    time.sleep(0.3)
    assert get(f"{edge.url}{stream_path}?offset=-1") == (200, b"hello")
    assert wait_until(lambda: not is_open(silent[0]), 5)
    assert all(is_open(sock) for sock in silent[1:])
    for sock in silent:
        sock.close()
    time.sleep(0.3)

    def long_poll() -> socket.socket:
        sock = socket.create_connection(address)
        query = f"offset={tail}&live=long-poll"
        sock.sendall(f"GET {stream_path}?{query} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        return sock

    def slow_upload() -> socket.socket:
        """A write whose body trickles: busy for as long as the test wants."""
        sock = socket.create_connection(address)
        head = f"POST {uploads_path} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
        sock.sendall(f"{head}Content-Length: 1000\r\n\r\nabc".encode())
        return sock

    # Every connection under the cap busy: the live readers at their cap, the rest writes.
    polls = [long_poll() for _ in range(12)]
    uploads = [slow_upload() for _ in range(8)]
    time.sleep(0.5)
    # A short request is still read and served, past the cap; a live reader is not.
    assert get(f"{edge.url}{stream_path}?offset=-1") == (200, b"hello")
    with long_poll() as refused:
        refused.settimeout(5)
        head, body = read_response(refused)
        assert head.startswith(b"HTTP/1.1 503")
        assert b"Retry-After: 5" in head.split(b"\r\n")
        assert body == b"edge is at --max-viewers\n"
        assert seconds_until_closed(refused, 5) < 2
    # Every head past the cap held too: a newcomer gets a plain 503 and is closed.
    uploads += [slow_upload() for _ in range(4)]
    time.sleep(0.5)
    with socket.create_connection(address) as newcomer:
        newcomer.settimeout(5)
        newcomer.sendall(f"GET {stream_path}?offset=-1 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head, body = read_response(newcomer)
        lines = head.split(b"\r\n")
        assert lines[0] == b"HTTP/1.1 503 Service Unavailable"
        assert b"Retry-After: 1" in lines
        assert b"Connection: close" in lines
        assert b"--max-connections" in body
        assert seconds_until_closed(newcomer, 5) < 2
    assert get(edge.admin_url + "/healthz")[0] == 200
    for sock in polls:
        sock.settimeout(10)
        assert sock.recv(100).startswith(b"HTTP/1.1 204")  # never cut
        sock.close()
    for sock in uploads:
        sock.close()
    log = edge.process.log.read_text()
    assert "at --max-connections (20): evicting" in log
    assert "at --max-connections (20): every connection is busy" in log
    assert "at its live-reader cap (12 viewers, --max-viewers)" in log
    text = edge.metrics_text()
    assert metric_value(text, "edge_refusals_total", kind="long_poll", reason="viewers") == 1
    assert metric_value(text, "edge_refusals_total", kind="catchup", reason="connections") == 1
    assert metric_value(text, "edge_refusals_total", kind="write") == 0


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
            if all(found.get(k) == v for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


# -- the flood --------------------------------------------------------------------------------

FLOOD_CONNECTIONS = 20_000
FLOOD_CAP = 2000


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "bounded_edge",
    # One process, as above: what is counted against FLOOD_CAP is one connection table.
    [["--workers", "1", "--header-timeout", "1", "--max-connections", str(FLOOD_CAP)]],
    indirect=True,
)
def test_a_flood_of_idle_and_half_sent_connections_leaves_the_edge_serving(
    bounded_edge: Edge, stream_path: str
) -> None:
    """20,000 connection attempts, half idle and half with half a request head, from two helper
    processes: the admin listener answers, a catch-up reader gets its exact bytes, the edge never
    holds more than its cap, and its descriptors fall back after the header timeout."""
    edge = bounded_edge
    host, port = host_port(edge.url)
    body = b"".join(b"line %06d\n" % i for i in range(20_000))  # 220 KB
    create_stream(edge, stream_path, body)
    assert get(f"{edge.url}{stream_path}?offset=-1") == (200, body)
    baseline = open_fds(edge.process.pid)

    helpers = [
        subprocess.Popen(
            [sys.executable, "-c", FLOOD, host, str(port), str(FLOOD_CONNECTIONS // 2), source],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for source in ("127.0.0.2", "127.0.0.3")
    ]
    peak = baseline
    stop_sampling = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop_sampling.is_set():
            peak = max(peak, open_fds(edge.process.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        served = 0
        while any(helper.poll() is None and not _reported(helper) for helper in helpers):
            assert get(edge.admin_url + "/healthz", timeout=10) == (200, b"ok\n")
            assert get(f"{edge.url}{stream_path}?offset=-1", timeout=20) == (200, body)
            served += 1
        reports = [json.loads(_reported(helper) or "{}") for helper in helpers]
        assert sum(report["connected"] for report in reports) >= FLOOD_CONNECTIONS * 0.95, reports
        assert served >= 1
        # Held open by the helpers, closed by the edge: its descriptors fall back.
        assert wait_until(lambda: open_fds(edge.process.pid) <= baseline + 10, 10), (
            open_fds(edge.process.pid),
            baseline,
        )
    finally:
        stop_sampling.set()
        sampler.join()
        for helper in helpers:
            assert helper.stdin is not None
            helper.stdin.close()
            try:
                helper.wait(10)
            except subprocess.TimeoutExpired:
                helper.kill()
                helper.wait()
            assert helper.stdout is not None
            helper.stdout.close()
    # The cap, the heads read past it, and a few descriptors of the edge's own.
    assert peak <= baseline + FLOOD_CAP + budget(0, max_connections=FLOOD_CAP).at_cap + 50, (
        peak,
        baseline,
    )
    assert "at --max-connections (2000): evicting" in edge.process.log.read_text()
    assert get(edge.admin_url + "/healthz") == (200, b"ok\n")
    assert get(f"{edge.url}{stream_path}?offset=-1") == (200, body)


_reports: dict[int, str] = {}


def _reported(helper: subprocess.Popen[str]) -> str | None:
    """The helper's JSON line, once it has printed it (without blocking)."""
    if helper.pid in _reports:
        return _reports[helper.pid]
    assert helper.stdout is not None
    if select.select([helper.stdout], [], [], 0)[0]:
        _reports[helper.pid] = helper.stdout.readline()
        return _reports[helper.pid]
    return None


# -- the admin listener -----------------------------------------------------------------------


async def test_readyz_needs_a_2xx_or_3xx_from_the_origin(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path
) -> None:
    async def not_found(_: web.Request) -> web.Response:
        return web.Response(status=404)

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/healthz", health)
    app.router.add_route("*", "/{tail:.*}", not_found)
    async with TestServer(app, host="127.0.0.1") as answers_404:
        base = str(answers_404.make_url("")).rstrip("/")
        unready = start_edge(base, logs_dir, name="edge-origin-404")
        probing_health = start_edge(
            base, logs_dir, "--origin-health-path", "/healthz", name="edge-origin-health"
        )
        try:
            async with http.get(unready.admin_url + "/readyz") as response:
                report = await response.json()
                assert response.status == 503
                assert report["ready"] is False
                assert "404 to OPTIONS /" in report["origin"]
                assert "--origin-health-path" in report["origin"]
            async with http.get(probing_health.admin_url + "/readyz") as response:
                assert response.status == 200
                assert "200 to GET /healthz" in (await response.json())["origin"]
        finally:
            unready.stop()
            probing_health.stop()
    # The reference origin answers 404 to HEAD / but 204 to a CORS preflight: ready.
    reference = start_edge(origin.url, logs_dir, name="edge-reference-ready")
    try:
        async with http.get(reference.admin_url + "/readyz") as response:
            assert response.status == 200
            assert "204 to OPTIONS /" in (await response.json())["origin"]
    finally:
        reference.stop()


async def test_purge_needs_the_token_when_one_is_set(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path
) -> None:
    edge = start_edge(origin.url, logs_dir, "--purge-token", "s3cret", name="edge-purge-token")
    try:
        url = edge.admin_url + "/purge?path=/v1/stream/x"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            async with http.post(url, headers=headers) as response:
                assert response.status == 401
                assert response.headers["WWW-Authenticate"] == "Bearer"
        async with http.post(url, headers={"Authorization": "Bearer s3cret"}) as response:
            assert response.status == 200
            assert (await response.json())["purged"] == "/v1/stream/x"
        # "//x" would parse as a host and purge "/" while saying it worked: refused.
        async with http.post(
            edge.admin_url + "/purge?path=//v1/stream/x",
            headers={"Authorization": "Bearer s3cret"},
        ) as response:
            assert response.status == 400
    finally:
        edge.stop()


async def test_purge_is_refused_without_a_token_when_the_admin_listener_is_not_loopback() -> None:
    """The admin routes as configured for ``--admin-listen 0.0.0.0:9090`` (served here on
    loopback: the decision follows the setting, not the socket)."""
    settings = Settings(
        origin="http://127.0.0.1:9",
        listen=Address(host="127.0.0.1", port=0),
        admin_listen=Address(host="0.0.0.0", port=9090),
    )
    app = web.Application()
    # The refused path never reaches the cache.
    never_used = cast(StreamLifecycle, object())
    add_admin_routes(app, Metrics(), ReadinessProbe(settings), never_used, asyncio.Event())
    async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as http:
        async with http.post(server.make_url("/purge?path=/v1/stream/x")) as response:
            assert response.status == 403
            text = await response.text()
            assert "--admin-token" in text
            assert "EDGE_ADMIN_TOKEN" in text
        async with http.get(server.make_url("/healthz")) as response:
            assert response.status == 200


def test_an_unreachable_redis_is_reported_at_start_up(origin: Origin, logs_dir: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]  # nothing listens here once the socket is closed
    edge = start_edge(
        origin.url, logs_dir, "--redis-url", f"redis://127.0.0.1:{closed}/0", name="edge-no-redis"
    )
    try:
        assert get(edge.admin_url + "/healthz") == (200, b"ok\n")
        status, report = get(edge.admin_url + "/readyz")
        assert status == 200  # degraded, not unready
        assert json.loads(report)["ready"] is True
        warnings = [
            line for line in edge.process.log.read_text().splitlines() if "--redis-url" in line
        ]
        assert len(warnings) == 1, warnings
        assert "WARNING" in warnings[0]
        assert f"127.0.0.1:{closed} does not answer" in warnings[0]
    finally:
        edge.stop()
