"""The stream instances this replica knows, and their lifecycle (DESIGN.md "a stream's identity").

A stream is its normalised path plus an *instance*: a DELETE and a PUT at the same path make a
new stream whose offsets start again. This module is the one home of that concept around the
pure core (``edge.log.stream_log``): every fact about a stream's existence enters here.

Rules this module owns:

* **Forgetting is total.** A stream is forgotten (``purge``) on a DELETE or a 201 PUT through
  the edge, a 404 or 410 to any request that speaks for the stream (``stream_gone``), a live
  upstream or catch-up answer that the core finds impossible for the instance it knows (the
  tail went back, a closure vanished), or a purge from the admin listener or another replica;
  and every stream at once when a live upstream saw the origin go away (``origin_lost``,
  ``edge.log.trust``). Forgetting drops the instance with every entry kept for it (segments,
  logs, derived frames), ends its live tails, viewers and waiting long-polls (``forgotten``
  listeners), and starts a durable purge in the shared tier. When what is held is only in
  doubt, not known to be another stream's (the origin went away, the shared tier silent too
  long), the live followers stay (``unconfirmed`` listeners): they go on by offset in the
  instance begun in its place.
* **What this process decides to forget, it tells.** Every forgetting this process decides from
  what it learned itself (``purge``, and a 404 that forgets one scope), whatever its cause, goes
  through ``_decided`` as one ``Forgetting`` (what, why, and whether this process is the one to
  tell what lies downstream), which hands it to the ``on_forget`` tellers (the sibling workers
  of ``--workers N``: edge.workers.siblings; the CDN: edge.cdn.purger) and keeps what they
  return until it is done. Whoever is about to answer with what revealed it awaits
  ``settled(stream)`` first, so no sibling serves the old instance after that answer. A teller
  bounds its own work (a sibling that does not answer delays nothing further; the CDN's teller
  returns nothing to wait for). Forgetting learned from the shared tier is not told: every
  process hears the shared tier itself. A forgetting carried out for another process (a
  sibling's, replayed at the supervisor's request) is told to siblings by nobody, and
  downstream by its decider (``TELLS_DOWNSTREAM``), or, when the decider held nothing of the
  stream (a 404 on a worker that never served it), by each sibling that held something.
* **A forgetting is in effect** (``in_effect``) once this process has forgotten, its siblings
  have been told, and the shared tier's purge is durable (or ``PURGE_WAIT_SECONDS`` passed):
  only then may a cache in front of the edge be purged, or it would fetch the old bytes again.
* **Work started under an instance stores nothing once it is gone**: callers pass the instance
  they started with, and ``LocalTier.current`` decides.
* **Replicas agree through generations.** With a shared tier, a replica confirms a stream's
  generation at most every ``GENERATION_CHECK_SECONDS`` before serving it, after its purge
  channel reconnects (``resync``), and on every shared read; a generation it did not know means
  another replica purged the stream: it forgets its own copy. A generation key Redis lost
  (restarted empty, expired, evicted) confirms nothing: the tier mints a new one in its place
  (``edge.store.shared``), so every replica holding the stream forgets it once and asks the
  origin, which says 404 for a stream deleted meanwhile. While the tier cannot say (Redis down),
  what is held is served for a bounded time after its last confirmation (``edge.log.trust``).
* **Every origin answer is evidence, whatever request it answered.** A 404 or 410 (the core's
  ``says_gone``) to a read, a write (``judge_write``), a DELETE, a HEAD, ``offset=now``, a live
  upstream or the edge's own lifetime probe ends the instance held as a DELETE through the edge
  does: every answer the edge relays or asks for without storing it goes through ``evidence``
  (the intake's ``decide``), a write's through ``judge_write``. Whose it is to forget is
  ``stream_gone``'s rule: a request that carried credentials the edge did not authorise speaks
  for its scope only (a bad token must not empty the cache for others), so only that scope is
  forgotten; without credentials, or with the edge's own, it is the stream's fate.
* Other refusals (401/403, 409, 400) are evidence about their request, not about the stream.
* Lifetimes (``Stream-TTL``, ``Stream-Expires-At``) are learned from writes, HEAD answers and any
  origin answer that carries them; a stream known only from reads is asked once (HEAD). Bytes
  the shared tier gives are served only once this process knows their instance's lifetime
  (``confirm_lifetime``): a sliding TTL counts from this process's own reads of the origin, so
  an instance it never read there asks the origin first, which renews it or says 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Generic, Literal, NamedTuple, TypeVar, assert_never

from edge.coalesce import SingleFlight
from edge.config import Settings
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
from edge.log.stream_log import (
    LogKey,
    Mark,
    StreamInstance,
    TailVerdict,
    Write,
    judge_shared,
    judge_write,
    names_another_instance,
)
from edge.log.trust import Unconfirmed, when_unconfirmed
from edge.metrics import Metrics
from edge.origin import OriginClient, OriginError
from edge.protocol.headers import (
    STREAM_CLOSED,
    STREAM_FORKED_FROM,
    STREAM_NEXT_OFFSET,
    first_value,
    flag,
    own_request_headers,
)
from edge.protocol.lifetimes import parse_expires_at, parse_ttl_seconds
from edge.protocol.offsets import is_offset_token
from edge.protocol.reads import PUBLIC_SCOPE, auth_scope, speaks_for_the_stream
from edge.store.local import LocalTier
from edge.store.shared import SharedTier
from edge.store.shared_codec import SharedClosure

logger = logging.getLogger(__name__)

# How often a replica confirms a stream's generation with the shared tier before serving it: a
# purge missed on the pub/sub channel (partition, restart) stops being served within this.
GENERATION_CHECK_SECONDS = 1.0
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


class Taken(NamedTuple):
    """What the one door made of an origin answer: the core's decision, the segment it
    decided to keep, and whether the local tier took it (it refuses a forgotten instance's)."""

    decision: Decision
    segment: Segment | None
    stored: bool


class InstanceChanged(Exception):
    """The stream instance a live upstream was following is gone."""


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
    """One forgetting this process decided (``Streams._decided``)."""

    # The stream, and the scope forgotten (the public scope forgets the whole instance).
    key: LogKey
    reason: Reason
    # This process held something of the stream; if not (a 404 for a path it never served),
    # only the shared tier can say whether any replica did (``Streams.held_elsewhere``).
    held_here: bool = True
    # The generation the shared tier's purge writes ("" without a shared tier, or for a scope).
    generation: str = ""
    # This process is the one to tell what lies downstream (``TELLS_DOWNSTREAM``).
    tells_downstream: bool = True
    # What was held is only in doubt (the origin went away): live followers stay
    # (``Streams.forget_locally``), on the siblings told too.
    followers_stay: bool = False

    @property
    def stream(self) -> str:
        return self.key.stream


# Told of each forgetting this process decided. Returns the telling under way, or None
# (nothing to wait for).
Teller = Callable[[Forgetting], "asyncio.Future[None] | None"]


def carries_body(headers: Sequence[tuple[str, str]]) -> bool:
    """Did a request say it carries a body (a positive ``Content-Length``, or chunked)?"""
    if first_value(headers, "transfer-encoding") is not None:
        return True
    length = first_value(headers, "content-length")
    return length is not None and length.strip().isdigit() and int(length) > 0


def written_as(
    method: str,
    status: int,
    request_headers: Sequence[tuple[str, str]],
    response_headers: Sequence[tuple[str, str]],
    floor: str | None,
    started: int,
) -> Write:
    """A write's request and answer as the core judges them (``judge_write``)."""
    body = carries_body(request_headers)
    if method == "PUT":
        named = first_value(response_headers, "content-type")
    elif method == "POST" and body:
        # A close without a body is taken whatever its Content-Type (clients send a default).
        named = first_value(request_headers, "content-type")
    else:
        named = None
    return Write(
        floor=floor,
        started=started,
        # An append of bytes (not a producer's, whose retry of a duplicate is answered with the
        # tail as it is) ends past the tail the edge knew before it started.
        appended=method == "POST" and body and first_value(request_headers, "producer-id") is None,
        content_type=named,
        answered=method == "PUT",
        status=status,
    )


class Streams:
    def __init__(
        self,
        settings: Settings,
        local: LocalTier,
        origin: OriginClient,
        metrics: Metrics,
        *,
        shared: SharedTier | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self.local = local
        self._origin = origin
        self._metrics = metrics
        self._shared = shared
        self._clock = clock
        self._checks: SingleFlight[str, str | None] = SingleFlight()
        self._tickets = itertools.count()
        self._background: set[asyncio.Task[None]] = set()
        # The lifetime asked of the origin (HEAD), one question per instance at a time.
        self._probing: dict[StreamInstance, asyncio.Task[None]] = {}
        # Told of every stream forgotten on this replica (live tails and viewers stop).
        self.forgotten: list[Callable[[str], None]] = []
        # Told of every stream forgotten while its live followers stay (``forget_locally``):
        # its tails follow the instance begun in its place.
        self.unconfirmed: list[Callable[[str], None]] = []
        # Told of every forgetting this process decided itself (see the module rules).
        self.on_forget: list[Teller] = []
        self._telling: Unsettled[asyncio.Future[None]] = Unsettled()

    def ticket(self) -> int:
        """Orders origin exchanges: taken when a request starts and when its answer arrives."""
        return next(self._tickets)

    # --- generations (the shared tier) ---

    async def check_generation(self, stream: str) -> None:
        """Confirm, at most once per ``GENERATION_CHECK_SECONDS``, that what this replica holds
        for ``stream`` is of the generation the shared tier names; forget it if not."""
        shared = self._shared
        if shared is None:
            return
        instance = self.local.instance_for(stream)
        if self._clock() - instance.verified_at < GENERATION_CHECK_SECONDS:
            return
        generation, _ = await self._checks.run(stream, lambda: shared.generation(stream))
        if not self.local.current(instance):
            return  # forgotten meanwhile: the answer is too old
        if generation is None:
            self._unconfirmed(instance)
            return
        self.adopt_generation(stream, generation)

    def _unconfirmed(self, instance: StreamInstance) -> None:
        """The shared tier cannot say whether ``instance`` is current: what is held of it is
        served only for a bounded time after its last confirmation (``edge.log.trust``)."""
        stream, now = instance.stream, self._clock()
        held = self.local.holds_learned(stream)
        verdict = when_unconfirmed(confirmed_at=instance.verified_at, now=now, holds=held)
        match verdict:
            case Unconfirmed.SERVE:
                pass
            case Unconfirmed.FORGET:
                logger.info("%s unconfirmed for too long: asking the origin", stream)
                # In doubt, not known to be another: its live followers go on by offset.
                self.forget_locally(stream, followers_stay=True)
                self.local.instance_for(stream).verified_at = now  # begun again, empty
            case Unconfirmed.BEGIN:
                instance.verified_at = now
            case _:
                assert_never(verdict)

    def adopt_generation(self, stream: str, generation: str) -> StreamInstance:
        assert self._shared is not None
        instance = self.local.instance_for(stream)
        pending = self._shared.pending_purges.get(stream)
        if pending is not None:
            generation = pending  # this replica's own purge, not yet in Redis, is newer
        if instance.generation != generation:
            if instance.generation or self.local.holds_learned(stream):
                self.forget_locally(stream)  # purged elsewhere (or held from before it knew)
                instance = self.local.instance_for(stream)
            instance.generation = generation
        instance.verified_at = self._clock()
        return instance

    async def pull_shared(self, key: LogKey, start: str) -> bool:
        """Copy the shared tier's segment at ``start`` into the local tier; False if none."""
        assert self._shared is not None
        before = self.local.instance_for(key.stream)
        found = await self._shared.get(key, start)
        if found is None or not self.local.current(before):
            return False  # unavailable, or the stream was forgotten while Redis answered
        instance = self.adopt_generation(key.stream, found.generation)
        if found.value is None or instance is not before:
            return False
        if instance.generation != found.generation:
            return False  # this replica's own newer purge is still pending: not that value
        held = self.local.log(key)
        verdict = judge_shared(
            instance, held.tail if held is not None else None, start,
            content_type=found.value.content_type, seen_at=found.value.seen_at,
        )  # fmt: skip
        if verdict is TailVerdict.NEW_INSTANCE:
            # Another stream at the path than the one held (one of the two was filled after a
            # recreation behind the edge): only the origin knows which is current. A purge
            # starts a new generation, so neither is served again, here or on any replica.
            logger.info("%s shared as another content type: a new instance", key.stream)
            self.purge(key.stream, reason="new_instance")
            return False
        if verdict is not TailVerdict.BELIEVED:
            return False  # heard the tail open at ``start`` since it was seen past it
        log = self.local.log_for(key)
        if log.content_type is None:
            log.content_type = found.value.content_type
        segment = found.value.segment
        instance.reached(segment.end, self.ticket())
        if found.value.open_tail:
            log.heard_open(segment.end, found.value.seen_at)
        return self.local.put(key, segment, instance)

    async def pull_shared_closure(self, key: LogKey, end: str) -> bool:
        """Did another replica see the stream closed exactly where the edge's chain ends?"""
        assert self._shared is not None
        log = self.local.log(key)
        if log is None or (log.tail is not None and log.tail.closed):
            return False
        instance = log.instance
        if not instance.generation:
            return False
        closure = await self._shared.get_closed(key, instance.generation)
        if closure is None or closure.end != end or not self.local.current(instance):
            return False
        verdict = judge_shared(
            instance, log.tail, end, content_type=closure.content_type, seen_at=closure.seen_at
        )
        if verdict is TailVerdict.NEW_INSTANCE:
            logger.info("%s shared closed as another content type: a new instance", key.stream)
            self.purge(key.stream, reason="new_instance")
            return False
        if verdict is not TailVerdict.BELIEVED:
            return False  # heard open there since that closure was seen: the origin says
        ticket = self.ticket()
        verdict = log.observe_tail(
            end, closed=True, now=self._clock(), started=ticket, received=ticket
        )
        return verdict is TailVerdict.BELIEVED

    def share(
        self, key: LogKey, segment: Segment | None, closed_at: str | None, open_tail: bool = False
    ) -> None:
        shared = self._shared
        log = self.local.log(key)
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

    # --- what live upstreams tell ---

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
        current = self.local.current(instance)
        existing = self.local.log(key) if current else None
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
                self.purge(key.stream, reason="new_instance")
            case ForgetScope():
                self.stream_gone(key)
            case Bypass(until=until):
                instance.bypass_until = until
            case Describe(content_type=content_type, template=template):
                log = self.local.log_for(key)
                log.content_type = content_type
                log.header_template = self.local.template(template)
            case Touched(now=now):
                instance.touched_origin(now)
            case LearnLifetime(headers=headers):
                self.learn_lifetime(instance, headers)
            case BelieveTail(judgement=judgement):
                self.local.log_for(key).believe(judgement)
            case Reached(offset=offset, received=received):
                instance.reached(offset, received)
            case Keep(segment=segment, closed_at=closed_at, open_tail=open_tail):
                stored = segment is not None and self.local.put(key, segment, instance)
                self.share(key, segment if stored else None, closed_at, open_tail)
                return stored
            case ProbeLifetime():
                if not instance.lifetime_known:
                    self.probe_lifetime(key, instance, credentials)
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
        held = self.local.instance(key.stream) if instance is None else instance
        # Nothing held of the stream: still the stream's current state (a 404 for a path never
        # held is told to the shared tier, which may hold it for another replica).
        current = held is None or self.local.current(held)
        judged = held if held is not None else StreamInstance(stream=key.stream)
        arrival = Arrival.evidence(
            status, tuple(headers), live=live, started=started, received=self.ticket(),
            now=self._clock(),
        )  # fmt: skip
        intake = decide(arrival, judged, None, current=current)
        for action in intake.actions:
            self._carry_out(key, judged, action, ())
        return intake.decision

    # --- what live upstreams tell ---

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
        log = self.local.log(key)
        content_type = log.content_type if log is not None else instance.content_type
        arrival = Arrival(
            live=True, start=start, status=200, end=end, body=body, headers=(),
            content_type=content_type, up_to_date=up_to_date, closed=closed, started=started,
            received=self.ticket(), now=self._clock(),
        )  # fmt: skip
        taken = self.take_in(key, instance, arrival)
        if taken.decision is Decision.MALFORMED:
            raise ValueError(f"the origin sent a malformed offset {end[:64]!r}")
        if taken.decision is not Decision.STORE:
            raise InstanceChanged(key.stream)
        return taken.segment

    def live_ended(self, key: LogKey) -> None:
        """The live upstream stopped: its last word on the tail is now only as of its time."""
        log = self.local.log(key)
        if log is not None:
            log.lose_authority(self._clock())

    # --- lifetimes ---

    def learn_lifetime(
        self,
        instance: StreamInstance,
        headers: Sequence[tuple[str, str]],
        *,
        complete: bool = False,
    ) -> None:
        """Learn the lifetime ``headers`` state. ``complete``: they state all of it (a HEAD
        answer, a creating PUT), so stating none means the stream does not expire."""
        ttl = parse_ttl_seconds(first_value(headers, "stream-ttl"))
        expires_at = parse_expires_at(first_value(headers, "stream-expires-at"))
        if complete or ttl is not None or expires_at is not None:
            instance.learn_lifetime(ttl, expires_at)

    def probe_lifetime(
        self, key: LogKey, instance: StreamInstance, credentials: Sequence[tuple[str, str]]
    ) -> asyncio.Task[None]:
        """A stream known only from reads: ask the origin (HEAD, once per instance at a time)
        whether it expires, so the edge neither serves it past its end nor advertises it for a
        year. A HEAD does not renew a sliding TTL at the origin (PROTOCOL.md 5.1)."""
        task = self._probing.get(instance)
        if task is not None:
            return task
        task = asyncio.ensure_future(self._head_lifetime(key, instance, tuple(credentials)))
        self._probing[instance] = task
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def confirm_lifetime(
        self, key: LogKey, instance: StreamInstance, credentials: Sequence[tuple[str, str]]
    ) -> None:
        """Learn the lifetime of an instance this process holds bytes of without having asked
        the origin (the shared tier gave them): before they are served, as the origin may have
        expired it since the replica that filled them last touched it. Once its lifetime is
        known, an expiring instance counts from this process's own touches (none yet: its next
        read asks the origin, which renews it); a 404 forgets it. An origin that cannot say
        (unreachable, or no answer within ``--upstream-connect-timeout``: a HEAD is answered at
        once) leaves what is held served, as without a shared tier."""
        if instance.lifetime_known:
            return
        # Shielded: a reader that leaves, or stops waiting, does not cancel the question.
        asked = asyncio.shield(self.probe_lifetime(key, instance, credentials))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asked, self._settings.upstream_connect_timeout_seconds)

    async def _head_lifetime(
        self, key: LogKey, instance: StreamInstance, credentials: tuple[tuple[str, str], ...]
    ) -> None:
        started = self.ticket()
        try:
            upstream = await self._origin.open(
                "HEAD", instance.stream, own_request_headers(credentials), live=False
            )
            upstream.close()
        except OriginError:
            return
        finally:
            self._probing.pop(instance, None)
        self._metrics.origin_requests.labels(kind="head", code=str(upstream.status)).inc()
        headers = list(upstream.headers.items())
        self.evidence(key, upstream.status, headers, started=started, instance=instance)
        if upstream.status == 200 and self.local.current(instance):
            self._headed(instance, headers)

    # --- what pass-through traffic tells ---

    def observe(
        self,
        method: str,
        stream: str,
        status: int,
        request_headers: Sequence[tuple[str, str]],
        response_headers: Sequence[tuple[str, str]],
        *,
        started: int,
    ) -> bool:
        """Called for every answer the origin gave to a request the cache did not serve (whose
        ticket was ``started``); True when it deleted, created or found gone the stream for
        everyone (the caller waits for the purge to be durable, as for a DELETE)."""
        method = method.upper()
        key = LogKey(stream=stream, scope=self.scope_of(request_headers))
        if method in ("PUT", "POST"):
            created = method == "PUT" and status == 201
            if created:
                # Created: whatever the edge knew of this path is another's.
                self.purge(stream, reason="created")
            gone = self._written(key, method, status, request_headers, response_headers, started)
            # Like a DELETE, answered once other replicas will not serve the old instance.
            return created or (gone and speaks_for_the_stream(key.scope))
        if self.evidence(key, status, response_headers, started=started) is Decision.GONE:
            return speaks_for_the_stream(key.scope)
        if method == "DELETE" and status < 400:
            self.purge(stream, reason="deleted")
            return True
        if method == "HEAD" and status == 200:
            self._headed(self.local.instance_for(stream), response_headers)
        return False

    def _headed(self, instance: StreamInstance, headers: Sequence[tuple[str, str]]) -> None:
        """A HEAD answer states the stream's whole lifetime, and its content type: of another
        type, it is another stream's lifetime (forget the instance held), not this one's."""
        if names_another_instance(instance, first_value(headers, "content-type")):
            logger.info(
                "%s answered a HEAD as another content type: a new instance", instance.stream
            )
            self.purge(instance.stream, reason="new_instance")
            return
        self.learn_lifetime(instance, headers, complete=True)

    def _written(
        self,
        key: LogKey,
        method: str,
        status: int,
        request_headers: Sequence[tuple[str, str]],
        response_headers: Sequence[tuple[str, str]],
        started: int,
    ) -> bool:
        """A write reached the origin. Any write may have moved the tail (even a failed one may
        have raced one that did); a successful one says how far (its ``Stream-Next-Offset``).
        A successful write that started after the edge knew the stream had reached further
        than it says went to another instance (deleted and recreated behind the edge); one
        answered 404 or 410 found the stream gone (forgotten in ``key.scope``: True)."""
        stream = key.stream
        ok = status < 300
        floor = first_value(response_headers, STREAM_NEXT_OFFSET) if ok else None
        if not is_offset_token(floor):
            floor = None
        closes = ok and flag(request_headers, STREAM_CLOSED)
        instance = self.local.instance_for(stream)
        write = written_as(method, status, request_headers, response_headers, floor, started)
        judgement = judge_write(instance, write)
        if judgement.gone:
            self.stream_gone(key)
            instance = self.local.instance_for(stream)
        elif judgement.another is not None:
            logger.info("%s %s: a new instance", stream, judgement.another)
            self.purge(stream, reason="new_instance")
            instance = self.local.instance_for(stream)
        names_instance = judgement.names_instance
        ticket = self.ticket()
        if floor is not None:
            instance.reached(floor, ticket)
            if closes and instance.closed_at is None:
                instance.closed_at = Mark(offset=floor, received=ticket)
        for log in self.local.logs_of(stream):
            log.mark_stale()
            if closes and floor is not None and names_instance:
                # Closed through this edge: every later read says so (read-after-write). A
                # close that names no instance is left to the next read to ask the origin
                # (its closure mark keeps an older answer that says open from being believed).
                log.observe_tail(
                    floor, closed=True, now=self._clock(), started=ticket, received=ticket
                )
        if method == "PUT" and status in (200, 201):
            # A creating PUT states the whole lifetime: no TTL header means none. Not a fork's:
            # without one of its own, it inherits its source's (PROTOCOL.md 4.2), which a HEAD
            # tells (``probe_lifetime``).
            forked = first_value(request_headers, STREAM_FORKED_FROM) is not None
            self.learn_lifetime(instance, request_headers, complete=status == 201 and not forked)
        return judgement.gone

    def scope_of(self, request_headers: Sequence[tuple[str, str]]) -> str:
        return auth_scope(
            request_headers,
            scope_headers=self._settings.scope_headers,
            scope_cookies=self._settings.scope_cookies,
        )

    def stream_gone(self, key: LogKey) -> None:
        """The origin said 404 or 410 to a request in ``key.scope``. Without credentials that is
        the stream's fate for everyone; with them it may only mean "not for you" (an origin may hide
        what a token cannot read), so only that scope forgets, and nobody can empty the cache
        for others by sending a bad token. A read the edge authorized carried the edge's own
        credential, so its 404 is the stream's fate too."""
        instance = self.local.instance(key.stream)
        # An instance known to have ended: the origin forgot it first (its lifetime).
        ended = instance is not None and instance.expired(self._clock())
        reason: Reason = "expired" if ended else "gone"
        if speaks_for_the_stream(key.scope):
            # A 404 for a path this replica never held (a scanner, a typo) costs the shared tier
            # one existence check, not a new generation and a message to every replica.
            self.purge(
                key.stream, reason=reason, only_if_known=not self.local.holds_data(key.stream)
            )
        else:
            self.local.purge_scope(key)
            self._decided(
                Forgetting(key=key, reason=reason, tells_downstream=tells_downstream(True))
            )

    def _decided(self, forgetting: Forgetting) -> None:
        """The one place a forgetting this process decided is told (see the module rules)."""
        stream = forgetting.stream
        for teller in self.on_forget:
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

    def forget_locally(self, stream: str, *, followers_stay: bool = False) -> int:
        """Forget ``stream`` (its instance and everything kept for it) on this replica.
        ``followers_stay``: its live tails and readers go on following the stream by offset, in
        the instance begun in its place (``unconfirmed``: what is held is in doubt, not known to
        be another stream)."""
        held = self.local.instance(stream)
        templates = [(log.key, log.header_template) for log in self.local.logs_of(stream)]
        dropped = self.local.purge(stream)
        if not followers_stay:
            for listener in self.forgotten:
                listener(stream)
            return dropped
        if held is not None:
            # How it is read (its type, the origin's headers), until an answer of the origin
            # says otherwise; the bytes and tail facts held are gone.
            self.local.instance_for(stream).content_type = held.content_type
            for key, template in templates:
                self.local.log_for(key).header_template = template
        for listener in self.unconfirmed:
            listener(stream)
        return dropped

    def purged_elsewhere(self, stream: str, generation: str) -> None:
        """A replica (maybe this one) purged ``stream``, starting ``generation``."""
        if self._shared is not None and self._shared.issued_here(generation):
            return  # this replica's own purge (maybe an older one, arriving late)
        instance = self.local.instance(stream)
        if instance is None or instance.generation == generation:
            return  # nothing held here, or a purge already adopted
        self.forget_locally(stream)
        adopted = self.local.instance_for(stream)
        adopted.generation = generation
        adopted.verified_at = self._clock()

    def resync(self) -> None:
        """Purges may have been missed (the shared tier's channel was down): check every
        stream's generation again before serving it."""
        for stream in self.local.streams():
            instance = self.local.instance(stream)
            if instance is not None:
                instance.verified_at = float("-inf")

    def purge(
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
        process holds nothing of it). ``followers_stay``: as ``forget_locally``'s."""
        dropped = self.forget_locally(stream, followers_stay=followers_stay)
        generation = ""
        if self._shared is not None:
            generation = self._shared.purge(stream, only_if_known=only_if_known)
            if not only_if_known:
                instance = self.local.instance_for(stream)
                instance.generation = generation
                instance.verified_at = self._clock()
        forgetting = Forgetting(
            key=LogKey(stream=stream, scope=PUBLIC_SCOPE), reason=reason,
            held_here=not only_if_known, generation=generation,
            tells_downstream=tells_downstream(not only_if_known), followers_stay=followers_stay,
        )  # fmt: skip
        self._decided(forgetting)
        return dropped

    def origin_lost(self) -> int:
        """A live upstream saw the origin go away (refused, broken: ``edge.log.trust``): it may
        have lost every stream, and any may be recreated there past the tail held. What this
        process holds of every stream is forgotten, everywhere (its live followers stay: they
        go on by offset, as a client of the origin would); returns how many streams. Told again
        (the origin still refusing), it forgets only what was learned since."""
        streams = [stream for stream in self.local.streams() if self.local.holds_learned(stream)]
        for stream in streams:
            self.purge(stream, reason="gone", followers_stay=True)
        return len(streams)

    async def in_effect(self, stream: str) -> bool:
        """Wait until this process's forgetting of ``stream`` is in effect as far as the edge
        can make it: forgotten here (at once), told to siblings (``settled``) and durable in the
        shared tier (waited for up to ``PURGE_WAIT_SECONDS``). True when durable (always,
        without a shared tier)."""
        await self.settled(stream)
        return await self.purged(stream)

    async def durable(self, stream: str, give_up_seconds: float) -> bool:
        """Wait, however long the shared tier is away (up to ``give_up_seconds``), until the
        purge of ``stream`` is durable; False if it was not by then."""
        deadline = time.monotonic() + give_up_seconds
        while not await self.purged(stream):
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

    async def purged(self, stream: str, timeout_seconds: float = PURGE_WAIT_SECONDS) -> bool:
        """Is the purge of ``stream`` durable (every replica will stop serving it)?"""
        if self._shared is None:
            return True
        return await self._shared.purged(stream, timeout_seconds)

    async def close(self) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
