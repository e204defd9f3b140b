"""The fast path's HTTP/1.1 core: which heads it may answer, and the bytes it writes."""

from __future__ import annotations

import inspect

import hypothesis.strategies as st
from hypothesis import given, settings

from edge.protocol.answer_key import scope_of
from edge.protocol.headers import (
    connection_tokens,
    first_value,
    joined_value,
    names_this_proxy,
    repeated_singleton,
)
from edge.protocol.http1 import (
    FOR_GOOD,
    HANDOFF,
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    ONE_REQUEST,
    SINGLETONS,
    BodyFraming,
    Handoff,
    HeadParser,
    RefusedHead,
    RequestHead,
    date_line,
    refused_before_its_end,
    relayed_answer_head,
    serialise,
    serialise_parts,
)
from edge.protocol.paths import BadTarget, parse_target

CREDENTIALS = ("authorization", "cookie")
TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.~", min_size=1, max_size=12)
VALUE = st.text(alphabet='abcdefghijklmnopqrstuvwxyzABC0123456789 ,;=*"/-', max_size=20).map(
    str.strip
)
NAMES = st.sampled_from(
    [
        "Host",
        "User-Agent",
        "Accept",
        "If-None-Match",
        "Origin",
        "Accept-Encoding",
        "Connection",
        "Authorization",
        "Cookie",
        "Last-Event-ID",
        "Range",
        "If-Modified-Since",
        "If-Match",
        "If-Unmodified-Since",
        "If-Range",
        "Via",
        "Expect",
        "X-Other",
    ]
)
# ``Connection`` is a token list (RFC 9110 §7.6.1): ``close`` wins, other tokens name fields.
CONNECTIONS = st.sampled_from(
    ["close", "keep-alive", "Close", "te", "keep-alive, te", "x-a, close", "Keep-Alive, Close"]
)
VIAS = st.sampled_from(["1.1 cdn", "1.1 edge", "1.0 a, 1.1 edge (x)", "HTTP/1.1 other"])
# Origin-form, absolute-form (RFC 9112 §3.2.2) and targets the full path refuses (a fragment,
# a scheme it does not take, a path whose stream cannot be named), the last four in aiohttp's
# parser (``UNPARSED``).
TARGET_FORMS = st.sampled_from(["{}", "{}", "{}", "http://edge.test{}", "HTTPS://h:1{}",
                                "{}#frag", "ftp://h{}", "//h{}", "//[::1]{}", "/.{}",
                                "*", "http://", "http://h:99999{}", "http://[::1{}"])  # fmt: skip
UNPARSED = ("*", "http://", "http://h:99999", "http://[::1")


@st.composite
def heads(draw: st.DrawFn) -> tuple[bytes, str, str, str, list[tuple[str, str]]]:
    method = draw(st.sampled_from(["GET", "GET", "GET", "HEAD", "OPTIONS", "DELETE"]))
    version = draw(st.sampled_from(["1.1", "1.1", "1.1", "1.0"]))
    path = "/" + "/".join(draw(st.lists(TOKEN, min_size=1, max_size=3)))
    query = draw(st.sampled_from(["", "offset=-1", "offset=0000_0010", "offset=now&live=sse"]))
    names = draw(st.lists(NAMES, max_size=6))
    headers = []
    for name in names:
        lowered = name.lower()
        values = CONNECTIONS if lowered == "connection" else VIAS if lowered == "via" else VALUE
        headers.append((name, draw(values)))
    if draw(st.integers(0, 4)) > 0:  # most heads name their host, as HTTP/1.1 requires
        headers.insert(draw(st.integers(0, len(headers))), ("Host", "edge.test"))
    target = draw(TARGET_FORMS).format(path + (f"?{query}" if query else ""))
    lines = [f"{method} {target} HTTP/{version}", *(f"{n}: {v}" for n, v in headers), "", ""]
    return "\r\n".join(lines).encode(), method, version, target, headers


def expected(method: str, version: str, target: str, headers: list[tuple[str, str]]) -> bool:
    """Is this a head the connection reads itself (by the module's rules, restated)?"""
    if method not in ("GET", "HEAD") or version not in ("1.1", "1.0"):
        return False
    if target in UNPARSED[:2] or target.startswith(UNPARSED[2:]):
        return False  # aiohttp's parser refuses it (400) and closes
    names = [n.lower().encode() for n, _ in headers]
    if any(n in HANDOFF or n == b"expect" for n in names):
        return False
    # aiohttp answers 400 to a head without one Host, or repeating a singleton.
    return names.count(b"host") == 1 and not any(names.count(n) > 1 for n in SINGLETONS)


def refusal(target: str, headers: list[tuple[str, str]]) -> int | None:
    """The status the full path refuses a read with before anything else (its order)."""
    try:
        parse_target(target, "GET")
    except BadTarget:
        return 400
    if names_this_proxy(v for n, v in headers if n.lower() == "via"):
        return 508
    if repeated_singleton(headers) is not None:
        return 400
    return None


def closes(headers: list[tuple[str, str]]) -> bool:
    return "close" in connection_tokens(headers)


@settings(max_examples=300)
@given(st.lists(heads(), min_size=1, max_size=6))
def test_a_head_is_answered_only_when_nothing_in_it_is_the_full_paths(
    sequence: list[tuple[bytes, str, str, str, list[tuple[str, str]]]],
) -> None:
    parser = HeadParser(CREDENTIALS)  # one per connection, heads in order
    for raw, method, version, target, headers in sequence:
        parsed = parser.parse(raw)
        if any(n.lower() == "expect" for n, _ in headers):
            # aiohttp may answer it before any middleware runs: never one request at a time.
            assert parsed is FOR_GOOD
            return
        if not expected(method, version, target, headers):
            assert parsed in (ONE_REQUEST, FOR_GOOD)
            if parsed is FOR_GOOD or version == "1.0" or closes(headers):
                return  # the connection is the full path's from here, or ends
            continue
        status = refusal(target, headers)
        if status is not None:
            assert isinstance(parsed, RefusedHead)
            assert parsed.status == status
            assert parsed.origin == first_value(headers, "origin")
            assert parsed.keep_alive == (version == "1.1" and not closes(headers))
        else:
            assert isinstance(parsed, RequestHead)
            path, _, query = parse_target(target, "GET").upstream.partition("?")
            assert (parsed.path, parsed.query) == (path, query)
            # List fields are one value however many lines carry them (RFC 9110 §5.3).
            assert parsed.if_none_match == joined_value(headers, "if-none-match")
            assert parsed.accept_encoding == joined_value(headers, "accept-encoding")
            assert parsed.origin == first_value(headers, "origin")
            assert parsed.last_event_id == first_value(headers, "last-event-id")
            # Credentials are collected as sent: the scope is the full path's function of them.
            assert parsed.credentials == tuple(
                (n.lower(), v) for n, v in headers if n.lower() in CREDENTIALS
            )
            assert parsed.keep_alive == (version == "1.1" and not closes(headers))
            assert parsed.head == (method == "HEAD")
        if not parsed.keep_alive:
            return


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(junk: bytes) -> None:
    result = HeadParser(CREDENTIALS).parse(junk + b"\r\n\r\n")
    assert (
        result is FOR_GOOD or result is ONE_REQUEST or isinstance(result, RequestHead | RefusedHead)
    )


def test_a_head_with_a_body_hands_the_connection_over_for_good() -> None:
    parser = HeadParser(CREDENTIALS)
    assert parser.parse(b"POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n") is FOR_GOOD
    chunked = b"GET /s HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert HeadParser(CREDENTIALS).parse(chunked) is FOR_GOOD
    smuggled = b"GET /s HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\n"
    assert HeadParser(CREDENTIALS).parse(smuggled) is FOR_GOOD


def test_configured_credential_headers_are_collected_as_sent_for_the_scope() -> None:
    parser = HeadParser(("x-api-key",))
    parsed = parser.parse(b"GET /s HTTP/1.1\r\nHost: x\r\nX-Api-Key: k\r\nX-API-KEY: j\r\n\r\n")
    assert isinstance(parsed, RequestHead)
    assert parsed.credentials == (("x-api-key", "k"), ("x-api-key", "j"))
    other = parser.parse(
        b"GET /s HTTP/1.1\r\nHost: x\r\nAuthorization: a\r\nOrigin: https://a.example\r\n\r\n"
    )
    assert isinstance(other, RequestHead)
    assert (other.credentials, other.origin) == ((), "https://a.example")
    twice = b"GET /s HTTP/1.1\r\nOrigin: https://a.example\r\nOrigin: https://b.example\r\n\r\n"
    assert parser.parse(twice) is ONE_REQUEST


def test_serialise_writes_aiohttps_order_and_refuses_line_breaks() -> None:
    head = serialise(200, [("Content-Type", "text/plain"), ("ETag", '"t"')], 5)
    assert head == (
        b'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nETag: "t"\r\nContent-Length: 5\r\n'
    )
    assert serialise(304, [("ETag", '"t"')], 0) == b'HTTP/1.1 304 Not Modified\r\nETag: "t"\r\n'
    for bad in ("a\r\nSet-Cookie: x", "a\nb", "a\rb"):
        try:
            serialise(200, [("X", bad)], 0)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was serialised")


def test_date_line_is_an_imf_fixdate() -> None:
    assert date_line(0) == b"Date: Thu, 01 Jan 1970 00:00:00 GMT"
    assert date_line(1796100000) == b"Date: Tue, 01 Dec 2026 04:40:00 GMT"


def test_the_singletons_are_aiohttps() -> None:
    from aiohttp.http_parser import SINGLETON_HEADERS

    assert {name.encode() for name in SINGLETON_HEADERS} == set(SINGLETONS)


def test_a_head_the_full_path_refuses_is_never_the_fast_paths() -> None:
    parser = HeadParser(CREDENTIALS)
    for raw in (
        b"GET /s HTTP/1.1\r\n\r\n",  # no Host
        b"GET /s HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"GET /s HTTP/1.1\r\nHost: a\r\nUser-Agent: x\r\nUser-Agent: y\r\n\r\n",
    ):
        assert parser.parse(raw) is ONE_REQUEST, raw
    parsed = parser.parse(b"GET /s HTTP/1.1\r\nHost: a\r\nCookie: s=1  \r\n\r\n")
    assert isinstance(parsed, RequestHead)
    assert parsed.credentials == (("cookie", "s=1"),)  # stripped, as aiohttp strips it


# --- heads read as the full path reads them: aiohttp's own request parser as the oracle ---


def aiohttp_reads(head: bytes) -> list[tuple[str, str]] | None:
    """The headers aiohttp's request parser (the C one the full path runs, with the limits
    ``web.Server`` gives it) makes of ``head``; None: it refuses the head (a 400)."""
    import asyncio

    from aiohttp import http_exceptions, web_protocol
    from aiohttp.http_parser import HttpRequestParser

    defaults = inspect.signature(web_protocol.RequestHandler.__init__).parameters
    loop = asyncio.new_event_loop()
    try:
        parser = HttpRequestParser(
            _Paused(), loop, 2**16,
            max_line_size=defaults["max_line_size"].default,
            max_field_size=defaults["max_field_size"].default,
            max_headers=defaults["max_headers"].default,
        )  # fmt: skip
        try:
            messages, _, _ = parser.feed_data(head)
        except http_exceptions.HttpProcessingError:
            return None
        assert len(messages) == 1
        return list(messages[0][0].headers.items())
    finally:
        loop.close()


class _Paused:
    transport = None

    def pause_reading(self) -> None:
        pass


def test_header_values_are_the_strings_aiohttp_makes_of_their_bytes() -> None:
    """Non-ASCII bytes in a credential are decoded as aiohttp decodes them (UTF-8, surrogate
    escapes), so the scope the fast path computes is the full path's: read as Latin-1, the UTF-8
    bytes of ``é`` would name the scope of the UTF-8 bytes of ``Ã©``, another reader's."""
    head = (
        b"GET /s HTTP/1.1\r\nHost: a\r\nCookie: s=\xc3\xa9; t=\xe9\r\n"
        b'Origin: https://\xc3\xa9.test\r\nIf-None-Match: "\xe9"\r\n'
        b"Accept-Encoding: gzip\xff\r\n\r\n"
    )
    parsed = HeadParser(CREDENTIALS).parse(head)
    full = aiohttp_reads(head)
    assert isinstance(parsed, RequestHead)
    assert full is not None
    values = dict(full)
    assert parsed.credentials == (("cookie", values["Cookie"]),)
    assert parsed.origin == values["Origin"]
    assert parsed.if_none_match == values["If-None-Match"]
    assert parsed.accept_encoding == values["Accept-Encoding"]
    aliased = HeadParser(CREDENTIALS).parse(
        b"GET /s HTTP/1.1\r\nHost: a\r\nCookie: s=\xc3\x83\xc2\xa9\r\n\r\n"
    )
    assert isinstance(aliased, RequestHead)
    assert scope_of(parsed.credentials[:1]) != scope_of(aliased.credentials)


def test_the_header_limit_is_aiohttps() -> None:
    from aiohttp import web_protocol

    defaults = inspect.signature(web_protocol.RequestHandler.__init__).parameters
    assert defaults["max_headers"].default == MAX_HEADERS
    assert defaults["max_field_size"].default < MAX_HEAD_BYTES


def test_heads_past_aiohttps_limits_are_never_the_fast_paths() -> None:
    """aiohttp refuses (400) more than 128 header fields, a field over 8190 bytes and the old
    WebSocket handshake header; the hit path must not answer such a head 200."""
    start = b"GET /s?offset=-1 HTTP/1.1\r\nHost: a\r\n"
    refused = {
        "129 fields": start + b"".join(b"X%d: b\r\n" % i for i in range(128)) + b"\r\n",
        "a long field": start + b"X-Pad: " + b"a" * 9000 + b"\r\n\r\n",
        "Sec-WebSocket-Key1": start + b"Sec-WebSocket-Key1: x\r\n\r\n",
    }
    for why, head in refused.items():
        assert aiohttp_reads(head) is None, why  # the oracle refuses it
        assert HeadParser(CREDENTIALS).parse(head) is FOR_GOOD, why
    accepted = start + b"".join(b"X%d: b\r\n" % i for i in range(126)) + b"\r\n"  # 127 fields
    assert aiohttp_reads(accepted) is not None
    assert isinstance(HeadParser(CREDENTIALS).parse(accepted), RequestHead)


FIELD_BYTES = st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([b"Cookie", b"Origin", b"X-A", b"Authorization"]), FIELD_BYTES),
        max_size=4,
    ),
    st.integers(0, 140),
    st.sampled_from([0, 100, 8000, 8200]),
)
def test_a_head_aiohttp_refuses_is_never_answered_and_one_it_accepts_is_read_alike(
    fields: list[tuple[bytes, bytes]], padding_fields: int, pad_size: int
) -> None:
    lines = [b"GET /s HTTP/1.1", b"Host: a", *(n + b": " + v for n, v in fields)]
    lines += [b"P%d: x" % i for i in range(padding_fields)]
    if pad_size:
        lines.append(b"X-Pad: " + b"p" * pad_size)
    head = b"\r\n".join([*lines, b"", b""])
    full = aiohttp_reads(head)
    parsed = HeadParser(CREDENTIALS).parse(head)
    if full is None:
        assert not isinstance(parsed, RequestHead)
        return
    if not isinstance(parsed, RequestHead):
        return  # the full path's to answer: never wrong, only slower
    credentials = [(n.lower(), v) for n, v in full if n.lower() in CREDENTIALS]
    assert list(parsed.credentials) == credentials
    assert parsed.origin == next((v for n, v in full if n.lower() == "origin"), None)


def test_a_last_header_goes_between_the_two_parts() -> None:
    """The hit path splices each hit's ``Age`` between them: where aiohttp writes a header
    added last to the answer's."""
    headers = [("Content-Type", "text/plain"), ("ETag", '"t"')]
    for status, length, head in ((200, 5, False), (304, 0, False), (200, 5, True), (200, 0, False)):
        first, rest = serialise_parts(status, headers, length, head=head)
        assert first + rest == serialise(status, headers, length, head=head)
        aged = serialise(status, [*headers, ("Age", "7")], length, head=head)
        assert first + b"Age: 7\r\n" + rest == aged
    assert serialise_parts(200, headers, 5)[1] == b"Content-Length: 5\r\n"


def aiohttp_message(head: bytes) -> tuple[str, bool] | None:
    """The target and ``should_close`` aiohttp's request parser makes of ``head``; None: it
    refuses the head."""
    import asyncio

    from aiohttp import http_exceptions
    from aiohttp.http_parser import HttpRequestParser

    loop = asyncio.new_event_loop()
    try:
        parser = HttpRequestParser(_Paused(), loop, 2**16)
        try:
            messages, _, _ = parser.feed_data(head)
        except http_exceptions.HttpProcessingError:
            return None
        message = messages[0][0]
        return message.path, message.should_close
    finally:
        loop.close()


CONNECTION_TOKENS = st.sampled_from(
    ["close", "Close", "CLOSE", "keep-alive", "Keep-Alive", "te", "upgrade", "x-hop", "closed"]
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(CONNECTION_TOKENS, min_size=1, max_size=3), max_size=3),
    st.sampled_from([", ", ",", " , "]),
    st.sampled_from(["/s?offset=-1", "http://h/s?offset=-1", "https://h:1/s", "http://h"]),
)
def test_connection_and_the_target_are_read_as_aiohttp_reads_them(
    lines: list[list[str]], separator: str, target: str
) -> None:
    """``Connection`` is a token list (``close`` wins, RFC 9110 §7.6.1; aiohttp and the
    connection both take llhttp's reading), and an absolute-form target's path and query are
    the target (RFC 9112 §3.2.2): the full path's ``parse_target`` of aiohttp's target."""
    fields = [f"Connection: {separator.join(tokens)}" for tokens in lines]
    head = "\r\n".join([f"GET {target} HTTP/1.1", "Host: a", *fields, "", ""]).encode()
    full = aiohttp_message(head)
    parsed = HeadParser(CREDENTIALS).parse(head)
    if full is None:
        assert not isinstance(parsed, RequestHead | RefusedHead)
        return
    full_target, should_close = full
    assert isinstance(parsed, RequestHead)
    assert parsed.keep_alive is not should_close
    upstream = parse_target(full_target, "GET").upstream
    assert (parsed.path, parsed.query) == tuple(upstream.partition("?")[::2])


def full_path_reading(head: bytes) -> tuple[str, object] | None:
    """What the full path makes of ``head``: aiohttp's request parser, then the refusals
    ``handle_stream_request`` makes before anything else, in its order, then the values the
    read handlers take (``edge.web.front.catchup_request``'s functions). None: aiohttp's
    parser refuses the head."""
    import asyncio

    from aiohttp import http_exceptions
    from aiohttp.http_parser import HttpRequestParser

    loop = asyncio.new_event_loop()
    try:
        parser = HttpRequestParser(_Paused(), loop, 2**16)
        try:
            messages, _, _ = parser.feed_data(head)
        except http_exceptions.HttpProcessingError:
            return None
    finally:
        loop.close()
    message = messages[0][0]
    headers = list(message.headers.items())
    origin = first_value(headers, "origin")
    # An HTTP/1.0 answer closes the connection on both paths (``answer_http10_as_http11``).
    keeps = not message.should_close and message.version >= (1, 1)
    try:
        target = parse_target(message.path, message.method)
    except BadTarget:
        return "refused", (400, origin, keeps)
    if names_this_proxy(v for n, v in headers if n.lower() == "via"):
        return "refused", (508, origin, keeps)
    if repeated_singleton(headers) is not None:
        return "refused", (400, origin, keeps)
    return "read", (
        message.method, (message.version.major, message.version.minor),
        target.upstream.partition("?")[::2],
        joined_value(headers, "if-none-match"), joined_value(headers, "accept-encoding"),
        origin, first_value(headers, "last-event-id"), keeps,
        tuple((n.lower(), v) for n, v in headers if n.lower() in CREDENTIALS),
    )  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(heads())
def test_a_head_the_connection_takes_is_read_as_the_full_path_reads_it(
    drawn: tuple[bytes, str, str, str, list[tuple[str, str]]],
) -> None:
    """The generated heads read by the connection and by the full path (aiohttp's parser and
    the edge's own functions of what it parsed) as the oracle: whatever the connection takes
    as a read, or refuses, the full path reads or refuses alike; what it hands over, the full
    path answers."""
    raw = drawn[0]
    parsed = HeadParser(CREDENTIALS).parse(raw)
    if isinstance(parsed, Handoff):
        return  # the full path's to answer: never wrong
    full = full_path_reading(raw)
    assert full is not None, raw  # aiohttp's parser takes what the connection takes
    what, values = full
    if isinstance(parsed, RefusedHead):
        assert (what, values) == ("refused", (parsed.status, parsed.origin, parsed.keep_alive))
        return
    method = "HEAD" if parsed.head else "GET"
    assert (what, values) == (
        "read", (
            method, (1, 0) if parsed.http10 else (1, 1), (parsed.path, parsed.query),
            parsed.if_none_match,
            parsed.accept_encoding, parsed.origin, parsed.last_event_id, parsed.keep_alive,
            parsed.credentials,
        ),
    )  # fmt: skip


def test_an_answer_to_http10_has_no_chunks_and_ends_with_the_close() -> None:
    """A body of unknown length to an HTTP/1.0 reader: no ``Transfer-Encoding``, no
    ``Content-Length``, written as it comes and ended by the close (``TO_CLOSE``), under an
    HTTP/1.1 status line; a body with a length keeps it."""
    headers = [("Content-Type", "text/event-stream")]
    head, framing = relayed_answer_head(
        200, "OK", headers, head=False, keep_alive=False, now_seconds=0, close_delimited=True
    )
    assert framing is BodyFraming.TO_CLOSE
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Transfer-Encoding" not in head
    assert b"Content-Length" not in head
    assert head.endswith(b"Connection: close\r\n\r\n")
    sized, framing = relayed_answer_head(
        200, "OK", [*headers, ("Content-Length", "3")], head=False, keep_alive=False,
        now_seconds=0, close_delimited=True,
    )  # fmt: skip
    assert framing is BodyFraming.LENGTH
    assert b"Content-Length: 3\r\n" in sized
    sse_head = serialise(200, headers, 0, close_delimited=True)
    assert b"Content-Length" not in sse_head
    assert b"Transfer-Encoding" not in sse_head
    assert b"Transfer-Encoding: chunked" in serialise(200, headers, 0, chunked=True)


@given(heads(), st.data())
def test_the_start_of_a_head_is_refused_before_its_end_only_where_llhttp_refuses_it(
    drawn: tuple[bytes, str, str, str, list[tuple[str, str]]], data: st.DataObject
) -> None:
    """Any start of a head the parser reads whole is read on (its end may come); a line of it
    ended by LF alone is refused, as is a TLS ClientHello."""
    raw = drawn[0]
    whole = HeadParser(CREDENTIALS).parse(raw)
    cut = data.draw(st.integers(0, len(raw) - 1))
    if whole is not FOR_GOOD:  # llhttp read it whole
        assert not refused_before_its_end(raw[:cut])
    line_end = raw.find(b"\r\n")
    bare = raw[:line_end] + b"\n" + raw[line_end + 2 :]
    assert refused_before_its_end(bare[: bare.index(b"\n") + 2])
    assert refused_before_its_end(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
