"""Knowledge that cannot be confirmed is trusted for a bounded time (DESIGN.md "What makes a
segment true").

What a replica holds of a stream is true only while something confirms it: the shared tier
naming the generation held (no other replica deleted or recreated the stream), and the origin
still being the one that answered (its live tail connected). This module decides, from those
facts and the clock, what becomes of what is held when the confirmation is missing. Pure: time
is an argument; ``edge.instances.generations`` records confirmations and carries the verdicts out.

Rules this module owns:

* **The shared tier's silence is trusted for ``UNCONFIRMED_TRUST_SECONDS``.** When the tier
  cannot say whether the generation held is current (an error, a timeout, its breaker open), what
  is held is served until ``UNCONFIRMED_TRUST_SECONDS`` after its last confirmation, then
  forgotten on this replica, so the read asks the origin. While the tier is away, a DELETE
  through another replica cannot reach this one at all: this bound is its only protection.
* **Forgotten, not set aside.** Past the bound the held segments (and every answer derived from
  them) are dropped, not kept unserved until the origin confirms them: nothing but a re-read of
  the same range tells whether they are of the current instance (the protocol names no
  instance; the reference origin's ETag is built from the path and offsets), and a re-read
  brings the bytes anyway. Kept, they could be joined to a delta the origin gives of another
  instance. The live followers stay (tails, SSE viewers, waiting long-polls): they go on by
  offset, as a client reading the origin would, into the instance begun in its place. Cost:
  while the tier is away, one origin read per stream read every ``UNCONFIRMED_TRUST_SECONDS``
  per process.
* **Confirmed from when it began.** A replica that begins holding a stream (from nothing, or just
  after forgetting it) while the tier is silent counts it confirmed from that moment: everything
  it learns afterwards comes from the origin, no earlier than that.
* **An origin seen going away loses everything held of it** (``origin_went_away``). A live
  tail's upstream refused (nothing listens at the origin's address) or broken (reset, or ended
  before its answer's end) is a fact about the whole origin, not one stream: an origin with a
  memory store that restarts has lost every stream, and a writer may recreate any of them, past
  the old tail, before the edge reads again. No answer of the origin tells one instance from
  another, so the cheapest rule that is never wrong is to forget what this process holds of
  every stream, everywhere (a purge: siblings, the shared tier, the CDN), at once, its live
  followers staying as above. A full re-read compared with the held bytes' digest costs the same
  read and more; the origin's ETag does not tell instances apart. Cost: one read from the
  origin per stream read again, also after a reset that was only a network fault; a tail that
  keeps failing forgets again only what was learned since. A timeout, an answer with a status
  or a clean end is not a loss: the origin was there to say it.
"""

from __future__ import annotations

import enum
from typing import assert_never

# How long what is held is served after its last confirmation while the shared tier cannot say
# whether it is current: three generation checks (1 s each:
# edge.instances.generations.GENERATION_CHECK_SECONDS),
# so a tier that misses one or two checks (a failover, a blip that opens the breaker) costs no
# re-read of every stream, while another replica's DELETE or recreate is served over for at
# most these few seconds, of the same order as an at-tail answer's freshness.
UNCONFIRMED_TRUST_SECONDS = 3.0


class Unconfirmed(enum.Enum):
    """What becomes of what is held when the shared tier cannot confirm it now."""

    SERVE = "serve"  # confirmed recently enough: served as it is
    FORGET = "forget"  # past the bound: forgotten here, the read asks the origin
    BEGIN = "begin"  # nothing held: confirmed from now (all it learns later is newer)


def when_unconfirmed(*, confirmed_at: float, now: float, holds: bool) -> Unconfirmed:
    """The shared tier could not say at ``now`` whether the generation held is current; what is
    held (``holds``) was last confirmed at ``confirmed_at``."""
    if not holds:
        return Unconfirmed.BEGIN
    if now - confirmed_at < UNCONFIRMED_TRUST_SECONDS:
        return Unconfirmed.SERVE
    return Unconfirmed.FORGET


class Ending(enum.Enum):
    """How a live upstream request to the origin ended."""

    CLEAN = "clean"  # the origin ended its answer (or the stream closed)
    ANSWERED = "answered"  # with a status the tail cannot use (5xx, 4xx): the origin is there
    TIMED_OUT = "timed_out"  # silence: the origin may be slow or stopped, not gone
    REFUSED = "refused"  # no connection: nothing listens at the origin's address
    BROKEN = "broken"  # reset, or ended before its answer's end: the origin's process went away


def origin_went_away(ending: Ending) -> bool:
    """Does ``ending`` say the origin may have lost every stream it held?"""
    match ending:
        case Ending.REFUSED | Ending.BROKEN:
            return True
        case Ending.CLEAN | Ending.ANSWERED | Ending.TIMED_OUT:
            return False
        case _:
            assert_never(ending)
