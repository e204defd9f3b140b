"""A viewer flood never silences the run (issue 21), against the real origin and the real edge,
one worker and two: the edge full of SSE viewers at their cap still takes an append, an
idempotent producer append (what the watch page's Stop sends), a catch-up read and a HEAD; every
viewer gets the appended bytes; a viewer past the cap gets 503 with ``Retry-After`` and CORS,
and gets in on a retry once a viewer leaves.

The edges run with their defaults under a lowered open-file limit (so the cap is the one the
edge derives for itself, as in a real flood, and the test stays a few hundred connections), and
with a small ``--max-connections`` (the issue's reduced case)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest

from devstack.processes import Edge, Origin, start_edge

# The edge's open-file limit in the lowered cases: 153 viewers and 15 short requests a worker
# (edge.web.descriptors).
LOW_NOFILE = 256
# `python -c` that lowers the limit (soft and hard: the edge cannot raise it back) and runs
# `python -m edge` with the arguments after it; workers inherit the limit.
LOW_NOFILE_LAUNCHER = (
    "-c",
    "import resource, runpy; "
    f"resource.setrlimit(resource.RLIMIT_NOFILE, ({LOW_NOFILE}, {LOW_NOFILE})); "
    "runpy.run_module('edge', run_name='__main__', alter_sys=True)",
)
TEXT = {"Content-Type": "text/plain"}
# Refused viewers retry at once here (a real client waits Retry-After): each retry is a new
# connection, so with two workers the kernel picks a worker afresh.
MAX_ATTEMPTS = 3000


@dataclass
class Viewer:
    """One SSE viewer on a raw connection: its response head and every byte after it."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    head: bytes
    body: bytearray = field(default_factory=bytearray)
    task: asyncio.Task[None] | None = None

    @property
    def status(self) -> int:
        return int(self.head.split(b" ", 2)[1])

    def headers(self) -> dict[str, str]:
        lines = self.head.decode("latin-1").split("\r\n")[1:]
        return {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines if x)}

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionError):
            while chunk := await self.reader.read(65536):
                self.body += chunk

    def follow(self) -> None:
        self.task = asyncio.ensure_future(self._read())

    async def close(self) -> None:
        self.writer.close()
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


async def open_viewer(edge: Edge, path: str) -> Viewer:
    parts = urlsplit(edge.url)
    assert parts.hostname is not None
    assert parts.port is not None
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(f"GET {path}?offset=-1&live=sse HTTP/1.1\r\nHost: edge\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    viewer = Viewer(reader=reader, writer=writer, head=head[:-4])
    if viewer.status == 200:
        viewer.follow()
    return viewer


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith((name + "{", name + " ")):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def metrics(edge: Edge) -> str:
    return await asyncio.to_thread(edge.metrics_text)


@dataclass(frozen=True)
class Case:
    workers: int
    args: tuple[str, ...] = ()
    low_nofile: bool = True

    @property
    def name(self) -> str:
        how = f"nofile{LOW_NOFILE}" if self.low_nofile else "-".join(self.args).strip("-")
        return f"workers{self.workers}-{how}"


CASES = [
    Case(workers=1),
    Case(workers=2),
    # The reduced case: a small --max-connections, the viewer cap derived from it.
    Case(workers=2, args=("--max-connections", "100"), low_nofile=False),
]


@pytest.fixture(params=CASES, ids=[case.name for case in CASES])
def full_edge(
    request: pytest.FixtureRequest, origin: Origin, logs_dir: Path
) -> Iterator[tuple[Case, Edge]]:
    case: Case = request.param
    started = start_edge(
        origin.url,
        logs_dir,
        "--workers",
        str(case.workers),
        *case.args,
        name=f"edge-admission-{case.name}",
        launcher=LOW_NOFILE_LAUNCHER if case.low_nofile else ("-m", "edge"),
    )
    yield case, started
    started.stop()


@pytest.fixture
async def viewers() -> AsyncIterator[list[Viewer]]:
    held: list[Viewer] = []
    yield held
    await asyncio.gather(*(viewer.close() for viewer in held))


async def fill_to_the_cap(edge: Edge, path: str, cap: int, held: list[Viewer]) -> int:
    """Viewers until ``cap`` are in; returns how many were refused on the way (each refusal
    checked: 503, Retry-After, CORS, the connection closed after it)."""
    refused = 0
    for _ in range(MAX_ATTEMPTS):
        if len(held) == cap:
            return refused
        viewer = await open_viewer(edge, path)
        if viewer.status == 200:
            held.append(viewer)
            continue
        refused += 1
        assert_refused(viewer)
        await viewer.close()
    raise AssertionError(f"only {len(held)} of {cap} viewers got in")


def assert_refused(viewer: Viewer) -> None:
    headers = viewer.headers()
    assert viewer.status == 503, viewer.head
    assert headers["retry-after"] == "5"
    assert headers["access-control-allow-origin"] == "*"  # a browser EventSource can read it
    assert headers["connection"] == "close"


async def until(predicate: object, seconds: float) -> bool:
    assert callable(predicate)
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.1)
    return bool(await predicate())


async def test_a_viewer_flood_never_silences_the_run(
    full_edge: tuple[Case, Edge],
    viewers: list[Viewer],
    http: aiohttp.ClientSession,
    stream_path: str,
) -> None:
    case, edge = full_edge
    url = edge.url + stream_path
    async with http.put(url, headers=TEXT) as created:
        assert created.status == 201

    text = await metrics(edge)
    cap = int(metric(text, "edge_live_readers_limit"))
    if case.low_nofile:
        assert cap == 153 * case.workers  # what edge.web.descriptors derives from 256
        line = f"stream listener holds {cap} viewers (SSE and long-poll)"
        assert line in edge.process.log.read_text()
        assert f"limited by the open-file limit {LOW_NOFILE}" in edge.process.log.read_text()
    else:
        assert cap == (50 - 8) * case.workers  # --max-connections 100: 50 a worker, 8 kept

    refused_filling = await fill_to_the_cap(edge, stream_path, cap, viewers)
    assert await until(lambda: _live_readers_are(edge, cap), 10), (
        "the edge does not count its viewers"
    )

    # Past the cap, on any worker: refused with what a browser can read; long-polls are live
    # readers too.
    late = await open_viewer(edge, stream_path)
    assert_refused(late)
    await late.close()
    async with http.head(url) as head:
        tail = head.headers["Stream-Next-Offset"]
    async with http.get(url, params={"offset": tail, "live": "long-poll"}) as polled:
        assert polled.status == 503
        assert polled.headers["Retry-After"] == "5"

    # The writers, the Stop button and readers of the run are served.
    async with http.post(url, data=b"append-one", headers=TEXT) as appended:
        assert appended.status in (200, 204), await appended.text()
    producer = {**TEXT, "Producer-Id": "stop-button", "Producer-Epoch": "0", "Producer-Seq": "0"}
    async with http.post(url, data=b"producer-two", headers=producer) as stopped:
        assert stopped.status in (200, 204), await stopped.text()
    async with http.get(url + "?offset=-1") as caught_up:
        assert caught_up.status == 200
        assert await caught_up.read() == b"append-oneproducer-two"
    async with http.head(url) as head:
        assert head.status == 200
        assert head.headers["Stream-Next-Offset"]

    # Every viewer at the cap gets the appended bytes.
    async def everyone_has_both() -> bool:
        return all(b"append-one" in v.body and b"producer-two" in v.body for v in viewers)

    assert await until(everyone_has_both, 20), sum(
        1 for v in viewers if b"producer-two" not in v.body
    )

    text = await metrics(edge)
    assert metric(text, "edge_refusals_total", kind="sse", reason="viewers") == 1 + refused_filling
    assert metric(text, "edge_refusals_total", kind="long_poll", reason="viewers") == 1
    assert metric(text, "edge_refusals_total", kind="write") == 0
    assert metric(text, "edge_client_connections_closed_total", reason="evicted") == 0

    # A viewer leaves: a retry gets in (with two workers, once it reaches the one with room).
    await viewers.pop().close()
    for _ in range(200):
        retry = await open_viewer(edge, stream_path)
        if retry.status == 200:
            viewers.append(retry)
            break
        assert_refused(retry)
        await retry.close()
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("no retry got in after a viewer left")
    assert await until(lambda: _has(viewers[-1], b"producer-two"), 10)


async def _live_readers_are(edge: Edge, count: int) -> bool:
    return metric(await metrics(edge), "edge_live_readers") == count


async def _has(viewer: Viewer, data: bytes) -> bool:
    return data in viewer.body
