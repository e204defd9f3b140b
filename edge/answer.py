"""What the edge answers a read with, and what that answer was derived from.

A read the cache does not answer is a ``Bypass`` naming why: the web layer relays it.

An answer the edge builds from its logs carries its ``Derivation``: whatever is kept of it (a
stored response, a compressed body, an encoded long-poll) is kept under that, and reused only
while it still holds (the instance is current, the scope and representation are the
request's). An answer relayed from the origin carries none: nothing of it is the edge's to
reuse.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from edge.log.freshness import Reuse
from edge.log.stream_log import StreamInstance
from edge.protocol.headers import HOP_BY_HOP


class Releasable(Protocol):
    """A share of a budget held while an answer's bytes are written (``edge.fill_budget.Hold``)."""

    def release(self) -> None: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Derivation:
    """What an answer the edge built from its logs was derived from. Whatever is kept of it (a
    stored response, a compressed body) is kept under this, and only while it still holds:
    the instance is current (``LocalTier``), the scope and representation are the request's."""

    instance: StreamInstance
    # The instance's shared-tier generation when the answer was built: its purge keys name it,
    # so what is kept of the answer is given only while the instance still has it.
    generation: str
    scope: str
    start: str
    end: str
    encoding: str | None  # the body's Content-Encoding (None: identity)
    reuse: Reuse
    kept: bool  # every segment of it is in the local tier: the next read is a local hit
    # It ends at the tail the edge knew (``Stream-Up-To-Date``), closing the stream or not: it
    # holds only while that tail does (``edge.log.policy.at_tail_holds``).
    up_to_date: bool = False
    closed: bool = False


class Result(enum.StrEnum):
    """What an answer was, as ``edge_cache_requests_total`` counts it (its ``result`` label)."""

    HIT = "hit"
    DELTA = "delta"  # the edge held the start, the origin was asked for the rest
    MISS = "miss"
    BYPASS = "bypass"  # the origin's answer, relayed (nothing of it is the edge's)
    LIVE = "live"  # a live answer (long-poll), counted with the live readers


class Why(enum.Enum):
    """Why a read the cache was asked is relayed instead (``Cache-Status``'s ``detail``)."""

    NOT_CACHEABLE = "not-cacheable"  # past the tail, no-store, a malformed offset
    TOO_LARGE = "too-large"  # a body past what the edge keeps in one piece
    FILL_OVERDUE = "fill-overdue"  # the fill it waited on did not end within --fill-wait
    CORS = "cors"  # the origin's CORS varies by Origin and this one was never answered


@dataclass(frozen=True, kw_only=True, slots=True)
class Bypass:
    """This read is not the cache's to answer: the web layer relays the client's own request to
    the origin, and nothing of that relay is stored. ``reason`` is what the log says."""

    why: Why
    reason: str

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True, kw_only=True, slots=True)
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    cache_status: str
    result: Result
    # The fill budget share of the origin bytes in ``body``: release once the body is written.
    hold: Releasable | None = None
    # None for an answer relayed from the origin: nothing of it is the edge's to reuse.
    derivation: Derivation | None = None
    # An at-tail answer's ``Age`` (``edge.log.freshness.tail_age_seconds``) when it was built;
    # None: it carries none.
    age_seconds: int | None = None


def relayable(headers: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(n, v) for n, v in headers if n.lower() not in HOP_BY_HOP]
