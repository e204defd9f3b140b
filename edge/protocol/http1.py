"""HTTP/1.1 for the pre-serialised hit path: request heads parsed strictly, answers serialised
exactly as the full (aiohttp) path serialises them.

Rules this module owns:

* A head is parsed by llhttp (through ``httptools``, the binding uvicorn uses), the same C
  parser family aiohttp's own parser is built on, so a head the fast path accepts is one the
  full path would accept too. Anything llhttp refuses, or that is not a plain HTTP/1.1 or
  HTTP/1.0 ``GET`` or ``HEAD`` without a body, is not the fast path's: ``parse`` says so and
  the full path decides.
* An HTTP/1.0 read (``RequestHead.http10``) is answered as an HTTP/1.1 server answers it, on
  both paths (``edge.web.proxy.answer_http10_as_http11``): an ``HTTP/1.1`` status line (RFC
  9110 §2.5), ``Connection: close`` and the connection closed after it (RFC 9112 §9.3 leaves
  HTTP/1.0 keep-alive to the server: its ``keep_alive`` is False), a body of unknown length
  written to the close, never in chunks (``serialise``'s and ``relayed_answer_head``'s
  ``close_delimited``).
* Headers that change what the full path answers are named here (``CONSULTED``) and read as it
  reads them: a list field's lines (``LISTS``) are one value (RFC 9110 §5.3,
  ``edge.protocol.headers.joined_value``); a field whose one value changes the answer
  (``ANSWER_SINGLETONS``: ``Origin``, ``Last-Event-ID``) sent twice is refused (400) on both
  paths. ``Range`` and the conditionals the edge does not consult are ignored, as on the full
  path; a head carrying a body or an upgrade (``HANDOFF``) is not the fast path's. The
  configured credential headers are collected as sent: the scope they name is computed by the
  full path's own function (``edge.protocol.answer_key``), never approximated here.
* ``Connection`` is llhttp's reading of it, the one aiohttp takes: a token list, ``close``
  wins. The target is ``parse_target``'s (origin-form, or absolute-form whose path and query
  are the target, RFC 9112 §3.2.2). A read the full path refuses before anything else (a
  target ``parse_target`` refuses: 400; a loop: 508; a repeated answer singleton: 400) is a
  ``RefusedHead``, which the connection writes as the full path writes it.
* A target aiohttp's parser refuses (not origin-form, and not absolute-form with a host yarl
  reads: ``*`` for a ``GET``, ``http://``, a port out of range) is the full path's for good:
  aiohttp answers 400 and closes before any application runs.
* A head the full path would refuse (no ``Host``, a repeated header aiohttp allows once, more
  than ``MAX_HEADERS`` fields, a head past ``MAX_HEAD_BYTES`` and so possibly a field or target
  past aiohttp's 8190-byte limits, the old ``Sec-WebSocket-Key1`` handshake) is the full
  path's, so the fast path never answers what the full path answers 400. Header values are
  stripped of surrounding whitespace and decoded as aiohttp decodes them (UTF-8, surrogate
  escapes for other bytes), so a value names what it names on the full path: decoded any other
  way, the bytes of one credential would read as another's, and name its scope.
* A head is found by its CRLF CRLF end; one llhttp refuses before it (lines ended by a bare
  LF, which have no such end; TLS sent to the HTTP port) is aiohttp's 400 and close:
  ``refused_before_its_end`` tells the connection so before the end it would otherwise wait
  for in vain.
* A head with ``Expect`` hands the connection over for good, whatever its method: aiohttp
  answers an expectation it does not meet (417) before the application runs, so no middleware
  would tell the connection that answer was written, and the requests behind it would wait.
* ``serialise`` + ``date_line`` + ``trailer`` write an answer the way aiohttp writes the edge's
  own answers: the status line and the answer's headers in order, ``Content-Length`` (never
  on a bodiless status), a default ``Content-Type``, ``Date``, and ``Connection`` where the
  version's default is not what happens. The one set of these rules serves the fast path and
  the long-polls released together (``tests/integration/test_fast_path.py`` compares with
  the full path byte for byte, ``tests/unit/test_wire.py`` with a real aiohttp server).
* The rarer heads aiohttp writes its own way are framed here too: ``dated_answer_head`` for an
  edge answer whose headers carry the origin's ``Date`` (kept in place, none added), and
  ``relayed_answer_head`` for a relayed answer (the origin's reason, ``Date`` and ``Server``;
  chunked without a ``Content-Length``; nothing after a HEAD, 204, 304 or 1xx), each as aiohttp
  frames it (``tests/integration/test_own_relay.py`` compares with the full path).
* A head the hit path took is read whole again only for a relay (``parse_whole_head``: every
  header, in order), so the hot parse keeps only what it consults.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from email.utils import formatdate
from enum import Enum
from http import HTTPStatus
from typing import NamedTuple

import httptools
from yarl import URL

from edge.protocol.headers import LOOP_TEXT, names_this_proxy, repeated_text
from edge.protocol.paths import MEMO_ENTRIES, BadTarget, Target, parse_target

# Longer heads are aiohttp's to judge (its limits are 8190 bytes a line, and it answers 431).
MAX_HEAD_BYTES = 8192
# aiohttp's ``RequestHandler`` refuses more header fields than this (400; a test pins it).
MAX_HEADERS = 128
# How aiohttp's parser turns header bytes into strings (``_http_parser.pyx``).
VALUE_ENCODING, VALUE_ERRORS = "utf-8", "surrogateescape"

IF_NONE_MATCH = b"if-none-match"
ACCEPT_ENCODING = b"accept-encoding"
ORIGIN = b"origin"
EXPECT = b"expect"
# The pre-RFC 6455 WebSocket handshake: aiohttp refuses any head carrying it (400).
SEC_WEBSOCKET_KEY1 = b"sec-websocket-key1"
VIA = b"via"
LAST_EVENT_ID = b"last-event-id"
# List-valued fields (RFC 9110 §5.3): their field lines, however many, are one value, joined
# with ", " (``edge.protocol.headers.joined_value``, the full path's reading of them).
LISTS = frozenset({IF_NONE_MATCH, ACCEPT_ENCODING, VIA})
# Fields whose one value changes the answer: sent more than once, the request is refused
# (``REPEATED``), on both paths.
ANSWER_SINGLETONS = frozenset({ORIGIN, LAST_EVENT_ID})
CONSULTED = LISTS | ANSWER_SINGLETONS
HOST = b"host"
# Headers aiohttp's parser refuses to see twice (``aiohttp.http_parser.SINGLETON_HEADERS``; a
# test pins the copy): a head that repeats one is the full path's, which answers 400, as it does
# a head without ``Host``.
SINGLETONS = frozenset(
    {
        b"content-length",
        b"content-location",
        b"content-range",
        b"content-type",
        b"etag",
        HOST,
        b"max-forwards",
        b"server",
        b"transfer-encoding",
        b"user-agent",
    }
)
# Their presence means a body or an upgrade the full path handles. ``Range`` and the
# conditionals other than ``If-None-Match`` (``If-Match``, ``If-Modified-Since``,
# ``If-Unmodified-Since``, ``If-Range``) are not here: the edge's answer to a read does not
# consult them (RFC 9110 §13.2.1 and §14.2 let a server ignore them), and a relayed read passes
# them on as the full path does.
HANDOFF = frozenset(
    {
        b"content-length",
        b"transfer-encoding",
        EXPECT,  # for good, not once: see ``HeadParser.parse``
        b"upgrade",
        SEC_WEBSOCKET_KEY1,  # for good: aiohttp refuses it before the application runs
    }
)
# Of those, the ones that hand the connection over for good, not one request.
FOR_GOOD_NAMES = frozenset({EXPECT, SEC_WEBSOCKET_KEY1})


class RequestHead(NamedTuple):
    """A plain HTTP/1.1 GET head: the target as sent and the headers the answer depends on.
    A named tuple, made once per request on the hit path: a frozen dataclass's ``__init__``
    sets each field through ``object.__setattr__``, which costs more than the lookup."""

    path: str
    query: str
    if_none_match: str | None
    accept_encoding: str | None
    keep_alive: bool
    origin: str | None = None
    # The configured credential headers, as sent (name lower-cased), in order.
    credentials: tuple[tuple[str, str], ...] = ()
    head: bool = False  # a HEAD: the same target's metadata, answered without a body
    # An EventSource's resume point (only an SSE read uses it: ``LiveHub.start``).
    last_event_id: str | None = None
    # An HTTP/1.0 read: answered as HTTP/1.1 answers, then the connection closes, and a body
    # of unknown length is written to the close, never in chunks (``http10_rule``).
    http10: bool = False


class _Collector:
    """httptools callbacks; one parser per connection, reset by llhttp between messages."""

    __slots__ = ("complete", "headers", "keep_alive", "parser", "url")

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False
        self.keep_alive = False
        self.parser: httptools.HttpRequestParser | None = None

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        # llhttp's reading of ``Connection`` (a token list: ``close`` wins; the version's
        # default otherwise), taken where aiohttp takes it: llhttp forgets it once the message
        # is complete.
        assert self.parser is not None
        self.keep_alive = self.parser.should_keep_alive()

    def on_message_complete(self) -> None:
        self.complete = True


@dataclass(frozen=True, kw_only=True, slots=True)
class Handoff:
    """The head is the full path's. ``once``: it is one complete request without a body, so the
    full path can answer it alone and the connection's next head is the fast path's again;
    otherwise every byte from here on is the full path's."""

    once: bool


ONE_REQUEST = Handoff(once=True)
FOR_GOOD = Handoff(once=False)


LOOP_DETECTED = 508  # the status of a request that came back round a loop


@dataclass(frozen=True, kw_only=True, slots=True)
class RefusedHead:
    """A read the edge refuses before anything else, as the full path refuses it
    (``edge.web.dispatch.handle_stream_request``): 400 for a target ``parse_target`` refuses
    or a repeated field whose one value changes the answer, 508 for a loop. The connection
    writes the edge's short answer (``text``) with the CORS headers for ``origin`` (the first
    ``Origin`` sent, the full path's ``request_origin``)."""

    status: int
    text: str
    origin: str | None
    head: bool  # a HEAD: the answer's head alone
    keep_alive: bool


class HeadParser:
    """Parses one complete request head at a time (the caller found its end). After a
    ``FOR_GOOD`` hand-off the parser must not be used again."""

    __slots__ = ("_collector", "_credentials", "_parser")

    def __init__(self, credential_headers: Collection[str]) -> None:
        self._collector = _Collector()
        self._parser = httptools.HttpRequestParser(self._collector)
        self._collector.parser = self._parser
        self._credentials = frozenset(name.lower().encode("latin-1") for name in credential_headers)

    def parse(self, head: bytes) -> RequestHead | Handoff | RefusedHead:
        if len(head) > MAX_HEAD_BYTES:
            return FOR_GOOD  # a field or the target may be past aiohttp's limits: its to judge
        collector = self._collector
        try:
            self._parser.feed_data(head)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            return FOR_GOOD
        if not collector.complete:
            return FOR_GOOD  # a body follows: its framing is the full path's
        if len(collector.headers) > MAX_HEADERS:
            return FOR_GOOD  # aiohttp answers 400 and closes
        if collector.url[:1] != b"/" and _unparsed_target(
            collector.url.decode(VALUE_ENCODING, VALUE_ERRORS)
        ):
            return FOR_GOOD  # aiohttp's parser refuses it (400) and closes
        # One pass over the headers for every method: an Expect anywhere is FOR_GOOD, even
        # after a header that alone would hand over one request.
        handoff = False
        repeated: bytes | None = None  # the first answer singleton sent twice
        consulted: dict[bytes, bytes] = {}
        credentials: tuple[tuple[str, str], ...] = ()
        for name, value in collector.headers:
            if name in HANDOFF:
                if name in FOR_GOOD_NAMES:
                    return FOR_GOOD
                handoff = True
            elif name in self._credentials:  # rare on hits: a tuple grown only when present
                # Read as aiohttp reads values: the scope is computed from the same string.
                credentials += ((name.decode("latin-1"), _text(value)),)
            elif name in CONSULTED or name in SINGLETONS:
                known = consulted.get(name)
                if known is None:
                    consulted[name] = value
                elif name in LISTS:
                    # One value (RFC 9110 §5.3), as ``joined_value`` reads it: each line
                    # stripped, empty ones left out (decoding byte by byte commutes with it).
                    known, value = known.strip(b" \t"), value.strip(b" \t")
                    consulted[name] = known + b", " + value if known and value else known or value
                elif name in ANSWER_SINGLETONS:
                    repeated = repeated or name
                else:
                    handoff = True  # a singleton aiohttp's parser allows once: its 400
        method = self._parser.get_method()
        if (
            handoff
            or HOST not in consulted  # HTTP/1.1 requires one (aiohttp answers 400)
            or method not in (b"GET", b"HEAD")
        ):
            return ONE_REQUEST
        version = self._parser.get_http_version()
        if version != "1.1" and version != "1.0":
            return ONE_REQUEST
        http10 = version == "1.0"
        # HTTP/1.0: the connection closes after the answer, keep-alive asked or not.
        keep_alive, is_head = collector.keep_alive and not http10, method == b"HEAD"
        origin_value = consulted.get(ORIGIN)
        origin = _text(origin_value) if origin_value is not None else None
        # Origin-form or absolute-form (RFC 9112 §3.2.2: its path and query are the target);
        # what the full path refuses (a fragment, a stream that cannot be named), refused alike:
        # ``parse_target`` decides, on the target as aiohttp decodes it.
        try:
            target = _target(collector.url.decode(VALUE_ENCODING, VALUE_ERRORS))
        except BadTarget as bad:
            return RefusedHead(
                status=400, text=str(bad), origin=origin, head=is_head, keep_alive=keep_alive
            )
        path, _, query = target.upstream.partition("?")
        via = consulted.get(VIA)
        if via is not None and names_this_proxy((_text(via),)):
            return RefusedHead(
                status=LOOP_DETECTED,
                text=LOOP_TEXT,
                origin=origin,
                head=is_head,
                keep_alive=keep_alive,
            )
        if repeated is not None:
            text = repeated_text(repeated.decode("ascii"))
            return RefusedHead(
                status=400, text=text, origin=origin, head=is_head, keep_alive=keep_alive
            )
        # Values read as aiohttp reads them (only those read: most heads carry none).
        inm = consulted.get(IF_NONE_MATCH)
        ae = consulted.get(ACCEPT_ENCODING)
        last_event_id = consulted.get(LAST_EVENT_ID)
        # By position: a named tuple is made faster so, on every hit.
        return RequestHead(
            path,
            query,
            _text(inm) if inm is not None else None,
            _text(ae) if ae is not None else None,
            keep_alive,
            origin,
            credentials,
            is_head,
            _text(last_event_id) if last_event_id is not None else None,
            http10,
        )


class _Probe:
    """No callbacks: llhttp only says whether the start of a head is one it can read on."""


def refused_before_its_end(pending: bytes | bytearray) -> bool:
    """Whether llhttp already refuses the start of a head whose CRLF CRLF end has not come (a
    line ended by a bare LF, a request line no method starts, such as TLS sent to the HTTP
    port): aiohttp answers it 400, so waiting for its end waits for ever."""
    try:
        httptools.HttpRequestParser(_Probe()).feed_data(bytes(pending))
    except httptools.HttpParserError:
        return True
    return False


def _unparsed_target(url: str) -> bool:
    """Whether aiohttp's parser refuses the target of a ``GET`` or ``HEAD`` that is not
    origin-form (``_http_parser.pyx``): only absolute-form is taken, with ``//`` and an
    authority (``http_parser._has_authority``) from which yarl reads a host, so ``*``, a
    hostless URL, a port out of range or an unclosed IPv6 host are its 400."""
    rest = url.partition(":")[2]
    if rest[:2] != "//" or rest[2:3] in ("", "/", "?", "#"):
        return True
    try:
        return URL(url, encoded=True).raw_host is None
    except ValueError:
        return True


@functools.lru_cache(maxsize=MEMO_ENTRIES)
def _target(url: str) -> Target:
    # Remembered: an audience sends the same targets again and again (a refusal is not kept).
    return parse_target(url, "GET")


def header_value(head: bytes, name: bytes) -> str | None:
    """The value of the field ``name`` (lower-case) of a head ``HeadParser`` parsed, as aiohttp
    reads it: for the rare answer that needs a field the parser does not keep."""
    for line in head.split(b"\r\n")[1:]:
        field, colon, value = line.partition(b":")
        if colon and field.lower() == name:
            return _text(value)
    return None


def _text(value: bytes) -> str:
    """A header value as aiohttp gives it to the full path: stripped, then decoded as it is."""
    return value.strip(b" \t").decode(VALUE_ENCODING, VALUE_ERRORS)


# What aiohttp refuses in a header (http_writer._FORBIDDEN_HEADER_CHARS_RE): every control
# character but tab.
_FORBIDDEN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


_SERIALISERS_OWN = frozenset({"date", "connection"})


def bodiless(status: int) -> bool:
    """Statuses whose answers carry no body and no ``Content-Length`` (RFC 9110 §8.6)."""
    return status in (204, 304) or 100 <= status < 200


def serialise(
    status: int,
    headers: Sequence[tuple[str, str]],
    body_length: int,
    *,
    version: tuple[int, int] = (1, 1),
    head: bool = False,
    chunked: bool = False,
    close_delimited: bool = False,
) -> bytes:
    """The head of an answer up to (not including) its ``Date`` line, as aiohttp writes an
    ``EdgeResponse``: the headers in order, then ``Content-Length`` (none on a bodiless
    status) and a default ``Content-Type`` for a body without one. ``trailer`` ends it. The
    headers are the edge's own answer headers: a ``Server`` is dropped, a ``Date`` or
    ``Connection`` refused (``ValueError``), as a header with a control character is."""
    return b"".join(
        serialise_parts(
            status,
            headers,
            body_length,
            version=version,
            head=head,
            chunked=chunked,
            close_delimited=close_delimited,
        )
    )


def serialise_parts(
    status: int,
    headers: Sequence[tuple[str, str]],
    body_length: int,
    *,
    version: tuple[int, int] = (1, 1),
    head: bool = False,
    chunked: bool = False,
    close_delimited: bool = False,
) -> tuple[bytes, bytes]:
    """``serialise`` in two parts: the status line and ``headers``, then what aiohttp adds
    after them (``Content-Length``, a default ``Content-Type``). A header added last to an
    answer's headers goes between the two: the hit path splices each hit's ``Age`` there.
    ``chunked``: a body of unknown length follows in chunks (``chunk``), ended by ``LAST_CHUNK``;
    ``close_delimited``: it follows to the close (no length, no chunks)."""
    # One search over every name and value (the separators added below are not searched).
    if _FORBIDDEN.search("".join([text for pair in headers for text in pair])):
        bad = next(n for n, v in headers if _FORBIDDEN.search(n) or _FORBIDDEN.search(v))
        raise ValueError(f"a control character in the {bad!r} header")
    lines = [f"HTTP/{version[0]}.{version[1]} {status} {HTTPStatus(status).phrase}"]
    names = set()
    for name, value in headers:
        lowered = name.lower()
        if lowered in _SERIALISERS_OWN:
            raise ValueError(f"{name} is the serialiser's to write")
        if lowered == "server" or (lowered == "content-length" and bodiless(status)):
            continue  # the edge's answers name no server (``EdgeResponse``)
        names.add(lowered)
        lines.append(f"{name}: {value}")
    added = []
    if close_delimited:
        pass  # a body of unknown length, written to the close (an HTTP/1.0 reader's answer)
    elif chunked:
        # A body of unknown length (an SSE answer): chunks, as aiohttp frames a StreamResponse.
        added.append("Transfer-Encoding: chunked\r\n")
    elif not bodiless(status) and not head:  # aiohttp writes no length for a bodiless HEAD
        if "content-length" not in names:
            added.append(f"Content-Length: {body_length}\r\n")
        if body_length and "content-type" not in names:
            added.append("Content-Type: application/octet-stream\r\n")
    return _wire(lines) + b"\r\n", "".join(added).encode("utf-8")


def trailer(version: tuple[int, int], keep_alive: bool) -> bytes:
    """What follows the ``Date`` line: ``Connection`` where the version's default is not what
    happens, then the blank line."""
    if keep_alive and version == (1, 0):
        return KEEP_ALIVE_1_0_TRAILER
    if not keep_alive and version == (1, 1):
        return CLOSE_TRAILER
    return KEEP_ALIVE_TRAILER


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk of a chunked body."""
    return b"%x\r\n%b\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"
CLOSE_TRAILER = b"\r\nConnection: close\r\n\r\n"
KEEP_ALIVE_1_0_TRAILER = b"\r\nConnection: keep-alive\r\n\r\n"
KEEP_ALIVE_TRAILER = b"\r\n\r\n"


@functools.lru_cache(maxsize=4)
def date_line(epoch_seconds: int) -> bytes:
    """``Date: <IMF-fixdate>`` without its line end, as aiohttp formats it (made once a
    second: every answer of that second carries the same)."""
    return b"Date: " + formatdate(epoch_seconds, usegmt=True).encode("ascii")


class BodyFraming(Enum):
    """How the body of an answer whose length is not known in advance is framed."""

    NONE = "none"  # no body may follow (a HEAD, 204, 304, 1xx)
    LENGTH = "length"  # as long as its Content-Length says
    TO_CLOSE = "to-close"  # as it comes, ended by the connection's close (an HTTP/1.0 reader)
    CHUNKED = "chunked"  # in chunks (``chunk``), ended by ``LAST_CHUNK``


def _wire(lines: list[str]) -> bytes:
    """Head lines as bytes: UTF-8, as aiohttp encodes headers, and a value the origin sent as
    bytes that are not UTF-8 (HTTP's obs-text: aiohttp's client decodes them with
    ``surrogateescape``) goes out as the very bytes it came as. ``ValueError`` (a
    ``UnicodeEncodeError``) for text no bytes stand behind."""
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")


def _check(status_line: str, headers: Sequence[tuple[str, str]]) -> None:
    if _FORBIDDEN.search(status_line + "".join([text for pair in headers for text in pair])):
        raise ValueError("a control character in the answer's head")


def _closing(lines: list[str], names: set[str], version: tuple[int, int], keep_alive: bool,
             now_seconds: int) -> bytes:  # fmt: skip
    """aiohttp's last lines: ``Date`` where the headers have none, ``Connection`` where the
    version's default is not what happens, the blank line."""
    if "date" not in names:
        lines.append(date_line(now_seconds).decode("ascii"))
    if "connection" not in names:
        if keep_alive and version == (1, 0):
            lines.append("Connection: keep-alive")
        elif not keep_alive and version == (1, 1):
            lines.append("Connection: close")
    return _wire(lines) + b"\r\n\r\n"


def dated_answer_head(
    status: int,
    headers: Sequence[tuple[str, str]],
    body_length: int,
    *,
    keep_alive: bool,
    now_seconds: int,
    version: tuple[int, int] = (1, 1),
    head: bool = False,
) -> bytes:
    """The whole head of an edge answer whose headers may carry a ``Date`` of their own (an
    origin answer the cache passed on): as aiohttp writes such an ``EdgeResponse``, the
    ``Date`` stays where it is and none is added; otherwise as ``serialise`` + ``date_line``
    + ``trailer``. ``head``: the answer to a HEAD, whose body (``body_length`` long) is not
    written."""
    lines = [f"HTTP/{version[0]}.{version[1]} {status} {HTTPStatus(status).phrase}"]
    _check(lines[0], headers)
    names = set()
    for name, value in headers:
        lowered = name.lower()
        if lowered == "server" or (lowered == "content-length" and bodiless(status)):
            continue  # the edge's answers name no server (``EdgeResponse``)
        names.add(lowered)
        lines.append(f"{name}: {value}")
    if not bodiless(status) and "content-length" not in names and (body_length or not head):
        # A HEAD's answer says how long the GET's body is (which is not written), if any.
        lines.append(f"Content-Length: {body_length}")
    if not bodiless(status) and not head and body_length and "content-type" not in names:
        lines.append("Content-Type: application/octet-stream")
    return _closing(lines, names, version, keep_alive, now_seconds)


def relayed_answer_head(
    status: int,
    reason: str | None,
    headers: Sequence[tuple[str, str]],
    *,
    head: bool,
    keep_alive: bool,
    now_seconds: int,
    version: tuple[int, int] = (1, 1),
    close_delimited: bool = False,
) -> tuple[bytes, BodyFraming]:
    """The head of a relayed answer (``headers``: the relay's, finished) and how its body is
    framed, as aiohttp writes the relay's ``StreamResponse``: the origin's reason, the headers
    in order (its ``Date`` and ``Server`` where it sent them; no default of aiohttp's), then
    ``Transfer-Encoding: chunked`` for a body without a ``Content-Length`` (HTTP/1.1), a
    ``Date`` where it sent none, and ``Connection``. No body may follow a HEAD, a 204, a 304
    or a 1xx (their ``Transfer-Encoding`` dropped, and a 204's or 304's ``Content-Length``).
    ``close_delimited``: a body without a ``Content-Length`` is written to the close, never in
    chunks (the answer to an HTTP/1.0 read)."""
    phrase = reason
    if phrase is None:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
    lines = [f"HTTP/{version[0]}.{version[1]} {status} {phrase}"]
    _check(lines[0], headers)
    empty = head or bodiless(status)
    names = set()
    for name, value in headers:
        lowered = name.lower()
        if empty and lowered == "transfer-encoding":
            continue
        if lowered == "content-length" and bodiless(status):
            continue
        names.add(lowered)
        lines.append(f"{name}: {value}")
    if empty:
        framing = BodyFraming.NONE
    elif "content-length" in names:
        framing = BodyFraming.LENGTH
    elif version >= (1, 1) and not close_delimited:
        framing = BodyFraming.CHUNKED
        lines.append("Transfer-Encoding: chunked")
        names.add("transfer-encoding")
    else:
        framing = BodyFraming.TO_CLOSE  # HTTP/1.0's way, and the answer to an HTTP/1.0 read
        keep_alive = False
    return _closing(lines, names, version, keep_alive, now_seconds), framing


class WholeHead(NamedTuple):
    """Every part of a request head, for what must pass it on whole (a relay): the method,
    the target as sent, and every header in order, names as sent, values as aiohttp reads
    them (``_text``)."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    keep_alive: bool
    http10: bool = False  # answered as ``RequestHead.http10`` says


class _WholeCollector:
    __slots__ = ("headers", "keep_alive", "parser", "url")

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = False
        self.parser: httptools.HttpRequestParser | None = None

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        self.keep_alive = self.parser.should_keep_alive()  # as ``_Collector`` reads it


def parse_whole_head(raw: bytes) -> WholeHead:
    """``raw``, a head ``HeadParser`` took (so llhttp takes it too), read whole: the rare
    request that is relayed needs every header, which the hit path's parse does not keep."""
    collector = _WholeCollector()
    parser = httptools.HttpRequestParser(collector)
    collector.parser = parser
    parser.feed_data(raw)
    headers = tuple(
        (name.decode(VALUE_ENCODING, VALUE_ERRORS), _text(value))
        for name, value in collector.headers
    )
    method = parser.get_method().decode("ascii")
    url = collector.url.decode(VALUE_ENCODING, VALUE_ERRORS)  # as aiohttp decodes it
    http10 = parser.get_http_version() == "1.0"
    return WholeHead(method, url, headers, collector.keep_alive and not http10, http10)
