"""What one catch-up fill brought back, and what a read resolved to: values, no I/O.

Rules this module owns:

* A fill's answer either joins the stream's chain (``Chained``: a forward segment of the current
  instance, with where it ends, ``Reach``, and whether the local tier kept it) or does not
  (``Unchained``: true for its own request only, or fetched under an instance forgotten
  meanwhile, so the read starts again). Nothing in between.
* A fill that outlived ``--fill-deadline`` is ``Abandoned``: nothing of it was stored.
* A reader's share of a fill's bytes (``Hold``) is given back once, by ``Resolution.release``
  or by whoever writes its answer.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from edge.fill_budget import Hold
from edge.log.policy import Fetch, Hit
from edge.log.segment import Segment


@dataclass(frozen=True, kw_only=True, slots=True)
class Abandoned:
    """A fill that outlived ``--fill-deadline``: its upstream is closed, its share of the fill
    budget given back, and nothing of it was stored."""

    deadline_seconds: float


class Reach(enum.Enum):
    """Where a fill's answer ends, as the origin said."""

    BEHIND = "behind"  # more of the stream follows
    TAIL = "tail"  # at the tail (``Stream-Up-To-Date``)
    CLOSED = "closed"  # at the tail, and the stream is closed

    @staticmethod
    def of(*, up_to_date: bool, closed: bool) -> Reach:
        if not up_to_date:
            return Reach.BEHIND
        return Reach.CLOSED if closed else Reach.TAIL

    @property
    def up_to_date(self) -> bool:
        return self is not Reach.BEHIND

    @property
    def closed(self) -> bool:
        return self is Reach.CLOSED


@dataclass(frozen=True, kw_only=True, slots=True)
class Chained:
    """A fill's answer that is a forward segment of the current instance: it joins the chain."""

    segment: Segment | None
    next_offset: str
    reach: Reach
    kept: bool  # the segment is in the local tier (not refused for room)


class Unchained(enum.Enum):
    """A fill's answer that joins no chain."""

    FOR_THIS_REQUEST = "for this request"  # a refusal, past the tail, no-store: relayed verbatim
    STALE = "stale"  # fetched under a stream instance that was forgotten meanwhile: read again


@dataclass(frozen=True, kw_only=True, slots=True)
class Fill:
    """What one origin fetch at ``offset`` returned, shared by every collapsed waiter, and what
    it is to the stream's chain (``joins``)."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    joins: Chained | Unchained
    hold: Hold | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Resolution:
    plan: Hit | Fetch
    shared_hit: bool
    fill: Fill | None  # the origin's answer, when the plan was a Fetch
    collapsed: bool

    def release(self) -> None:
        """This reader is done with the fill's bytes (its answer is written, or not needed)."""
        if self.fill is not None and self.fill.hold is not None:
            self.fill.hold.release()

    @property
    def error(self) -> Fill | None:
        """The origin's refusal (404, 400, ...), if that is how the read ended."""
        if self.fill is not None and self.fill.status != 200:
            return self.fill
        return None
