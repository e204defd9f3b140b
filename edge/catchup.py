"""Catch-up reads answered from the stream logs, asking the origin only for what is missing.

The async pump around ``edge.log.policy``: plan (synchronously, so no other task can interleave:
the event loop is the lock), then do I/O (shared tier, the fills) and build the answer. What
the origin is asked, single-flight, and how its answer is taken in through the door, is
``edge.fills``'s (``Fills``).

Rules this module owns:

* A read is planned from what the local tier holds, then from what the shared tier adds (at most
  ``MAX_SHARED_PULLS`` pulls), and only then does a fill ask the origin, from where the edge's
  chain ends.
* An answer fetched under an instance that was forgotten meanwhile is read again, under the
  current one; what a fill revealed (a 404, a new instance) is settled before its answer goes.
* Bytes another replica filled are served once this process knows their instance's lifetime.
* An at-tail hit late in its tail's window (``Hit.refresh``) is shown to the refresh-ahead
  (``edge.refresh_ahead``), which renews the tail in the background; the hit is answered as it
  would be.
* A fill's answer is capped by the reader's own prefix (``fill_coverage``), whoever led it.
* A read ends in one of named states: an ``Answer``, a ``Bypass`` naming why the web layer
  relays the client's own request instead, or an ``OriginError`` (the origin boundary: the
  origin failed; a fill past ``--fill-deadline`` is a 504). ``BodyTooLarge`` from a fill is
  translated into ``Bypass(TOO_LARGE)`` here.

What the edge learns about a stream's existence (writes, deletes, 404s, lifetimes, live
upstreams, other replicas) is ``edge.instances``'s to keep; this module asks it. The fills, the
local tier, the parts of the stream instances it uses (the forgetter, the generations and the
lifetimes) and the compressor are handed in by the composition root (``edge.web.wiring``);
nothing reaches them through this service.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import assert_never

from edge.answer import Answer, Bypass, Derivation, Result, Why
from edge.config import Settings
from edge.fills import Chained, Fill, Fills, Reach, Resolution, Unchained
from edge.instances.forgetting import Forgetter
from edge.instances.generations import Generations
from edge.instances.lifetimes import Lifetimes
from edge.log.freshness import Reuse, Tiers, never_stored, reuse, tail_age_seconds
from edge.log.intake import header_template
from edge.log.policy import (
    Fetch,
    Hit,
    answer_headers,
    etag,
    fill_coverage,
    if_none_match_hits,
    keys_of,
    plan_catchup,
)
from edge.log.segment import (
    Segment,
    content_digest,
    stitch,
)
from edge.log.stream_log import LogKey, StreamLog, TailFact
from edge.origin import BodyTooLarge
from edge.protocol.answer_key import accepts_gzip
from edge.protocol.headers import (
    first_value,
)
from edge.protocol.reads import PUBLIC_SCOPE, START, Read, is_client_offset
from edge.refresh_ahead import RefreshAhead
from edge.store.local import Compressor, LocalTier

logger = logging.getLogger(__name__)

COMPRESS_MIN_BYTES = 1024
# Pulling a long chain from the shared tier is one round trip per segment; past this many the
# origin is asked instead.
MAX_SHARED_PULLS = 256


def live_authority_seconds(settings: Settings) -> float:
    """How long a live upstream's last word on the tail is trusted: origins speak on a live read
    at least every long-poll timeout (the edge's --long-poll-timeout mirrors the origin's)."""
    timeout = settings.long_poll_timeout_seconds
    return timeout + max(1.0, 0.2 * timeout)


def tiers_of(settings: Settings) -> Tiers:
    """What the settings say of the caches downstream (``edge.log.freshness``)."""
    return Tiers(
        freshness_seconds=settings.tail_freshness_seconds,
        browser_max_age_seconds=settings.browser_max_age_seconds,
        cdn_purged=bool(settings.cdn_purge),
    )


class CatchupCache:
    """The catch-up service: a read answered from the logs, the origin asked for what is missing."""

    def __init__(
        self,
        settings: Settings,
        *,
        fills: Fills,
        local: LocalTier,
        forgetter: Forgetter,
        generations: Generations | None,
        lifetimes: Lifetimes,
        compressor: Compressor,
        ahead: RefreshAhead | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._ahead = ahead
        self._authority_seconds = live_authority_seconds(settings)
        self._fills = fills
        self._local = local
        self._forgetter = forgetter
        self._generations = generations
        self._lifetimes = lifetimes
        self._compressor = compressor
        self._clock = clock
        self.tiers = tiers_of(settings)

    # --- reads ---

    def plan(self, key: LogKey, offset: str) -> Hit | Fetch:
        """What the cache holds for a read at ``offset`` now (``plan_catchup``), without waiting."""
        return plan_catchup(
            self._local.log(key),
            self._local.get,
            key,
            offset,
            now=self._clock(),
            freshness_seconds=self._settings.tail_freshness_seconds,
            max_bytes=self._settings.max_response_bytes,
            authority_seconds=self._authority_seconds,
        )

    async def resolve(
        self, key: LogKey, offset: str, credentials: Sequence[tuple[str, str]]
    ) -> Resolution | Bypass:
        """Find the answer for a read at ``offset``: from the local tier, the shared tier, or
        (single-flight) the origin, which is asked only from where the edge's chain ends."""
        if not is_client_offset(offset) or offset == "now":
            return Bypass(
                why=Why.NOT_CACHEABLE, reason=f"offset {offset!r} is the origin's to judge"
            )
        try:
            return await self._resolve(key, offset, credentials)
        except BodyTooLarge as uncacheable:
            # The origin boundary's word for a body past what the edge keeps in one piece.
            return Bypass(why=Why.TOO_LARGE, reason=str(uncacheable))

    async def _resolve(
        self, key: LogKey, offset: str, credentials: Sequence[tuple[str, str]]
    ) -> Resolution | Bypass:
        resolved = await self._resolve_once(key, offset, credentials)
        if isinstance(resolved, Bypass):
            return resolved
        fill = resolved.fill
        if fill is not None and fill.joins is Unchained.STALE:
            # The stream was forgotten while the fetch was out (deleted, recreated, purged):
            # its answer belongs to no instance the edge knows; read the current one instead.
            resolved.release()
            resolved = await self._resolve_once(key, offset, credentials)
            if isinstance(resolved, Bypass):
                return resolved
        if fill is not None:
            # What a fill revealed (a 404, a new instance) is told before its answer goes out.
            await self._forgetter.settled(key.stream)
        return resolved

    async def _resolve_once(
        self, key: LogKey, offset: str, credentials: Sequence[tuple[str, str]]
    ) -> Resolution | Bypass:
        generations = self._generations
        if generations is not None:
            await generations.check_generation(key.stream)
        planned = self._local.instance_for(key.stream)
        plan = self.plan(key, offset)
        shared_hit = False
        pulls = 0
        while isinstance(plan, Fetch) and generations is not None and pulls < MAX_SHARED_PULLS:
            pulled_at = plan.offset
            if not await generations.pull_shared(key, pulled_at):
                if await generations.pull_shared_closure(key, pulled_at):
                    plan = self.plan(key, offset)
                break
            shared_hit = True
            pulls += 1
            plan = self.plan(key, offset)
            if isinstance(plan, Fetch) and plan.offset == pulled_at:
                break  # the plan does not use what was pulled (expired, bypassed): go to origin
        if shared_hit and not planned.lifetime_known and self._local.current(planned):
            # Bytes another replica filled: whether the stream still lives is the origin's to
            # say (a sliding TTL counts from the last read that reached it, not from theirs).
            await self._lifetimes.confirm_lifetime(key, planned, credentials)
            await self._forgetter.settled(key.stream)
            plan = self.plan(key, offset)
        instance = planned
        if not self._local.current(planned):
            # Forgotten while the shared tier answered (another replica's purge, another
            # instance's segment): a plan made of the old instance's segments would join them
            # to what the origin says of the new one. Plan again, from what is held now.
            instance = self._local.instance_for(key.stream)
            plan = self.plan(key, offset)
        if isinstance(plan, Hit):
            return Resolution(plan=plan, shared_hit=shared_hit, fill=None, collapsed=False)
        fetch = plan
        outcome = await self._fills.fetch(key, fetch, credentials, instance)
        if isinstance(outcome, Bypass):
            return outcome
        fill, collapsed = outcome
        return Resolution(plan=fetch, shared_hit=shared_hit, fill=fill, collapsed=collapsed)

    async def head(self, read: Read) -> Answer | None:
        """The edge's own answer to a ``HEAD`` of ``read``'s stream, when it knows all of it: a
        trusted tail that its segments reach from the start (so ``Stream-Next-Offset`` is the
        tail, never a cap), and a lifetime known to have no end (else the origin's answer
        would name it). None: the origin answers (and the edge learns from it)."""
        key = LogKey(stream=read.stream, scope=read.scope)
        if self._generations is not None:
            await self._generations.check_generation(key.stream)
        plan = self.plan(key, START)
        log = self._local.log(key)
        if not isinstance(plan, Hit) or not plan.up_to_date or log is None:
            return None
        instance = log.instance
        if not instance.lifetime_known or instance.remaining_seconds(self._clock()) is not None:
            return None
        segments, end = plan.coverage.segments, plan.coverage.end
        closed = plan.closed
        digest = content_digest(segments, log.content_type)
        tag = etag(read.stream, START, end, digest=digest, closed=closed, encoding=None)
        verdict = never_stored(shared=log.key.scope == PUBLIC_SCOPE)
        generation = instance.generation
        headers = answer_headers(
            log, next_offset=end, up_to_date=False, closed=closed, tag=tag, verdict=verdict,
            keys=keys_of(read.stream, generation), varies_by_encoding=False,
        )  # fmt: skip
        derivation = Derivation(
            instance=instance, generation=generation, scope=key.scope, start=START, end=end,
            encoding=None, reuse=verdict, kept=True, up_to_date=True, closed=closed,
        )  # fmt: skip
        return Answer(
            status=200, headers=headers, body=b"", cache_status="edge; hit", result=Result.HIT,
            derivation=derivation,
        )  # fmt: skip

    async def read(
        self,
        read: Read,
        *,
        credentials: Sequence[tuple[str, str]],
        if_none_match: str | None,
        accept_encoding: str | None,
    ) -> Answer | Bypass:
        key = LogKey(stream=read.stream, scope=read.scope)
        # An absent offset means the start (§5.6); an empty one is the origin's to refuse.
        offset = START if read.offset is None else read.offset
        resolved = await self.resolve(key, offset, credentials)
        if isinstance(resolved, Bypass):
            return resolved
        plan, fill = resolved.plan, resolved.fill
        if isinstance(plan, Hit):
            log = self._local.log(key)
            assert log is not None
            if self._ahead is not None:
                # Late in the tail's window: renewed in the background; this read is answered.
                self._ahead.served(log, credentials, plan.refresh)
            status = "edge; hit; detail=shared" if resolved.shared_hit else "edge; hit"
            return await self._answer(
                read, log, offset, plan.coverage.segments, plan.coverage.end,
                up_to_date=plan.up_to_date, closed=plan.closed,
                if_none_match=if_none_match, accept_encoding=accept_encoding,
                cache_status=status, result=Result.HIT, kept=True, observed=log.tail,
            )  # fmt: skip
        assert fill is not None
        try:
            answer = await self._answer_fill(
                read, key, offset, resolved, fill, plan, if_none_match, accept_encoding
            )
        except BaseException:
            resolved.release()
            raise
        if isinstance(answer, Bypass):
            resolved.release()
            return answer
        # The answer's bytes keep the fill's budget share until the web layer has written them.
        return replace(answer, hold=fill.hold) if fill.hold is not None else answer

    async def _answer_fill(
        self,
        read: Read,
        key: LogKey,
        offset: str,
        resolved: Resolution,
        fill: Fill,
        plan: Fetch,
        if_none_match: str | None,
        accept_encoding: str | None,
    ) -> Answer | Bypass:
        result = Result.DELTA if plan.is_delta else Result.MISS
        forward = "partial" if plan.is_delta else "uri-miss"
        chained: Chained | None
        match fill.joins:
            case Chained():
                chained = fill.joins
            case Unchained.FOR_THIS_REQUEST | Unchained.STALE:
                chained = None
            case _:
                assert_never(fill.joins)
        stored = chained is not None and chained.kept
        detail = "; collapsed" if resolved.collapsed else ("; stored" if stored else "")
        cache_status = f"edge; fwd={forward}; fwd-status={fill.status}{detail}"
        if chained is None:
            return fill.relayed(
                delta=plan.is_delta, private=key.scope != PUBLIC_SCOPE,
                cache_status=cache_status, result=result,
            )  # fmt: skip
        log = self._local.log_for(key)
        if log.content_type is None:  # evicted or purged while the fetch was in flight
            log.content_type = first_value(fill.headers, "content-type")
            log.header_template = self._local.template(header_template(fill.headers))
        # Capped by this reader's own prefix, whoever's fill it is (a refill, another delta).
        coverage = fill_coverage(
            plan.prefix, chained.segment, chained.next_offset,
            max_bytes=self._settings.max_response_bytes,
        )  # fmt: skip
        reach = Reach.BEHIND if coverage.capped else chained.reach
        return await self._answer(
            read, log, offset, coverage.segments, coverage.end,
            up_to_date=reach.up_to_date, closed=reach.closed,
            if_none_match=if_none_match, accept_encoding=accept_encoding,
            cache_status=cache_status, result=result,
            kept=coverage.capped or chained.kept,
        )  # fmt: skip

    def reuse_for(self, log: StreamLog, *, immutable: bool) -> Reuse:
        """The policy's verdict on reusing an answer built from ``log`` now."""
        instance = log.instance
        return reuse(
            scope=log.key.scope,
            immutable=immutable,
            tiers=self.tiers,
            lifetime_known=instance.lifetime_known,
            remaining_seconds=instance.remaining_seconds(self._clock()),
        )

    def age_of(self, verdict: Reuse, observed: TailFact | None) -> int | None:
        """The ``Age`` of an answer with ``verdict`` whose tail was ``observed`` (None: just
        now, by the fill it came with); None: it carries none (``edge.log.freshness``)."""
        if not verdict.at_tail:
            return None
        return 0 if observed is None else tail_age_seconds(observed, self._clock())

    async def _answer(
        self,
        read: Read,
        log: StreamLog,
        start: str,
        segments: Sequence[Segment],
        end: str,
        *,
        up_to_date: bool,
        closed: bool,
        if_none_match: str | None,
        accept_encoding: str | None,
        cache_status: str,
        result: Result,
        kept: bool,
        observed: TailFact | None = None,
    ) -> Answer:
        """``observed``: the tail fact an at-tail answer from the log ends at (None: a fill's
        answer, whose tail the origin has just told)."""
        # Fixed before any await: the answer is of this instance, whatever happens meanwhile.
        instance = log.instance
        generation = instance.generation
        body = stitch(segments, json=log.json)
        final = closed and up_to_date
        # Past --max-response-bytes (a single large segment) the body goes as it is: compressing
        # megabytes on the event loop would stall every viewer, and hold a second copy per reader.
        compress = COMPRESS_MIN_BYTES <= len(
            body
        ) <= self._settings.max_response_bytes and accepts_gzip(accept_encoding)
        encoding = "gzip" if compress else None
        digest = content_digest(segments, log.content_type)
        tag = etag(read.stream, start, end, digest=digest, closed=final, encoding=encoding)
        verdict = self.reuse_for(log, immutable=final or not up_to_date)
        headers = answer_headers(
            log, next_offset=end, up_to_date=up_to_date, closed=final, tag=tag,
            verdict=verdict, keys=keys_of(read.stream, generation),
        )  # fmt: skip
        derivation = Derivation(
            instance=instance, generation=generation, scope=log.key.scope, start=start,
            end=end, encoding=encoding, reuse=verdict, kept=kept, up_to_date=up_to_date,
            closed=final,
        )  # fmt: skip
        age = self.age_of(verdict, observed)
        if if_none_match_hits(if_none_match, tag):
            return Answer(
                status=304, headers=headers, body=b"", cache_status=cache_status, result=result,
                derivation=derivation, age_seconds=age,
            )  # fmt: skip
        if compress:
            body = await self._compressor.gzip(log.key, instance, (start, end, digest), body)
            headers.append(("Content-Encoding", "gzip"))
        return Answer(
            status=200, headers=headers, body=body, cache_status=cache_status, result=result,
            derivation=derivation, age_seconds=age,
        )  # fmt: skip


__all__ = ["CatchupCache"]
