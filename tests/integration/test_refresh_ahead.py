"""Refresh-ahead against the real origin: a tail read steadily is never let lapse.

An at-tail answer of an open stream is given from the edge while its tail was observed within
``--tail-freshness``; a read in the last tenth of that window starts one background refill
(``edge.refresh_ahead``). So a reader that reads the tail over several windows is answered from
the edge every time after its first read (``Cache-Status: edge; hit``: never a fill it waits
on), the origin sees one read per window and never two at once, and bytes appended at the
origin reach every read that starts a window after they were appended (the tail is observed as
of when the edge's request left, so that bound is exact, not a matter of speed).

The origin is the reference origin behind a small counting relay in this test's process, so the
test counts what the edge asked of it (and how many at once). Both paths: the hit path
(``--workers 1``: one process's stored answers) and the full path (``--fast-path off``). And a
fill's answer is capped by the reader's own prefix (``--max-response-bytes``), whoever led it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from devstack.processes import Edge, Origin, start_edge
from tests.integration.test_passthrough import call, metric_value

# Long enough that the last tenth (0.3 s) holds a loopback refill on a busy two-core machine.
FRESHNESS_SECONDS = 3.0
READING_SECONDS = 7.5  # two and a half windows
READ_EVERY_SECONDS = 0.03  # ten reads in the last tenth of a window
APPEND_AT_SECONDS = 4.0
BODY = b"x" * 2048

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


@dataclass
class CountingRelay:
    """The origin, as the edge sees it: every request relayed, the stream reads counted."""

    origin: str
    url: str = ""
    reads: Counter[str] = field(default_factory=Counter)
    in_flight: Counter[str] = field(default_factory=Counter)
    most_at_once: Counter[str] = field(default_factory=Counter)


def relay_app(relay: CountingRelay, session: aiohttp.ClientSession) -> web.Application:
    async def forward(request: web.Request) -> web.StreamResponse:
        read = request.method == "GET" and "offset" in request.query
        if read:
            relay.reads[request.path] += 1
            relay.in_flight[request.path] += 1
            most = max(relay.most_at_once[request.path], relay.in_flight[request.path])
            relay.most_at_once[request.path] = most
        headers = [(n, v) for n, v in request.headers.items() if n.lower() not in HOP_BY_HOP]
        headers = [(n, v) for n, v in headers if n.lower() != "host"]
        try:
            async with session.request(
                request.method, relay.origin + request.path_qs, headers=headers,
                data=await request.read() if request.can_read_body else None,
            ) as upstream:  # fmt: skip
                body = await upstream.read()
                answered = [
                    (n, v) for n, v in upstream.headers.items() if n.lower() not in HOP_BY_HOP
                ]
                return web.Response(status=upstream.status, headers=answered, body=body)
        finally:
            if read:
                relay.in_flight[request.path] -= 1

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


@pytest.fixture
async def relay(origin: Origin) -> AsyncIterator[CountingRelay]:
    counting = CountingRelay(origin=origin.url)
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        runner = web.AppRunner(relay_app(counting, session))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        counting.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        yield counting
        await runner.cleanup()


PATHS = {
    "hit-path": ("--workers", "1"),
    "full-path": ("--workers", "1", "--fast-path", "off"),
}


@pytest.fixture(params=list(PATHS))
async def edge(
    request: pytest.FixtureRequest, relay: CountingRelay, logs_dir: Path
) -> AsyncIterator[Edge]:
    args = (*PATHS[request.param], "--tail-freshness", str(FRESHNESS_SECONDS))
    started = await asyncio.to_thread(
        start_edge, relay.url, logs_dir, *args, name=f"refresh-{request.param}"
    )
    yield started
    await asyncio.to_thread(started.stop)


@dataclass(frozen=True)
class Read:
    started: float
    cache_status: str
    body: bytes


async def test_a_tail_read_steadily_never_lapses(
    http: aiohttp.ClientSession,
    origin: Origin,
    relay: CountingRelay,
    edge: Edge,
    stream_path: str,
) -> None:
    url = origin.url + stream_path
    status, _, _ = await call(http, "PUT", url, headers={"Content-Type": "text/plain"})
    assert status == 201
    status, _, _ = await call(
        http, "POST", url, headers={"Content-Type": "text/plain"}, data=BODY
    )  # fmt: skip
    assert status == 204
    target = f"{edge.url}{stream_path}?offset=-1"
    reads: list[Read] = []
    appended_at: float | None = None
    begun = time.monotonic()
    while (now := time.monotonic()) - begun < READING_SECONDS:
        if appended_at is None and now - begun >= APPEND_AT_SECONDS:
            # Behind the edge's back: only the origin knows, until the edge asks it again.
            status, _, _ = await call(
                http, "POST", url, headers={"Content-Type": "text/plain"}, data=b"new"
            )  # fmt: skip
            assert status == 204
            appended_at = time.monotonic()
        started = time.monotonic()
        async with http.get(target) as response:
            assert response.status == 200
            assert response.headers["Stream-Up-To-Date"] == "true"
            reads.append(
                Read(
                    started=started,
                    cache_status=response.headers["Cache-Status"],
                    body=await response.read(),
                )
            )
        await asyncio.sleep(READ_EVERY_SECONDS)

    first, rest = reads[0], reads[1:]
    assert "fwd=uri-miss" in first.cache_status  # the one read that waited on the origin
    waited = [
        (round(r.started - begun, 2), r.cache_status) for r in rest if r.cache_status != "edge; hit"
    ]
    assert waited == []  # every later reader was answered by the edge alone, across windows
    assert {r.body for r in reads} <= {BODY, BODY + b"new"}
    assert appended_at is not None
    # No answer is older than the window: a read that started a window after the append has it
    # (the edge counts a tail from when its request left, after the append had been taken).
    late = [r for r in reads if r.started >= appended_at + FRESHNESS_SECONDS]
    assert late
    assert all(r.body == BODY + b"new" for r in late)
    seen_new = next(r.started for r in reads if r.body == BODY + b"new")
    assert all(r.body == BODY + b"new" for r in reads if r.started >= seen_new)
    # One origin read per window (the first read's fill, then one refill started in each
    # window's last tenth), never two at once: not one per reader, nor none.
    windows = int(READING_SECONDS / FRESHNESS_SECONDS)
    origin_reads = relay.reads[stream_path]
    assert windows <= origin_reads - 1 <= windows + 1, origin_reads
    assert relay.most_at_once[stream_path] == 1
    text = await asyncio.to_thread(edge.metrics_text)
    renewed = metric_value(text, "edge_refresh_ahead_total", result="renewed")
    assert renewed == origin_reads - 1, (renewed, origin_reads)


async def test_a_fills_answer_is_capped_by_its_own_readers_prefix(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    """A read whose chain stops short of the tail asks the origin for the rest; its answer is
    capped at ``--max-response-bytes`` past its first segment as a stitched answer is, so it is
    the same answer the next read gets from the stored chain (and a fill another reader led,
    a refill of the tail with no prefix at all, gives each reader its own capped answer)."""
    url = origin.url + stream_path
    status, _, _ = await call(http, "PUT", url, headers={"Content-Type": "text/plain"})
    assert status == 201
    args = ("--workers", "1", "--max-response-bytes", "1KiB", "--tail-freshness", "0")
    edge = await asyncio.to_thread(start_edge, origin.url, logs_dir, *args, name="refresh-cap")
    try:
        target = f"{edge.url}{stream_path}?offset=-1"
        answers = []
        for part in (b"a" * 800, b"b" * 800):
            status, _, _ = await call(
                http, "POST", url, headers={"Content-Type": "text/plain"}, data=part
            )  # fmt: skip
            assert status == 204
            for _ in range(2):  # the fill's answer, then the stored chain's
                async with http.get(target) as response:
                    answers.append(
                        (
                            response.headers["Cache-Status"],
                            response.headers.get("Stream-Up-To-Date"),
                            await response.read(),
                        )
                    )
        assert [(up_to_date, body) for _, up_to_date, body in answers] == [
            ("true", b"a" * 800),
            ("true", b"a" * 800),
            (None, b"a" * 800),  # capped: the b's are the next read's
            (None, b"a" * 800),
        ]
        assert answers[2][0].startswith("edge; fwd=partial")
        assert answers[3][0] == "edge; hit"
    finally:
        await asyncio.to_thread(edge.stop)
