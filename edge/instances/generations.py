"""Replicas agree through generations: confirming, adopting, and reading the shared tier.

Rules this module owns:

* **Replicas agree through generations.** With a shared tier, a replica confirms a stream's
  generation at most every ``GENERATION_CHECK_SECONDS`` before serving it, after its purge
  channel reconnects (``Forgetter.resync``), and on every shared read; a generation it did not
  know means another replica purged the stream: it forgets its own copy. A generation key Redis
  lost (restarted empty, expired, evicted) confirms nothing: the tier mints a new one in its
  place (``edge.store.shared``), so every replica holding the stream forgets it once and asks
  the origin, which says 404 for a stream deleted meanwhile. While the tier cannot say (Redis
  down), what is held is served for a bounded time after its last confirmation
  (``edge.log.trust``).
* This replica's own purge still pending (not yet in Redis) is newer than what Redis names.
* A shared value is taken only for the instance held when it was asked for, of the generation
  it names, and as the core judges it (``judge_shared``): another content type is another
  instance, which only the origin can settle (forgotten everywhere); a tail heard open since
  the value was seen is not believed closed.
* Only what a generation the tier named guards is shared; the rest stays local.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import assert_never

from edge.coalesce import SingleFlight
from edge.instances.forgetting import Forgetter
from edge.log.segment import Segment
from edge.log.stream_log import LogKey, StreamInstance, TailVerdict, judge_shared
from edge.log.trust import Unconfirmed, when_unconfirmed
from edge.store.local import LocalTier
from edge.store.shared import SharedTier
from edge.store.shared_codec import SharedClosure

logger = logging.getLogger(__name__)

# How often a replica confirms a stream's generation with the shared tier before serving it: a
# purge missed on the pub/sub channel (partition, restart) stops being served within this.
GENERATION_CHECK_SECONDS = 1.0


class Generations:
    def __init__(
        self,
        local: LocalTier,
        forgetter: Forgetter,
        ticket: Callable[[], int],
        *,
        shared: SharedTier | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._local = local
        self._forgetter = forgetter
        self._ticket = ticket
        self._shared = shared
        self._clock = clock
        self._checks: SingleFlight[str, str | None] = SingleFlight()

    async def check_generation(self, stream: str) -> None:
        """Confirm, at most once per ``GENERATION_CHECK_SECONDS``, that what this replica holds
        for ``stream`` is of the generation the shared tier names; forget it if not."""
        shared = self._shared
        if shared is None:
            return
        instance = self._local.instance_for(stream)
        if self._clock() - instance.verified_at < GENERATION_CHECK_SECONDS:
            return
        generation, _ = await self._checks.run(stream, lambda: shared.generation(stream))
        if not self._local.current(instance):
            return  # forgotten meanwhile: the answer is too old
        if generation is None:
            self._unconfirmed(instance)
            return
        self.adopt_generation(stream, generation)

    def _unconfirmed(self, instance: StreamInstance) -> None:
        """The shared tier cannot say whether ``instance`` is current: what is held of it is
        served only for a bounded time after its last confirmation (``edge.log.trust``)."""
        stream, now = instance.stream, self._clock()
        held = self._local.holds_learned(stream)
        verdict = when_unconfirmed(confirmed_at=instance.verified_at, now=now, holds=held)
        match verdict:
            case Unconfirmed.SERVE:
                pass
            case Unconfirmed.FORGET:
                logger.info("%s unconfirmed for too long: asking the origin", stream)
                # In doubt, not known to be another: its live followers go on by offset.
                self._forgetter.forget_here(stream, followers_stay=True)
                self._local.instance_for(stream).verified_at = now  # begun again, empty
            case Unconfirmed.BEGIN:
                instance.verified_at = now
            case _:
                assert_never(verdict)

    def adopt_generation(self, stream: str, generation: str) -> StreamInstance:
        assert self._shared is not None
        instance = self._local.instance_for(stream)
        pending = self._shared.pending_purges.get(stream)
        if pending is not None:
            generation = pending  # this replica's own purge, not yet in Redis, is newer
        if instance.generation != generation:
            if instance.generation or self._local.holds_learned(stream):
                # Purged elsewhere (or held from before it knew).
                self._forgetter.forget_here(stream)
                instance = self._local.instance_for(stream)
            instance.generation = generation
        instance.verified_at = self._clock()
        return instance

    async def pull_shared(self, key: LogKey, start: str) -> bool:
        """Copy the shared tier's segment at ``start`` into the local tier; False if none."""
        assert self._shared is not None
        local = self._local
        before = local.instance_for(key.stream)
        found = await self._shared.get(key, start)
        if found is None or not local.current(before):
            return False  # unavailable, or the stream was forgotten while Redis answered
        instance = self.adopt_generation(key.stream, found.generation)
        if found.value is None or instance is not before:
            return False
        if instance.generation != found.generation:
            return False  # this replica's own newer purge is still pending: not that value
        held = local.log(key)
        verdict = judge_shared(
            instance, held.tail if held is not None else None, start,
            content_type=found.value.content_type, seen_at=found.value.seen_at,
        )  # fmt: skip
        if verdict is TailVerdict.NEW_INSTANCE:
            # Another stream at the path than the one held (one of the two was filled after a
            # recreation behind the edge): only the origin knows which is current. A purge
            # starts a new generation, so neither is served again, here or on any replica.
            logger.info("%s shared as another content type: a new instance", key.stream)
            self._forgetter.forget(key.stream, reason="new_instance")
            return False
        if verdict is not TailVerdict.BELIEVED:
            return False  # heard the tail open at ``start`` since it was seen past it
        log = local.log_for(key)
        if log.content_type is None:
            log.content_type = found.value.content_type
        segment = found.value.segment
        instance.reached(segment.end, self._ticket())
        if found.value.open_tail:
            log.heard_open(segment.end, found.value.seen_at)
        return local.put(key, segment, instance)

    async def pull_shared_closure(self, key: LogKey, end: str) -> bool:
        """Did another replica see the stream closed exactly where the edge's chain ends?"""
        assert self._shared is not None
        log = self._local.log(key)
        if log is None or (log.tail is not None and log.tail.closed):
            return False
        instance = log.instance
        if not instance.generation:
            return False
        closure = await self._shared.get_closed(key, instance.generation)
        if closure is None or closure.end != end or not self._local.current(instance):
            return False
        verdict = judge_shared(
            instance, log.tail, end, content_type=closure.content_type, seen_at=closure.seen_at
        )
        if verdict is TailVerdict.NEW_INSTANCE:
            logger.info("%s shared closed as another content type: a new instance", key.stream)
            self._forgetter.forget(key.stream, reason="new_instance")
            return False
        if verdict is not TailVerdict.BELIEVED:
            return False  # heard open there since that closure was seen: the origin says
        ticket = self._ticket()
        verdict = log.observe_tail(
            end, closed=True, now=self._clock(), started=ticket, received=ticket
        )
        return verdict is TailVerdict.BELIEVED

    def share(
        self, key: LogKey, segment: Segment | None, closed_at: str | None, open_tail: bool = False
    ) -> None:
        shared = self._shared
        log = self._local.log(key)
        if shared is None or log is None or not log.instance.generation:
            return  # a generation the tier has not named: keep it local
        generation, seen_at = log.instance.generation, self._clock()
        if segment is not None:
            shared.put(
                key, segment, log.content_type, generation, seen_at=seen_at, open_tail=open_tail
            )
        if closed_at is not None:
            closure = SharedClosure(end=closed_at, content_type=log.content_type, seen_at=seen_at)
            shared.put_closed(key, closure, generation)
