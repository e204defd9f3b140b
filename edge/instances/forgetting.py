"""Forgetting a stream, and telling whoever else holds it (DESIGN.md "a stream's identity").

One verb per place: the edge **forgets** a stream (its own memory: the local tier, the instance,
its live followers); a forgetting **purges** what others hold for it (the shared tier's keys,
``edge.store.shared``; a CDN's copies, ``edge.cdn``).

Rules this module owns:

* **Forgetting is total.** A stream is forgotten (``forget``) on a DELETE or a 201 PUT through
  the edge, a 404 or 410 to any request that speaks for the stream (``stream_gone``), a live
  upstream or catch-up answer that the core finds impossible for the instance it knows (the
  tail went back, a closure vanished), or a purge from the admin listener or another replica
  (``forgotten_elsewhere``); and every stream at once when a live upstream saw the origin go
  away (``origin_lost``, ``edge.log.trust``). Forgetting drops the instance with every entry
  kept for it (segments, logs, derived frames), ends its live tails, viewers and waiting
  long-polls (``on_forgotten_here`` listeners), and starts a durable purge in the shared tier.
  When what is held is only in doubt, not known to be another stream's (the origin went away,
  the shared tier silent too long), the live followers stay (``on_unconfirmed`` listeners):
  they go on by offset in the instance begun in its place.
* **Whose it is to forget** (``stream_gone``): a request that carried credentials the edge did
  not authorise speaks for its scope only (a bad token must not empty the cache for others),
  so only that scope is forgotten; without credentials, or with the edge's own, it is the
  stream's fate.
* **What this process decides to forget, it tells.** Every forgetting this process decides from
  what it learned itself (``forget``, and a 404 that forgets one scope), whatever its cause,
  goes through ``_tell`` as one ``Forgetting`` (what, why, and whether this process is the one
  to tell what lies downstream), which hands it to the ``tellers`` (the sibling workers of
  ``--workers N``: edge.workers.siblings; the CDN: edge.cdn.purger) and keeps what they return
  until it is done. Whoever is about to answer with what revealed it awaits ``settled(stream)``
  first, so no sibling serves the old instance after that answer. A teller bounds its own work
  (a sibling that does not answer delays nothing further; the CDN's teller returns nothing to
  wait for). Forgetting learned from the shared tier is not told: every process hears the
  shared tier itself. A forgetting carried out for another process (a sibling's, replayed at
  the supervisor's request) is told to siblings by nobody, and downstream by its decider
  (``TELLS_DOWNSTREAM``), or, when the decider held nothing of the stream (a 404 on a worker
  that never served it), by each sibling that held something.
* **A forgetting is in effect** (``in_effect``) once this process has forgotten, its siblings
  have been told, and the shared tier's purge is durable (``forgotten_everywhere``, or
  ``PURGE_WAIT_SECONDS`` passed): only then may a cache in front of the edge be purged, or it
  would fetch the old bytes again.
* A replica that hears another's purge (a generation it did not issue) forgets its own copy and
  adopts that generation; after the purge channel reconnects (``resync``) every stream's
  generation is checked again before it is served (``edge.instances.generations``).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable, Hashable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from edge.log.stream_log import LogKey
from edge.protocol.reads import PUBLIC_SCOPE, speaks_for_the_stream
from edge.store.local import LocalTier
from edge.store.shared import SharedTier

# The durable part of a purge is awaited this long by those who wait for it.
PURGE_WAIT_SECONDS = 2.0
# While the shared tier is away, whether a purge has become durable is looked at this often.
DURABLE_POLL_SECONDS = 1.0

# Why a stream was forgotten (told downstream: a webhook's ``reason``, the logs).
Reason = Literal["deleted", "created", "gone", "expired", "new_instance", "admin_purge"]
REASONS: tuple[Reason, ...] = (
    "deleted", "created", "gone", "expired", "new_instance", "admin_purge",
)  # fmt: skip


class Downstream(enum.Enum):
    """Who tells what lies downstream (the CDN) of the forgettings made in a context."""

    DECIDED_HERE = "decided_here"  # this process decided them: it tells
    DECIDED_ELSEWHERE = "decided_elsewhere"  # carried out for their decider, which tells
    # Carried out for a sibling that held nothing of the stream (its 404): this process tells,
    # if it held something (it may have served the stream downstream; the sibling did not).
    DECIDER_HELD_NOTHING = "decider_held_nothing"


TELLS_DOWNSTREAM: ContextVar[Downstream] = ContextVar(
    "tells_downstream", default=Downstream.DECIDED_HERE
)


def tells_downstream(held_here: bool) -> bool:
    """Is a forgetting made now, in this context, this process's to tell downstream?"""
    mode = TELLS_DOWNSTREAM.get()
    return mode is Downstream.DECIDED_HERE or (
        mode is Downstream.DECIDER_HELD_NOTHING and held_here
    )


T = TypeVar("T", bound=Hashable)


class Unsettled(Generic[T]):
    """Work still under way per stream (telling siblings of a forgetting): what an answer about
    the stream waits for. Pure bookkeeping; the caller awaits the handles it lists."""

    def __init__(self) -> None:
        self._by_stream: dict[str, set[T]] = {}

    def add(self, stream: str, handle: T) -> None:
        self._by_stream.setdefault(stream, set()).add(handle)

    def done(self, stream: str, handle: T) -> None:
        handles = self._by_stream.get(stream)
        if handles is not None:
            handles.discard(handle)
            if not handles:
                del self._by_stream[stream]

    def of(self, stream: str) -> tuple[T, ...]:
        return tuple(self._by_stream.get(stream, ()))


@dataclass(frozen=True, kw_only=True, slots=True)
class Forgetting:
    """One forgetting this process decided (``Forgetter._tell``)."""

    # The stream, and the scope forgotten (the public scope forgets the whole instance).
    key: LogKey
    reason: Reason
    # This process held something of the stream; if not (a 404 for a path it never served),
    # only the shared tier can say whether any replica did (``Forgetter.held_elsewhere``).
    held_here: bool = True
    # The generation the shared tier's purge writes ("" without a shared tier, or for a scope).
    generation: str = ""
    # This process is the one to tell what lies downstream (``TELLS_DOWNSTREAM``).
    tells_downstream: bool = True
    # What was held is only in doubt (the origin went away): live followers stay
    # (``Forgetter.forget_here``), on the siblings told too.
    followers_stay: bool = False

    @property
    def stream(self) -> str:
        return self.key.stream


# Told of each forgetting this process decided. Returns the telling under way, or None
# (nothing to wait for).
Teller = Callable[[Forgetting], "asyncio.Future[None] | None"]


class Forgetter:
    """Forgets streams here, purges the shared tier, and tells the ``tellers``."""

    def __init__(
        self,
        local: LocalTier,
        *,
        shared: SharedTier | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._local = local
        self._shared = shared
        self._clock = clock
        # Told of every stream forgotten on this replica (live tails and viewers stop).
        self.on_forgotten_here: list[Callable[[str], None]] = []
        # Told of every stream forgotten while its live followers stay (``forget_here``):
        # its tails follow the instance begun in its place.
        self.on_unconfirmed: list[Callable[[str], None]] = []
        # Told of every forgetting this process decided itself (see the module rules).
        self.tellers: list[Teller] = []
        self._telling: Unsettled[asyncio.Future[None]] = Unsettled()

    def forget(
        self,
        stream: str,
        *,
        reason: Reason,
        only_if_known: bool = False,
        followers_stay: bool = False,
    ) -> int:
        """Forget ``stream`` here and start a durable purge in the shared tier, which tells
        every other replica; a new instance (with the purge's generation) starts at once.
        ``only_if_known``: purge the shared tier only if it holds anything of the stream (this
        process holds nothing of it). ``followers_stay``: as ``forget_here``'s."""
        dropped = self.forget_here(stream, followers_stay=followers_stay)
        generation = ""
        if self._shared is not None:
            generation = self._shared.purge(stream, only_if_known=only_if_known)
            if not only_if_known:
                instance = self._local.instance_for(stream)
                instance.generation = generation
                instance.verified_at = self._clock()
        forgetting = Forgetting(
            key=LogKey(stream=stream, scope=PUBLIC_SCOPE), reason=reason,
            held_here=not only_if_known, generation=generation,
            tells_downstream=tells_downstream(not only_if_known), followers_stay=followers_stay,
        )  # fmt: skip
        self._tell(forgetting)
        return dropped

    def forget_here(self, stream: str, *, followers_stay: bool = False) -> int:
        """Forget ``stream`` (its instance and everything kept for it) on this replica.
        ``followers_stay``: its live tails and readers go on following the stream by offset, in
        the instance begun in its place (``on_unconfirmed``: what is held is in doubt, not known
        to be another stream)."""
        held = self._local.instance(stream)
        templates = [(log.key, log.header_template) for log in self._local.logs_of(stream)]
        dropped = self._local.forget(stream)
        if not followers_stay:
            for listener in self.on_forgotten_here:
                listener(stream)
            return dropped
        if held is not None:
            # How it is read (its type, the origin's headers), until an answer of the origin
            # says otherwise; the bytes and tail facts held are gone.
            self._local.instance_for(stream).content_type = held.content_type
            for key, template in templates:
                self._local.log_for(key).header_template = template
        for listener in self.on_unconfirmed:
            listener(stream)
        return dropped

    def stream_gone(self, key: LogKey) -> None:
        """The origin said 404 or 410 to a request in ``key.scope``. Without credentials that is
        the stream's fate for everyone; with them it may only mean "not for you" (an origin may hide
        what a token cannot read), so only that scope forgets, and nobody can empty the cache
        for others by sending a bad token. A read the edge authorized carried the edge's own
        credential, so its 404 is the stream's fate too."""
        instance = self._local.instance(key.stream)
        # An instance known to have ended: the origin forgot it first (its lifetime).
        ended = instance is not None and instance.expired(self._clock())
        reason: Reason = "expired" if ended else "gone"
        if speaks_for_the_stream(key.scope):
            # A 404 for a path this replica never held (a scanner, a typo) costs the shared tier
            # one existence check, not a new generation and a message to every replica.
            self.forget(
                key.stream, reason=reason, only_if_known=not self._local.holds_data(key.stream)
            )
        else:
            self._local.forget_scope(key)
            self._tell(Forgetting(key=key, reason=reason, tells_downstream=tells_downstream(True)))

    def forgotten_elsewhere(self, stream: str, generation: str) -> None:
        """A replica (maybe this one) purged ``stream``, starting ``generation``."""
        if self._shared is not None and self._shared.issued_here(generation):
            return  # this replica's own purge (maybe an older one, arriving late)
        instance = self._local.instance(stream)
        if instance is None or instance.generation == generation:
            return  # nothing held here, or a purge already adopted
        self.forget_here(stream)
        adopted = self._local.instance_for(stream)
        adopted.generation = generation
        adopted.verified_at = self._clock()

    def resync(self) -> None:
        """Purges may have been missed (the shared tier's channel was down): check every
        stream's generation again before serving it."""
        for stream in self._local.streams():
            instance = self._local.instance(stream)
            if instance is not None:
                instance.verified_at = float("-inf")

    def origin_lost(self) -> int:
        """A live upstream saw the origin go away (refused, broken: ``edge.log.trust``): it may
        have lost every stream, and any may be recreated there past the tail held. What this
        process holds of every stream is forgotten, everywhere (its live followers stay: they
        go on by offset, as a client of the origin would); returns how many streams. Told again
        (the origin still refusing), it forgets only what was learned since."""
        local = self._local
        streams = [stream for stream in local.streams() if local.holds_learned(stream)]
        for stream in streams:
            self.forget(stream, reason="gone", followers_stay=True)
        return len(streams)

    def _tell(self, forgetting: Forgetting) -> None:
        """The one place a forgetting this process decided is told (see the module rules)."""
        stream = forgetting.stream
        for teller in self.tellers:
            telling = teller(forgetting)
            if telling is not None:
                self._telling.add(stream, telling)
                telling.add_done_callback(lambda done: self._telling.done(stream, done))

    async def settled(self, stream: str) -> None:
        """Return once every forgetting of ``stream`` this process decided has been told (each
        teller bounds its own time)."""
        pending = self._telling.of(stream)
        if pending:
            await asyncio.wait(pending)

    async def in_effect(self, stream: str) -> bool:
        """Wait until this process's forgetting of ``stream`` is in effect as far as the edge
        can make it: forgotten here (at once), told to siblings (``settled``) and durable in the
        shared tier (waited for up to ``PURGE_WAIT_SECONDS``). True when durable (always,
        without a shared tier)."""
        await self.settled(stream)
        return await self.forgotten_everywhere(stream)

    async def forgotten_everywhere(
        self, stream: str, timeout_seconds: float = PURGE_WAIT_SECONDS
    ) -> bool:
        """Is the shared tier's purge of ``stream`` durable (every replica will stop serving
        it)? Waits up to ``timeout_seconds``."""
        if self._shared is None:
            return True
        return await self._shared.purged(stream, timeout_seconds)

    async def durable(self, stream: str, give_up_seconds: float) -> bool:
        """Wait, however long the shared tier is away (up to ``give_up_seconds``), until the
        purge of ``stream`` is durable; False if it was not by then."""
        deadline = time.monotonic() + give_up_seconds
        while not await self.forgotten_everywhere(stream):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(DURABLE_POLL_SECONDS)
        return True

    async def held_elsewhere(self, forgetting: Forgetting) -> bool:
        """For a forgetting of a stream this process held nothing of: did the shared tier hold
        segments of it (so another replica served it since it was last purged)? False when
        the tier cannot say within ``PURGE_WAIT_SECONDS``."""
        shared = self._shared
        if shared is None or not forgetting.generation:
            return False
        return await shared.purge_found_values(
            forgetting.stream, forgetting.generation, PURGE_WAIT_SECONDS
        )
