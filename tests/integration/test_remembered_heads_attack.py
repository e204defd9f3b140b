"""Issue 29 from outside: a remembered head (``FastPath.hit``: raw head in, stored answer out)
must never give what the full path would not. Real processes only: the reference origin, an
edge with the hit path and one with ``--fast-path off`` (the reference for bytes), raw sockets.

A head is remembered on its first answer from the store (``answer``) and answered from memory
from then on, on any connection: every ``get`` below opens its own connection and sends one
head alone, so from the third read of a warmed target on, the hit path answers it.
Every edge's log is read for tracebacks when its test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aredis
from aiohttp import web

from devstack.processes import Edge, Origin, start_edge
from edge.instances.generations import GENERATION_CHECK_SECONDS
from edge.store.shared_codec import generation_key
from tests.conftest import shared_redis_in
from tests.integration.replicas import raw as exact_url
from tests.integration.test_fast_path import (
    Raw,
    edge_pair,
    exchange,
    fast_answers,
    get,
    host_port,
    make_stream,
    read_answers,
    warm,
)
from tests.integration.test_fast_path import request as head_of
from tests.integration.test_passthrough import call, metric_value

ONE = ("--workers", "1")
TEXT = "text/plain"


def no_tracebacks(*edges: Edge) -> None:
    for edge in edges:
        text = edge.process.log.read_text(errors="replace")
        assert "Traceback" not in text, edge.process.log
        assert " ERROR " not in text, edge.process.log


@contextlib.contextmanager
def pair(origin: Origin, logs_dir: Path, name: str, *args: str) -> Iterator[tuple[Edge, Edge]]:
    with edge_pair(origin, logs_dir, name, *ONE, *args) as edges:
        yield edges
        no_tracebacks(*edges)


async def remembered(url: str, target: str, *headers: str) -> Raw:
    """Warm ``target`` until stored, read it once more (remembered), and once from memory."""
    await warm(url, target, *headers)
    await get(url, target, *headers)
    return await get(url, target, *headers)


async def both(fast: Edge, full: Edge, target: str, *headers: str) -> tuple[Raw, Raw]:
    return await get(fast.url, target, *headers), await get(full.url, target, *headers)


# What an edge (or one of its workers) says of how long an answer may be kept depends on
# whether it has learnt the stream's lifetime yet (asked in the background: a first fill says
# max-age=1, a later hit immutable) and on whether this worker stored it (Cache-Status): two
# edges, or two workers of one, may legitimately differ there for a moment. The question here
# is what is given (status, every other header, the bytes); those four are compared, settled,
# by tests/integration/test_own_heads.py and test_fast_path.py.
LEARNT = {b"Cache-Control", b"CDN-Cache-Control", b"Surrogate-Control", b"Cache-Status"}


def given(raw: Raw) -> tuple[bytes, list[tuple[bytes, bytes]], bytes]:
    status, headers, body = raw.comparable()
    return status, [(name, value) for name, value in headers if name not in LEARNT], body


def same(fast: Raw, full: Raw) -> None:
    assert given(fast) == given(full)


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_deleted_and_recreated_through_the_edge_with_other_bytes(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str, workers: str
) -> None:
    target = f"{stream_path}?offset=-1"
    await make_stream(http, origin.url + stream_path, TEXT, b"a" * 1000, close=True)
    args = ("--workers", workers)
    with edge_pair(origin, logs_dir, f"recreate-{workers}", *args) as (fast, full):
        old = await remembered(fast.url, target)
        same(old, await remembered(full.url, target))
        assert old.body == b"a" * 1000
        for _ in range(12):  # fresh connections: every worker remembers it
            same(await get(fast.url, target), old)
        assert (await call(http, "DELETE", fast.url + stream_path))[0] == 204
        assert (await call(http, "POST", f"{full.admin_url}/purge?path={stream_path}"))[0] == 200
        gone_fast, gone_full = await both(fast, full, target)
        assert gone_fast.status_line == gone_full.status_line
        assert b"404" in gone_fast.status_line
        # Same offsets, other bytes.
        await make_stream(http, origin.url + stream_path, TEXT, b"b" * 1000, close=True)
        for _ in range(4):
            # While the edges learn the new stream (a worker's first fill of it says
            # max-age=1 until its lifetime is known; another's may already be a hit), the
            # headers may differ between them; the bytes never may, and never the old ones.
            got, want = await both(fast, full, target)
            assert got.status_line == want.status_line
            assert got.body == want.body
            assert got.body in (b"b" * 1000, b"")
        new = await remembered(fast.url, target)
        assert new.body == b"b" * 1000
        same(new, await remembered(full.url, target))
        for _ in range(12):
            same(await get(fast.url, target), new)
        no_tracebacks(fast, full)


async def test_deleted_behind_the_edges_back_and_purged_through_the_admin_api(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    target = f"{stream_path}?offset=-1"
    await make_stream(http, origin.url + stream_path, TEXT, b"a" * 1000, close=True)
    with pair(origin, logs_dir, "admin-purge") as (fast, full):
        await remembered(fast.url, target)
        await remembered(full.url, target)
        assert (await call(http, "DELETE", origin.url + stream_path))[0] == 204
        await make_stream(http, origin.url + stream_path, TEXT, b"b" * 1000, close=True)
        # Immutable: both still give the old bytes (the design), alike.
        got, want = await both(fast, full, target)
        same(got, want)
        for edge in (fast, full):
            status, _, _ = await call(http, "POST", f"{edge.admin_url}/purge?path={stream_path}")
            assert status == 200
        got, want = await both(fast, full, target)
        assert got.body == want.body == b"b" * 1000
        same(got, want)


async def test_purged_from_another_replica_through_redis(
    http: aiohttp.ClientSession,
    origin: Origin,
    logs_dir: Path,
    stream_path: str,
    request: pytest.FixtureRequest,
) -> None:
    shared = shared_redis_in("standalone", request)
    target = f"{stream_path}?offset=-1"
    await make_stream(http, origin.url + stream_path, TEXT, b"a" * 1000, close=True)
    a = start_edge(origin.url, logs_dir, *ONE, *shared.edge_args, name="redis-a")
    b = start_edge(origin.url, logs_dir, *ONE, *shared.edge_args, name="redis-b")
    try:
        await remembered(b.url, target)
        before = fast_answers(b)
        assert (await get(b.url, target)).body == b"a" * 1000
        assert fast_answers(b) == before + 1
        # Deleted through A: B hears of it (pub/sub) and must stop.
        assert (await call(http, "DELETE", a.url + stream_path))[0] == 204
        for _ in range(100):
            got = await get(b.url, target)
            if b"404" in got.status_line:
                break
            await asyncio.sleep(0.05)
        assert b"404" in got.status_line
        await make_stream(http, origin.url + stream_path, TEXT, b"b" * 1000, close=True)
        for _ in range(20):
            got = await get(b.url, target)
            assert got.body != b"a" * 1000
        assert (await remembered(b.url, target)).body == b"b" * 1000
        # Deleted behind both, purged through A's admin API: B stops too.
        assert (await call(http, "DELETE", origin.url + stream_path))[0] == 204
        await make_stream(http, origin.url + stream_path, TEXT, b"c" * 1000, close=True)
        assert (await call(http, "POST", f"{a.admin_url}/purge?path={stream_path}"))[0] == 200
        for _ in range(100):
            got = await get(b.url, target)
            if got.body == b"c" * 1000:
                break
            await asyncio.sleep(0.05)
        assert got.body == b"c" * 1000
        for _ in range(20):
            assert (await get(b.url, target)).body == b"c" * 1000
    finally:
        a.stop()
        b.stop()
    no_tracebacks(a, b)


async def test_evicted_by_cache_pressure_then_deleted_behind_the_edge(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    target = f"{stream_path}?offset=-1"
    await make_stream(http, origin.url + stream_path, TEXT, b"a" * 1000, close=True)
    others = [f"{stream_path}-other-{i}" for i in range(24)]
    for other in others:
        await make_stream(http, origin.url + other, TEXT, b"o" * 16000, close=True)
    with pair(
        origin, logs_dir, "evicted", "--cache-bytes", "256KiB", "--max-segment-bytes", "32KiB"
    ) as (fast, full):
        same(await remembered(fast.url, target), await remembered(full.url, target))
        for other in others:  # each read twice: the second is a local hit, stored
            for _ in range(2):
                same(*await both(fast, full, f"{other}?offset=-1"))
        assert (await call(http, "DELETE", origin.url + stream_path))[0] == 204
        got, want = await both(fast, full, target)
        assert b"404" in want.status_line  # the reference forgot it: so must the hit path
        same(got, want)


LIFETIME_HEADERS = (b"Cache-Control", b"CDN-Cache-Control", b"Surrogate-Control")


def but_lifetime(answer: Raw) -> tuple[bytes, list[tuple[bytes, bytes]], bytes]:
    """``comparable`` without what counts down with the stream's lifetime (its max-age)."""
    status, headers, body = answer.comparable()
    return status, [(n, v) for n, v in headers if n not in LIFETIME_HEADERS], body


def iso_in(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds))


@pytest.mark.parametrize("lifetime", ["ttl", "expires-at"])
async def test_a_stream_whose_lifetime_ends(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str, lifetime: str
) -> None:
    with pair(origin, logs_dir, lifetime) as (fast, full):
        ends = {"Stream-TTL": "3"} if lifetime == "ttl" else {"Stream-Expires-At": iso_in(4)}
        async with http.put(
            origin.url + stream_path, headers={"Content-Type": TEXT, **ends}
        ) as put:
            assert put.status == 201
        status, _, _ = await call(
            http, "POST", origin.url + stream_path, headers={"Content-Type": TEXT}, data=b"t" * 500
        )
        assert status == 204
        status, _, _ = await call(
            http, "POST", origin.url + stream_path, headers={"Stream-Closed": "true"}
        )
        assert status == 204
        target = f"{stream_path}?offset=-1"
        for _ in range(6):
            got, want = await both(fast, full, target)
            assert but_lifetime(got) == but_lifetime(want)
            assert got.body == b"t" * 500
        await asyncio.sleep(5)  # nobody touches it: the origin ends it
        got, want = await both(fast, full, target)
        assert b"404" in got.status_line
        same(got, want)


def variants(path: str, tag: str) -> list[tuple[bytes, str]]:
    """Heads of one stored answer's neighbourhood: each a representation, a scope, a method or
    a framing of its own (raw bytes, and the method read_answers reads it as)."""
    target = f"{path}?offset=-1"
    plain = [
        (),
        ("Accept-Encoding: gzip",),
        ("Accept-Encoding: gzip, deflate, br",),
        ("Accept-Encoding: identity",),
        ("Accept-Encoding: gzip;q=0",),
        ("Accept-Encoding: *",),
        ("Accept-Encoding: br", "Accept-Encoding: gzip"),
        ("accept-encoding: GZIP",),
        ("Authorization: Bearer one",),
        ("Authorization: Bearer two",),
        ("Authorization: Bearer one", "Accept-Encoding: gzip"),
        ("Cookie: session=1",),
        (f"If-None-Match: {tag}",),
        (f"If-None-Match: {tag}", "Accept-Encoding: gzip"),
        ('If-None-Match: "other"',),
        ("If-None-Match: *",),
        ("Range: bytes=0-9",),
        ("Cache-Control: no-cache",),
        ("Pragma: no-cache",),
        ("Origin: https://elsewhere.example",),
        ("Connection: keep-alive",),
        ("X-Anything: 1",),
    ]
    heads = [(head_of(target, *headers), "GET") for headers in plain]
    heads += [
        (head_of(target, method="HEAD"), "HEAD"),
        (head_of(target, "Accept-Encoding: gzip", method="HEAD"), "HEAD"),
        (head_of(f"{path}?offset=%2D1"), "GET"),
        (head_of(f"{path}?offset=-1&"), "GET"),
        (head_of(f"http://edge.test{target}"), "GET"),
        (
            f"GET {target} HTTP/1.0\r\nHost: edge.test\r\nConnection: keep-alive\r\n\r\n".encode(),
            "GET",
        ),
    ]
    return heads


async def test_every_neighbouring_head_is_answered_as_the_full_path_answers_it(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    await make_stream(http, origin.url + stream_path, TEXT, b"v" * 3000, close=True)
    target = f"{stream_path}?offset=-1"
    with pair(origin, logs_dir, "neighbours") as (fast, full):
        first = await remembered(fast.url, target)
        await remembered(full.url, target)
        tag = first.header(b"ETag")
        assert tag is not None
        heads = variants(stream_path, tag.decode())
        for _ in range(4):  # met, stored, remembered, answered from memory
            for head, method in heads:
                got = (await exchange(fast.url, head, [method]))[0]
                want = (await exchange(full.url, head, [method]))[0]
                assert given(got) == given(want), head


GRANTED = "https://granted.example"


@pytest.fixture
async def cors_switch(origin: Origin) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """The real origin behind a forwarder whose CORS the test switches: ``mode["cors"]`` is
    ``star`` (one grant for all), ``per-origin`` (``GRANTED`` only, ``Vary: Origin``) or
    ``none`` (no CORS headers: teaches nothing); ``mode["no-store"]``: its reads' 200s say
    ``Cache-Control: no-store``."""
    mode = {"cors": "star"}
    session = aiohttp.ClientSession(
        auto_decompress=False, skip_auto_headers=("Accept-Encoding", "Accept", "User-Agent")
    )

    async def forward(incoming: web.Request) -> web.StreamResponse:
        headers = [(n, v) for n, v in incoming.headers.items() if n.lower() != "host"]
        async with session.request(
            incoming.method, origin.url + incoming.path_qs, headers=headers,
            data=await incoming.read(), allow_redirects=False,
        ) as answer:  # fmt: skip
            body = await answer.read()
            out = web.Response(status=answer.status, body=body)
            for name, value in answer.headers.items():
                lowered = name.lower()
                if lowered.startswith("access-control-") or lowered in HOP:
                    continue
                out.headers.add(name, value)
            if mode.get("no-store") and incoming.method == "GET" and answer.status == 200:
                out.headers["Cache-Control"] = "no-store"
            asked = incoming.headers.get("Origin")
            if mode["cors"] == "star":
                out.headers["Access-Control-Allow-Origin"] = "*"
            elif mode["cors"] == "per-origin":
                if asked == GRANTED:
                    out.headers["Access-Control-Allow-Origin"] = asked
                    out.headers["Access-Control-Allow-Credentials"] = "true"
                out.headers.add("Vary", "Origin")
            return out

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", mode
    await runner.cleanup()
    await session.close()


HOP = ("content-length", "transfer-encoding", "connection", "date", "server")


async def test_the_origins_cors_changes_under_remembered_heads(
    http: aiohttp.ClientSession,
    origin: Origin,
    logs_dir: Path,
    stream_path: str,
    cors_switch: tuple[str, dict[str, str]],
) -> None:
    url, mode = cors_switch
    await make_stream(http, origin.url + stream_path, TEXT, b"c" * 800, close=True)
    target = f"{stream_path}?offset=-1"
    heads = [(), (f"Origin: {GRANTED}",), ("Origin: https://other.example",)]
    fast = await asyncio.to_thread(start_edge, url, logs_dir, *ONE, name="cors-fast")
    full = await asyncio.to_thread(
        start_edge, url, logs_dir, *ONE, "--fast-path", "off", name="cors-full"
    )
    try:
        for step in ("star", "per-origin", "star", "per-origin"):
            mode["cors"] = step
            # Each edge learns the new policy from a read that reaches the origin.
            for edge in (fast, full):
                for headers in heads:
                    await get(edge.url, f"{stream_path}-{step}-{len(headers)}", *headers)
                    await get(edge.url, f"{target}&learn={time.monotonic()}", *headers)
            for _ in range(4):
                for headers in heads:
                    got, want = await both(fast, full, target, *headers)
                    assert given(got) == given(want), (step, headers)
    finally:
        await asyncio.to_thread(fast.stop)
        await asyncio.to_thread(full.stop)
    no_tracebacks(fast, full)


async def test_remembered_heads_sent_one_by_one_around_reads_of_other_paths(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    """Each head is its own packet, unread answers pending: a remembered head that arrives
    alone while the connection waits on another path's answer (aiohttp's, a parked long-poll,
    a relay) is answered after it, in order."""
    closed, open_ = stream_path + "-closed", stream_path + "-open"
    await make_stream(http, origin.url + closed, TEXT, b"h" * 900, close=True)
    await make_stream(http, origin.url + open_, TEXT, b"tail", close=False)
    hit = head_of(f"{closed}?offset=-1")
    with pair(origin, logs_dir, "one-by-one") as (fast, full):
        want_hit = await remembered(full.url, f"{closed}?offset=-1")
        await remembered(fast.url, f"{closed}?offset=-1")
        at_tail = (await get(fast.url, f"{open_}?offset=-1")).header(b"Stream-Next-Offset")
        assert at_tail is not None
        batch = [
            (hit, "GET"),
            (head_of(f"{open_}?offset={at_tail.decode()}&live=long-poll"), "GET"),  # parks
            (hit, "GET"),
            (head_of(f"{closed}?offset=-1&x=1"), "GET"),  # an unknown parameter: relayed
            (hit, "GET"),
            (head_of(f"{open_}?offset=-1"), "GET"),  # at the tail: not remembered
            (hit, "GET"),
            (head_of(closed, method="HEAD"), "HEAD"),
            (hit, "GET"),
        ]
        reader, writer = await asyncio.open_connection(*host_port(fast.url))
        try:
            for raw, _ in batch:
                writer.write(raw)
                await writer.drain()
                await asyncio.sleep(0.05)  # its own packet
            status, _, _ = await call(
                http, "POST", origin.url + open_, headers={"Content-Type": TEXT}, data=b"more"
            )
            assert status == 204
            answers = await asyncio.wait_for(read_answers(reader, [m for _, m in batch]), 20)
        finally:
            writer.close()
        assert answers[1].body == b"more"
        assert answers[3].body == b"h" * 900
        assert answers[5].body == b"tailmore"
        for index in (0, 2, 4, 6, 8):
            assert given(answers[index]) == given(want_hit), index


def rss_bytes(edge: Edge) -> int:
    for line in Path(f"/proc/{edge.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def test_a_client_that_never_reads_while_remembered_hits_are_pipelined(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    body = bytes(range(256)) * 60  # 15 KiB: joined to its head, remembered
    await make_stream(http, origin.url + stream_path, TEXT, body, close=True)
    target = f"{stream_path}?offset=-1"
    with pair(origin, logs_dir, "never-reads") as (fast, full):
        want = await remembered(full.url, target)
        await remembered(fast.url, target)
        head = head_of(target)
        before = rss_bytes(fast)
        reader, writer = await asyncio.open_connection(*host_port(fast.url))
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sent = 0
        try:
            # Heads one by one (most arrive alone: the hit path), none of the answers read,
            # until the edge stops reading (our writes stall).
            while sent < 20_000:
                writer.write(head)
                try:
                    await asyncio.wait_for(writer.drain(), 2)
                except TimeoutError:
                    break
                sent += 1
                if sent % 4 == 0:
                    await asyncio.sleep(0)
            grown = rss_bytes(fast) - before
            # 20k answers would be 300 MB: what the edge holds is the socket's, not ours.
            assert grown < 40 * 1024 * 1024, grown
            # And every answer is there, in order, whole.
            writer.transport.resume_reading()
            answers = await asyncio.wait_for(read_answers(reader, ["GET"] * sent), 60)
            assert all(given(a) == given(want) for a in answers)
        finally:
            writer.close()


async def test_date_is_the_seconds_across_its_boundaries(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    await make_stream(http, origin.url + stream_path, TEXT, b"d" * 500, close=True)
    target = f"{stream_path}?offset=-1"
    with pair(origin, logs_dir, "dates") as (fast, full):
        want = await remembered(full.url, target)
        await remembered(fast.url, target)
        tag = want.header(b"ETag")
        assert tag is not None
        condition = f"If-None-Match: {tag.decode()}"
        want_304 = await remembered(full.url, target, condition)
        await remembered(fast.url, target, condition)
        reader, writer = await asyncio.open_connection(*host_port(fast.url))
        try:
            ends = time.time() + 2.6  # three second boundaries at least
            dates = set()
            turn = 0
            while time.time() < ends:
                turn += 1
                headers, expected = ((condition,), want_304) if turn % 2 else ((), want)
                asked = time.time()
                writer.write(head_of(target, *headers))
                got = (await read_answers(reader, ["GET"]))[0]
                answered = time.time()
                date = got.header(b"Date")
                assert date is not None
                when = email.utils.parsedate_to_datetime(date.decode()).timestamp()
                assert int(asked) <= when <= answered, (asked, date, answered)
                assert given(got) == given(expected)
                assert got.header(b"Age") is None
                dates.add(date)
                await asyncio.sleep(0.01)
            assert len(dates) >= 3
        finally:
            writer.close()


async def test_ten_thousand_distinct_heads_keep_the_book_bounded(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    body = b"m" * 15000
    await make_stream(http, origin.url + stream_path, TEXT, body, close=True)
    target = f"{stream_path}?offset=-1"
    with pair(
        origin, logs_dir, "ten-thousand", "--cache-bytes", "8MiB", "--max-segment-bytes", "1MiB"
    ) as (fast, _full):
        want = await remembered(fast.url, target)
        reader, writer = await asyncio.open_connection(*host_port(fast.url))
        try:
            base = rss_bytes(fast)
            for round_ in range(2):
                for i in range(10_000):
                    # Same answer, distinct heads: each remembered on its first answer.
                    writer.write(head_of(target, f"X-Viewer: {round_}-{i:05d}"))
                    got = (await read_answers(reader, ["GET"]))[0]
                    assert given(got) == given(want)
                grown = rss_bytes(fast) - base
                # The book holds 4 MiB of its own, parsed heads 1024 x 1 KiB: far below this.
                assert grown < 48 * 1024 * 1024, (round_, grown)
        finally:
            writer.close()


def catchups(edge: Edge) -> float:
    return metric_value(edge.metrics_text(), "edge_requests_total", kind="catchup", code="200")


def reads_of(origin: Origin, path: str) -> int:
    return sum(r["method"] in ("GET", "HEAD") for r in origin.counts(path)["requests"])


async def test_remembered_hits_after_an_answer_that_filled_the_socket_wait_for_the_reader(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    """An answer of the connection's own (a catch-up miss, written by its task) leaves the
    transport above its high-water mark and ends: what the client then pipelines, remembered
    heads above all (60 bytes in, 15 KiB out), must wait for it to read, not pile up in the
    edge's memory. The probe after them is a read the origin would see if the edge read it."""
    big, small, probe = stream_path + "-big", stream_path + "-small", stream_path + "-probe"
    # A stream with a lifetime: never a stored answer, so its local hit is the catch-up's own.
    async with http.put(origin.url + big, headers={"Content-Type": TEXT, "Stream-TTL": "3600"}):
        pass
    for i in range(8):
        status, _, _ = await call(
            http, "POST", origin.url + big, headers={"Content-Type": TEXT},
            data=bytes([65 + i]) * (1 << 20),
        )  # fmt: skip
        assert status == 204
    await make_stream(http, origin.url + small, TEXT, bytes(range(256)) * 60, close=True)
    await make_stream(http, origin.url + probe, TEXT, b"probe", close=True)
    args = ("--max-response-bytes", "16MiB", "--max-segment-bytes", "16MiB")
    with pair(origin, logs_dir, "filled", *args) as (fast, _full):
        target = f"{small}?offset=-1"
        want = await remembered(fast.url, target)
        for _ in range(2):  # a miss, then in the tier: the next read of it is a local hit
            assert len((await get(fast.url, f"{big}?offset=-1")).body) == 8 << 20
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, host_port(fast.url))
        reader, writer = await asyncio.open_connection(sock=sock)
        heads = 3000
        try:
            answered = catchups(fast)
            writer.write(head_of(f"{big}?offset=-1"))  # the catch-up's own answer, no hold
            await writer.drain()
            for _ in range(100):  # counted as it is written, in the step its task ends in
                if catchups(fast) > answered:
                    break
                await asyncio.sleep(0.05)
            assert catchups(fast) == answered + 1
            base = rss_bytes(fast)
            for i in range(heads):
                writer.write(head_of(target))
                await writer.drain()
                if i % 8 == 0:
                    await asyncio.sleep(0)
            writer.write(head_of(f"{probe}?offset=-1"))
            await writer.drain()
            for _ in range(30):  # the edge, if it reads on, asks the origin for the probe
                if reads_of(origin, probe):
                    break
                await asyncio.sleep(0.1)
            grown = rss_bytes(fast) - base
            assert reads_of(origin, probe) == 0, grown
            assert grown < 16 * 1024 * 1024, grown
            answers = await asyncio.wait_for(read_answers(reader, ["GET"] * (heads + 2)), 120)
            assert len(answers[0].body) == 8 << 20
            assert all(given(a) == given(want) for a in answers[1:-1])
            assert answers[-1].body == b"probe"
        finally:
            writer.close()


async def test_a_purge_whose_message_was_missed_ends_a_remembered_head_by_the_generation_check(
    http: aiohttp.ClientSession,
    origin: Origin,
    logs_dir: Path,
    stream_path: str,
    request: pytest.FixtureRequest,
) -> None:
    """Recreated behind the edges and its generation gone from Redis (no message on the
    channel, as after a partition): each replica confirms its generation within
    ``GENERATION_CHECK_SECONDS`` and forgets; a remembered head must not outlast that."""
    shared = shared_redis_in("standalone", request)
    target = f"{stream_path}?offset=-1"
    await make_stream(http, origin.url + stream_path, TEXT, b"a" * 1000, close=True)
    fast = start_edge(origin.url, logs_dir, *ONE, *shared.edge_args, name="missed-fast")
    full = start_edge(
        origin.url, logs_dir, *ONE, *shared.edge_args, "--fast-path", "off", name="missed-full"
    )
    client = aredis.Redis.from_url(shared.url)
    try:
        await remembered(fast.url, target)
        await remembered(full.url, target)
        assert (await call(http, "DELETE", origin.url + stream_path))[0] == 204
        await make_stream(http, origin.url + stream_path, TEXT, b"b" * 1000, close=True)
        assert await client.delete(generation_key(stream_path)) == 1
        changed_at: dict[str, float] = {}
        began = time.monotonic()
        while len(changed_at) < 2 and time.monotonic() - began < 10:
            for name, edge in (("fast", fast), ("full", full)):
                body = (await get(edge.url, target)).body
                if name in changed_at:
                    assert body == b"b" * 1000, name  # never the old bytes again
                elif body == b"b" * 1000:
                    changed_at[name] = time.monotonic() - began
                else:
                    assert body == b"a" * 1000
            await asyncio.sleep(0.05)
        assert set(changed_at) == {"fast", "full"}, changed_at
        assert changed_at["fast"] < GENERATION_CHECK_SECONDS + 1.5, changed_at
    finally:
        await client.aclose()
        fast.stop()
        full.stop()
    no_tracebacks(fast, full)


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_a_relayed_404_ends_remembered_heads_on_every_worker(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str, workers: str
) -> None:
    """Deleted behind the edge; an append it relays is answered 404: the stream ends on every
    worker (``test_gone``), its remembered heads with it."""
    target = f"{stream_path}?offset=-1"
    await make_stream(http, origin.url + stream_path, TEXT, b"g" * 700, close=True)
    with edge_pair(origin, logs_dir, f"gone-{workers}", "--workers", workers) as (fast, full):
        want = await remembered(full.url, target)
        await remembered(fast.url, target)
        for _ in range(12):  # fresh connections: every worker remembers it
            same(await get(fast.url, target), want)
        assert (await call(http, "DELETE", origin.url + stream_path))[0] == 204
        for edge in (fast, full):
            status, _, _ = await call(
                http, "POST", edge.url + stream_path, headers={"Content-Type": TEXT}, data=b"x"
            )
            assert status == 404
        for _ in range(12):
            got, want = await both(fast, full, target)
            same(got, want)
            assert b"404" in got.status_line
        no_tracebacks(fast, full)


async def test_the_origin_forbids_storing_under_remembered_heads(
    http: aiohttp.ClientSession,
    origin: Origin,
    logs_dir: Path,
    stream_path: str,
    cors_switch: tuple[str, dict[str, str]],
) -> None:
    """The origin starts saying ``no-store`` for the stream (learned from a fill of another
    range of it): a remembered head of it is the full path's again, relayed as it relays."""
    url, mode = cors_switch
    await make_stream(http, origin.url + stream_path, TEXT, close=False)
    status, headers, _ = await call(
        http, "POST", origin.url + stream_path, headers={"Content-Type": TEXT}, data=b"1" * 600
    )
    assert status == 204
    middle = next(v for n, v in headers if n.lower() == "stream-next-offset")
    for part in (b"2" * 600,):
        await call(
            http, "POST", origin.url + stream_path, headers={"Content-Type": TEXT}, data=part
        )
    await call(http, "POST", origin.url + stream_path, headers={"Stream-Closed": "true"})
    target = f"{stream_path}?offset=-1"
    fast = await asyncio.to_thread(start_edge, url, logs_dir, *ONE, name="no-store-fast")
    full = await asyncio.to_thread(
        start_edge, url, logs_dir, *ONE, "--fast-path", "off", name="no-store-full"
    )
    try:
        want = await remembered(full.url, target)
        same(await remembered(fast.url, target), want)
        mode["no-store"] = "yes"
        for edge in (fast, full):  # a range neither holds as such: filled from the origin
            filled = await get(edge.url, f"{stream_path}?offset={middle}")
            assert filled.body == b"2" * 600
        for _ in range(4):
            got, want = await both(fast, full, target)
            assert got.header(b"Cache-Control") == b"no-store"
            assert given(got) == given(want)
    finally:
        await asyncio.to_thread(fast.stop)
        await asyncio.to_thread(full.stop)
    no_tracebacks(fast, full)


def aliases(path: str) -> list[str]:
    """Targets the origin routes to ``path`` (``edge.protocol.paths``)."""
    head, _, name = path.rpartition("/")
    return [
        path,
        f"{head}/./{name}",
        f"{head}/%2e/{name}",
        f"{head}/x/../{name}",
        f"{head}\\{name}",
        f"http://elsewhere.example{path}",
    ]


async def test_alias_heads_end_with_a_delete_through_another_alias(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    await make_stream(http, origin.url + stream_path, TEXT, b"a" * 900, close=True)
    targets = [f"{alias}?offset=-1" for alias in aliases(stream_path)]
    with pair(origin, logs_dir, "aliases") as (fast, full):
        for target in targets:
            same(await remembered(fast.url, target), await remembered(full.url, target))
        # Deleted through the edge by an alias, recreated with other bytes at the same offsets.
        head, _, name = stream_path.rpartition("/")
        status, _, _ = await call(http, "DELETE", exact_url(fast.url + f"{head}/%2e/{name}"))
        assert status == 204
        assert (await call(http, "POST", f"{full.admin_url}/purge?path={stream_path}"))[0] == 200
        await make_stream(http, origin.url + stream_path, TEXT, b"b" * 900, close=True)
        for _ in range(3):
            for target in targets:
                got, want = await both(fast, full, target)
                same(got, want)
                assert got.body == b"b" * 900, target


async def test_a_credentials_scope_forgotten_ends_its_remembered_heads_alone(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    """Credentials split cache scopes (no --auth): a 404 the origin gives one credential's
    read forgets that scope; its remembered heads end, every other scope's answer as the full
    path gives it."""
    target = f"{stream_path}?offset=-1"
    await make_stream(http, origin.url + stream_path, TEXT, b"s" * 800, close=True)
    scopes = [(), ("Authorization: Bearer one",), ("Authorization: Bearer two",)]
    with pair(origin, logs_dir, "scopes") as (fast, full):
        for headers in scopes:
            same(
                await remembered(fast.url, target, *headers),
                await remembered(full.url, target, *headers),
            )
        assert (await call(http, "DELETE", origin.url + stream_path))[0] == 204
        for edge in (fast, full):  # relayed (an unknown parameter), answered 404
            gone = await get(edge.url, f"{target}&x=1", *scopes[1])
            assert b"404" in gone.status_line
        for _ in range(3):
            for headers in scopes:
                got, want = await both(fast, full, target, *headers)
                assert given(got) == given(want), headers
        assert b"404" in (await get(fast.url, target, *scopes[1])).status_line
