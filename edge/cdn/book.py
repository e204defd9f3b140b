"""What one CDN target is owed, and when each purge is sent (one ``PurgeBook`` per target).

Rules this module owns:

* **One entry per stream** while anything is owed: a forgetting of a stream already owed
  coalesces into its entry (``forgot`` answers ``Booked.COALESCED``) and adds only what it
  needs.
* **What a forgetting needs.** Once it is in effect at ``r`` (``in_effect``), a send that
  starts at or after ``r``, as soon as possible, and another that starts at or after
  ``r + double_after_seconds`` (the double purge: another replica may have refilled the CDN
  before it confirmed the stream's generation). An entry keeps the earliest send still needed
  (``next_at``) and the latest (``final_at``); a send starting at ``s`` meets every need up to
  ``s``. A need that arrives while a send is in flight is not met by it. A durability learned
  later (``confirmed``: the shared tier was away) needs one more send, ``double_after_seconds``
  after it, even if everything owed before was sent.
* An entry whose forgettings are not all in effect yet (``waiting``) is kept, owing nothing
  until they are.
* **Retries.** A failed send is retried after a backoff that doubles per failure, from
  ``Backoff.first_seconds`` to ``Backoff.most_seconds``, half of it random (edges that failed
  together do not retry together). An answer's ``Retry-After`` (a rate limit) holds every send
  to the target until then: the receiver asked the target, not one batch, to wait. An entry
  failing for ``give_up_seconds`` is given up (``failed`` returns it).
* **Bounded.** At most ``cap`` entries: a forgetting of a stream not owed yet is dropped past
  it (``Booked.DROPPED``; the caller counts and logs it), one that coalesces never is.
* A send in flight is never handed out again (``due`` skips it).
* **Draining** (``drain``): everything owed is due at once, the double purge included (there
  is no later); needs arriving after it are due at once too.

Pure: time and randomness are arguments.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

NEVER = float("-inf")


class Booked(enum.Enum):
    NEW = "new"
    COALESCED = "coalesced"
    DROPPED = "dropped"


@dataclass(frozen=True, kw_only=True, slots=True)
class Backoff:
    first_seconds: float = 0.5
    most_seconds: float = 30.0

    def delay(self, failures: int, uniform: float) -> float:
        """The wait after the ``failures``-th failure in a row; ``uniform`` in [0, 1)."""
        base = min(self.most_seconds, self.first_seconds * 2.0 ** max(0, failures - 1))
        return base / 2 + base / 2 * uniform


@dataclass(kw_only=True, slots=True)
class Owed:
    stream: str
    reason: str
    waiting: int = 0  # forgettings not yet in effect
    next_at: float | None = None  # the earliest send still needed (None: none yet)
    final_at: float = NEVER  # the latest send still needed
    in_flight_since: float | None = None  # a send of it started then, not yet answered
    failures: int = 0  # failed sends in a row
    failing_since: float | None = None

    @property
    def owes(self) -> bool:
        return self.next_at is not None or self.waiting > 0


class PurgeBook:
    def __init__(
        self,
        *,
        cap: int,
        double_after_seconds: float,
        give_up_seconds: float,
        backoff: Backoff | None = None,
    ) -> None:
        self._cap = cap
        self._double_after = double_after_seconds
        self._give_up = give_up_seconds
        self._backoff = backoff or Backoff()
        self._owed: dict[str, Owed] = {}
        self.draining = False
        self.paused_until = NEVER  # the receiver's Retry-After

    def __len__(self) -> int:
        return len(self._owed)

    def __contains__(self, stream: object) -> bool:
        return stream in self._owed

    def get(self, stream: str) -> Owed | None:
        return self._owed.get(stream)

    def streams(self) -> list[str]:
        return list(self._owed)

    # --- what the edge tells ---

    def forgot(self, stream: str, reason: str) -> Booked:
        """A forgetting of ``stream`` decided here, not in effect yet."""
        owed = self._owed.get(stream)
        if owed is not None:
            owed.waiting += 1
            owed.reason = reason
            return Booked.COALESCED
        if len(self._owed) >= self._cap:
            return Booked.DROPPED
        self._owed[stream] = Owed(stream=stream, reason=reason, waiting=1)
        return Booked.NEW

    def in_effect(self, stream: str, now: float, *, settled: int = 1) -> None:
        """``settled`` forgettings of ``stream`` are in effect since ``now``."""
        owed = self._owed.get(stream)
        if owed is None:
            return  # dropped, or given up
        owed.waiting = max(0, owed.waiting - settled)
        self._need(owed, now, now if self.draining else now + self._double_after)

    def confirmed(self, stream: str, reason: str, now: float) -> Booked:
        """The shared tier made a forgetting of ``stream`` durable only now (it was away):
        other replicas confirm the stream's generation from now on, so one more send is owed
        ``double_after_seconds`` later, whatever was sent before (the entry may be gone)."""
        owed = self._owed.get(stream)
        booked = Booked.COALESCED
        if owed is None:
            if len(self._owed) >= self._cap:
                return Booked.DROPPED
            owed = self._owed[stream] = Owed(stream=stream, reason=reason)
            booked = Booked.NEW
        final = now if self.draining else now + self._double_after
        owed.final_at = max(owed.final_at, final)
        if owed.next_at is None:
            owed.next_at = final
        return booked

    def _need(self, owed: Owed, first: float, final: float) -> None:
        if owed.next_at is None:
            owed.next_at = first
        elif owed.in_flight_since is not None and owed.next_at <= owed.in_flight_since:
            owed.next_at = first  # the send in flight started before this need
        else:
            owed.next_at = min(owed.next_at, first)
        owed.final_at = max(owed.final_at, final)

    # --- what the sender asks and reports ---

    def next_wake(self) -> float | None:
        """When the earliest send not in flight is due (None: nothing is)."""
        times = [
            o.next_at
            for o in self._owed.values()
            if o.next_at is not None and o.in_flight_since is None
        ]
        return max(min(times), self.paused_until) if times else None

    def due(self, now: float, limit: int) -> list[Owed]:
        """Up to ``limit`` entries due by ``now``, earliest first, now in flight."""
        if now < self.paused_until:
            return []
        ready = sorted(
            (
                o
                for o in self._owed.values()
                if o.next_at is not None and o.next_at <= now and o.in_flight_since is None
            ),
            key=lambda o: o.next_at if o.next_at is not None else now,
        )[:limit]
        for owed in ready:
            owed.in_flight_since = now
        return ready

    def sent(self, streams: Iterable[str]) -> list[str]:
        """Sends of ``streams`` succeeded; returns those now owed nothing (removed)."""
        done: list[str] = []
        for stream in streams:
            owed = self._owed.get(stream)
            if owed is None or owed.in_flight_since is None:
                continue
            started = owed.in_flight_since
            owed.in_flight_since = None
            owed.failures, owed.failing_since = 0, None
            if owed.next_at is not None and owed.next_at > started:
                continue  # a need that arrived while in flight
            if owed.final_at > started:
                owed.next_at = owed.final_at
                continue
            owed.next_at, owed.final_at = None, NEVER
            if not owed.waiting:
                del self._owed[stream]
                done.append(stream)
        return done

    def failed(
        self,
        streams: Iterable[str],
        now: float,
        *,
        uniform: float,
        retry_after_seconds: float | None = None,
    ) -> list[str]:
        """Sends of ``streams`` failed at ``now``; returns those given up (removed, or kept only
        for forgettings still waiting)."""
        given_up: list[str] = []
        if retry_after_seconds is not None:
            self.paused_until = max(self.paused_until, now + retry_after_seconds)
        for stream in streams:
            owed = self._owed.get(stream)
            if owed is None or owed.in_flight_since is None:
                continue
            owed.in_flight_since = None
            owed.failures += 1
            if owed.failing_since is None:
                owed.failing_since = now
            if now - owed.failing_since >= self._give_up:
                given_up.append(stream)
                owed.next_at, owed.final_at = None, NEVER
                owed.failures, owed.failing_since = 0, None
                if not owed.waiting:
                    del self._owed[stream]
                continue
            wait = self._backoff.delay(owed.failures, uniform)
            if retry_after_seconds is not None:
                wait = max(wait, retry_after_seconds)
            owed.next_at = now + wait
            owed.final_at = max(owed.final_at, owed.next_at)
        return given_up

    # --- shutdown ---

    def drain(self, now: float) -> None:
        """From now on everything owed is due at once (see the module rules), a rate limit
        aside."""
        self.draining = True
        for owed in self._owed.values():
            if owed.next_at is not None or owed.final_at > NEVER:
                owed.final_at = min(owed.final_at, now) if owed.final_at > NEVER else now
                if owed.in_flight_since is None:
                    owed.next_at = now if owed.next_at is None else min(owed.next_at, now)

    def abandon(self) -> list[str]:
        """Forget everything still owed (at shutdown, past its deadline); returns it."""
        left = list(self._owed)
        self._owed.clear()
        return left
