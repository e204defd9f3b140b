"""The one door for what the origin says about a stream instance: decided by the pure core
(``edge.log.intake.decide``), carried out here.

A stream is its normalised path plus an *instance*: a DELETE and a PUT at the same path make a
new stream whose offsets start again (DESIGN.md "a stream's identity"). Every fact about an
instance's existence that an origin answer carries enters through ``take_in`` (answers the edge
stores: catch-up fills, live batches through ``record_live``) or ``evidence`` (answers it only
relays or asks for).

Rules this module owns:

* **Decide, then act.** The core decides what an arrival means for the instance it was fetched
  under; the actions it returns are carried out here, in order, after deciding, each by the
  object that owns it (forgetting, sharing, lifetimes). The match over the actions is
  exhaustive.
* **Work started under an instance stores nothing once it is gone**: callers pass the instance
  they started with, and ``LocalTier.current`` decides.
* **Every origin answer is evidence, whatever request it answered.** A 404 or 410 (the core's
  ``says_gone``) to a read, a write, a DELETE, a HEAD, ``offset=now``, a live upstream or the
  edge's own lifetime probe ends the instance held as a DELETE through the edge does: every
  answer the edge relays or asks for without storing it goes through ``evidence``; whose it is
  to forget is ``Forgetter.stream_gone``'s rule.
* Other refusals (401/403, 409, 400) are evidence about their request, not about the stream.
* While a live upstream runs, what it says about the tail is authoritative; once it stops, its
  last word is only as of its time (``live_ended``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, assert_never

from edge.instances.forgetting import Forgetter
from edge.instances.generations import Generations
from edge.instances.lifetimes import Lifetimes, learn_lifetime
from edge.log.intake import (
    Action,
    Arrival,
    BelieveTail,
    Bypass,
    Decision,
    Describe,
    Forget,
    ForgetScope,
    Keep,
    LearnLifetime,
    ProbeLifetime,
    Reached,
    Touched,
    decide,
)
from edge.log.segment import Segment
from edge.log.stream_log import LogKey, StreamInstance
from edge.store.local import LocalTier

logger = logging.getLogger(__name__)


class Taken(NamedTuple):
    """What the one door made of an origin answer: the core's decision, the segment it
    decided to keep, and whether the local tier took it (it refuses a forgotten instance's)."""

    decision: Decision
    segment: Segment | None
    stored: bool


class InstanceChanged(Exception):
    """The stream instance a live upstream was following is gone."""


class Door:
    def __init__(
        self,
        local: LocalTier,
        forgetter: Forgetter,
        generations: Generations | None,
        lifetimes: Lifetimes,
        ticket: Callable[[], int],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._local = local
        self._forgetter = forgetter
        self._generations = generations
        self._lifetimes = lifetimes
        self._ticket = ticket
        self._clock = clock

    def take_in(
        self,
        key: LogKey,
        instance: StreamInstance,
        arrival: Arrival,
        credentials: Sequence[tuple[str, str]] = (),
    ) -> Taken:
        """The one door for origin answers, catch-up fills and live batches alike: the core
        decides (``edge.log.intake.decide``) what ``arrival``, fetched under ``instance``, means;
        its actions are carried out here, in order, after deciding. ``credentials``: the
        request's, for what the edge asks the origin on its behalf (a lifetime probe)."""
        current = self._local.current(instance)
        existing = self._local.log(key) if current else None
        tail = existing.tail if existing is not None else None
        intake = decide(arrival, instance, tail, current=current)
        stored = False
        for action in intake.actions:
            stored |= self._carry_out(key, instance, action, credentials)
        return Taken(intake.decision, intake.segment, stored)

    def _carry_out(
        self,
        key: LogKey,
        instance: StreamInstance,
        action: Action,
        credentials: Sequence[tuple[str, str]],
    ) -> bool:
        """Carry out one action; True when it stored a segment."""
        match action:
            case Forget(why=why):
                logger.info("%s: a new instance (%s)", key.stream, why)
                self._forgetter.forget(key.stream, reason="new_instance")
            case ForgetScope():
                self._forgetter.stream_gone(key)
            case Bypass(until=until):
                instance.bypass_until = until
            case Describe(content_type=content_type, template=template):
                log = self._local.log_for(key)
                log.content_type = content_type
                log.header_template = self._local.template(template)
            case Touched(now=now):
                instance.touched_origin(now)
            case LearnLifetime(headers=headers):
                learn_lifetime(instance, headers)
            case BelieveTail(judgement=judgement):
                self._local.log_for(key).believe(judgement)
            case Reached(offset=offset, received=received):
                instance.reached(offset, received)
            case Keep(segment=segment, closed_at=closed_at, open_tail=open_tail):
                stored = segment is not None and self._local.put(key, segment, instance)
                if self._generations is not None:
                    self._generations.share(key, segment if stored else None, closed_at, open_tail)
                return stored
            case ProbeLifetime():
                if not instance.lifetime_known:
                    self._lifetimes.probe_lifetime(key, instance, credentials)
            case _:
                assert_never(action)
        return False

    def evidence(
        self,
        key: LogKey,
        status: int,
        headers: Sequence[tuple[str, str]],
        *,
        started: int,
        instance: StreamInstance | None = None,
        live: bool = False,
    ) -> Decision:
        """An origin answer the edge never stores (a relayed read, HEAD or DELETE, ``offset=now``,
        a lifetime probe, a live upstream's refusal), to a request in ``key.scope`` that started
        at ``started`` under ``instance`` (None: whatever is held now): what it says of the
        stream, through the one intake (``decide``), carried out here. ``GONE`` when it said the
        stream is gone (the scope, or the instance, is forgotten)."""
        held = self._local.instance(key.stream) if instance is None else instance
        # Nothing held of the stream: still the stream's current state (a 404 for a path never
        # held is told to the shared tier, which may hold it for another replica).
        current = held is None or self._local.current(held)
        judged = held if held is not None else StreamInstance(stream=key.stream)
        arrival = Arrival.evidence(
            status, tuple(headers), live=live, started=started, received=self._ticket(),
            now=self._clock(),
        )  # fmt: skip
        intake = decide(arrival, judged, None, current=current)
        for action in intake.actions:
            self._carry_out(key, judged, action, ())
        return intake.decision

    def record_live(
        self,
        key: LogKey,
        start: str,
        end: str,
        body: bytes,
        *,
        up_to_date: bool,
        closed: bool,
        instance: StreamInstance,
        started: int,
    ) -> Segment | None:
        """A batch a live upstream delivered: [start, end). While the upstream runs, what it
        says about the tail is authoritative. Returns the segment, if any; raises
        InstanceChanged when the instance it follows is gone, ValueError for a bad offset."""
        log = self._local.log(key)
        content_type = log.content_type if log is not None else instance.content_type
        arrival = Arrival(
            live=True, start=start, status=200, end=end, body=body, headers=(),
            content_type=content_type, up_to_date=up_to_date, closed=closed, started=started,
            received=self._ticket(), now=self._clock(),
        )  # fmt: skip
        taken = self.take_in(key, instance, arrival)
        if taken.decision is Decision.MALFORMED:
            raise ValueError(f"the origin sent a malformed offset {end[:64]!r}")
        if taken.decision is not Decision.STORE:
            raise InstanceChanged(key.stream)
        return taken.segment

    def live_ended(self, key: LogKey) -> None:
        """The live upstream stopped: its last word on the tail is now only as of its time."""
        log = self._local.log(key)
        if log is not None:
            log.lose_authority(self._clock())
