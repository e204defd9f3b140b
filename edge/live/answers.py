"""What live reads answer, built from bytes and values: long-poll answers and SSE frames.

Rules this module owns (PROTOCOL.md §5.7, §5.8, §10; PROTOCOL-NOTES trap 1):

* A long-poll with data answers 200 with the stitched bytes of its coverage and
  ``Stream-Next-Offset`` at the coverage's end. It is up to date only if that end is the tail and
  the coverage is not capped, and it ends a closed stream (``Stream-Closed``) only then. Its
  ``ETag`` and ``Cache-Control`` are the catch-up answer's for the same range (``edge.log.policy``
  makes both; the verdict is asked for an answer that can never change when it is capped or ends
  a closed stream), so a client may revalidate either with the other's tag; so are its CDN
  lifetime, purge keys and, at the tail, ``Age``. It carries a ``Stream-Cursor`` unless it ends
  a closed stream, and never ``Vary: Accept-Encoding``: long-poll answers are not compressed.
* A long-poll with nothing new answers 204 at its own offset with ``Stream-Up-To-Date``, and
  ``Stream-Closed`` if the stream is closed there, else a ``Stream-Cursor``. No browser keeps it
  (``no-store``): "nothing new" is only true until the next append. A CDN keeps a shared scope's
  for about a second under its cursor URL (``edge.log.freshness.long_poll_empty_reuse``), so a
  herd parked there is released at once; it carries the stream instance's purge keys.
* An edge whose live upstream is failing answers 502, never "nothing new", which would be a guess;
  it and the origin's refusals are ``no-store``.
* SSE: a batch is one ``data`` event (text for text/* and JSON, else base64, §5.8) followed by its
  ``control`` event (``streamNextOffset``; ``streamClosed``, or ``streamCursor`` and, at the
  tail, ``upToDate``), both with ``id: <offset after the batch>`` so a client resumes exactly
  there. A closure with no new bytes is the control event alone.

Pure: bytes and values in, answers out; no event loop, sockets or metrics. ``edge.live.hub``
decides when each is given, and keeps the frames it encodes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from enum import Enum
from typing import Protocol

from edge.answer import Answer, Result, relayable
from edge.log.freshness import Reuse, long_poll_empty_reuse
from edge.log.policy import Coverage, answer_headers, etag, keys_of, purge_headers
from edge.log.segment import content_digest, media_type, stitch
from edge.log.stream_log import StreamLog, TailFact
from edge.protocol.headers import not_to_be_kept
from edge.protocol.http1 import chunk
from edge.protocol.reads import PUBLIC_SCOPE
from edge.protocol.sse import encode_event


class ReuseFor(Protocol):
    """The policy's verdict on reusing an answer of the stream that can never change
    (``immutable``) or may (``CatchupCache.reuse_for`` for its log): it knows the settings and
    the stream's lifetime, this module only which of the two an answer is."""

    def __call__(self, *, immutable: bool) -> Reuse: ...


class AgeOf(Protocol):
    """The ``Age`` of an answer with this verdict whose tail the edge ``observed`` (None: it
    carries none; ``CatchupCache.age_of``, which knows the clock)."""

    def __call__(self, verdict: Reuse, observed: TailFact | None, /) -> int | None: ...


class Pending(Enum):
    """Why a long-poll has no answer yet: it waits (WAIT), must fetch the gap to the tail
    (GAP), or its stream is gone (GONE). The last two wake a group's waiters to do it each."""

    WAIT = "wait"
    GAP = "gap"
    GONE = "gone"

    @property
    def wakes(self) -> bool:
        return self is not Pending.WAIT


def sse_encoding(content_type: str | None) -> str:
    """How data events carry bytes: ``text`` for text/* and JSON, else ``base64`` (§5.8)."""
    ct = media_type(content_type)
    return "text" if ct.startswith("text/") or ct == "application/json" else "base64"


def long_poll_data(
    log: StreamLog,
    offset: str,
    coverage: Coverage,
    *,
    cursor: str,
    waited: bool,
    reuse_for: ReuseFor,
    age_of: AgeOf,
) -> Answer:
    """The 200 for a long-poll at ``offset`` whose ``coverage`` holds at least one segment.
    ``waited``: it waited at the tail for these bytes (``Cache-Status`` says so)."""
    end = coverage.end
    tail = log.tail
    at_tail = tail is not None and tail.offset == end and not coverage.capped
    closed = at_tail and tail is not None and tail.closed
    verdict = reuse_for(immutable=closed or not at_tail)
    headers = answer_headers(
        log,
        next_offset=end,
        up_to_date=at_tail,
        closed=closed,
        tag=etag(
            log.key.stream,
            offset,
            end,
            digest=content_digest(coverage.segments, log.content_type),
            closed=closed,
            encoding=None,
        ),
        verdict=verdict,
        keys=keys_of(log.key.stream, log.instance.generation),
        cursor=None if closed else cursor,
        varies_by_encoding=False,
    )
    return Answer(
        result=Result.LIVE,
        status=200,
        headers=headers,
        body=stitch(coverage.segments, json=log.json),
        cache_status="edge; hit; detail=waited" if waited else "edge; hit",
        age_seconds=age_of(verdict, tail),
    )


def long_poll_empty(log: StreamLog, offset: str, *, cursor: str, closed: bool) -> Answer:
    """The 204 for a long-poll at ``offset`` with nothing new: the stream is closed there, or
    nothing arrived before its timeout (or the edge drains)."""
    headers = list(log.header_template)
    headers += [("Stream-Next-Offset", offset), ("Stream-Up-To-Date", "true")]
    if closed:
        headers.append(("Stream-Closed", "true"))
    else:
        headers.append(("Stream-Cursor", cursor))
    # No browser keeps "nothing new" (PROTOCOL-NOTES trap 1); a CDN for a second (trap 13).
    headers += long_poll_empty_reuse(shared=log.key.scope == PUBLIC_SCOPE).headers()
    headers += purge_headers(keys_of(log.key.stream, log.instance.generation))
    return Answer(
        status=204, headers=headers, body=b"", cache_status="edge; hit", result=Result.LIVE
    )


def upstream_failing() -> Answer:
    """For a long-poll timing out while the live upstream fails: the edge cannot know there is
    nothing new."""
    return Answer(
        status=502,
        headers=[("Content-Type", "text/plain"), ("Cache-Control", "no-store")],
        body=b"origin unavailable: the live upstream is failing\n",
        cache_status="edge; fwd=request; detail=upstream-failing",
        result=Result.LIVE,
    )


def origin_refusal(
    status: int,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    *,
    forwarded: str,
    private: bool = False,
) -> Answer:
    """The origin's own answer to a live read it refused (404, 400, ...), passed on as it came
    but for hop-by-hop headers and any lifetime: no tier keeps a refusal (``no-store``;
    ``private, no-store`` for a credential's, ``private``). ``forwarded`` is how the edge asked
    (``Cache-Status`` ``fwd``)."""
    return Answer(
        result=Result.LIVE,
        status=status,
        headers=not_to_be_kept(relayable(headers), private=private),
        body=body,
        cache_status=f"edge; fwd={forwarded}; fwd-status={status}",
    )


def sse_frames(
    log: StreamLog,
    coverage: Coverage,
    *,
    up_to_date: bool,
    closed: bool,
    cursor: str,
    chunked: bool,
) -> bytes:
    """The data + control events for ``coverage`` (the control event alone when it holds no
    segment), framed as one HTTP/1.1 chunk when ``chunked``."""
    end = coverage.end
    frame = b""
    if coverage.segments:
        body = stitch(coverage.segments, json=log.json)
        if sse_encoding(log.content_type) == "base64":
            payload = base64.b64encode(body).decode()
        else:
            # SSE is UTF-8 text: bytes of a text stream that are not valid UTF-8 cannot be
            # carried as they are.
            payload = body.decode("utf-8", errors="replace")
        frame += encode_event("data", payload, event_id=end)
    control: dict[str, object] = {"streamNextOffset": end}
    if closed:
        control["streamClosed"] = True
    else:
        control["streamCursor"] = cursor
        if up_to_date:
            control["upToDate"] = True
    frame += encode_event("control", json.dumps(control, separators=(",", ":")), event_id=end)
    return chunk(frame) if chunked else frame
