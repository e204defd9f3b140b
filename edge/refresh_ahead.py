"""Refresh-ahead, carried out: a read given an at-tail answer late in its freshness window starts
one background refill of the tail, so the window is renewed before it ends and no reader waits
on a lapse (the decision is ``edge.log.ahead``'s, made by the catch-up plan or the hit path).

With a live upstream tail running the tail is moved by that upstream (authoritative): nothing
is refreshed then (``Refresh.NONE``).

Rules this module owns:

* **Decide at the read, fill in the background.** ``served`` is synchronous (the hit path calls
  it from the connection's protocol, the catch-up service on a ``Hit``): given the read's
  ``Refresh``, the pure book decides whether it starts a refill (``Refreshing.start``) and, if
  so, one task is scheduled. The read is answered from what the edge holds, as it would have
  been without it, and never waits on the refill.
* **A refill is a fill.** It asks ``Fills.fetch`` for the tail offset under the instance the
  answer was built from, in the single flight every reader's fill of that range joins (one
  origin request between them; each reader caps its answer by its own prefix,
  ``edge.log.policy.fill_coverage``), and its answer goes through the one door
  (``edge.instances.door.Door.take_in``): evidence rules, a stream gone, another instance, and
  never a byte of a forgotten instance stored, exactly as for a reader's fill. The generation is
  confirmed first where the shared tier is used, as a reader's plan does.
* **It never outlives its bounds.** One per stream log at once (the pure book); the fill's own
  deadline ends it; its share of the fill budget is given back at once (no reader writes it);
  ``close`` cancels what is still out when the application closes. Each ends counted in
  ``edge_refresh_ahead_total{result}`` (``Refreshed``); an origin failure is counted there and
  logged, never raised to a reader.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Sequence
from typing import assert_never

from edge.answer import Bypass
from edge.fills import Chained, Fills, Unchained
from edge.instances.generations import Generations
from edge.log.ahead import Refresh, Refreshing
from edge.log.policy import Coverage, Fetch
from edge.log.stream_log import LogKey, StreamInstance, StreamLog, says_gone
from edge.metrics import Metrics
from edge.origin import BodyTooLarge, OriginError
from edge.store.local import LocalTier

logger = logging.getLogger(__name__)


class Refreshed(enum.Enum):
    """How one refresh ended (the ``result`` label of ``edge_refresh_ahead_total``)."""

    RENEWED = "renewed"  # the origin's answer joined the log: the tail observed again, or moved
    REFUSED = "refused"  # an answer for that request only (a 401, a 5xx, no-store): nothing kept
    GONE = "gone"  # a 404 or 410: the door forgot the stream (in that scope)
    STALE = "stale"  # the instance was forgotten meanwhile: nothing of it kept
    OVERDUE = "overdue"  # joined a reader's fill that outlived --fill-wait
    FAILED = "failed"  # the origin failed (unreachable, reset, past --fill-deadline, too large)


class RefreshAhead:
    """Starts one background refill of an at-tail answer's tail late in its freshness window."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        fills: Fills,
        local: LocalTier,
        generations: Generations | None,
    ) -> None:
        self._metrics = metrics
        self._fills = fills
        self._local = local
        self._generations = generations
        self._book = Refreshing()
        self._tasks: set[asyncio.Task[None]] = set()

    def served(
        self, log: StreamLog, credentials: Sequence[tuple[str, str]], refresh: Refresh
    ) -> None:
        """A read of ``log`` was given an at-tail answer that asks ``refresh`` of its tail;
        ``credentials``: what a fill of its scope sends upstream."""
        key = log.key
        tail = log.tail
        if tail is None or not self._book.start(key, refresh):
            return
        task = asyncio.get_running_loop().create_task(
            self._refresh(key, log.instance, tail.offset, tuple(credentials))
        )
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (fault := task.exception()) is not None:
            # Not the origin's failure (counted as ``failed``): a fault of the edge's own.
            logger.error("refresh-ahead ended by a fault", exc_info=fault)

    def running(self, key: LogKey) -> bool:
        """Is a refill of ``key``'s log in flight?"""
        return self._book.running(key)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _refresh(
        self,
        key: LogKey,
        instance: StreamInstance,
        offset: str,
        credentials: tuple[tuple[str, str], ...],
    ) -> None:
        try:
            try:
                result = await self._refill(key, instance, offset, credentials)
            except (OriginError, BodyTooLarge) as failure:
                logger.info("refresh of %s at %s failed: %s", key.stream, offset, failure)
                result = Refreshed.FAILED
        finally:
            self._book.ended(key)
        self._metrics.refresh_ahead.labels(result=result.value).inc()

    async def _refill(
        self,
        key: LogKey,
        instance: StreamInstance,
        offset: str,
        credentials: tuple[tuple[str, str], ...],
    ) -> Refreshed:
        if self._generations is not None:
            await self._generations.check_generation(key.stream)
        if not self._local.current(instance):
            return Refreshed.STALE
        fetch = Fetch(offset=offset, prefix=Coverage(segments=(), end=offset, capped=False))
        outcome = await self._fills.fetch(key, fetch, credentials, instance)
        if isinstance(outcome, Bypass):
            return Refreshed.OVERDUE
        fill, _ = outcome
        if fill.hold is not None:
            fill.hold.release()  # this refresh's share: it writes the bytes to no one
        match fill.joins:
            case Chained():
                return Refreshed.RENEWED
            case Unchained.STALE:
                return Refreshed.GONE if says_gone(fill.status) else Refreshed.STALE
            case Unchained.FOR_THIS_REQUEST:
                return Refreshed.GONE if says_gone(fill.status) else Refreshed.REFUSED
            case _:
                assert_never(fill.joins)
