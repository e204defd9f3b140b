"""Reads the connection protocol serves itself with ``--auth jwt|forward``, against the real
origin: long-polls (released, at once, at the timeout), SSE (open and frames) and catch-up
misses, each authorized by the gate's own code and byte for byte the answer of an edge with
``--fast-path off`` beside it; refusals (no credential, a bad one, another stream's) identical;
and no aiohttp handler entered for any of them (``edge_full_path_requests_total``).

Three ways in: a JWT as ``Authorization: Bearer``, a JWT as a ``token`` query parameter, and a
forward-auth service's session cookie; the service's verdicts kept (decided at once after the
first) or never kept (``--auth-cache-seconds 0``: every read waits for the service, in a task
of its connection's)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin, start_edge
from tests.auth_support import hs_key, jwks, token
from tests.integration.auth_services import AuthService
from tests.integration.own_reads_support import (
    CORS_ORIGIN,
    READ_KINDS,
    MixedLoad,
    Raw,
    append,
    edge_pair,
    exchange,
    full_path_requests,
    host_port,
    make_stream,
    request,
    settled,
    tail_of,
)
from tests.integration.test_own_relay import StandIn, stand_in
from tests.integration.test_passthrough import call, metric_value

build_request = request  # a test's own ``request`` is pytest's fixture request
__all__ = ["stand_in"]  # ``test_own_relay``'s stand-in origin, a fixture here too

HS = hs_key("hs-own")
EDGE_SECRET = "Bearer edge-secret"
TIMEOUT_SECONDS = 2
ARGS = (
    "--workers", "1", "--long-poll-timeout", str(TIMEOUT_SECONDS),
    "--origin-header", f"Authorization: {EDGE_SECRET}",
)  # fmt: skip
KINDS = READ_KINDS


@dataclass(frozen=True)
class Way:
    """How a reader presents its credential to a pair of edges."""

    name: str
    fast: Edge
    full: Edge
    service: AuthService | None = None

    def credential(self, path: str, *, sub: str = "viewer", lifetime: float = 300.0) -> str:
        """What a reader of ``path`` sends: a header line, or ``token=...`` for the query."""
        if self.name == "jwt-query":
            return "token=" + token(HS, path, sub=sub, lifetime=lifetime)
        if self.name == "jwt":
            return f"Authorization: Bearer {token(HS, path, sub=sub, lifetime=lifetime)}"
        return "Cookie: session=reader"

    def target(self, path: str, query: str, credential: str) -> str:
        if credential.startswith("token="):
            return f"{path}?{query}&{credential}" if query else f"{path}?{credential}"
        return f"{path}?{query}" if query else path

    def headers(self, credential: str, *extra: str) -> tuple[str, ...]:
        return extra if credential.startswith("token=") else (credential, *extra)


@pytest.fixture(scope="module")
def jwt_pair(
    origin: Origin, logs_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Edge, Edge]]:
    keys = tmp_path_factory.mktemp("jwks-own") / "jwks.json"
    keys.write_bytes(jwks(HS))
    args = ("--auth", "jwt", "--jwt-jwks", str(keys), "--jwt-leeway", "0", *ARGS)
    with edge_pair(origin, logs_dir, "own-jwt", *args) as pair:
        yield pair


@pytest.fixture(scope="module")
def service() -> Iterator[AuthService]:
    started = AuthService(sessions={"reader": "/v1/stream/"}).start()
    yield started
    assert started.server is not None
    started.server.close()


@pytest.fixture(scope="module")
def forward_pair(
    origin: Origin, logs_dir: Path, service: AuthService
) -> Iterator[tuple[Edge, Edge]]:
    args = ("--auth", "forward", "--auth-url", service.url, *ARGS)
    with edge_pair(origin, logs_dir, "own-forward", *args) as pair:
        yield pair


@pytest.fixture(scope="module")
def asking_pair(
    origin: Origin, logs_dir: Path, service: AuthService
) -> Iterator[tuple[Edge, Edge]]:
    """Edges that keep no verdict: every read waits for the service."""
    args = ("--auth", "forward", "--auth-url", service.url, "--auth-cache-seconds", "0", *ARGS)
    with edge_pair(origin, logs_dir, "own-asking", *args) as pair:
        yield pair


WAYS = ("jwt", "jwt-query", "forward", "forward-asking")


@pytest.fixture(params=WAYS)
def way(request: pytest.FixtureRequest, service: AuthService) -> Way:
    name = request.param
    if name.startswith("jwt"):
        fast, full = request.getfixturevalue("jwt_pair")
        return Way(name, fast, full)
    fixture = "asking_pair" if name == "forward-asking" else "forward_pair"
    fast, full = request.getfixturevalue(fixture)
    return Way(name, fast, full, service)


async def both(way: Way, target: str, *headers: str) -> list[Raw]:
    """The one request, sent to both edges at once."""
    answers = await asyncio.gather(
        *(exchange(e.url, request(target, *headers), ["GET"]) for e in (way.fast, way.full))
    )
    return [a[0] for a in answers]


@pytest.mark.parametrize("cors", [False, True])
async def test_authorized_reads_are_the_full_paths_answers_and_enter_no_handler(
    http: aiohttp.ClientSession, origin: Origin, way: Way, stream_path: str, cors: bool
) -> None:
    fast, full = way.fast, way.full
    credential = way.credential(stream_path)
    headers = way.headers(credential, *((CORS_ORIGIN,) if cors else ()))

    def at(query: str) -> str:
        return way.target(stream_path, query, credential)

    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"first ", close=False)
    middle = await tail_of(http, url)
    tail = await append(http, url, b"second")
    # A first catch-up and long-poll: the first ones fill the log and start the tail, and a
    # CORS Origin is learnt from the origin's answer (relayed, by the connection's own relay).
    entered = full_path_requests(fast)
    for edge in (fast, full):
        await exchange(edge.url, request(at("offset=-1"), *headers), ["GET"])
        first = await exchange(
            edge.url, request(at(f"offset={tail}&live=long-poll"), *headers), ["GET"]
        )
        assert first[0].status_line.split()[1] in (b"200", b"204"), first
    allowed = [decisions(e, allowed=True) for e in (fast, full)]

    # Catch-up misses and their revalidation.
    middle_reads = await both(way, at(f"offset={middle}"), *headers)
    assert middle_reads[0].status_line == b"HTTP/1.1 200 OK"
    assert middle_reads[0].body == b"second"
    assert middle_reads[0].comparable() == middle_reads[1].comparable()
    assert b"private" in (middle_reads[0].header(b"Cache-Control") or b"")

    # At the tail: parked, then released by an append.
    poll = at(f"offset={tail}&live=long-poll")
    waiting = [
        asyncio.ensure_future(exchange(e.url, request(poll, *headers), ["GET"]))
        for e in (fast, full)
    ]
    await asyncio.sleep(0.3)
    assert not any(w.done() for w in waiting)
    new_tail = await append(http, url, b"third")
    released = [a[0] for a in await asyncio.wait_for(asyncio.gather(*waiting), 10)]
    assert released[0].body == b"third"
    assert released[0].comparable() == released[1].comparable()

    # Behind the tail: at once.
    behind = await both(way, poll, *headers)
    assert behind[0].body == b"third"
    assert behind[0].comparable() == behind[1].comparable()

    # Nothing arrives: 204 at the timeout.
    timed_out = await both(way, at(f"offset={new_tail}&live=long-poll"), *headers)
    assert timed_out[0].status_line == b"HTTP/1.1 204 No Content"
    assert timed_out[0].comparable() == timed_out[1].comparable()

    # SSE: open, catch-up frames, a live append, the closure.
    live = [
        asyncio.ensure_future(exchange(e.url, request(at("offset=-1&live=sse"), *headers), ["GET"]))
        for e in (fast, full)
    ]
    await asyncio.sleep(0.5)
    await append(http, url, b" fourth")
    await asyncio.sleep(0.3)
    status, _, _ = await call(http, "POST", url, headers={"Stream-Closed": "true"})
    assert status == 204
    streamed = [a[0] for a in await asyncio.wait_for(asyncio.gather(*live), 15)]
    assert streamed[0].status_line == b"HTTP/1.1 200 OK"
    assert b"first second" in streamed[0].body
    assert b" fourth" in streamed[0].body
    assert b'"streamClosed":true' in streamed[0].body
    assert streamed[0].comparable()[1] == streamed[1].comparable()[1]  # headers, in order

    assert full_path_requests(fast) == entered
    assert full_path_requests(full) != entered
    # Every read was allowed once, on either edge: counted where the full path counts it.
    now_allowed = [decisions(e, allowed=True) for e in (fast, full)]
    assert now_allowed[0] - allowed[0] == now_allowed[1] - allowed[1] == 5
    if way.service is not None:
        # The service was asked about both edges' readers alike: the same Host, the same
        # client address.
        assert set(way.service.forwarded) == {("edge.test", "127.0.0.1")}


def decisions(edge: Edge, *, allowed: bool) -> float:
    """``edge_auth_decisions_total``: the allowed ones, or every refusal."""
    total = 0.0
    for line in edge.metrics_text().splitlines():
        counted = line.startswith("edge_auth_decisions_total{")
        if counted and ('result="allowed"' in line) == allowed:
            total += float(line.rsplit(" ", 1)[1])
    return total


def refusals(edge: Edge) -> float:
    text = edge.metrics_text()
    return sum(
        metric_value(text, "edge_requests_total", kind=kind, code=code)
        for kind in KINDS
        for code in ("401", "403")
    )


async def test_refusals_are_the_full_paths_and_written_by_the_connection(
    http: aiohttp.ClientSession, origin: Origin, way: Way, stream_path: str
) -> None:
    fast, full = way.fast, way.full
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"kept ", close=False)
    tail = await tail_of(http, url)
    other = stream_path + "-other"
    if way.name.startswith("jwt"):
        bad = "Authorization: Bearer " + token(HS, stream_path)[:-4] + "AAAA"
        wrong = "Authorization: Bearer " + token(HS, other)
        # A key the edge does not hold: decided after a look at the key set, in a task.
        stranger = "Authorization: Bearer " + token(hs_key("stranger"), stream_path)
        unknown = [bad, wrong, stranger]
    else:
        assert way.service is not None
        way.service.sessions["elsewhere"] = other
        unknown = ["Cookie: session=stranger", "Cookie: session=elsewhere"]
    # Both edges learn the origin's CORS headers alike (a refusal carries them).
    credential = way.credential(stream_path)
    for origin_sent in ((), (CORS_ORIGIN,)):
        target = way.target(stream_path, "offset=-1", credential)
        await both(way, target, *way.headers(credential), *origin_sent)
    entered = full_path_requests(fast)
    refused_before = refusals(fast)
    decided_before = [decisions(e, allowed=False) for e in (fast, full)]
    count = 0
    for query in ("offset=-1", f"offset={tail}&live=long-poll", "offset=-1&live=sse"):
        for sent in ([], *([u] for u in unknown)):
            for extra in ((), (CORS_ORIGIN,)):
                answers = await both(way, f"{stream_path}?{query}", *sent, *extra)
                assert answers[0].status_line.split()[1] in (b"401", b"403"), (query, sent)
                assert answers[0].comparable() == answers[1].comparable(), (query, sent)
                count += 1
    for sent in ([], *([u] for u in unknown)):  # a HEAD: the GET's head, no body
        heads = await asyncio.gather(
            *(
                exchange(e.url, request(stream_path, *sent, method="HEAD"), ["HEAD"])
                for e in (fast, full)
            )
        )
        assert heads[0][0].status_line.split()[1] in (b"401", b"403"), sent
        assert heads[0][0].comparable() == heads[1][0].comparable(), sent
        count += 1
    decided = [decisions(e, allowed=False) for e in (fast, full)]
    assert decided[0] - decided_before[0] == decided[1] - decided_before[1] == count
    # Pipelined behind a refusal, an allowed read is answered on the same connection.
    payload = request(f"{stream_path}?offset=-1") + request(
        way.target(stream_path, "offset=-1", credential), *way.headers(credential)
    )
    refused, allowed = await exchange(fast.url, payload, ["GET", "GET"])
    assert refused.status_line.split()[1] == b"401"
    assert allowed.status_line == b"HTTP/1.1 200 OK"
    assert allowed.body == b"kept "
    assert full_path_requests(fast) == entered
    assert refusals(fast) == refused_before + count + 1


async def test_a_credential_that_expires_ends_its_live_reads_as_the_full_path_does(
    http: aiohttp.ClientSession, origin: Origin, jwt_pair: tuple[Edge, Edge], stream_path: str
) -> None:
    """A long-poll parked on a JWT that expires before the timeout is answered then (204), and
    an SSE viewer's body ends cleanly then; the next read with it is refused."""
    fast, full = jwt_pair
    way = Way("jwt", fast, full)
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"soon ", close=False)
    tail = await tail_of(http, url)
    lasting = way.credential(stream_path, sub="lasting")
    for edge in (fast, full):  # the log filled and the tail started
        await exchange(edge.url, request(f"{stream_path}?offset=-1", lasting), ["GET"])
        await exchange(
            edge.url, request(f"{stream_path}?offset={tail}&live=long-poll", lasting), ["GET"]
        )
    entered = full_path_requests(fast)
    brief = way.credential(stream_path, sub="brief", lifetime=1.5)
    polls = await both(way, f"{stream_path}?offset={tail}&live=long-poll", brief)
    assert polls[0].status_line == b"HTTP/1.1 204 No Content"
    assert polls[0].comparable() == polls[1].comparable()
    # An SSE body would go on for --sse-max-seconds: it ends (and ``exchange`` reads it
    # whole) only because its credential expires.
    brief = way.credential(stream_path, sub="brief-sse", lifetime=1.5)
    viewers = await both(way, f"{stream_path}?offset=-1&live=sse", brief)
    assert viewers[0].status_line == b"HTTP/1.1 200 OK"
    assert b"soon " in viewers[0].body
    assert viewers[0].comparable()[1] == viewers[1].comparable()[1]
    await asyncio.sleep(1.6)
    late = await both(way, f"{stream_path}?offset={tail}&live=long-poll", brief)
    assert late[0].status_line == b"HTTP/1.1 401 Unauthorized"
    assert late[0].comparable() == late[1].comparable()
    assert full_path_requests(fast) == entered


async def test_a_missing_stream_and_pipelined_reads_are_answered_as_the_full_path_does(
    http: aiohttp.ClientSession, origin: Origin, way: Way, stream_path: str
) -> None:
    """The origin's 404 to an authorized reader (each kind of read), and reads pipelined on
    one connection, each decided in turn (in the asking mode each waits for the service while
    the ones behind it wait unread)."""
    fast, full = way.fast, way.full
    missing = stream_path + "-never"
    credential = way.credential(missing)
    entered = full_path_requests(fast)
    for query in ("offset=-1", "offset=-1&live=long-poll", "offset=-1&live=sse"):
        answers = await both(way, way.target(missing, query, credential), *way.headers(credential))
        assert answers[0].status_line.split()[1] == b"404", query
        assert answers[0].comparable() == answers[1].comparable(), query
    # (The origin's 404 carries its own Date: handed on, nothing written, and written by the
    # connection's own relay with it, with the read's admission.)
    assert full_path_requests(fast) == entered
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"one ", close=False)
    middle = await tail_of(http, url)
    tail = await append(http, url, b"two")
    credential = way.credential(stream_path)
    sent = way.headers(credential)
    entered = full_path_requests(fast)

    def at(query: str) -> bytes:
        return request(way.target(stream_path, query, credential), *sent)

    for edge in (fast, full):
        await exchange(edge.url, at(f"offset={tail}&live=long-poll"), ["GET"])
    payload = (
        at(f"offset={middle}&live=long-poll")
        + request(f"{stream_path}?offset=-1")  # refused: no credential
        + at("offset=-1")
        + at(f"offset={tail}&live=long-poll")
        + at(f"offset={middle}")
    )
    methods = ["GET"] * 5
    answers = await asyncio.gather(*(exchange(e.url, payload, methods) for e in (fast, full)))
    assert [a.body for a in answers[0]][::2] == [b"two", b"one two", b"two"]
    assert [a.status_line.split()[1] for a in answers[0]][1::2] == [b"401", b"204"]
    for got, want in zip(answers[0], answers[1], strict=True):
        assert got.comparable() == want.comparable()
    assert full_path_requests(fast) == entered


async def test_a_reader_waiting_for_the_service_may_half_close_or_leave(
    origin: Origin,
    service: AuthService,
    asking_pair: tuple[Edge, Edge],
    http: aiohttp.ClientSession,
    stream_path: str,
) -> None:
    """While the service is slow: a reader that half-closes after its request gets its answer,
    then the close; one that leaves is let go, and the edge serves the next reader."""
    fast, _ = asking_pair
    await make_stream(http, origin.url + stream_path, "text/plain", b"patient", close=True)
    entered = full_path_requests(fast)
    service.mode, service.delay = "slow", 0.5
    try:
        reader, writer = await asyncio.open_connection(*host_port(fast.url))
        writer.write(request(f"{stream_path}?offset=-1", "Cookie: session=reader"))
        await writer.drain()
        writer.write_eof()  # half-closed while the gate waits for the service
        answered = await asyncio.wait_for(reader.read(), 10)  # to the close
        assert answered.startswith(b"HTTP/1.1 200 OK")
        assert answered.endswith(b"patient")
        writer.close()
        _, leaving = await asyncio.open_connection(*host_port(fast.url))
        leaving.write(request(f"{stream_path}?offset=-1", "Cookie: session=reader"))
        await leaving.drain()
        leaving.transport.abort()  # gone before the service answers
    finally:
        service.mode = "ok"
    after = await exchange(
        fast.url, request(f"{stream_path}?offset=-1", "Cookie: session=reader"), ["GET"]
    )
    assert after[0].body == b"patient"
    assert full_path_requests(fast) == entered


# --- reads the connection relays, with the admission its gate decided (issue 29) ---


def origin_heads(edge: Edge) -> float:
    text = edge.metrics_text()
    return sum(
        metric_value(text, "edge_origin_requests_total", kind="head", code=code)
        for code in ("200", "404")
    )


def asked_of_service(way: Way) -> int:
    return 0 if way.service is None else len(way.service.asked)


async def test_relayed_reads_are_decided_once_and_are_the_full_paths(
    http: aiohttp.ClientSession, origin: Origin, way: Way, stream_path: str
) -> None:
    """A HEAD miss, a HEAD of a missing stream, ``offset=now`` (a read and a long-poll), and
    live reads whose CORS answer is unknown for their ``Origin``, all with the gate's
    admission: relayed by the connection (no aiohttp handler entered), byte for byte the full
    path's, each decided once (``edge_auth_decisions_total``; without kept verdicts, the
    service asked once per read)."""
    fast, full = way.fast, way.full
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"relayed ", close=False)
    credential = way.credential(stream_path)
    missing = stream_path + "-never"
    missing_credential = way.credential(missing)
    sent = way.headers(credential)
    reads: list[tuple[bytes, str, bytes]] = [
        (request(way.target(stream_path, "", credential), *sent, method="HEAD"), "HEAD", b"200"),
        (
            request(way.target(missing, "", missing_credential), *way.headers(missing_credential),
                    method="HEAD"),
            "HEAD",
            b"404",
        ),
        (request(way.target(stream_path, "offset=now", credential), *sent), "GET", b"200"),
        (
            request(way.target(stream_path, "offset=now&live=long-poll", credential), *sent),
            "GET",
            b"204",
        ),
    ]  # fmt: skip
    entered = full_path_requests(fast)
    allowed = [decisions(e, allowed=True) for e in (fast, full)]
    for edge in (fast, full):
        # One edge at a time, so that the service's questions are each edge's own.
        before = asked_of_service(way)
        for payload, method, status in reads:
            answer = (await exchange(edge.url, payload, [method]))[0]
            assert answer.status_line.split()[1] == status, (edge.url, payload)
        if way.name == "forward-asking":
            assert asked_of_service(way) - before == len(reads), edge.url
    # Byte for byte (a HEAD both edges now know is the edge's own answer: asked again, alike).
    for payload, method, _ in reads:
        answers = await asyncio.gather(*(exchange(e.url, payload, [method]) for e in (fast, full)))
        assert answers[0][0].comparable() == answers[1][0].comparable(), payload
    # A live read from an Origin neither edge has asked the origin about: relayed so that the
    # origin's answer teaches the edge.
    tail = await tail_of(http, url)
    poll = way.target(stream_path, f"offset={tail}&live=long-poll", credential)
    taught = await both(way, poll, *sent, f"Origin: https://relay-{way.name}.example")
    assert taught[0].status_line.split()[1] in (b"200", b"204")
    assert taught[0].comparable() == taught[1].comparable()
    # Closed and read whole: a HEAD is then the edge's own answer, looked up in the policy's
    # scope (the origin is not asked).
    status, _, _ = await call(http, "POST", url, headers={"Stream-Closed": "true"})
    assert status == 204
    await both(way, way.target(stream_path, "offset=-1", credential), *sent)
    heads_asked = [origin_heads(e) for e in (fast, full)]
    known = await asyncio.gather(*(exchange(e.url, reads[0][0], ["HEAD"]) for e in (fast, full)))
    assert known[0][0].header(b"Stream-Closed") == b"true"
    assert known[0][0].comparable() == known[1][0].comparable()
    assert [origin_heads(e) for e in (fast, full)] == heads_asked
    assert full_path_requests(fast) == entered
    now_allowed = [decisions(e, allowed=True) for e in (fast, full)]
    count = 2 * len(reads) + 3
    assert now_allowed[0] - allowed[0] == now_allowed[1] - allowed[1] == count


async def test_an_origin_that_is_down_is_a_502_relayed_with_the_admission(
    logs_dir: Path, service: AuthService, tmp_path: Path
) -> None:
    """jwt and forward: every kind of read to an origin that is down is the full path's 502,
    written by the connection, and nothing enters aiohttp's handler."""
    down = "http://127.0.0.1:9"  # nothing listens there
    keys = tmp_path / "jwks.json"
    keys.write_bytes(jwks(HS))
    path = "/v1/stream/down"
    modes = {
        "jwt": (("--auth", "jwt", "--jwt-jwks", str(keys)), "jwt"),
        "forward": (("--auth", "forward", "--auth-url", service.url,
                     "--auth-cache-seconds", "0"), "forward"),
    }  # fmt: skip
    for mode, (args, way_name) in modes.items():
        fast = await asyncio.to_thread(
            start_edge, down, logs_dir, *args, *ARGS, name=f"own-auth-down-{mode}"
        )
        try:
            full = await asyncio.to_thread(
                start_edge, down, logs_dir, *args, *ARGS, "--fast-path", "off",
                name=f"own-auth-down-{mode}-full",
            )  # fmt: skip
            try:
                way = Way(way_name, fast, full)
                credential = way.credential(path)
                payload = b"".join(
                    request(way.target(path, query, credential), *way.headers(credential),
                            method=method)
                    for query, method in (("offset=now", "GET"), ("", "HEAD"),
                                          ("offset=-1", "GET"), ("offset=-1&live=long-poll", "GET"),
                                          ("offset=-1&live=sse", "GET"))
                )  # fmt: skip
                methods = ["GET", "HEAD", "GET", "GET", "GET"]
                answers = await asyncio.gather(
                    *(exchange(e.url, payload, methods) for e in (fast, full))
                )
                assert {a.status_line for a in answers[0]} == {b"HTTP/1.1 502 Bad Gateway"}, mode
                for got, want in zip(answers[0], answers[1], strict=True):
                    assert got.comparable() == want.comparable(), mode
                assert full_path_requests(fast) == dict.fromkeys(KINDS, 0.0), mode
                assert decisions(fast, allowed=True) == decisions(full, allowed=True) == 5
            finally:
                await asyncio.to_thread(full.stop)
        finally:
            await asyncio.to_thread(fast.stop)


@pytest.mark.parametrize("name", ["jwt", "forward-asking"])
async def test_a_mixed_gated_read_load_enters_no_aiohttp_handler(
    http: aiohttp.ClientSession,
    origin: Origin,
    service: AuthService,
    stream_path: str,
    name: str,
    request: pytest.FixtureRequest,
) -> None:
    """Authorized readers read one run every way at once while an agent appends: catch-ups
    from the start and each offset they learn, long-polls following the tail, SSE viewers,
    HEADs and reads at ``now``. aiohttp's request handler sees none of them, and every
    follower gets every byte once, in order."""
    fast, full = request.getfixturevalue("jwt_pair" if name == "jwt" else "asking_pair")
    way = Way(name, fast, full, None if name == "jwt" else service)
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"0;", close=False)
    credential = way.credential(stream_path)
    sent = way.headers(credential)

    def at(query: str, method: str) -> bytes:
        return build_request(way.target(stream_path, query, credential), *sent, method=method)

    entered = full_path_requests(fast)
    allowed = decisions(fast, allowed=True)
    asked = asked_of_service(way)
    load = MixedLoad(http, fast, url, at)
    await load.run(first=b"0;", pollers=4, viewers=2, readers=2, rounds=10, appends=20)
    assert full_path_requests(fast) == entered
    # Every read decided once: allowed once each; without kept verdicts the service is asked
    # at most once a read (identical questions in flight at once share one answer).
    assert decisions(fast, allowed=True) - allowed == load.reads
    if way.service is not None:
        assert 0 < asked_of_service(way) - asked <= load.reads


async def test_a_bypassed_stream_is_relayed_with_the_edges_credential_and_decided_once(
    stand_in: StandIn, logs_dir: Path, tmp_path: Path
) -> None:
    """A stream the origin forbids keeping (``no-store``), read with a JWT: relayed by the
    connection without validators, upstream with the edge's ``--origin-header`` (never the
    reader's token), its answer the full path's byte for byte, each read allowed once."""
    keys = tmp_path / "jwks.json"
    keys.write_bytes(jwks(HS))
    args = ("--auth", "jwt", "--jwt-jwks", str(keys), *ARGS)
    fast = await asyncio.to_thread(start_edge, stand_in.url, logs_dir, *args, name="own-auth-ns")
    try:
        full = await asyncio.to_thread(
            start_edge, stand_in.url, logs_dir, *args, "--fast-path", "off",
            name="own-auth-ns-full",
        )  # fmt: skip
        try:
            path = "/v1/stream/no-store"
            reader = f"Authorization: Bearer {token(HS, path)}"
            for _ in range(3):  # the first answer says no-store; those after are bypassed
                answers = await asyncio.gather(
                    *(exchange(e.url, request(f"{path}?offset=-1", reader), ["GET"])
                      for e in (fast, full))
                )  # fmt: skip
                assert answers[0][0].body == b"kept nowhere"
                assert answers[0][0].comparable() == answers[1][0].comparable()
            assert set(stand_in.authorizations) == {EDGE_SECRET}
            text = fast.metrics_text()
            assert metric_value(text, "edge_cache_requests_total", result="bypass") >= 2
            assert full_path_requests(fast) == dict.fromkeys(KINDS, 0.0)
            assert decisions(fast, allowed=True) == decisions(full, allowed=True) == 3
        finally:
            await asyncio.to_thread(full.stop)
    finally:
        await asyncio.to_thread(fast.stop)


IMF_DATE = "Tue, 01 Dec 2026 04:40:00 GMT"
# Heads the connection once handed to aiohttp (``test_own_heads.py`` has them all, ungated).
ODD_HEADS = {
    "range-and-conditionals": ("Range: bytes=0-2", f"If-Modified-Since: {IMF_DATE}"),
    "lists-twice": ('If-None-Match: "a"', 'If-None-Match: "b"', "Accept-Encoding: identity",
                    "Accept-Encoding: gzip"),
    "connection-list": ("Connection: keep-alive, TE", "TE: trailers"),
    "origin-twice": (CORS_ORIGIN, "Origin: https://b.example"),
}  # fmt: skip


async def test_odd_heads_are_decided_and_served_by_the_connection_as_the_full_path_serves_them(
    http: aiohttp.ClientSession, origin: Origin, way: Way, stream_path: str
) -> None:
    """``Range`` and the conditionals the edge ignores, repeated list fields, a ``Connection``
    token list and an absolute-form target, with each way's credential: the full path's
    answers, and a repeated ``Origin`` its 400 before the gate; no aiohttp handler entered."""
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"first ", b"second", close=True)
    credential = way.credential(stream_path)
    tail = await tail_of(http, url)
    catchup = way.target(stream_path, "offset=-1", credential)
    await settled((way.fast, way.full), catchup, *way.headers(credential))
    entered = full_path_requests(way.fast)
    for name, extra in ODD_HEADS.items():
        headers = way.headers(credential, *extra)
        for query in ("offset=-1", f"offset={tail}&live=long-poll", "offset=-1&live=sse"):
            for prefix in ("", "http://edge.test"):
                target = prefix + way.target(stream_path, query, credential)
                fast, full = await both(way, target, *headers)
                if fast.comparable() != full.comparable():
                    print(
                        "FAST",
                        fast.status_line,
                        [h for h in fast.comparable()[1] if not h[0].startswith(b"Access")],
                    )
                    print(
                        "FULL",
                        full.status_line,
                        [h for h in full.comparable()[1] if not h[0].startswith(b"Access")],
                    )
                assert fast.comparable() == full.comparable(), (name, target)
                expected = (b"400",) if name == "origin-twice" else (b"200", b"204")
                assert fast.status_line.split()[1] in expected, (name, target, fast)
    # HTTP/1.0: answered as HTTP/1.1 answers it, then closed, on both paths; a refusal too.
    queries = [("offset=-1", credential), ("offset=-1&live=sse", credential), ("offset=-1", "")]
    for query, sent in queries:
        sent_headers = way.headers(sent) if sent else ()
        http11 = build_request(way.target(stream_path, query, sent), *sent_headers)
        payload = http11.replace(b" HTTP/1.1\r\n", b" HTTP/1.0\r\n", 1)
        fast, full = [(await exchange(e.url, payload, ["GET"]))[0] for e in (way.fast, way.full)]
        assert fast.comparable() == full.comparable(), (query, sent)
        assert fast.status_line.startswith(b"HTTP/1.1 "), fast.status_line
        assert fast.header(b"Connection") == b"close"
        assert fast.status_line.split()[1] == (b"200" if sent else b"401"), fast.status_line
    assert full_path_requests(way.fast) == entered
