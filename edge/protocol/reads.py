"""Classify a client request into what the edge must do with it (PROTOCOL.md §5).

Rules this module owns:

* The kind of a request decides its metrics label and, later, its path through the cache:
  ``GET`` with ``live=sse`` is an SSE read, with ``live=long-poll`` a long-poll, with no ``live`` a
  catch-up read; ``HEAD`` is metadata; ``PUT``/``POST``/``DELETE`` change a stream; anything else
  (``OPTIONS``, an unknown ``live`` value, other methods) is ``other`` and is only forwarded.
* A request to the origin's control API (a path with a ``__ds`` segment,
  ``edge.protocol.paths.names_control``) is ``control``, whatever its method and query: decided
  before anything else, as servers route it before stream operations (PROTOCOL.md 6). It is no
  stream's read or write: only relayed, verbatim, never stored, collapsed or fanned out, and its
  answer teaches the edge nothing of any stream.
* A read is described by value: stream path, offset, live mode, cursor, ``Last-Event-ID`` and the
  credential scope, so the cache can key on it without looking at the request again.
* Credentials put a request in a private scope named by a hash of them; requests without
  credentials share the public scope (RFC 9111 §3.5). Which headers are credentials is
  configuration (``--scope-headers``, default ``Authorization`` and ``Cookie``); with
  ``--scope-cookies``, only the named cookies of a ``Cookie`` header count. The credentials that
  name a scope are exactly the ones the edge sends upstream for it (``scope_credentials``), so
  a scope's bytes always come from an origin request carrying that scope's credentials.
* A read the edge authorized itself (``--auth jwt|forward``) is in its policy's scope, named by
  the mode and a digest of the credential the edge sends upstream for it (``--origin-header``):
  replicas with different policies on one Redis never share a key, so what one fetched with
  its credential never reaches another's anonymous readers. Like a credential's, the policy's
  scope is ``private`` to downstream caches; like the public scope, no client's credential
  reached the origin for it (``speaks_for_the_stream``).
* Query parameters are parsed once, in order-independent form (PROTOCOL-NOTES trap 3).
* Offsets are values (PROTOCOL.md §8): opaque to the edge but lexicographically sortable, so
  the edge compares them as strings and never parses them. An offset from the origin
  (``Stream-Next-Offset``, an SSE ``streamNextOffset``) or from a client (``offset=``,
  ``Last-Event-ID``) is checked here (``is_offset_token``, ``is_client_offset``) before it
  reaches a cache key, an ETag, an SSE ``id:`` line or a log line: 1 to ``MAX_OFFSET_CHARS``
  visible ASCII characters, none of which can end a header, a frame or a quoted tag (no
  whitespace, controls, ``"``, ``,`` or ``\\``). ``-1`` (the start) and ``now`` (the tail) are
  sentinels a client may send; the origin never issues them as a position.
* A bare request line (all a connection refused at the cap sends before it is gone) has the
  kind its method and query give (``kind_of_request_line``), so refusals are counted by kind.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import parse_qsl

from edge.protocol.headers import AUTHORIZATION, COOKIE, LAST_EVENT_ID, filter_cookies
from edge.protocol.paths import MEMO_ENTRIES, names_control

START = "-1"
NOW = "now"
MAX_OFFSET_CHARS = 256

_TOKEN = re.compile(r"[!#-+\--\[\]-~]{1,%d}" % MAX_OFFSET_CHARS)  # noqa: UP031


def is_offset_token(value: str | None) -> bool:
    """Could ``value`` be a position the origin issued?"""
    return value is not None and value not in (START, NOW) and _TOKEN.fullmatch(value) is not None


def is_client_offset(value: str | None) -> bool:
    """May a client start a read here (a position, ``-1`` or ``now``)?"""
    return value is not None and (value in (START, NOW) or _TOKEN.fullmatch(value) is not None)


PUBLIC_SCOPE = "public"
CREDENTIAL_SCOPE_PREFIX = "cred-"
POLICY_SCOPE_PREFIX = "auth-"
# The defaults of ``Settings.scope_headers`` and ``Settings.scope_cookies``.
DEFAULT_SCOPE_HEADERS: tuple[str, ...] = (AUTHORIZATION, COOKIE)
DEFAULT_SCOPE_COOKIES: tuple[str, ...] = ()


class RequestKind(enum.StrEnum):
    CATCHUP = "catchup"
    LONG_POLL = "long_poll"
    SSE = "sse"
    HEAD = "head"
    WRITE = "write"
    CONTROL = "control"
    OTHER = "other"


LIVE_MODES = {"long-poll": RequestKind.LONG_POLL, "sse": RequestKind.SSE}
WRITE_METHODS = frozenset({"PUT", "POST", "DELETE"})


@dataclass(frozen=True, kw_only=True, slots=True)
class Read:
    """A GET of a stream, in the terms the cache needs."""

    stream: str
    offset: str | None
    live: str | None
    cursor: str | None
    last_event_id: str | None
    scope: str
    # Only protocol parameters, each once: such a read may be answered from the cache. Anything
    # else (an unknown or repeated parameter) goes to the origin as sent, which judges it.
    plain: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class Classified:
    kind: RequestKind
    read: Read | None


def scope_credentials(
    headers: Iterable[tuple[str, str]],
    *,
    scope_headers: Collection[str] = DEFAULT_SCOPE_HEADERS,
    scope_cookies: Collection[str] = DEFAULT_SCOPE_COOKIES,
) -> list[tuple[str, str]]:
    """The request's credential headers, in order: those named in ``scope_headers`` (lower-case),
    with a ``Cookie`` cut down to ``scope_cookies`` when that is not empty (dropped if none
    remain). What names the scope, and all of the client's that a cache fill or a live tail
    sends upstream."""
    credentials: list[tuple[str, str]] = []
    for name, value in headers:
        lowered = name.lower()
        if lowered not in scope_headers:
            continue
        if lowered == COOKIE and scope_cookies:
            kept = filter_cookies(value, scope_cookies)
            if kept is None:
                continue
            value = kept
        credentials.append((name, value))
    return credentials


def auth_scope(
    headers: Iterable[tuple[str, str]],
    *,
    scope_headers: Collection[str] = DEFAULT_SCOPE_HEADERS,
    scope_cookies: Collection[str] = DEFAULT_SCOPE_COOKIES,
) -> str:
    """``public`` for a request without credentials, else a stable hash of the credentials."""
    credentials = sorted(
        (name.lower(), value)
        for name, value in scope_credentials(
            headers, scope_headers=scope_headers, scope_cookies=scope_cookies
        )
    )
    if not credentials:
        return PUBLIC_SCOPE
    return CREDENTIAL_SCOPE_PREFIX + _digest(credentials)


def policy_scope(mode: str, origin_headers: Iterable[tuple[str, str]]) -> str:
    """The scope of the reads an ``--auth`` policy authorized (``mode`` is ``jwt`` or
    ``forward``; ``origin_headers`` what its origin requests carry)."""
    credentials = sorted((name.lower(), value) for name, value in origin_headers)
    return POLICY_SCOPE_PREFIX + _digest([("mode", mode), *credentials])


def speaks_for_the_stream(scope: str) -> bool:
    """Whether the origin's answers in ``scope`` say what the stream is, not what one client
    may see: public, or an auth policy's (the edge's own credential went upstream)."""
    return scope == PUBLIC_SCOPE or scope.startswith(POLICY_SCOPE_PREFIX)


def _digest(pairs: Iterable[tuple[str, str]]) -> str:
    digest = hashlib.sha256()
    for name, value in pairs:
        digest.update(f"{name}\0{value}\0".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:32]


PROTOCOL_PARAMS = frozenset({"offset", "live", "cursor"})


def query_params(query_string: str) -> dict[str, str]:
    """Query parameters by name; the first occurrence of a repeated name wins."""
    params: dict[str, str] = {}
    for name, value in parse_qsl(query_string, keep_blank_values=True):
        params.setdefault(name, value)
    return params


def only_protocol_params(query_string: str) -> bool:
    names = [name for name, _ in parse_qsl(query_string, keep_blank_values=True)]
    return len(names) == len(set(names)) and set(names) <= PROTOCOL_PARAMS


class LiveQuery(NamedTuple):
    """What a live read's query asks, read once per distinct query string."""

    live: str
    offset: str | None
    cursor: str | None
    plain: bool  # only protocol parameters, each once (``only_protocol_params``)


@functools.lru_cache(maxsize=MEMO_ENTRIES)
def live_query(query_string: str) -> LiveQuery | None:
    """The live mode, offset and cursor ``classify`` reads from ``query_string``; None when it
    asks for no live mode. Memoised: after each release every viewer of a stream asks with the
    same query."""
    params = query_params(query_string)
    live = params.get("live")
    if live is None:
        return None
    return LiveQuery(
        live=live,
        offset=params.get("offset"),
        cursor=params.get("cursor"),
        plain=only_protocol_params(query_string),
    )


def kind_of_request_line(data: bytes) -> RequestKind | None:
    """The kind of the request whose head starts ``data``: None while its request line is not
    complete, ``other`` for one that is not ``METHOD TARGET VERSION``."""
    line, found, _ = data.partition(b"\r\n")
    if not found:
        return None
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[0].isalpha():
        return RequestKind.OTHER
    method = parts[0].decode("ascii").upper()
    query = parts[1].partition(b"?")[2].decode("latin-1")
    return classify(method, "", query, ()).kind


def classify(
    method: str,
    path: str,
    query_string: str,
    headers: Iterable[tuple[str, str]],
    *,
    scope_headers: Collection[str] = DEFAULT_SCOPE_HEADERS,
    scope_cookies: Collection[str] = DEFAULT_SCOPE_COOKIES,
    scope: str | None = None,
) -> Classified:
    """What to do with a request; ``path`` is the stream's normalised path
    (``edge.protocol.paths``). ``scope``, when given, is the read's scope whatever its
    credentials (a read the edge authorized itself is its policy's, ``policy_scope``)."""
    if names_control(path):
        return Classified(kind=RequestKind.CONTROL, read=None)
    method = method.upper()
    if method == "HEAD":
        # Metadata of the stream: the edge may answer it where it knows the whole stream, when
        # the query asks nothing of it (anything else is the origin's to judge).
        header_list = list(headers)
        head = Read(
            stream=path, offset=None, live=None, cursor=None, last_event_id=None,
            scope=scope
            if scope is not None
            else auth_scope(header_list, scope_headers=scope_headers, scope_cookies=scope_cookies),
            plain=query_string == "",
        )  # fmt: skip
        return Classified(kind=RequestKind.HEAD, read=head)
    if method in WRITE_METHODS:
        return Classified(kind=RequestKind.WRITE, read=None)
    if method != "GET":
        return Classified(kind=RequestKind.OTHER, read=None)

    params = query_params(query_string)
    live = params.get("live")
    if live is None:
        kind = RequestKind.CATCHUP
    elif live in LIVE_MODES:
        kind = LIVE_MODES[live]
    else:
        return Classified(kind=RequestKind.OTHER, read=None)

    header_list = list(headers)
    last_event_id = next(
        (value for name, value in header_list if name.lower() == LAST_EVENT_ID), None
    )
    read = Read(
        stream=path,
        offset=params.get("offset"),
        live=live,
        cursor=params.get("cursor"),
        last_event_id=last_event_id,
        scope=scope
        if scope is not None
        else auth_scope(header_list, scope_headers=scope_headers, scope_cookies=scope_cookies),
        plain=only_protocol_params(query_string),
    )
    return Classified(kind=kind, read=read)
