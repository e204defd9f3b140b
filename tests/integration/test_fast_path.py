"""The pre-serialised hit path against the real origin: the same bytes as the full path, HTTP/1.1
done right (keep-alive, pipelining, Connection: close, HEAD, 304), purged with its stream.

The full path is an edge started with ``--fast-path off`` in front of the same origin; every
answer is compared byte for byte (status line, headers in order, body) but for ``Date``, and
``Age`` (at the same place), whose value may differ by the time between the two reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin, start_edge
from edge.protocol.purge_keys import purge_keys
from tests.integration.live_support import view_sse
from tests.integration.test_passthrough import call, metric_value

# What a browser and a CDN are told of a range that can never change (edge.log.freshness).
BROWSER = b"max-age=60, stale-if-error=60"
PURGED_CDN = b"max-age=31536000, stale-while-revalidate=86400, stale-if-error=86400"


# One worker each: these tests read what one process stored, one connection at a time (with
# --workers N a new connection may reach any worker; test_workers.py covers that).
ONE = ("--workers", "1")


@pytest.fixture(scope="module")
def edge(origin: Origin, logs_dir: Path) -> Iterator[Edge]:
    started = start_edge(origin.url, logs_dir, *ONE, name="fast-path")
    yield started
    started.stop()


@pytest.fixture(scope="module")
def full_path_edge(origin: Origin, logs_dir: Path) -> Iterator[Edge]:
    started = start_edge(origin.url, logs_dir, *ONE, "--fast-path", "off", name="full-path")
    yield started
    started.stop()


@contextlib.contextmanager
def edge_pair(origin: Origin, logs_dir: Path, name: str, *args: str) -> Iterator[tuple[Edge, Edge]]:
    """Two edges started with ``args`` in front of ``origin``: with the hit path, and without
    (``--fast-path off``), whose answers the first one's must equal."""
    fast = start_edge(origin.url, logs_dir, *args, name=f"{name}-fast")
    try:
        full = start_edge(origin.url, logs_dir, *args, "--fast-path", "off", name=f"{name}-full")
    except BaseException:
        fast.stop()
        raise
    try:
        yield fast, full
    finally:
        full.stop()
        fast.stop()


# A CDN the edges are told they may purge (nothing listens there: no forgetting happens here
# that a purge would be sent for, and one that is sent is retried in the background).
CDN_PURGE = ("--cdn-purge", "varnish=http://127.0.0.1:9/")


@pytest.fixture(scope="module")
def capped_edges(origin: Origin, logs_dir: Path) -> Iterator[tuple[Edge, Edge]]:
    """Edges that cap answers at 1 KiB, so that ranges of open streams are immutable too, and
    that may keep a CDN's copies long (``--cdn-purge``)."""
    args = ("--max-response-bytes", "1KiB", *CDN_PURGE, *ONE)
    with edge_pair(origin, logs_dir, "capped", *args) as pair:
        yield pair


@dataclass
class Raw:
    status_line: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        return next((v for n, v in self.headers if n.lower() == name.lower()), None)

    def comparable(self) -> tuple[bytes, list[tuple[bytes, bytes]], bytes]:
        """Everything but ``Date``, and ``Age``'s value (``age``)."""
        headers = [(n, b"*" if n == b"Age" else v) for n, v in self.headers if n != b"Date"]
        return self.status_line, headers, self.body

    @property
    def age(self) -> int | None:
        value = self.header(b"Age")
        return None if value is None else int(value)


def host_port(url: str) -> tuple[str, int]:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    return host, int(port)


async def read_answers(
    reader: asyncio.StreamReader, methods: list[str]
) -> list[Raw]:  # one answer per request, in order
    answers = []
    for method in methods:
        status_line = (await reader.readuntil(b"\r\n"))[:-2]
        headers = []
        while (line := (await reader.readuntil(b"\r\n"))[:-2]) != b"":
            name, _, value = line.partition(b": ")
            headers.append((name, value))
        length = next((int(v) for n, v in headers if n.lower() == b"content-length"), None)
        chunked = any(n.lower() == b"transfer-encoding" for n, _ in headers)
        status = int(status_line.split()[1])
        body = b""
        if method == "HEAD" or status in (204, 304):
            pass
        elif chunked:
            while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
                body += (await reader.readexactly(size + 2))[:-2]
            await reader.readuntil(b"\r\n")
        elif length is None:
            body = await reader.read()  # to the close (an answer to HTTP/1.0)
        elif length:
            body = await reader.readexactly(length)
        answers.append(Raw(status_line, headers, body))
    return answers


async def exchange(url: str, payload: bytes, methods: list[str]) -> list[Raw]:
    """Send ``payload`` (one or more requests) on one connection; read one answer each."""
    reader, writer = await asyncio.open_connection(*host_port(url))
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(read_answers(reader, methods), 10)
    finally:
        writer.close()


def request(target: str, *headers: str, method: str = "GET") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: edge.test", *headers, "", ""]
    return "\r\n".join(lines).encode()


async def get(url: str, target: str, *headers: str) -> Raw:
    return (await exchange(url, request(target, *headers), ["GET"]))[0]


async def warm(url: str, target: str, *headers: str) -> Raw:
    """Read until the edge knows the stream's lifetime (it asks HEAD once) and answers
    ``immutable``, then once more: that answer is stored."""
    for _ in range(50):
        answer = await get(url, target, *headers)
        if (answer.header(b"Cache-Control") or b"").endswith(b", immutable"):
            return await get(url, target, *headers)
        await asyncio.sleep(0.05)
    raise AssertionError(f"{target} never became immutable")


def fast_answers(edge: Edge) -> float:
    return metric_value(edge.metrics_text(), "edge_fast_path_answers_total")


async def make_stream(
    http: aiohttp.ClientSession, url: str, content_type: str, *parts: bytes, close: bool
) -> None:
    status, _, _ = await call(http, "PUT", url, headers={"Content-Type": content_type})
    assert status == 201
    for part in parts:
        status, _, _ = await call(
            http, "POST", url, headers={"Content-Type": content_type}, data=part
        )
        assert status == 204
    if close:
        status, _, _ = await call(http, "POST", url, headers={"Stream-Closed": "true"})
        assert status == 204


KINDS = {
    "json": ("application/json", [b'{"i":1}', b'{"text":"' + b"a" * 3000 + b'"}']),
    "text": ("text/plain", [b"hello ", b" world" * 400]),
    "binary": ("application/octet-stream", [bytes(range(256)) * 8, b"\x00\xff" * 600]),
    "tiny": ("text/plain", [b"100 bytes " * 10]),
}
REPRESENTATIONS = {
    "identity": (),
    "gzip": ("Accept-Encoding: gzip, deflate",),
    "gzip-refused": ("Accept-Encoding: gzip;q=0, identity",),
}


@pytest.mark.parametrize("kind", list(KINDS))
async def test_every_stored_answer_is_the_full_paths_answer_byte_for_byte(
    http: aiohttp.ClientSession,
    origin: Origin,
    edge: Edge,
    full_path_edge: Edge,
    stream_path: str,
    kind: str,
) -> None:
    content_type, parts = KINDS[kind]
    await make_stream(http, origin.url + stream_path, content_type, *parts, close=True)
    targets = [f"{stream_path}?offset=-1", stream_path]
    for target in targets:
        for name, headers in REPRESENTATIONS.items():
            full = await warm(full_path_edge.url, target, *headers)
            await warm(edge.url, target, *headers)
            before = fast_answers(edge)
            fast = await get(edge.url, target, *headers)
            assert fast_answers(edge) == before + 1, f"{target} {name} was not a stored hit"
            assert fast.comparable() == full.comparable(), (target, name)
            assert fast.status_line == b"HTTP/1.1 200 OK"
            assert fast.header(b"Cache-Control") == b"public, " + BROWSER + b", immutable"
            assert fast.header(b"CDN-Cache-Control") == BROWSER  # no --cdn-purge: no longer
            assert fast.header(b"Surrogate-Control") == BROWSER
            assert fast.header(b"Surrogate-Key") == purge_keys(stream_path).surrogate_key.encode()
            assert fast.header(b"Cache-Tag") == purge_keys(stream_path).cache_tag.encode()
            assert fast.age is None  # it never changes: no Age
            tag = fast.header(b"ETag")
            assert tag is not None
            for condition in (f"If-None-Match: {tag.decode()}", "If-None-Match: *"):
                full_304 = await get(full_path_edge.url, target, *headers, condition)
                fast_304 = await get(edge.url, target, *headers, condition)
                assert fast_304.status_line == b"HTTP/1.1 304 Not Modified"
                assert fast_304.comparable() == full_304.comparable(), (target, name, condition)
            # A tag of another representation or instance is a 200, from the same entry.
            other = await get(edge.url, target, *headers, 'If-None-Match: "other"')
            assert other.comparable() == full.comparable()
    if kind != "tiny":
        gzipped = await get(edge.url, targets[0], *REPRESENTATIONS["gzip"])
        assert gzipped.header(b"Content-Encoding") == b"gzip"
        assert fast_answers(edge) > 0


async def test_capped_ranges_of_an_open_stream_are_stored_and_exact(
    http: aiohttp.ClientSession,
    origin: Origin,
    capped_edges: tuple[Edge, Edge],
    stream_path: str,
) -> None:
    fast, full = capped_edges
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", close=False)
    target = f"{stream_path}?offset=-1"
    for part in (b"a" * 800, b"b" * 800):
        status, _, _ = await call(
            http, "POST", url, headers={"Content-Type": "text/plain"}, data=part
        )
        assert status == 204
        for edge in capped_edges:  # each edge learns the stream as two segments
            assert (await get(edge.url, target)).status_line == b"HTTP/1.1 200 OK"
    want = await warm(full.url, target)
    assert want.header(b"Stream-Up-To-Date") is None  # capped: more follows
    await warm(fast.url, target)
    before = fast_answers(fast)
    got = await get(fast.url, target)
    assert fast_answers(fast) == before + 1
    assert got.comparable() == want.comparable()
    assert got.body == b"a" * 800
    # Told it may purge the CDN: the CDN keeps the range a year, browsers as ever.
    assert got.header(b"Cache-Control") == b"public, " + BROWSER + b", immutable"
    assert got.header(b"CDN-Cache-Control") == got.header(b"Surrogate-Control") == PURGED_CDN


async def test_pipelined_requests_are_answered_in_order_whichever_path_answers_them(
    http: aiohttp.ClientSession,
    origin: Origin,
    edge: Edge,
    full_path_edge: Edge,
    stream_path: str,
) -> None:
    closed, open_ = stream_path + "-closed", stream_path + "-open"
    await make_stream(http, origin.url + closed, "text/plain", b"x" * 2000, close=True)
    await make_stream(http, origin.url + open_, "text/plain", b"tail", close=False)
    hit = f"{closed}?offset=-1"
    for server in (edge, full_path_edge):
        await warm(server.url, hit)
        await warm(server.url, hit, "Accept-Encoding: gzip")
    batch = [
        (request(hit), "GET"),
        (request(closed, method="HEAD"), "HEAD"),  # relayed by the full path
        (request(hit, "Accept-Encoding: gzip"), "GET"),
        (request(f"{open_}?offset=-1"), "GET"),  # at the tail of an open stream: full path
        (request(hit, 'If-None-Match: "nope"', "Accept-Encoding: gzip"), "GET"),
        (request(f"{closed}?offset=-1&x=1"), "GET"),  # an unknown parameter: relayed
        (request(hit), "GET"),
        (request(hit, "Connection: close"), "GET"),
    ]
    payload = b"".join(raw for raw, _ in batch)
    methods = [method for _, method in batch]
    before = fast_answers(edge)
    answers = await exchange(edge.url, payload, methods)
    # Each answer is what the request alone gets (from the full path, on its own connection).
    for (raw, method), answer in zip(batch, answers, strict=True):
        alone = (await exchange(full_path_edge.url, raw, [method]))[0]
        if b"open" in raw.split(b"\r\n")[0]:
            assert answer.body == alone.body == b"tail"
            continue
        if method == "HEAD":
            assert answer.status_line == alone.status_line
            assert answer.header(b"Stream-Next-Offset") == alone.header(b"Stream-Next-Offset")
            continue
        if b"x=1" in raw:
            assert answer.body == alone.body == b"x" * 2000
            continue
        assert answer.comparable() == alone.comparable(), raw
    assert answers[-1].header(b"Connection") == b"close"
    assert fast_answers(edge) - before == 5  # the stored hits answered in between the rest


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_an_expectation_the_edge_refuses_keeps_the_pipeline_behind_it(
    http: aiohttp.ClientSession,
    origin: Origin,
    edge: Edge,
    full_path_edge: Edge,
    stream_path: str,
    method: str,
) -> None:
    """aiohttp answers an unknown ``Expect`` with 417 before any middleware runs: the requests
    pipelined behind it are answered at once, in order, not after the header timeout (10 s)."""
    await make_stream(http, origin.url + stream_path, "text/plain", b"e" * 900, close=True)
    hit = f"{stream_path}?offset=-1"
    want = await warm(edge.url, hit)
    refused = request(f"{stream_path}-other", "Expect: foo", method=method)
    payload = request(hit) + refused + request(hit)
    started = asyncio.get_running_loop().time()
    reader, writer = await asyncio.open_connection(*host_port(edge.url))
    try:
        writer.write(payload)
        await writer.drain()
        answers = await asyncio.wait_for(read_answers(reader, ["GET", method, "GET"]), 3)
    finally:
        writer.close()
    assert asyncio.get_running_loop().time() - started < 3
    first, expectation, last = answers
    assert expectation.status_line == b"HTTP/1.1 417 Expectation Failed"
    alone = (await exchange(full_path_edge.url, refused, [method]))[0]
    assert expectation.comparable() == alone.comparable()
    assert first.comparable() == last.comparable() == want.comparable()
    assert (await call(http, "HEAD", origin.url + stream_path))[0] == 200  # nothing relayed


async def test_a_head_sent_byte_by_byte_and_a_slow_request_in_between_keep_the_connection(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    await make_stream(http, origin.url + stream_path, "text/plain", b"slow " * 50, close=True)
    hit = f"{stream_path}?offset=-1"
    want = await warm(edge.url, hit)
    reader, writer = await asyncio.open_connection(*host_port(edge.url))
    try:
        before = fast_answers(edge)
        for byte in request(hit):
            writer.write(bytes([byte]))
            await writer.drain()
        [first] = await read_answers(reader, ["GET"])
        # A request only aiohttp answers, then stored hits again on the same connection.
        writer.write(request(stream_path, method="HEAD"))
        [head] = await read_answers(reader, ["HEAD"])
        writer.write(request(hit) + request(hit))
        again = await read_answers(reader, ["GET", "GET"])
        assert fast_answers(edge) - before == 3
    finally:
        writer.close()
    assert first.comparable() == want.comparable()
    assert head.status_line == b"HTTP/1.1 200 OK"
    assert [a.comparable() for a in again] == [want.comparable()] * 2


async def test_stored_answers_are_forgotten_with_their_stream(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    await make_stream(http, origin.url + stream_path, "text/plain", b"old " * 300, close=True)
    hit = f"{stream_path}?offset=-1"
    await warm(edge.url, hit)
    await warm(edge.url, hit, "Accept-Encoding: gzip")
    text = edge.metrics_text()
    assert metric_value(text, "edge_budget_entries", structure="response") >= 2
    assert metric_value(text, "edge_budget_bytes", structure="response") > 2 * 1200
    # Deleted and recreated through the edge: the old bytes are never answered again.
    status, _, _ = await call(http, "DELETE", edge.url + stream_path)
    assert status == 204
    assert (await get(edge.url, hit)).status_line == b"HTTP/1.1 404 Not Found"
    await make_stream(http, edge.url + stream_path, "text/plain", b"new " * 300, close=True)
    fresh = await warm(edge.url, hit)
    assert fresh.body == b"new " * 300
    # Deleted behind the edge's back and purged by the operator: the origin decides again.
    status, _, _ = await call(http, "DELETE", origin.url + stream_path)
    assert status == 204
    assert (await get(edge.url, hit)).body == b"new " * 300  # still stored, as it should be
    status, _, _ = await call(http, "POST", f"{edge.admin_url}/purge?path={stream_path}")
    assert status == 200
    assert (await get(edge.url, hit)).status_line == b"HTTP/1.1 404 Not Found"


# Long enough that a test's reads all fall inside one freshness window, on both edges.
FRESH = ("--tail-freshness", "30", *ONE)


@pytest.fixture(scope="module")
def fresh_edges(origin: Origin, logs_dir: Path) -> Iterator[tuple[Edge, Edge]]:
    """Edges that trust a tail they saw for 30 s, with and without the hit path."""
    with edge_pair(origin, logs_dir, "fresh", *FRESH) as pair:
        yield pair


async def stored_hit(edge: Edge, target: str, *headers: str) -> Raw:
    """Read ``target`` until an answer comes from the hit path; return that answer."""
    for _ in range(20):
        before = fast_answers(edge)
        answer = await get(edge.url, target, *headers)
        if fast_answers(edge) == before + 1:
            return answer
        await asyncio.sleep(0.05)
    raise AssertionError(f"{target} was never answered by the hit path")


async def test_at_tail_answers_of_an_open_stream_are_stored_while_the_tail_holds(
    http: aiohttp.ClientSession,
    origin: Origin,
    fresh_edges: tuple[Edge, Edge],
    stream_path: str,
) -> None:
    fast, full = fresh_edges
    target = f"{stream_path}?offset=-1"
    await make_stream(http, origin.url + stream_path, "text/plain", b"first " * 300, close=False)
    loop = asyncio.get_running_loop()
    observed = {full.url: loop.time()}
    for representation in REPRESENTATIONS.values():
        want = await get(full.url, target, *representation)
        want = await get(full.url, target, *representation)  # the full path's own hit
        assert want.header(b"Stream-Up-To-Date") == b"true"
        assert want.header(b"Cache-Control") == b"public, max-age=30"
        assert want.header(b"CDN-Cache-Control") == want.header(b"Surrogate-Control")
        assert want.header(b"CDN-Cache-Control") == b"max-age=30"  # nothing stale at the tail
        observed.setdefault(fast.url, loop.time())
        got = await stored_hit(fast, target, *representation)
        assert got.comparable() == want.comparable()
        tag = got.header(b"ETag")
        assert tag is not None
        condition = f"If-None-Match: {tag.decode()}"
        assert (await get(fast.url, target, *representation, condition)).comparable() == (
            await get(full.url, target, *representation, condition)
        ).comparable()
    # Age: how long ago each edge saw the tail (never longer than since this test's first read
    # of it), the same place on both paths, counted on the hit path per hit.
    await asyncio.sleep(1.05)
    got, want = await stored_hit(fast, target), await get(full.url, target)
    assert got.comparable() == want.comparable()
    for answer, url in ((got, fast.url), (want, full.url)):
        assert answer.age is not None
        assert 1 <= answer.age <= loop.time() - observed[url] + 1
    # A write through the edge moves the tail: the stored answer is not given again.
    status, _, _ = await call(
        http, "POST", fast.url + stream_path, headers={"Content-Type": "text/plain"},
        data=b"second",
    )  # fmt: skip
    assert status == 204
    before = fast_answers(fast)
    after_write = await get(fast.url, target)
    assert fast_answers(fast) == before
    assert after_write.body == b"first " * 300 + b"second"
    # Closed at the same offset behind the edge, then told by a write through it: the open
    # answer is not the closed stream's.
    status, _, _ = await call(
        http, "POST", fast.url + stream_path, headers={"Stream-Closed": "true"}
    )
    assert status == 204
    closed = await get(fast.url, target)
    assert closed.header(b"Stream-Closed") == b"true"
    assert closed.body == b"first " * 300 + b"second"


async def test_a_live_tail_moves_a_stored_at_tail_answer_on_the_moment_its_batch_arrives(
    http: aiohttp.ClientSession,
    origin: Origin,
    fresh_edges: tuple[Edge, Edge],
    stream_path: str,
) -> None:
    fast, _ = fresh_edges
    target = f"{stream_path}?offset=-1"
    await make_stream(http, origin.url + stream_path, "text/plain", b"a" * 100, close=False)
    await stored_hit(fast, target)
    viewer = asyncio.create_task(view_sse(http, fast.url + stream_path, deadline=20))
    try:
        for round_ in range(3):
            part = f"<{round_}>".encode()
            # Behind the edge's back: only the live tail tells the edge.
            status, _, _ = await call(
                http, "POST", origin.url + stream_path, headers={"Content-Type": "text/plain"},
                data=part,
            )  # fmt: skip
            assert status == 204
            want = b"a" * 100 + b"".join(f"<{i}>".encode() for i in range(round_ + 1))
            for _ in range(200):
                answer = await get(fast.url, target)
                if answer.body == want:
                    break
                # Until the batch arrives, the old tail is what the edge may say (within
                # --tail-freshness); never anything else.
                assert want.startswith(answer.body), answer.body
                await asyncio.sleep(0.02)
            else:
                raise AssertionError(f"the at-tail answer never showed round {round_}")
            # Once the batch is in, it is the tail: never the answer before it again.
            for _ in range(5):
                assert (await get(fast.url, target)).body == want
        status, _, _ = await call(
            http, "POST", origin.url + stream_path, headers={"Stream-Closed": "true"}
        )
        assert status == 204
        view = await asyncio.wait_for(viewer, 20)
        assert bytes(view.body) == want
    finally:
        viewer.cancel()


async def test_credentialed_reads_are_stored_per_scope(
    http: aiohttp.ClientSession,
    origin: Origin,
    edge: Edge,
    full_path_edge: Edge,
    stream_path: str,
) -> None:
    await make_stream(http, origin.url + stream_path, "text/plain", b"mine " * 300, close=True)
    target = f"{stream_path}?offset=-1"
    alice = "Cookie: session=alice"
    want = await warm(full_path_edge.url, target, alice)
    assert want.header(b"Cache-Control") == b"private, " + BROWSER + b", immutable"
    assert want.header(b"CDN-Cache-Control") is None  # a CDN honouring it would share it
    assert want.header(b"Surrogate-Control") is None
    await warm(edge.url, target, alice)
    got = await stored_hit(edge, target, alice)
    assert got.comparable() == want.comparable()
    # Another scope never gets alice's stored answer: its first read is the full path's.
    for other in ("Cookie: session=bob", "Authorization: Bearer bob", None):
        headers = (other,) if other is not None else ()
        before = fast_answers(edge)
        first = await get(edge.url, target, *headers)
        assert fast_answers(edge) == before, other
        assert not (first.header(b"Cache-Status") or b"").startswith(b"edge; hit"), other


async def read_to_the_tail(edge: Edge, path: str) -> None:
    """Catch up from the start as a client does, answer by answer, to the tail."""
    offset = "-1"
    for _ in range(20):
        answer = await get(edge.url, f"{path}?offset={offset}")
        assert answer.status_line == b"HTTP/1.1 200 OK"
        if answer.header(b"Stream-Up-To-Date") == b"true":
            return
        next_offset = answer.header(b"Stream-Next-Offset")
        assert next_offset is not None
        offset = next_offset.decode()
    raise AssertionError(f"{path} never reached its tail")


async def known_head(edge: Edge, path: str) -> Raw:
    """A HEAD the edge answers itself: once it has read the stream to its tail (trusted for
    --tail-freshness) and learned its lifetime (it asks the origin once, in the background)."""
    for _ in range(50):
        await read_to_the_tail(edge, path)
        answer = await head(edge.url, path)
        if answer.header(b"Cache-Status") == b"edge; hit":
            return answer
        await asyncio.sleep(0.05)
    raise AssertionError(f"{edge.url} never answered a HEAD of {path} itself")


async def head(url: str, target: str, *headers: str) -> Raw:
    return (await exchange(url, request(target, *headers, method="HEAD"), ["HEAD"]))[0]


def metadata(answer: Raw) -> dict[bytes, bytes | None]:
    return {
        name: answer.header(name)
        for name in (b"Stream-Next-Offset", b"Stream-Closed", b"Content-Type", b"Cache-Control")
    }


async def test_a_head_of_a_known_stream_is_the_edges_and_reports_its_real_tail(
    http: aiohttp.ClientSession,
    origin: Origin,
    capped_edges: tuple[Edge, Edge],
    fresh_edges: tuple[Edge, Edge],
    stream_path: str,
) -> None:
    """Answered by the edge once it knows the whole stream, the same bytes on both paths, and
    the origin's metadata: the tail even where reads are capped (1 KiB here), never the cap."""
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"x" * 900, b"y" * 900, b"z" * 900, close=False)
    want = await head(origin.url, stream_path)
    assert want.header(b"Cache-Control") == b"no-store"
    for fast, full in (capped_edges, fresh_edges):
        await known_head(fast, stream_path)  # stores it
        before = fast_answers(fast)
        fast_answer = await head(fast.url, stream_path)
        full_answer = await known_head(full, stream_path)
        assert fast_answers(fast) == before + 1
        assert metadata(full_answer) == metadata(want)
        assert full_answer.header(b"Content-Length") is None
        assert fast_answer.comparable() == full_answer.comparable()
    # A write through the edge moves the tail: the stored HEAD is not given again.
    status, _, _ = await call(
        http, "POST", fresh_edges[0].url + stream_path, headers={"Stream-Closed": "true"}
    )
    assert status == 204
    closed = await head(fresh_edges[0].url, stream_path)
    assert closed.header(b"Stream-Closed") == b"true"
    assert closed.header(b"Stream-Next-Offset") == want.header(b"Stream-Next-Offset")


async def test_a_404_to_a_credential_ends_that_scopes_stored_answers(
    http: aiohttp.ClientSession, origin: Origin, edge: Edge, stream_path: str
) -> None:
    """Found by an outside review: a 404 forgot the scope's log but not the answers stored for
    it, so the hit path kept serving a stream the origin no longer served to that credential."""
    await make_stream(http, origin.url + stream_path, "text/plain", b"secret", close=True)
    target = f"{stream_path}?offset=-1"
    alice = "Authorization: Bearer alice"
    await warm(edge.url, target, alice)
    await stored_hit(edge, target, alice)
    status, _, _ = await call(http, "DELETE", origin.url + stream_path)  # behind the edge
    assert status == 204
    # A read the edge must ask the origin about (another offset): 404, the scope forgets.
    gone = await get(edge.url, f"{stream_path}?offset=0000000000000000_0000000000000003", alice)
    assert gone.status_line == b"HTTP/1.1 404 Not Found"
    after = await get(edge.url, target, alice)
    assert after.status_line == b"HTTP/1.1 404 Not Found"
    assert after.body != b"secret"


def test_fast_hits_are_counted_where_every_hit_is(edge: Edge) -> None:
    text = edge.metrics_text()
    fast = metric_value(text, "edge_fast_path_answers_total")
    assert fast > 0
    hits = metric_value(text, "edge_cache_requests_total", result="hit")
    assert hits >= fast
    served = metric_value(text, "edge_requests_total", code="200", kind="catchup")
    not_modified = metric_value(text, "edge_requests_total", code="304", kind="catchup")
    assert served + not_modified >= fast
    assert re.search(r'^edge_budget_bytes\{structure="response"\} ', text, re.M)
