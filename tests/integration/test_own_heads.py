"""Every read head is the connection's, whatever it carries (issue 29): ``Range`` and the
conditionals the edge does not consult, repeated list fields (one value, RFC 9110 §5.3), a
repeated ``Origin`` or ``Last-Event-ID`` (a 400), ``Connection`` token lists, absolute-form
targets (RFC 9112 §3.2.2), targets the edge refuses (400) and loops (508). Each answer is the
full path's (``--fast-path off``) byte for byte but for ``Date`` and ``Age``'s value, for
catch-up, HEAD, long-poll and SSE, one at a time and pipelined; aiohttp's request handler sees
none of them (``edge_full_path_requests_total``), under a mixed load too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin
from tests.integration.own_reads_support import (
    READ_KINDS,
    Raw,
    append,
    edge_pair,
    exchange,
    full_path_requests,
    host_port,
    make_stream,
    read_answers,
    settled,
    tail_of,
)
from tests.integration.test_passthrough import call

ARGS = ("--workers", "1", "--long-poll-timeout", "2")
CORS_ORIGIN = "Origin: https://app.example"
DATE = "Tue, 01 Dec 2026 04:40:00 GMT"

# Header lines a read may carry that the connection once handed to aiohttp.
VARIANTS: dict[str, tuple[str, ...]] = {
    "range": ("Range: bytes=0-3",),
    "if-match": ('If-Match: "nope"',),
    "if-modified-since": (f"If-Modified-Since: {DATE}",),
    "if-unmodified-since": (f"If-Unmodified-Since: {DATE}",),
    "if-range": ('If-Range: "nope"', "Range: bytes=1-2"),
    "if-none-match-twice": ('If-None-Match: "a"', 'If-None-Match: "b"'),
    "accept-encoding-twice": ("Accept-Encoding: identity", "Accept-Encoding: gzip"),
    "origin": (CORS_ORIGIN,),
    "origin-twice": (CORS_ORIGIN, "Origin: https://other.example"),
    "last-event-id-twice": ("Last-Event-ID: x", "Last-Event-ID: y"),
    "connection-list": ("Connection: keep-alive, TE", "TE: trailers"),
    "connection-list-close": ("Connection: x-hop, close", "X-Hop: 1"),
    "via": ("Via: 1.1 cdn",),
    "via-loop": ("Via: 1.1 cdn, 1.1 edge",),
    "via-loop-twice": ("Via: 1.1 cdn", "Via: 1.0 edge"),
}
# Request targets: origin-form, absolute-form, and ones the edge refuses (400).
TARGETS = {
    "origin-form": "{path}?{query}",
    "absolute-form": "http://edge.test{path}?{query}",
    "absolute-form-https": "HTTPS://elsewhere.example:8443{path}?{query}",
    "fragment": "{path}?{query}#frag",
    "ftp": "ftp://edge.test{path}?{query}",
    "ipv6-authority": "//[::1]{path}?{query}",
}


def head_bytes(method: str, target: str, *headers: str, version: str = "1.1") -> bytes:
    lines = [f"{method} {target} HTTP/{version}", "Host: edge.test", *headers, "", ""]
    return "\r\n".join(lines).encode()


def ends_connection(answer: Raw) -> bool:
    return answer.header(b"Connection") == b"close"


async def on_both(edges: tuple[Edge, Edge], payload: bytes, methods: list[str]) -> list[Raw]:
    """``payload`` sent to each edge on one connection (the fast edge first); every answer of
    the fast edge is the full path's."""
    fast = await exchange(edges[0].url, payload, methods)
    full = await exchange(edges[1].url, payload, methods)
    for mine, theirs in zip(fast, full, strict=True):
        assert mine.comparable() == theirs.comparable(), difference(mine, theirs)
    return fast


def difference(mine: Raw, theirs: Raw) -> list[object]:
    """What differs between two answers, for the assertion's message."""
    a, b = mine.comparable(), theirs.comparable()
    lines = [(x, y) for x, y in zip(a[1], b[1], strict=False) if x != y]
    return [a[0], b[0], lines, len(a[1]), len(b[1]), a[2][:80], b[2][:80]]


@pytest.fixture(scope="module")
def edges(origin: Origin, logs_dir: Path) -> Iterator[tuple[Edge, Edge]]:
    with edge_pair(origin, logs_dir, "own-heads", *ARGS) as pair:
        yield pair


def reads(path: str, tail: str) -> dict[str, tuple[str, str]]:
    """Each read kind of a closed stream: (method, query). A closed stream answers each at
    once, so both edges give the same answer whenever they are asked."""
    return {
        "catchup": ("GET", "offset=-1"),
        "head": ("HEAD", "offset=-1"),
        "long-poll-behind": ("GET", "offset=-1&live=long-poll"),
        "long-poll-at-tail": ("GET", f"offset={tail}&live=long-poll"),
        "sse": ("GET", "offset=-1&live=sse"),
    }


@pytest.mark.parametrize("variant", list(VARIANTS))
async def test_every_read_with_such_a_head_is_the_full_paths_and_the_connections(
    http: aiohttp.ClientSession,
    origin: Origin,
    edges: tuple[Edge, Edge],
    stream_path: str,
    variant: str,
) -> None:
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"first ", b"second " * 300, close=True)
    await settled(edges, f"{stream_path}?offset=-1")
    tail = await tail_of(http, url)
    before = full_path_requests(edges[0])
    for kind, (method, query) in reads(stream_path, tail).items():
        for form, shape in TARGETS.items():
            target = shape.format(path=stream_path, query=query)
            payload = head_bytes(method, target, *VARIANTS[variant])
            answer = (await on_both(edges, payload, [method]))[0]
            assert answer.status_line.startswith(b"HTTP/1.1 "), (kind, form, answer)
    assert full_path_requests(edges[0]) == before


@pytest.mark.parametrize("asked", ["", "Connection: keep-alive"], ids=["plain", "keep-alive"])
async def test_an_http10_read_is_answered_as_http11_answers_it_then_closed(
    http: aiohttp.ClientSession,
    origin: Origin,
    edges: tuple[Edge, Edge],
    stream_path: str,
    asked: str,
) -> None:
    """HTTP/1.0, keep-alive asked or not: an ``HTTP/1.1`` status line and ``Connection:
    close`` on both paths (RFC 9110 §2.5, RFC 9112 §9.3), the connection closed after the
    answer, an SSE body written to the close (no chunks), relayed reads too (HEAD, ``now``)."""
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"first ", b"second", close=True)
    await settled(edges, f"{stream_path}?offset=-1")
    tail = await tail_of(http, url)
    headers = (asked,) if asked else ()
    before = full_path_requests(edges[0])
    queries = {**reads(stream_path, tail), "now": ("GET", "offset=now")}
    for kind, (method, query) in queries.items():
        for shape in ("{path}?{query}", "http://edge.test{path}?{query}"):
            target = shape.format(path=stream_path, query=query)
            payload = head_bytes(method, target, *headers, version="1.0")
            # Once: aiohttp's parser refuses the whole of what follows a request that closes
            # (llhttp's "Data after Connection: close", a 400 in place of the first answer).
            answers = [await closed_answer(edge.url, payload, method) for edge in edges]
            for answer in answers:
                assert answer.status_line.startswith(b"HTTP/1.1 2"), (kind, answer)
                assert answer.header(b"Connection") == b"close", (kind, answer)
                assert answer.header(b"Transfer-Encoding") is None, (kind, answer)
            assert answers[0].comparable() == answers[1].comparable(), difference(*answers)
    # An SSE read with a parameter the edge does not know is relayed: the origin's chunked
    # answer is passed on to the close.
    target = f"{stream_path}?offset=-1&live=sse&_=http10"
    payload = head_bytes("GET", target, *headers, version="1.0")
    relayed = [await closed_answer(edge.url, payload, "GET") for edge in edges]
    assert (relayed[0].header(b"Cache-Status") or b"").startswith(b"edge; fwd="), relayed[0]
    assert relayed[0].header(b"Transfer-Encoding") is None
    assert b"second" in relayed[0].body
    assert relayed[0].comparable() == relayed[1].comparable(), difference(*relayed)
    assert full_path_requests(edges[0]) == before


async def closed_answer(url: str, payload: bytes, method: str) -> Raw:
    """The one answer to ``payload``, after which the edge closes the connection."""
    reader, writer = await asyncio.open_connection(*host_port(url))
    try:
        writer.write(payload)
        answer = (await asyncio.wait_for(read_answers(reader, [method]), 10))[0]
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, nothing more
        return answer
    finally:
        writer.close()


async def test_a_repeated_if_none_match_is_one_list_on_both_paths(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    """Two ``If-None-Match`` lines, the second naming the answer's tag: one list (RFC 9110
    §5.3), so both paths answer 304 (the full path once read only the first line: 200)."""
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"bytes", close=True)
    await settled(edges, f"{stream_path}?offset=-1")
    target = f"{stream_path}?offset=-1"
    first = (await on_both(edges, head_bytes("GET", target), ["GET"]))[0]
    etag = (first.header(b"ETag") or b"").decode()
    assert etag
    before = full_path_requests(edges[0])
    payload = head_bytes("GET", target, 'If-None-Match: "nope"', f"If-None-Match: {etag}")
    answer = (await on_both(edges, payload, ["GET"]))[0]
    assert answer.status_line == b"HTTP/1.1 304 Not Modified"
    assert full_path_requests(edges[0]) == before


async def test_refused_heads_are_answered_alike_and_the_connection_goes_on(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    """A 400 (a target the edge refuses, a repeated ``Origin``) and a 508 (a loop) are the
    full path's answers, with the CORS headers for the first ``Origin``, and the connection
    reads on; ``Connection: close`` among a token list closes it after the answer."""
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"bytes", close=True)
    await settled(edges, f"{stream_path}?offset=-1")
    query = "offset=-1"
    payload = (
        head_bytes("GET", f"{stream_path}?{query}#frag", CORS_ORIGIN)
        + head_bytes("HEAD", f"{stream_path}?{query}", CORS_ORIGIN, "Origin: https://b.example")
        + head_bytes("GET", f"{stream_path}?{query}", "Via: 1.1 edge")
        + head_bytes("GET", f"http://x{stream_path}?{query}", "Connection: te, close")
    )
    before = full_path_requests(edges[0])
    answers = await on_both(edges, payload, ["GET", "HEAD", "GET", "GET"])
    statuses = [a.status_line.split()[1] for a in answers]
    assert statuses == [b"400", b"400", b"508", b"200"]
    assert answers[0].header(b"Access-Control-Allow-Origin") is not None
    assert answers[1].body == b""
    assert ends_connection(answers[3])
    assert full_path_requests(edges[0]) == before


# Starts of heads llhttp refuses before their end, which never comes (no CRLF CRLF): lines
# ended by LF alone, where llhttp wants CRLF, and a TLS ClientHello sent to the HTTP port.
UNENDED = {
    "bare-lf-every-line": "GET {target} HTTP/1.1\nHost: edge.test\n\n",
    "bare-lf-one-header": "GET {target} HTTP/1.1\r\nHost: edge.test\n\r\n",
    "bare-lf-the-end": "GET {target} HTTP/1.1\r\nHost: edge.test\r\n\n",
    "tls-client-hello": "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
}


@pytest.mark.parametrize("shape", list(UNENDED))
async def test_a_head_refused_before_its_end_is_refused_as_the_full_path_refuses_it(
    http: aiohttp.ClientSession,
    origin: Origin,
    edges: tuple[Edge, Edge],
    stream_path: str,
    shape: str,
) -> None:
    """A head llhttp refuses before the CRLF CRLF end the connection looks for (which never
    comes): the full path's 400 at once, after the answers to the heads before it, and the
    connection closed; never a silent wait for an end that is not coming (the connection once
    sent nothing until the header deadline closed it)."""
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"bytes", close=True)
    await settled(edges, f"{stream_path}?offset=-1")
    target = f"{stream_path}?offset=-1"
    unended = UNENDED[shape].format(target=target).encode("latin-1")
    answer = (await on_both(edges, unended, ["GET"]))[0]
    assert answer.status_line.split()[1] == b"400", answer
    for edge in edges:
        assert (await closed_answer(edge.url, unended, "GET")).status_line.split()[1] == b"400"
    # Behind a head the connection answers: that answer, then the 400. (aiohttp alone answers
    # only the 400: llhttp refuses all it was fed at once.)
    pipelined = await exchange(edges[0].url, head_bytes("GET", target) + unended, ["GET", "GET"])
    assert [a.status_line.split()[1] for a in pipelined] == [b"200", b"400"]
    # The client's fault is one INFO line in the edge's log, not aiohttp's ERROR and traceback
    # (any client could flood the log so).
    for edge in edges:
        text = edge.process.log.read_text(errors="replace")
        assert "a malformed request (answered 400, closed)" in text
        assert "Error handling request" not in text


# Targets aiohttp's parser refuses before any application runs (its 400, then the close): not
# origin-form, and not absolute-form with a host yarl reads (``_http_parser.pyx``).
UNPARSED_TARGETS = {
    "asterisk": "*",
    "no-authority": "http://",
    "port-out-of-range": "http://edge.test:99999{path}?offset=-1",
    "unclosed-ipv6": "http://[::1{path}?offset=-1",
}


@pytest.mark.parametrize("form", list(UNPARSED_TARGETS))
@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_a_target_aiohttps_parser_refuses_is_refused_as_it_refuses_it(
    http: aiohttp.ClientSession,
    origin: Origin,
    edges: tuple[Edge, Edge],
    stream_path: str,
    form: str,
    method: str,
) -> None:
    """aiohttp's 400 and close, on both paths: the connection once answered a port out of
    range or an unclosed IPv6 host with the stream (200), and ``*`` or a hostless URL with
    the edge's own 400, keeping the connection open."""
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"bytes", close=True)
    await settled(edges, f"{stream_path}?offset=-1")
    payload = head_bytes(method, UNPARSED_TARGETS[form].format(path=stream_path))
    answers = [await closed_answer(edge.url, payload, "GET") for edge in edges]
    assert answers[0].status_line.split()[1] == b"400", answers[0]
    assert answers[0].comparable() == answers[1].comparable(), difference(*answers)


async def test_pipelined_heads_of_every_kind_are_answered_in_order(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    """Every variant of every read, pipelined on one connection: the full path's answers, in
    order, and none through aiohttp's handler."""
    url = origin.url + stream_path
    await make_stream(http, url, "application/json", b'{"a":1}', b'{"b":2}', close=True)
    await settled(edges, f"{stream_path}?offset=-1")
    tail = await tail_of(http, url)
    payload, methods = b"", []
    for variant, headers in VARIANTS.items():
        if variant == "connection-list-close":
            continue  # it ends the connection
        for method, query in reads(stream_path, tail).values():
            for shape in ("{path}?{query}", "http://edge.test{path}?{query}"):
                target = shape.format(path=stream_path, query=query)
                payload += head_bytes(method, target, *headers)
                methods.append(method)
    before = full_path_requests(edges[0])
    answers = await on_both(edges, payload, methods)
    assert len(answers) == len(methods)
    assert full_path_requests(edges[0]) == before


@pytest.mark.parametrize("version", ["1.1", "1.0"])
async def test_a_parked_long_poll_with_such_a_head_is_released_as_the_full_path_releases_it(
    http: aiohttp.ClientSession,
    origin: Origin,
    edges: tuple[Edge, Edge],
    stream_path: str,
    version: str,
) -> None:
    """Parked at the tail, released by an append: the full path's answer (over HTTP/1.0 too,
    closed after it), no aiohttp handler entered."""
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"a", close=False)
    tail = await tail_of(http, url)
    headers = (*VARIANTS["range"], *VARIANTS["connection-list"], *VARIANTS["origin"])
    target = f"http://edge.test{stream_path}?offset={tail}&live=long-poll"
    for edge in edges:  # the first long-poll of a stream starts its tail, after a wait
        await exchange(edge.url, head_bytes("GET", f"{stream_path}?offset=-1"), ["GET"])
        await exchange(edge.url, head_bytes("GET", target, *headers), ["GET"])
    before = full_path_requests(edges[0])
    payload = head_bytes("GET", target, *headers, version=version)

    async def released(url: str) -> Raw:
        if version == "1.0":
            return await closed_answer(url, payload, "GET")  # closed after it
        return (await exchange(url, payload, ["GET"]))[0]

    waiting = [asyncio.ensure_future(released(e.url)) for e in edges]
    await asyncio.sleep(0.3)
    assert not any(w.done() for w in waiting)
    await append(http, url, b"b")
    fast, full = await asyncio.wait_for(asyncio.gather(*waiting), 10)
    assert fast.body == b"b"
    assert fast.comparable() == full.comparable(), difference(fast, full)
    assert full_path_requests(edges[0]) == before


async def test_a_mixed_read_load_of_every_head_enters_no_aiohttp_handler(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    """Followers by long-poll and SSE, and catch-up readers, each sending every variant head
    (absolute-form targets among them, pipelined pairs too, HTTP/1.0 among them), while an
    agent appends: every follower gets every byte once, and no read enters aiohttp's
    handler."""
    fast, _ = edges
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"0;", close=False)
    before = full_path_requests(fast)
    assert set(before) == set(READ_KINDS)
    usable = [
        h
        for name, h in VARIANTS.items()
        if name not in ("origin-twice", "last-event-id-twice", "via-loop", "via-loop-twice")
    ]

    async def follow_by_long_poll(which: int, version: str = "1.1") -> bytes:
        seen, offset, turn = b"", "-1", which
        reader, writer = await asyncio.open_connection(*host_port(fast.url))
        try:
            while True:
                headers = usable[turn % len(usable)]
                turn += 1
                target = f"http://edge.test{stream_path}?offset={offset}&live=long-poll"
                writer.write(head_bytes("GET", target, *headers, version=version))
                answer = (await asyncio.wait_for(read_answers(reader, ["GET"]), 10))[0]
                seen += answer.body
                offset = (answer.header(b"Stream-Next-Offset") or b"").decode()
                if answer.header(b"Stream-Closed") == b"true":
                    return seen
                if ends_connection(answer):
                    writer.close()
                    reader, writer = await asyncio.open_connection(*host_port(fast.url))
        finally:
            writer.close()

    async def view(which: int, version: str = "1.1") -> list[Raw]:
        target = f"{stream_path}?offset=-1&live=sse"
        payload = head_bytes("GET", target, *usable[which], version=version)
        return await exchange(fast.url, payload, ["GET"])

    async def catch_up_repeatedly(which: int) -> None:
        for turn in range(10):
            headers = usable[(which + turn) % len(usable)]
            version = "1.0" if turn % 3 == 2 else "1.1"  # an HTTP/1.0 read closes after it
            payload = head_bytes("GET", f"{stream_path}?offset=-1", *headers, version=version)
            if version == "1.1" and not any("close" in h for h in headers):
                payload += head_bytes("HEAD", f"http://edge.test{stream_path}", *headers)
            methods = ["GET", "HEAD"][: payload.count(b" HTTP/1.")]
            answers = await exchange(fast.url, payload, methods)
            assert all(a.status_line.split()[1] in (b"200", b"304") for a in answers)
            await asyncio.sleep(0.05)

    async def agent() -> bytes:
        written = b"0;"
        for i in range(1, 25):
            part = f"{i};".encode()
            await append(http, url, part)
            written += part
            await asyncio.sleep(0.05)
        status, _, _ = await call(http, "POST", url, headers={"Stream-Closed": "true"})
        assert status == 204
        return written

    pollers = [asyncio.ensure_future(follow_by_long_poll(i)) for i in range(6)]
    pollers += [asyncio.ensure_future(follow_by_long_poll(i, "1.0")) for i in range(2)]
    viewers = [asyncio.ensure_future(view(i)) for i in range(3)]
    viewers += [asyncio.ensure_future(view(3, "1.0"))]
    readers = [asyncio.ensure_future(catch_up_repeatedly(i)) for i in range(3)]
    await asyncio.sleep(0.3)
    written = await agent()
    followed = await asyncio.wait_for(asyncio.gather(*pollers), 20)
    sse_answers = await asyncio.wait_for(asyncio.gather(*viewers), 20)
    await asyncio.wait_for(asyncio.gather(*readers), 30)
    assert all(seen == written for seen in followed)
    for answer in sse_answers:
        data = b"".join(
            line[5:]
            for line in answer[0].body.split(b"\n")
            if line.startswith(b"data:") and not line.startswith(b"data:{")
        )
        assert data == written
    assert full_path_requests(fast) == before
