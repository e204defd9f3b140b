"""Header hygiene for a transparent proxy (RFC 9110 §7.6).

Rules this module owns:

* Hop-by-hop headers never cross the proxy, in either direction: the fixed set below plus every
  name listed in ``Connection`` (RFC 9110 §7.6.1).
* ``Host`` is the origin's: the HTTP client derives it from the origin URL, so the client's value is
  dropped here.
* Nothing is added upstream that the client did not send, except the forwarding trail
  (``Forwarded``, ``X-Forwarded-For``, ``X-Forwarded-Proto``, ``Via``). A default ``Content-Type``
  or ``Accept-Encoding`` would change the origin's answer (PROTOCOL-NOTES trap 10).
* Everything else is relayed verbatim and in order, repeated headers included, but for the
  lifetime of a read's answer the edge relays: ``no-store`` in place of any the origin gave, a
  CDN's own (``CDN-Cache-Control``, ``Surrogate-Control``) included
  (``relayed_read_cache_control``, ``with_cache_control``), as no purge would reach a copy.
* A stream's lifetime is read from ``Stream-TTL`` (a non-negative whole number of seconds) and
  ``Stream-Expires-At`` (RFC 3339 with a zone) as the origin states them (PROTOCOL.md §5.1,
  §5.5, ``stated_lifetime``); a value of any other form states nothing.

Headers are handled as ordered lists of ``(name, value)`` pairs so repeats survive.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime

HeaderList = list[tuple[str, str]]

VIA_PSEUDONYM = "edge"

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)

# Durable Streams header names (PROTOCOL.md §5), lower-cased for lookups.
STREAM_NEXT_OFFSET = "stream-next-offset"
STREAM_CURSOR = "stream-cursor"
STREAM_UP_TO_DATE = "stream-up-to-date"
STREAM_CLOSED = "stream-closed"
STREAM_FORKED_FROM = "stream-forked-from"  # a PUT that creates a fork (PROTOCOL.md 4.2)
LAST_EVENT_ID = "last-event-id"
AUTHORIZATION = "authorization"
COOKIE = "cookie"

# What a browser needs on every answer, errors included, to let a page read it: the reference
# origin sends these on all its answers. An EventSource that gets an error without them gives up
# for good instead of reconnecting.
CORS_PREFIX = "access-control-"
CORS_COMPANIONS = frozenset({"x-content-type-options", "cross-origin-resource-policy"})


def connection_tokens(headers: Iterable[tuple[str, str]]) -> frozenset[str]:
    """Names listed in every ``Connection`` header, lower-cased."""
    tokens: set[str] = set()
    for name, value in headers:
        if name.lower() == "connection":
            tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
    return frozenset(tokens)


def strip_hop_by_hop(headers: Sequence[tuple[str, str]]) -> HeaderList:
    """Drop hop-by-hop headers, including those the message names in ``Connection``."""
    dropped = HOP_BY_HOP | connection_tokens(headers)
    return [(name, value) for name, value in headers if name.lower() not in dropped]


def _format_for_node(address: str) -> str:
    # RFC 7239 §6: IPv6 nodes are bracketed and the whole value quoted.
    return f'"[{address}]"' if ":" in address else address


def upstream_request_headers(
    headers: Sequence[tuple[str, str]],
    *,
    client_address: str | None,
    scheme: str,
    host: str | None,
    http_version: str = "1.1",
) -> HeaderList:
    """The headers to send to the origin for a client request with ``headers``.

    ``client_address`` is the peer's IP, ``scheme`` and ``host`` what the client used to reach us.
    """
    kept = [(n, v) for n, v in strip_hop_by_hop(headers) if n.lower() != "host"]
    node = client_address or "unknown"

    forwarded_for = [v for n, v in kept if n.lower() == "x-forwarded-for"]
    forwarded = [v for n, v in kept if n.lower() == "forwarded"]
    vias = [v for n, v in kept if n.lower() == "via"]
    has_proto = any(n.lower() == "x-forwarded-proto" for n, _ in kept)
    trail = {"x-forwarded-for", "forwarded", "via"}
    out = [(n, v) for n, v in kept if n.lower() not in trail]

    element = f"for={_format_for_node(node)};proto={scheme}"
    if host:
        element += f';host="{host}"'
    out.append(("Forwarded", ", ".join([*forwarded, element])))
    out.append(("X-Forwarded-For", ", ".join([*forwarded_for, node])))
    if not has_proto:
        out.append(("X-Forwarded-Proto", scheme))
    out.append(("Via", ", ".join([*vias, f"{http_version} {VIA_PSEUDONYM}"])))
    return out


def downstream_response_headers(
    headers: Sequence[tuple[str, str]],
    *,
    origin_base: str,
    public_base: str,
    http_version: str = "1.1",
) -> HeaderList:
    """The origin's response headers as relayed to the client: verbatim, minus hop-by-hop,
    with this proxy appended to ``Via``.

    A ``Location`` under ``origin_base`` (the origin names itself after a create) is rewritten
    under ``public_base``, the address the client used: the origin's own address is internal,
    and a client following it would bypass the edge (as nginx's default ``proxy_redirect``).
    """
    kept = strip_hop_by_hop(headers)
    vias = [v for n, v in kept if n.lower() == "via"]
    out = [
        (n, _rebase(v, origin_base, public_base) if n.lower() == "location" else v)
        for n, v in kept
        if n.lower() != "via"
    ]
    out.append(("Via", ", ".join([*vias, f"{http_version} {VIA_PSEUDONYM}"])))
    return out


def _rebase(url: str, origin_base: str, public_base: str) -> str:
    if url == origin_base or url.startswith(origin_base + "/"):
        return public_base + url[len(origin_base) :]
    return url


def flag(headers: Iterable[tuple[str, str]], name: str) -> bool:
    """Is header ``name`` the protocol's ``true`` (``Stream-Up-To-Date``, ``Stream-Closed``)?"""
    return (first_value(headers, name) or "").strip().lower() == "true"


def own_request_headers(credentials: Sequence[tuple[str, str]]) -> HeaderList:
    """Headers of a request the edge makes for itself (a cache fill, a live tail): identity bytes
    it can store and stitch, the scope's credentials, and nothing else of any one client."""
    return [("Accept-Encoding", "identity"), *credentials, ("Via", f"1.1 {VIA_PSEUDONYM}")]


def names_this_proxy(via_values: Iterable[str]) -> bool:
    """Has the request already passed through an edge (RFC 9110 §7.6.3: ``Via`` elements are
    ``protocol received-by [comment]``)? Then it came back round a loop (a CDN whose backend
    is itself, in front of the edge)."""
    for value in via_values:
        for element in value.split(","):
            parts = element.split()
            if len(parts) >= 2 and parts[1] == VIA_PSEUDONYM:
                return True
    return False


# Where a CDN takes a lifetime of its own from, over ``Cache-Control``: RFC 9213's targeted field,
# and ``Surrogate-Control`` (Varnish through the shipped VCL, Fastly).
CDN_LIFETIMES = frozenset({"cdn-cache-control", "surrogate-control"})
LIFETIMES = CDN_LIFETIMES | {"cache-control"}


def default_cache_control(
    headers: Sequence[tuple[str, str]], *, method: str, private: bool
) -> str | None:
    """The ``Cache-Control`` to add to an answer to a read that has none, so no cache downstream
    (a CDN, a browser) keeps it by its own heuristics. None: it has one, or it is not a read's."""
    if method.upper() not in ("GET", "HEAD"):
        return None
    if any(name.lower() == "cache-control" for name, _ in headers):
        return None
    return "private, no-store" if private else "no-store"


def relayed_read_cache_control(
    headers: Sequence[tuple[str, str]],
    *,
    method: str,
    private: bool,
    event_stream: bool = False,
    control: bool = False,
) -> str | None:
    """The ``Cache-Control`` a relayed answer to a read gets instead of any lifetime it had:
    ``no-store`` (``private, no-store`` with credentials). A read the edge relays was not
    answered from its cache: it carries no validator, its bytes were never checked against the
    stream instance, and no purge would reach a copy of it, so no tier keeps it; a HEAD reports
    the tail now; a refusal is about its own request, and a stream created after a 404 must be
    readable at once. None: leave the answer as it is: not a read's, or an event stream
    (``event_stream``) that says how it may be cached (``no-cache, no-transform``: no proxy
    may buffer or alter it), or an answer of the origin's control API (``control``) that says
    it: the origin's word on its own resource, which no purge of the edge's is about."""
    if method.upper() not in ("GET", "HEAD"):
        return None
    if (event_stream or control) and any(name.lower() == "cache-control" for name, _ in headers):
        return None
    return "private, no-store" if private else "no-store"


def with_cache_control(headers: Sequence[tuple[str, str]], control: str) -> HeaderList:
    """``headers`` with ``control`` as their one lifetime: in the place of their first
    ``Cache-Control`` (else last), and no lifetime a CDN would take over it."""
    out: HeaderList = []
    placed = False
    for name, value in headers:
        lowered = name.lower()
        if lowered == "cache-control" and not placed:
            out.append((name, control))
            placed = True
        elif lowered not in LIFETIMES:
            out.append((name, value))
    if not placed:
        out.append(("Cache-Control", control))
    return out


def not_to_be_kept(headers: Sequence[tuple[str, str]], *, private: bool) -> HeaderList:
    """``headers`` of an answer no tier may keep: any lifetime they gave (``Cache-Control``, a
    CDN's own) replaced by ``no-store`` (``private, no-store`` with credentials)."""
    return with_cache_control(headers, "private, no-store" if private else "no-store")


def first_value(headers: Iterable[tuple[str, str]], name: str) -> str | None:
    """The first value of header ``name`` (case-insensitive), or None."""
    wanted = name.lower()
    for key, value in headers:
        if key.lower() == wanted:
            return value
    return None


def joined_value(headers: Iterable[tuple[str, str]], name: str) -> str | None:
    """The value of the list-valued header ``name`` (case-insensitive): its field lines, however
    many, are one comma-separated list (RFC 9110 §5.3), joined with ``", "`` (an empty line
    adds no element); None if absent. Both paths read ``If-None-Match`` and ``Accept-Encoding``
    so."""
    wanted = name.lower()
    values = [value for key, value in headers if key.lower() == wanted]
    return ", ".join([value for value in values if value]) if values else None


# Request fields whose one value changes the answer: whose CORS headers, where an SSE read
# resumes. Sent more than once, which one counts would be a guess: the request is a 400
# (``REPEATED``), on both paths. (A repeated ``Host`` is aiohttp's own 400.)
ANSWER_SINGLETONS = {"origin": "Origin", "last-event-id": "Last-Event-ID"}
# The edge's answer to a request that came back round a loop (508).
LOOP_TEXT = "loop detected: this request already passed through the edge"


def repeated_text(name: str) -> str:
    """The text of the 400 to a request that repeats the answer singleton ``name``."""
    return f"the {ANSWER_SINGLETONS.get(name.lower(), name)} header may be sent only once"


def repeated_singleton(headers: Iterable[tuple[str, str]]) -> str | None:
    """The first of ``ANSWER_SINGLETONS`` that ``headers`` repeat (lower-cased), or None."""
    seen: set[str] = set()
    for key, _ in headers:
        lowered = key.lower()
        if lowered in ANSWER_SINGLETONS:
            if lowered in seen:
                return lowered
            seen.add(lowered)
    return None


def cors_headers(headers: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The ``access-control-*``, ``x-content-type-options`` and ``cross-origin-resource-policy``
    headers of an answer, in order."""
    return tuple(
        (name, value)
        for name, value in headers
        if name.lower().startswith(CORS_PREFIX) or name.lower() in CORS_COMPANIONS
    )


def filter_cookies(cookie_header: str, names: Collection[str]) -> str | None:
    """A ``Cookie`` header value (RFC 6265 §4.2.1: ``a=1; b=2``) keeping only the pairs whose
    name is in ``names`` (names are case-sensitive), in their order; None if none is left.

    Parsing is as lenient as servers are: pairs are split on ``;`` (a cookie value cannot hold
    one, quoted or not), whitespace around a pair or a name is ignored, a pair without ``=``
    names no cookie and is dropped.
    """
    kept = []
    for pair in cookie_header.split(";"):
        pair = pair.strip(" \t")
        name, equals, _ = pair.partition("=")
        if equals and name.strip(" \t") in names:
            kept.append(pair)
    return "; ".join(kept) if kept else None


def stated_lifetime(headers: Sequence[tuple[str, str]]) -> tuple[float | None, float | None]:
    """The ``Stream-TTL`` seconds and ``Stream-Expires-At`` POSIX timestamp ``headers`` state
    (each None when absent or malformed)."""
    return (
        parse_ttl_seconds(first_value(headers, "stream-ttl")),
        parse_expires_at(first_value(headers, "stream-expires-at")),
    )


def parse_ttl_seconds(value: str | None) -> float | None:
    """``Stream-TTL``: a non-negative whole number of seconds, else None."""
    if value is None or not value.strip().isdigit():
        return None
    return float(int(value.strip()))


def parse_expires_at(value: str | None) -> float | None:
    """``Stream-Expires-At`` (RFC 3339) as a POSIX timestamp, else None."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return moment.timestamp()
