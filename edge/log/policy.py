"""The catch-up policy: given what the edge holds, answer, or ask the origin for what is missing.

Rules this module owns (PROTOCOL.md §5.6, §10; PROTOCOL-NOTES "Cacheability"):

* A read at X follows segments from X, end to start. If that reaches the known tail and the tail
  is trusted (closed, followed live, or observed within the freshness window), the edge answers
  alone (``Hit``). If it stops short, the origin is asked only for the missing part, from the
  last known end (``Fetch``: a *delta* when the edge had a prefix, a *miss* when it had nothing).
* A stitched answer stops adding segments at ``max_bytes`` (always at least one). A capped answer
  is not up-to-date, carries no ``Stream-Up-To-Date`` and is immutable.
* ETags are ``"<stream id>:<start>:<end>:<content digest>"``, ``:c`` once the answer ends a
  closed stream, and a ``:gzip`` suffix for the compressed representation, so every
  representation has its own tag. The digest makes the tag a validator of the bytes: a stream
  deleted and recreated reuses offsets, never a tag, so an old tag cannot earn a 304.
* ``If-None-Match`` is one rule for both paths (``if_none_match_hits``): a listed tag matches
  the current one by weak comparison (RFC 9110 §8.8.3.2), and a *weak* tag also matches when it
  names the same bytes in another content coding. A CDN that fetched the gzip representation
  and decoded it for an identity client weakens its tag (RFC 9110 §8.8.1: ``W/"…:gzip"``); the
  client holds the very bytes the identity tag names, so it gets its 304. A strong tag of another
  coding names other bytes and does not match.
* A fill's answer is its reader's prefix and the segment the fill brought (``fill_coverage``),
  capped by the same rule as ``cover``: a reader that joins another's fill in flight gets what
  its own fill would have given it, never more than ``max_bytes`` past its first segment.
* An at-tail ``Hit`` of a tail the edge observed says whether it is late in its freshness
  window (``Hit.refresh``, ``edge.log.ahead``): the I/O layer then renews the tail in the
  background, and the answer is given as it would be.
* How long each tier may keep an answer is ``edge.log.freshness``'s (the ``Reuse`` verdict);
  every answer the edge builds of a stream carries the verdict's headers and the stream
  instance's purge keys (``edge.protocol.purge_keys``).
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from edge.log.ahead import Refresh, refresh_of
from edge.log.freshness import Reuse
from edge.log.segment import Segment
from edge.log.stream_log import LogKey, StreamLog
from edge.protocol.paths import MEMO_ENTRIES
from edge.protocol.purge_keys import PurgeKeys, purge_keys

SegmentLookup = Callable[[LogKey, str], Segment | None]

# A chain longer than this is answered in parts; it bounds the work one request can cause.
MAX_SEGMENTS_PER_ANSWER = 4096


@dataclass(frozen=True, kw_only=True, slots=True)
class Coverage:
    """Segments that join from the read offset, in order, and where they end."""

    segments: tuple[Segment, ...]
    end: str
    capped: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class Hit:
    coverage: Coverage
    up_to_date: bool
    closed: bool
    # An at-tail answer late in its tail's freshness window: renew the tail in the background.
    refresh: Refresh = Refresh.NONE


@dataclass(frozen=True, kw_only=True, slots=True)
class Fetch:
    """Ask the origin for ``offset``; ``prefix`` is what the edge already has before it."""

    offset: str
    prefix: Coverage

    @property
    def is_delta(self) -> bool:
        return bool(self.prefix.segments)


def cover(lookup: SegmentLookup, key: LogKey, offset: str, *, max_bytes: int) -> Coverage:
    segments: list[Segment] = []
    total = 0
    end = offset
    while len(segments) < MAX_SEGMENTS_PER_ANSWER:
        segment = lookup(key, end)
        if segment is None or segment.start != end or not segment.end > end:
            # Segments only move forward (``Segment`` enforces it); a lookup that answers
            # otherwise is not followed, so a chain can never loop.
            return Coverage(segments=tuple(segments), end=end, capped=False)
        if segments and total + segment.size > max_bytes:
            return Coverage(segments=tuple(segments), end=end, capped=True)
        segments.append(segment)
        total += segment.size
        end = segment.end
    return Coverage(segments=tuple(segments), end=end, capped=True)


def plan_catchup(
    log: StreamLog | None,
    lookup: SegmentLookup,
    key: LogKey,
    offset: str,
    *,
    now: float,
    freshness_seconds: float,
    max_bytes: int,
    authority_seconds: float = float("inf"),
) -> Hit | Fetch:
    if log is None or log.expired(now) or log.instance.bypassed(now):
        return Fetch(offset=offset, prefix=Coverage(segments=(), end=offset, capped=False))
    coverage = cover(lookup, key, offset, max_bytes=max_bytes)
    if coverage.capped:
        return Hit(coverage=coverage, up_to_date=False, closed=False)
    tail = log.tail
    if tail is not None and at_tail_holds(
        log, coverage.end, tail.closed, now=now, freshness_seconds=freshness_seconds,
        authority_seconds=authority_seconds,
    ):  # fmt: skip
        refresh = refresh_of(tail, now=now, freshness_seconds=freshness_seconds)
        return Hit(coverage=coverage, up_to_date=True, closed=tail.closed, refresh=refresh)
    return Fetch(offset=coverage.end, prefix=coverage)


def fill_coverage(
    prefix: Coverage, segment: Segment | None, end: str, *, max_bytes: int
) -> Coverage:
    """What a fill's reader answers: its own ``prefix`` and the ``segment`` the fill brought
    (ending at ``end``), capped as ``cover`` caps a chain. The same fill may be shared by
    readers with different prefixes (a refill of the tail, a delta): each is capped by its own.
    Capped, the answer is the prefix alone (the segment is in the log for the next read)."""
    if segment is None:
        return Coverage(segments=prefix.segments, end=end, capped=False)
    total = sum(s.size for s in prefix.segments)
    if prefix.segments and total + segment.size > max_bytes:
        return Coverage(segments=prefix.segments, end=prefix.end, capped=True)
    return Coverage(segments=(*prefix.segments, segment), end=end, capped=False)


def at_tail_holds(
    log: StreamLog,
    end: str,
    closed: bool,
    *,
    now: float,
    freshness_seconds: float,
    authority_seconds: float = float("inf"),
) -> bool:
    """May an answer that ends at ``end`` (closing the stream there, or not) be given now as
    the up-to-date answer? Only while the log's tail is exactly there, as closed as it was, and
    trusted (fresh, or followed live). The one rule both the catch-up plan and the stored
    at-tail answers of the hit path follow."""
    tail = log.tail
    return (
        tail is not None
        and tail.offset == end
        and tail.closed == closed
        and not log.expired(now)
        and not log.instance.bypassed(now)
        and log.tail_trusted(now, freshness_seconds, authority_seconds)
    )


@functools.lru_cache(maxsize=MEMO_ENTRIES)
def stream_id(stream: str) -> str:
    digest = hashlib.sha256(stream.encode()).digest()[:12]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


@functools.lru_cache(maxsize=MEMO_ENTRIES)
def keys_of(stream: str, generation: str) -> PurgeKeys:
    """The purge keys of the answers of ``stream``'s instance ``generation`` (computed once)."""
    return purge_keys(stream, generation)


def etag(
    stream: str, start: str, end: str, *, digest: str, closed: bool, encoding: str | None
) -> str:
    tag = f"{stream_id(stream)}:{start}:{end}:{digest}"
    if closed:
        tag += ":c"
    if encoding:
        tag += f":{encoding}"
    return f'"{tag}"'


# The content-coding suffixes of the edge's tags (``etag``): a tag without one names the bytes
# once decoded. A digest is hexadecimal, so no tag of the identity coding ends with one.
CODING_SUFFIXES = (':gzip"',)


def decoded_tag(opaque: str) -> str:
    """An edge tag (without ``W/``) without its content-coding suffix: what it names decoded."""
    for suffix in CODING_SUFFIXES:
        if opaque.endswith(suffix):
            return opaque[: -len(suffix)] + '"'
    return opaque


def if_none_match_hits(header: str | None, current: str) -> bool:
    """Does ``If-None-Match`` name what would be sent (RFC 9110 §13.1.2)? ``*``, a tag equal to
    ``current`` by weak comparison, or a weak tag of the same bytes in another content coding
    (see the module rules)."""
    if header is None:
        return False
    opaque = current.removeprefix("W/")
    decoded: str | None = None
    for candidate in header.split(","):
        candidate = candidate.strip()
        if candidate == "*":
            return True
        if candidate.startswith("W/"):
            candidate = candidate[2:]
            if candidate == opaque:
                return True
            if decoded is None:
                decoded = decoded_tag(opaque)
            if decoded_tag(candidate) == decoded:
                return True
        elif candidate == opaque:
            return True
    return False


def answer_headers(
    log: StreamLog,
    *,
    next_offset: str,
    up_to_date: bool,
    closed: bool,
    tag: str,
    verdict: Reuse,
    keys: PurgeKeys,
    cursor: str | None = None,
    varies_by_encoding: bool = True,
) -> list[tuple[str, str]]:
    """The Stream-* and caching headers of an answer the edge makes: a catch-up answer (also
    its 304), whose body may be gzipped, or a long-poll's 200, which carries a cursor. The
    caching headers are the verdict's, then the purge keys of the instance it was made of."""
    headers = list(log.header_template)
    if log.content_type is not None:
        headers.append(("Content-Type", log.content_type))
    headers.append(("Stream-Next-Offset", next_offset))
    if cursor is not None:
        headers.append(("Stream-Cursor", cursor))
    if up_to_date:
        headers.append(("Stream-Up-To-Date", "true"))
    if closed:
        headers.append(("Stream-Closed", "true"))
    headers.append(("ETag", tag))
    headers += verdict.headers()
    headers += purge_headers(keys)
    if varies_by_encoding:
        headers.append(("Vary", "Accept-Encoding"))
    return headers


def purge_headers(keys: PurgeKeys) -> list[tuple[str, str]]:
    """The keys a CDN purges an answer by: ``Surrogate-Key`` (Fastly, Varnish xkey) and
    ``Cache-Tag`` (Cloudflare)."""
    return [("Surrogate-Key", keys.surrogate_key), ("Cache-Tag", keys.cache_tag)]
