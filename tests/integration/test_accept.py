"""Issue 29, "accept what is waiting", against real processes on loopback: while the edge's event
loop is kept busy by clients pipelining reads, a herd of newcomers arriving at once is accepted
and answered, taken from the kernel's queue several a pass (libuv took one a pass, and a busy
edge left hundreds waiting there). No timed assertion: counts only."""

from __future__ import annotations

import asyncio
import json
import re
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin, start_edge
from tests.integration.test_bounds import host_port
from tests.integration.test_fast_path import make_stream, request, warm

# Keeps the edge's loop busy: CONNECTIONS keep-alive connections to HOST:PORT, each sending
# BURST pipelined GETs of TARGET, and the next BURST once they are all answered (so a pass of the
# edge's loop answers a bounded number). One JSON line once every connection has been answered,
# one with the count of answers when its stdin closes.
BUSY = r"""
import json, selectors, socket, sys, threading
host, port, count, size, target = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
burst = (f"GET {target} HTTP/1.1\r\nHost: edge.test\r\n\r\n" * size).encode()
selector = selectors.DefaultSelector()
answered, heard, carry, owed = 0, set(), {}, {}
for i in range(count):
    sock = socket.create_connection((host, port))
    selector.register(sock, selectors.EVENT_READ, i)
    sock.sendall(burst)
    carry[i], owed[i] = b"", size
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
while not done.is_set():
    for key, _ in selector.select(0.2):
        sock, i = key.fileobj, key.data
        data = sock.recv(1 << 18)
        if not data:
            raise SystemExit(f"connection {i} closed by the edge")
        seen = carry[i] + data
        got = seen.count(b"HTTP/1.1 200 ")
        answered += got
        owed[i] -= got
        carry[i] = seen[-12:]
        if owed[i] == 0:
            sock.sendall(burst)
            owed[i] = size
        if i not in heard:
            heard.add(i)
            if len(heard) == count:
                print(json.dumps({"busy": True}), flush=True)
print(json.dumps({"answered": answered}), flush=True)
"""

BUSY_CONNECTIONS = 16
BUSY_BURST = 32
NEWCOMERS = 300
ANSWER_LIMIT_SECONDS = 60.0  # a bound for a hang, not a measure: answers come in seconds


@pytest.fixture
def own_edge(origin: Origin, logs_dir: Path) -> Iterator[Edge]:
    started = start_edge(origin.url, logs_dir, name="edge-accept")
    yield started
    started.stop()


def newcomers_answered(address: tuple[str, int], target: str, count: int) -> list[bytes]:
    """``count`` connections opened at once, each asking ``target`` once (Connection: close):
    what each got back, read until the edge closes it."""
    selector = selectors.DefaultSelector()
    asked = request(target, "Connection: close")
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(address)
        selector.register(sock, selectors.EVENT_WRITE, bytearray())
    answers: list[bytes] = []
    deadline = time.monotonic() + ANSWER_LIMIT_SECONDS
    while len(answers) < count and time.monotonic() < deadline:
        for key, events in selector.select(1.0):
            sock, got = key.fileobj, key.data
            assert isinstance(sock, socket.socket)
            if events & selectors.EVENT_WRITE:
                sock.send(asked)  # a few hundred bytes: the buffer takes them whole
                selector.modify(sock, selectors.EVENT_READ, got)
                continue
            try:
                data = sock.recv(65536)
            except ConnectionError:
                data = b""
            if data:
                got += data
                continue
            selector.unregister(sock)
            sock.close()
            answers.append(bytes(got))
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    return answers


def histogram(text: str, name: str) -> dict[str, float]:
    """``name``'s buckets (by ``le``), ``count`` and ``sum``, from a metrics page."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = re.search(r'le="([^"]+)"', line)
            assert le is not None
            found[le.group(1)] = float(line.rsplit(" ", 1)[1])
        elif line.startswith((name + "_count ", name + "_sum ")):
            sample, value = line.rsplit(" ", 1)
            found[sample.removeprefix(name + "_")] = float(value)
    return found


def herd_while_busy(edge: Edge, target: str) -> tuple[list[bytes], int, dict[str, float]]:
    """NEWCOMERS' answers to ``target`` while busy clients keep the edge busy, how many answers
    the busy clients had meanwhile, and ``edge_accepts_per_pass`` over the run."""
    address = host_port(edge.url)
    # Read before and after the busy clients: a metrics page read in between would wait on the
    # busy worker like any newcomer (the supervisor folds each worker's counts in).
    before = histogram(edge.metrics_text(), "edge_accepts_per_pass")
    busy = subprocess.Popen(
        [sys.executable, "-c", BUSY, address[0], str(address[1]),
         str(BUSY_CONNECTIONS), str(BUSY_BURST), target],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert busy.stdout is not None
        assert json.loads(busy.stdout.readline()) == {"busy": True}
        answers = newcomers_answered(address, target, NEWCOMERS)
        assert busy.poll() is None, "the busy clients stopped before the newcomers were answered"
    finally:
        stdout, _ = busy.communicate("", timeout=30)
    after = histogram(edge.metrics_text(), "edge_accepts_per_pass")
    assert "count" in after, "no edge_accepts_per_pass on the metrics page"
    over_the_run = {key: value - before.get(key, 0) for key, value in after.items()}
    return answers, json.loads(stdout.strip().splitlines()[-1])["answered"], over_the_run


async def test_a_busy_edge_takes_a_herd_of_newcomers_several_a_pass(
    http: aiohttp.ClientSession, origin: Origin, own_edge: Edge, stream_path: str
) -> None:
    edge = own_edge
    body = b"accept what is waiting " * 4
    await make_stream(http, origin.url + stream_path, "text/plain", body, close=True)
    target = f"{stream_path}?offset=-1"
    await warm(edge.url, target)  # a stored hit from here on: the busy clients' reads are cheap
    answers, busy_answered, accepts = await asyncio.to_thread(herd_while_busy, edge, target)
    # Every newcomer accepted and answered, whole.
    assert len(answers) == NEWCOMERS
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
        assert answer.endswith(b"\r\n\r\n" + body)
    # The busy clients were answered all along (the edge was busy, not stuck).
    assert busy_answered > 0
    # Taken several a pass. One a pass, as libuv does, makes as many passes as connections; the
    # busy clients' own connections, even all in one pass, could save BUSY_CONNECTIONS - 1 of
    # them: more saved than that is the newcomers taken several a pass.
    passes, accepted = accepts["count"], accepts["sum"]
    assert accepted == NEWCOMERS + BUSY_CONNECTIONS, accepts
    assert accepted - passes >= BUSY_CONNECTIONS, accepts
    assert accepts["1.0"] < passes, accepts  # some pass took more than one
