"""What the edge knows about one stream in one credential scope, besides its bytes.

Rules this module owns:

* The only mutable facts about a stream are where its tail is and whether it is closed. A tail
  fact is *authoritative* while a live upstream follows the stream, otherwise true only as of
  ``observed_at``. Closure is final: once closed, the tail never moves again.
* A write through the edge makes the tail fact stale at once, and the write's own
  ``Stream-Next-Offset`` becomes a floor: any later observation of a tail before it (an answer
  that left the origin before the write landed) is not believed. Read-after-write is exact.
* Expiry: an absolute ``Stream-Expires-At`` ends service at that instant. A sliding ``Stream-TTL``
  is counted from the last time the edge touched the origin for the stream, because reads the
  edge absorbs do not extend it there (PROTOCOL-NOTES "Cacheability").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from edge.log.segment import is_json

NEVER = float("-inf")


@dataclass(frozen=True, kw_only=True, slots=True)
class LogKey:
    stream: str
    scope: str


@dataclass(frozen=True, kw_only=True, slots=True)
class TailFact:
    offset: str
    closed: bool
    authoritative: bool
    observed_at: float


@dataclass(kw_only=True, slots=True)
class StreamLog:
    key: LogKey
    content_type: str | None = None
    # Response headers the origin sends on every answer for this stream (CORS, nosniff, ...),
    # replayed on answers the edge makes itself.
    header_template: tuple[tuple[str, str], ...] = ()
    tail: TailFact | None = None
    ttl_seconds: float | None = None
    expires_at: float | None = None
    last_origin_touch: float = NEVER
    floor: str | None = None  # the tail is at least here: a write through the edge said so

    @property
    def json(self) -> bool:
        return is_json(self.content_type)

    def observe_tail(
        self, offset: str, *, closed: bool, now: float, authoritative: bool = False
    ) -> None:
        if self.tail is not None and self.tail.closed and not closed:
            return  # closure is final; an older answer arriving late cannot reopen the stream
        if self.floor is not None and offset < self.floor and not closed:
            # Older than a write this edge saw complete: true once, not now.
            self.tail = TailFact(
                offset=offset, closed=False, authoritative=False, observed_at=NEVER
            )
            return
        if (
            not authoritative
            and self.tail is not None
            and self.tail.authoritative
            and offset < self.tail.offset
        ):
            return  # a catch-up answer older than what the live upstream already reported
        self.tail = TailFact(
            offset=offset, closed=closed, authoritative=authoritative, observed_at=now
        )

    def lose_authority(self, now: float) -> None:
        if self.tail is not None and self.tail.authoritative:
            self.tail = replace(self.tail, authoritative=False, observed_at=now)

    def mark_stale(self, floor: str | None = None) -> None:
        if floor is not None and (self.floor is None or floor > self.floor):
            self.floor = floor
        if self.tail is not None and not self.tail.closed:
            self.tail = replace(self.tail, observed_at=NEVER, authoritative=False)

    def touched_origin(self, now: float) -> None:
        self.last_origin_touch = now

    def expired(self, now: float) -> bool:
        if self.expires_at is not None and now >= self.expires_at:
            return True
        return self.ttl_seconds is not None and now >= self.last_origin_touch + self.ttl_seconds

    def tail_trusted(self, now: float, freshness_seconds: float) -> bool:
        """May an at-tail answer be given from what the edge knows, without asking the origin?"""
        tail = self.tail
        if tail is None:
            return False
        if self.ttl_seconds is not None and now >= self.last_origin_touch + self.ttl_seconds / 2:
            # Touch the origin well before its sliding TTL would end the stream under viewers.
            return False
        return tail.closed or tail.authoritative or now - tail.observed_at < freshness_seconds
