"""Purges sent to the CDN whenever the edge forgets a stream (``--cdn-purge KIND=TARGET``): the
asyncio adapter around ``edge.cdn.book`` (what each target is owed, and when) and
``edge.cdn.api`` (each kind's call).

Rules this module owns:

* ``forgot`` is a ``Forgetter.tellers`` teller that returns nothing to wait for: no answer ever
  waits for a CDN, and a dead endpoint costs only background retries.
* **What is sent.** Forgettings of a whole stream (the public scope) that this process is the
  one to tell downstream (``Forgetting.tells_downstream``: not those it carries out for a
  sibling or for its supervisor, whose decider sends). A scope's forgetting leaves the CDN
  alone: it holds no credentialed answer. A 404 for a stream this process held nothing of is
  sent only if the shared tier held it (some replica served it), so a scanner's 404s cost the
  CDN nothing; at most ``MAX_CHECKS`` such checks at once, past it none.
* **When.** Once the forgetting is in effect (``Forgetter.in_effect``: forgotten here, siblings
  told, the shared tier's purge durable), else the CDN would fetch the old bytes again from
  this edge; then once more ``DOUBLE_PURGE_SECONDS`` later (replicas confirm a stream's
  generation within ``GENERATION_CHECK_SECONDS``, and an answer begun before may still be on
  its way); and when the shared tier made it durable only later (Redis away), once more that
  long after it did.
* **How.** One call in flight per target; what comes due meanwhile is batched into the next
  one, up to the kind's limit (``edge.cdn.api``). Each call is bounded by
  ``CALL_TIMEOUT_SECONDS``. Retries, coalescing and the cap are the book's
  (``MAX_OWED_STREAMS`` per target; past it a new stream's purge is dropped).
* **Seen.** ``edge_cdn_purges_total{kind,result}`` and ``edge_cdn_purges_pending{kind}``; a
  target's first failure is logged at WARNING and its recovery at INFO, each give-up and the
  first drop of a run at ERROR, what a drain left at ERROR.
* **Drained at shutdown.** ``start_draining`` (when the edge stops) makes everything owed due
  at once, the double purge included; ``close`` waits until nothing is owed or
  ``--drain-seconds`` after that, then counts what is left as abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable

import aiohttp

from edge import __version__
from edge.cdn.api import PurgeCall, Purged, Target, call_for, judge, targets
from edge.cdn.book import Booked, Owed, PurgeBook
from edge.config import Settings
from edge.instances.forgetting import Forgetter, Forgetting
from edge.instances.generations import GENERATION_CHECK_SECONDS
from edge.metrics import CDN_PURGE_RESULTS, Metrics
from edge.protocol.reads import PUBLIC_SCOPE

logger = logging.getLogger(__name__)

# The double purge: past the window in which replicas confirm a stream's generation, plus a
# second for answers begun before the forgetting that are still being written.
DOUBLE_PURGE_SECONDS = GENERATION_CHECK_SECONDS + 1.0
# Streams owed a purge per target; a flood of forgettings past it is dropped (and counted)
# rather than held without bound while a CDN is away.
MAX_OWED_STREAMS = 10_000
# A purge failing this long is given up (logged): as long as the shared tier keeps retrying.
GIVE_UP_SECONDS = 3600.0
CALL_TIMEOUT_SECONDS = 5.0
# Checks of the shared tier for 404s of streams this process never held, at once.
MAX_CHECKS = 256
# What a call's answer may say that the edge reads (Cloudflare's verdict): the rest is left.
MAX_ANSWER_BYTES = 64 * 1024
USER_AGENT = f"edge/{__version__} (cdn purge)"

Answered = tuple[int | None, tuple[tuple[str, str], ...], bytes, str]


class Lane:
    """One target: its book, its sender, and what has been logged of it."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.book = PurgeBook(
            cap=MAX_OWED_STREAMS,
            double_after_seconds=DOUBLE_PURGE_SECONDS,
            give_up_seconds=GIVE_UP_SECONDS,
        )
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.failing = False
        self.dropping = False


class CdnPurger:
    def __init__(
        self,
        settings: Settings,
        forgetter: Forgetter,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        self._lanes = [Lane(target) for target in targets(settings)]
        self._forgetter = forgetter
        self._metrics = metrics
        self._clock = clock
        self._uniform = uniform
        self._drain_seconds = settings.drain_seconds
        self._deadline: float | None = None
        self._closed = False
        self._session: aiohttp.ClientSession | None = None
        # Forgettings booked but not yet in effect, per stream, and the one task per stream
        # waiting for them.
        self._unsettled: dict[str, int] = {}
        self._settling: dict[str, asyncio.Task[None]] = {}
        self._confirming: dict[str, asyncio.Task[None]] = {}
        self._checks: set[asyncio.Task[None]] = set()
        # Set whenever a send is answered or a wait ends: what a drain waits on.
        self._progress = asyncio.Event()
        for kind in {lane.target.kind for lane in self._lanes}:
            metrics.cdn_purges_pending.labels(kind=kind).set_function(self._owed_of(kind))
            for result in CDN_PURGE_RESULTS:
                metrics.cdn_purges.labels(kind=kind, result=result)

    def _owed_of(self, kind: str) -> Callable[[], float]:
        lanes = [lane for lane in self._lanes if lane.target.kind == kind]
        return lambda: float(sum(len(lane.book) for lane in lanes))

    @property
    def owed(self) -> int:
        """Streams owed a purge, over every target."""
        return sum(len(lane.book) for lane in self._lanes)

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            headers={"User-Agent": USER_AGENT},
            timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_SECONDS),
        )
        for lane in self._lanes:
            lane.task = asyncio.ensure_future(self._run(lane))
        logger.debug(  # the start-up summary (edge.summary) names the kinds
            "CDN purges go to %s",
            ", ".join(lane.target.label for lane in self._lanes) or "nobody",
        )

    # --- what the edge tells ---

    def forgot(self, forgetting: Forgetting) -> None:
        """A ``Forgetter.tellers`` teller (see the module rules)."""
        if forgetting.key.scope != PUBLIC_SCOPE or not forgetting.tells_downstream:
            return
        if self._closed:
            logger.warning("%s forgotten after the CDN purges ended: not sent", forgetting.stream)
            return
        if forgetting.held_here:
            self._owe(forgetting.stream, forgetting.reason)
        elif len(self._checks) < MAX_CHECKS:
            check = asyncio.ensure_future(self._check(forgetting))
            self._checks.add(check)
            check.add_done_callback(self._check_done)

    def _check_done(self, check: asyncio.Task[None]) -> None:
        self._checks.discard(check)
        self._progress.set()

    async def _check(self, forgetting: Forgetting) -> None:
        if await self._forgetter.held_elsewhere(forgetting) and not self._closed:
            self._owe(forgetting.stream, forgetting.reason)

    def _owe(self, stream: str, reason: str) -> None:
        booked = False
        for lane in self._lanes:
            booked |= self._booked(lane, stream, lane.book.forgot(stream, reason))
        if not booked:
            return
        self._unsettled[stream] = self._unsettled.get(stream, 0) + 1
        if stream not in self._settling:
            self._settling[stream] = asyncio.ensure_future(self._settle(stream))

    def _booked(self, lane: Lane, stream: str, booked: Booked) -> bool:
        if booked is Booked.DROPPED:
            self._metrics.cdn_purges.labels(kind=lane.target.kind, result="dropped").inc()
            if not lane.dropping:
                lane.dropping = True
                logger.error(
                    "%s: %d streams already owed a purge; %s (and any other new one until "
                    "some are sent) is dropped: the CDN keeps its copy until it expires",
                    lane.target.label,
                    len(lane.book),
                    stream,
                )
            return False
        if booked is Booked.NEW:
            lane.dropping = False
        return True

    async def _settle(self, stream: str) -> None:
        """Wait until the forgettings of ``stream`` booked so far are in effect, and owe their
        sends; again while more are booked meanwhile."""
        try:
            while (count := self._unsettled.get(stream, 0)) > 0:
                durable = True
                try:
                    durable = await self._forgetter.in_effect(stream)
                finally:
                    # Even when waiting failed the purge is owed: early is safe, never is not.
                    self._unsettled[stream] -= count
                    now = self._clock()
                    for lane in self._lanes:
                        lane.book.in_effect(stream, now, settled=count)
                        lane.wake.set()
                if not durable and self._deadline is None and stream not in self._confirming:
                    reason = next(
                        (o.reason for lane in self._lanes if (o := lane.book.get(stream))), "gone"
                    )
                    confirming = asyncio.ensure_future(self._confirm(stream, reason))
                    self._confirming[stream] = confirming
        finally:
            self._settling.pop(stream, None)
            if self._unsettled.get(stream, 1) <= 0:
                del self._unsettled[stream]
            self._progress.set()

    async def _confirm(self, stream: str, reason: str) -> None:
        """The shared tier was away: once it makes the purge durable, owe one more send."""
        try:
            if not await self._forgetter.durable(stream, GIVE_UP_SECONDS):
                return
            now = self._clock()
            for lane in self._lanes:
                self._booked(lane, stream, lane.book.confirmed(stream, reason, now))
                lane.wake.set()
        finally:
            self._confirming.pop(stream, None)

    # --- sending ---

    async def _run(self, lane: Lane) -> None:
        while True:
            now = self._clock()
            batch = lane.book.due(now, lane.target.streams_per_call)
            if not batch:
                wake = lane.book.next_wake()
                lane.wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(None if wake is None else max(0.0, wake - now)):
                        await lane.wake.wait()
                continue
            try:
                await self._send(lane, batch)
            except Exception:  # a bug must not stop every later purge of this target
                logger.exception("%s: a purge call failed", lane.target.label)
                self._failed(lane, batch, "edge error", None)
            self._progress.set()

    async def _send(self, lane: Lane, batch: list[Owed]) -> None:
        call = call_for(lane.target, [Purged(stream=o.stream, reason=o.reason) for o in batch])
        status, headers, body, error = await self._call(call)
        verdict = judge(lane.target, status, headers, body)
        if not verdict.done:
            self._failed(lane, batch, error or verdict.detail, verdict.retry_after_seconds)
            return
        lane.book.sent(call.streams)
        self._metrics.cdn_purges.labels(kind=lane.target.kind, result="ok").inc(len(batch))
        if lane.failing:
            lane.failing = False
            logger.info("%s: purges are acknowledged again", lane.target.label)

    def _failed(
        self, lane: Lane, batch: list[Owed], detail: str, retry_after_seconds: float | None
    ) -> None:
        streams = [owed.stream for owed in batch]
        given_up = lane.book.failed(
            streams, self._clock(), uniform=self._uniform(), retry_after_seconds=retry_after_seconds
        )
        kind = lane.target.kind
        self._metrics.cdn_purges.labels(kind=kind, result="error").inc(len(streams))
        if not lane.failing:
            lane.failing = True
            logger.warning(
                "%s: a purge failed (%s); retried with backoff until acknowledged",
                lane.target.label,
                detail,
            )
        if given_up:
            self._metrics.cdn_purges.labels(kind=kind, result="gave_up").inc(len(given_up))
            logger.error(
                "%s: gave up purging %d streams after %.0f s of failures (%s): %s",
                lane.target.label,
                len(given_up),
                GIVE_UP_SECONDS,
                detail,
                ", ".join(given_up[:10]),
            )

    async def _call(self, call: PurgeCall) -> Answered:
        session = self._session
        assert session is not None, "start() first"
        try:
            async with (
                asyncio.timeout(CALL_TIMEOUT_SECONDS),
                session.request(
                    call.method,
                    call.url,
                    headers=list(call.headers),
                    data=call.body or None,
                    allow_redirects=False,
                ) as response,
            ):
                body = await response.content.read(MAX_ANSWER_BYTES)
                return response.status, tuple(response.headers.items()), body, ""
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            return None, (), b"", f"no answer: {type(error).__name__}"

    # --- shutdown ---

    def start_draining(self) -> None:
        """The edge is stopping: send everything owed now; ``close`` waits for it until
        ``--drain-seconds`` from now."""
        if self._deadline is not None:
            return
        now = self._clock()
        self._deadline = now + self._drain_seconds
        for confirming in self._confirming.values():
            confirming.cancel()  # its send is due now anyway
        for lane in self._lanes:
            lane.book.drain(now)
            lane.wake.set()

    def _quiet(self) -> bool:
        return not self._settling and not self._checks and not self.owed

    async def close(self) -> None:
        self.start_draining()
        assert self._deadline is not None
        while not self._quiet() and (remaining := self._deadline - self._clock()) > 0:
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._progress.wait()
        self._closed = True
        tasks = [
            *(lane.task for lane in self._lanes if lane.task is not None),
            *self._settling.values(),
            *self._confirming.values(),
            *self._checks,
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for lane in self._lanes:
            left = lane.book.abandon()
            if left:
                self._metrics.cdn_purges.labels(kind=lane.target.kind, result="abandoned").inc(
                    len(left)
                )
                logger.error(
                    "%s: %d purges still owed when the drain ended (--drain-seconds): %s",
                    lane.target.label,
                    len(left),
                    ", ".join(left[:10]),
                )
        if self._session is not None:
            await self._session.close()
