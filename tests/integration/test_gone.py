"""Issue 27, case 1: every origin answer is evidence, whatever request it answered.

A 404 or 410 from the origin to a write, a DELETE or a HEAD the edge relays ends the stream
instance it holds, on every worker, with a CDN purge, as a DELETE through the edge does. And
forks (PROTOCOL.md 4.2) pass through exactly: created through the edge, read and cached as
streams of their own, and a soft-deleted source (410 to everything) is never served again.

Real processes: the reference origin and the edge (``--workers 1`` and ``2``), a webhook
stand-in for the CDN. Each stream here is closed before it is read, so the edge serves it from
what it holds for ever unless something tells it otherwise: what tells it is the one relayed
answer each test sends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from multidict import CIMultiDict

from devstack.processes import Edge, Origin, start_edge
from edge.protocol.purge_keys import stream_key
from tests.cdn_stand_ins import StandIn, WebhookStandIn, eventually
from tests.conftest import ORIGIN_LONG_POLL_MS
from tests.integration.test_passthrough import call

TEXT = {"Content-Type": "text/plain"}
# Fresh connections spread over the workers by the kernel: the chance that this many all land
# on one of two workers is 2 / 2**12.
READS = 12
# A text stream's live tail long-polls the origin, which answers a waiting long-poll at its
# timeout (tests.conftest.ORIGIN_LONG_POLL_MS); the tail's next one is refused. Plus slack.
LIVE_NOTICED = ORIGIN_LONG_POLL_MS / 1000 + 3.0


@pytest.fixture(scope="module")
def webhook() -> Iterator[StandIn]:
    started = WebhookStandIn().start()
    yield started
    started.close()
    assert not started.rejected


@pytest.fixture(scope="module", params=[1, 2], ids=["workers1", "workers2"])
def gone_edge(
    request: pytest.FixtureRequest, origin: Origin, logs_dir: Path, webhook: StandIn
) -> Iterator[Edge]:
    workers = request.param
    started = start_edge(
        origin.url, logs_dir, "--workers", str(workers),
        "--cdn-purge", f"webhook={webhook.url}/cdn-purge", name=f"edge-gone-{workers}",
    )  # fmt: skip
    yield started
    started.stop()


@pytest.fixture
async def fresh() -> AsyncIterator[aiohttp.ClientSession]:
    """A new TCP connection for every request, so the kernel spreads them over the workers."""
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=15),
    ) as session:
        yield session


async def closed_stream(http: aiohttp.ClientSession, url: str, *parts: bytes) -> list[str]:
    """Create a text stream at ``url``, append ``parts`` and close it; the offset after each."""
    status, headers, _ = await call(http, "PUT", url, headers=TEXT)
    assert status == 201
    offsets = [CIMultiDict(headers)["Stream-Next-Offset"]]
    for part in parts:
        status, headers, _ = await call(http, "POST", url, headers=TEXT, data=part)
        assert status == 204
        offsets.append(CIMultiDict(headers)["Stream-Next-Offset"])
    status, _, _ = await call(http, "POST", url, headers={"Stream-Closed": "true"})
    assert status == 204
    return offsets


async def held_everywhere(fresh: aiohttp.ClientSession, edge: Edge, path: str) -> bytes:
    """Read ``path`` through the edge on many connections, so every worker holds it."""
    bodies = set()
    for _ in range(READS):
        status, _, body = await call(fresh, "GET", f"{edge.url}{path}?offset=-1")
        assert status == 200
        bodies.add(body)
    assert len(bodies) == 1
    return bodies.pop()


async def statuses(
    fresh: aiohttp.ClientSession, edge: Edge, path: str, offsets: list[str]
) -> list[int]:
    """What reads of ``path`` through the edge answer, on many connections: a GET from the
    start and from every offset the stream issued, and a HEAD, each several times."""
    seen = []
    for _ in range(READS // 2):
        for offset in ["-1", *offsets]:
            seen.append((await call(fresh, "GET", f"{edge.url}{path}?offset={offset}"))[0])
        seen.append((await call(fresh, "HEAD", edge.url + path))[0])
    return seen


def reasons(webhook: StandIn, path: str) -> list[str | None]:
    return [c.reason for c in webhook.calls_for(stream_key(path))]


async def test_an_append_answered_404_ends_the_stream_on_every_worker(
    http: aiohttp.ClientSession, fresh: aiohttp.ClientSession, origin: Origin, gone_edge: Edge,
    webhook: StandIn, stream_path: str,
) -> None:  # fmt: skip
    """Deleted behind the edge: the append it relays is answered 404, and no worker serves the
    stream's bytes afterwards; the CDN is purged."""
    offsets = await closed_stream(http, origin.url + stream_path, b"hello ", b"world")
    assert await held_everywhere(fresh, gone_edge, stream_path) == b"hello world"
    assert (await call(http, "DELETE", origin.url + stream_path))[0] == 204
    append = await call(http, "POST", gone_edge.url + stream_path, headers=TEXT, data=b"!")
    assert append[0] == 404
    assert set(await statuses(fresh, gone_edge, stream_path, offsets)) == {404}
    assert await eventually(lambda: "gone" in reasons(webhook, stream_path))


async def test_an_append_answered_410_ends_the_soft_deleted_stream_on_every_worker(
    http: aiohttp.ClientSession, fresh: aiohttp.ClientSession, origin: Origin, gone_edge: Edge,
    webhook: StandIn, stream_path: str,
) -> None:  # fmt: skip
    """Deleted behind the edge while it has a fork (soft-deleted: 410 to everything): the append
    it relays is answered 410, and no worker serves the stream's bytes afterwards."""
    source = origin.url + stream_path
    offsets = await closed_stream(http, source, b"hello ", b"world")
    fork = {"Stream-Forked-From": stream_path, "Stream-Fork-Offset": offsets[1]}
    assert (await call(http, "PUT", f"{source}-fork", headers={**TEXT, **fork}))[0] == 201
    assert await held_everywhere(fresh, gone_edge, stream_path) == b"hello world"
    assert (await call(http, "DELETE", source))[0] == 204  # soft: the fork reads through it
    append = await call(http, "POST", gone_edge.url + stream_path, headers=TEXT, data=b"!")
    assert append[0] == 410
    assert set(await statuses(fresh, gone_edge, stream_path, offsets)) == {410}
    assert await eventually(lambda: "gone" in reasons(webhook, stream_path))


async def test_a_fork_passes_through_and_its_soft_deleted_source_is_never_served(
    http: aiohttp.ClientSession, fresh: aiohttp.ClientSession, origin: Origin, gone_edge: Edge,
    webhook: StandIn, stream_path: str,
) -> None:  # fmt: skip
    """A fork created through the edge (its headers reach the origin verbatim) is read and
    cached as a stream of its own; once the source is deleted (here by another client,
    directly at the origin), a DELETE through the edge is answered 410 and from then on every
    read of the source through the edge is 410, as the origin's own; the fork lives on."""
    source, fork_path, prefix_path = stream_path, f"{stream_path}-fork", f"{stream_path}-prefix"
    offsets = await closed_stream(http, gone_edge.url + source, b"hello ", b"world")
    assert await held_everywhere(fresh, gone_edge, source) == b"hello world"
    forked = {**TEXT, "Stream-Forked-From": source, "Stream-Fork-Offset": offsets[1]}
    assert (await call(http, "PUT", gone_edge.url + fork_path, headers=forked))[0] == 201
    # A sub-offset forks inside the message at the fork offset: "hel" of "hello ".
    sub = {**TEXT, "Stream-Forked-From": source, "Stream-Fork-Offset": offsets[0]}
    sub["Stream-Fork-Sub-Offset"] = "3"
    assert (await call(http, "PUT", gone_edge.url + prefix_path, headers=sub))[0] == 201
    status, _, _ = await call(http, "POST", gone_edge.url + fork_path, headers=TEXT, data=b"there")
    assert status == 204
    for path, expected in ((fork_path, b"hello there"), (prefix_path, b"hel")):
        at_origin = await call(http, "GET", f"{origin.url}{path}?offset=-1")
        assert (at_origin[0], at_origin[2]) == (200, expected)
        assert await held_everywhere(fresh, gone_edge, path) == expected
        _, headers, _ = await call(http, "GET", f"{gone_edge.url}{path}?offset=-1")
        assert "hit" in CIMultiDict(headers)["Cache-Status"]  # cached like any stream

    assert (await call(http, "DELETE", origin.url + source))[0] == 204  # soft: it has forks
    assert (await call(http, "DELETE", gone_edge.url + source))[0] == 410
    assert set(await statuses(fresh, gone_edge, source, offsets)) == {410}
    assert (await call(http, "PUT", gone_edge.url + source, headers=TEXT))[0] == 409
    assert set(await statuses(fresh, gone_edge, source, offsets)) == {410}
    assert await eventually(lambda: "gone" in reasons(webhook, source))
    assert await held_everywhere(fresh, gone_edge, fork_path) == b"hello there"


async def test_a_live_tail_refused_410_ends_its_viewers_and_the_stream(
    http: aiohttp.ClientSession, fresh: aiohttp.ClientSession, origin: Origin, gone_edge: Edge,
    stream_path: str,
) -> None:  # fmt: skip
    """An SSE viewer follows an open stream through the edge (its tail long-polls the origin);
    the stream is deleted at the origin while it has a fork (soft-deleted). The tail's next
    long-poll is answered 410: the stream is gone, so the viewer's answer ends (it is not left
    open on a tail retrying for ever) and every later read is 410."""
    source = origin.url + stream_path
    assert (await call(http, "PUT", source, headers=TEXT))[0] == 201
    assert (await call(http, "POST", source, headers=TEXT, data=b"hello"))[0] == 204
    fork = {**TEXT, "Stream-Forked-From": stream_path}
    assert (await call(http, "PUT", f"{source}-fork", headers=fork))[0] == 201
    async with http.get(f"{gone_edge.url}{stream_path}?offset=-1&live=sse") as viewer:
        assert viewer.status == 200
        seen = b""
        async with asyncio.timeout(5):
            while b"hello" not in seen:
                seen += await viewer.content.read(65536)
        assert (await call(http, "DELETE", source))[0] == 204  # soft: it has a fork
        async with asyncio.timeout(LIVE_NOTICED):
            while await viewer.content.read(65536):
                pass
    assert set(await statuses(fresh, gone_edge, stream_path, [])) == {410}
