"""Long-polls served by the stream listener's own connection protocol, without aiohttp.

Rules this module owns:

* A plain long-poll of a stream's normalised path, with the CORS answer for its ``Origin``
  known, is the connection's. With ``--auth jwt|forward`` only once the gate allowed it
  (``edge.web.own_gate``), and then as the full path serves that admission
  (``LiveTargets.admitted``: its target without ``token`` parameters, the policy's scope, the
  edge's own credential upstream, an answer ``private`` to its reader), its wait ending when its
  credential expires (``LiveHub.long_poll``'s ``max_seconds``). It is served at once (``serve``)
  when everything the full path would consult is known without waiting: a stream log whose
  generation the shared tier confirmed within ``GENERATION_CHECK_SECONDS`` (with Redis) and
  whose plan from the offset (one the origin issued) is the cache's (``CatchupCache.plan``: a
  ``Hit``), and, to wait, a running upstream tail. Otherwise it ``Waits``: a task of the
  connection's runs the full path's own steps (``LiveHub.start``, ``LiveHub.long_poll``) and
  writes their answer; only what they do not answer (a ``Bypass``, an origin failure, an
  answer carrying the origin's ``Date``) is handed on (``HandOn``), nothing having been
  written, to the connection's own relay (``edge.web.own_relay``). Anything else is not this
  module's (``HANDED_OFF``): a relay (the connection's own), or a read with ``--auth`` the
  connection has no admission for.
* What it gets is the hub's own decision (``LiveHub.settle``, the same code the full path and a
  group's release run): the bytes behind the tail, a closed stream's 204, at once; or a wait on
  the board with every other long-poll there (``LongPollFanout.park``), released by the same
  fan-out, with the same bytes for the same framing (``edge.web.wire.encode``).
* A parked long-poll holds its tail (``TailRegistry.watch_running``) until it leaves the board,
  answered or not; exactly once (``Parked.leave``).
* A parked long-poll woken without an answer (its stream gone, a gap to fetch) has had nothing
  written: it looks again, as ``Waits``; one whose answer cannot be encoded is handed on.
* What a target gets is decided once a second: after each release every viewer re-polls with
  the same head (``Decided`` says what else a decision was derived from). A target is its
  scope and upstream credential too, so a decision is only reused for reads served alike; with
  ``--auth`` every read is authorized before it is looked up, and the targets of admitted
  heads are remembered under their admission. An answer's cursor is
  then one drawn jump for all of them, as valid as one each (``edge.protocol.cursor``).
* A long-poll past ``--max-viewers`` is answered 503 with ``Retry-After`` and the origin's CORS
  headers for its ``Origin``, and its connection closes, as the full path answers it.
* Counting is plain integers, folded into the Prometheus counters at scrape time.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple, assert_never

from multidict import CIMultiDict

from edge.answer import Answer, Bypass
from edge.auth.gate import RequestAdmission
from edge.catchup import CatchupCache
from edge.config import Settings
from edge.instances.generations import GENERATION_CHECK_SECONDS
from edge.live.answers import Pending
from edge.live.board import Waiter
from edge.live.hub import LiveHub
from edge.live.polls import AlreadyWritten, Encode, Framing, Outcome, Sink, Socket, Ticket
from edge.live.tail import Tail
from edge.log.policy import Hit
from edge.log.stream_log import LogKey, StreamLog, TailFact
from edge.metrics import Metrics
from edge.origin import OriginError
from edge.protocol.answer_key import scope_of
from edge.protocol.cursor import cursor_class
from edge.protocol.http1 import CLOSE_TRAILER, RequestHead, date_line, serialise
from edge.protocol.paths import MEMO_ENTRIES, BadTarget, names_control, normalise_path
from edge.protocol.reads import (
    PUBLIC_SCOPE,
    RequestKind,
    is_client_offset,
    is_offset_token,
    live_query,
    scope_credentials,
)
from edge.store.local import LocalTier
from edge.web.front import Served
from edge.web.proxy import OriginCors

logger = logging.getLogger(__name__)

LONG_POLL = "long-poll"
REFUSED_TEXT = b"edge is at --max-viewers\n"


class HandedOff:
    """The full path serves this head."""


HANDED_OFF = HandedOff()


@dataclass(frozen=True, slots=True)
class HandOn:
    """Nothing was written: the connection's own relay (``edge.web.own_relay``) answers
    ``head`` with what the connection found (``found``: the cache's ``Bypass``, the origin's
    failure, or an answer carrying the origin's own ``Date``), so that nothing is asked twice,
    with ``--auth`` with the admission the connection's gate gave the read; None: the relay
    plans it afresh (what its route leaves to the own paths is aiohttp's, which asks again)."""

    head: bytes
    found: Bypass | OriginError | Answer | Served | None = None


class Ending(Enum):
    """How an answer of its own ended, for its connection."""

    READ_ON = "read on"  # written whole: the connection reads its next request
    CLOSE = "close"  # written whole, to a request that asked to close: flushed, then closed
    CUT = "cut"  # cut short: aborted, the client resumes by offset


def written(keep_alive: bool) -> Ending:
    return Ending.READ_ON if keep_alive else Ending.CLOSE


Done = Callable[[Ending | HandOn], None]


@dataclass(frozen=True, slots=True)
class AnsweredNow:
    """The whole answer, to write now."""

    data: bytes
    keep_alive: bool
    status: int
    body_bytes: int


@dataclass(eq=False, slots=True)
class Parked:
    """A long-poll on the board; ``leave`` takes it off (its client left) and gives its tail
    back, at most once whatever calls it."""

    target: LiveTarget
    tail: Tail
    since: float  # the loop's time when it was parked
    expires_at: float | None = None  # wall clock: the gate's credential ends its wait by then
    waiter: Waiter[Ticket] | None = None
    left: bool = field(default=False, init=False)

    @property
    def key(self) -> LogKey:
        return self.target.key


class LiveTarget(NamedTuple):
    """What a live read's head asks, derived by the full path's own functions."""

    key: LogKey
    offset: str  # as sent: a position, ``-1`` or ``now``
    cursor: str | None  # the client's, as sent
    framing: Framing
    credentials: tuple[tuple[str, str], ...]  # what the cache sends upstream for its scope


class LogsNow:
    """What the edge's logs answer without a wait, by the full path's own rules: a log held,
    its generation confirmed by the shared tier within ``GENERATION_CHECK_SECONDS`` (with
    Redis; else the full path asks first), and the catch-up plan from an offset a ``Hit``
    (else a fill comes first). The one test both the long-polls and the SSE reads the
    connections serve make."""

    def __init__(
        self,
        settings: Settings,
        local: LocalTier,
        catchup: CatchupCache,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._local = local
        self._catchup = catchup
        self._clock = clock
        self._verify = settings.redis_url is not None

    def log(self, key: LogKey, now: float) -> StreamLog | None:
        log = self._local.log(key)
        if log is None:
            return None
        if self._verify and now - log.instance.verified_at >= GENERATION_CHECK_SECONDS:
            return None
        return log

    def hit(self, key: LogKey, offset: str) -> Hit | None:
        plan = self._catchup.plan(key, offset)
        return plan if isinstance(plan, Hit) else None


class LiveTargets:
    """``LiveTarget``s of heads, remembered: a pure function of the head and the settings
    (``of``), or with ``--auth`` of the head and the gate's admission of it (``admitted``),
    asked on every live read (after each release every viewer of a stream sends the same
    head)."""

    def __init__(self, settings: Settings) -> None:
        self._scope_headers = settings.scope_headers
        self._scope_cookies = settings.scope_cookies
        self.of = functools.lru_cache(maxsize=MEMO_ENTRIES)(self._derive)
        # Keyed by the admission too: a target is only ever what its own admission says (its
        # scope, its upstream credential), never one another decision derived.
        self.admitted = functools.lru_cache(maxsize=MEMO_ENTRIES)(self._derive_admitted)

    def _derive(self, head: RequestHead, mode: str) -> LiveTarget | None:
        """None: not a plain ``mode`` read of a stream at an offset a client may give. The
        stream is the path the origin routes to (``normalise_path``), as the full path's
        classification names it: ``/v1/stream/./x`` reads ``/v1/stream/x``."""
        if head.head or mode not in head.query:
            return None
        try:
            path = normalise_path(head.path)
        except BadTarget:
            return None  # the full path's 400
        credentials = head.credentials
        scope = (
            scope_of(
                credentials, scope_headers=self._scope_headers, scope_cookies=self._scope_cookies
            )
            if credentials
            else PUBLIC_SCOPE
        )
        upstream = tuple(
            scope_credentials(
                credentials, scope_headers=self._scope_headers, scope_cookies=self._scope_cookies
            )
        )
        framing = Framing(
            version=(1, 1), keep_alive=head.keep_alive, origin=head.origin,
            close_delimited=head.http10,
        )  # fmt: skip
        return _live_target(path, head.query, mode, scope, upstream, framing)

    def _derive_admitted(
        self, head: RequestHead, mode: str, admission: RequestAdmission
    ) -> LiveTarget | None:
        """``_derive`` for a read the gate allowed, as the full path classifies it: its target
        without token parameters, the policy's scope, the edge's own credential upstream, and
        an answer for its reader alone (``reader_only``)."""
        scope = admission.scope
        if head.head or mode not in head.query or scope is None:
            return None
        target = admission.target
        framing = Framing(
            version=(1, 1), keep_alive=head.keep_alive, reader_only=True, origin=head.origin,
            close_delimited=head.http10,
        )  # fmt: skip
        return _live_target(target.stream, target.query, mode, scope, admission.upstream, framing)


def _live_target(
    path: str,
    query_text: str,
    mode: str,
    scope: str,
    upstream: tuple[tuple[str, str], ...],
    framing: Framing,
) -> LiveTarget | None:
    query = live_query(query_text)
    if query is None or query.live != mode or not query.plain:
        return None
    offset = query.offset
    if offset is None or not is_client_offset(offset) or names_control(path):
        return None
    return LiveTarget(LogKey(stream=path, scope=scope), offset, query.cursor, framing, upstream)


@dataclass(frozen=True, kw_only=True, slots=True)
class Decided:
    """What a long-poll target got: an answer's bytes (``data``), or a wait at the tail
    (``upstream``) when ``data`` is None; with everything it was derived from. It is decided
    again unless asked in the same second (an answer's ``Date``, ``Age`` and cursor interval
    are the second's), of the same log with the same tail (the same bytes from the offset, the
    same up-to-date and closed), with the same CORS headers and lifetime knowledge, and while
    the origin has not since forbidden keeping the stream (``bypassed``, which the plan asks)."""

    log: StreamLog
    tail: TailFact | None
    cors: object
    second: int
    lifetime_known: bool
    upstream: Tail
    data: bytes | None
    status: int
    body_bytes: int


@dataclass(frozen=True, slots=True)
class Waits:
    """The connection's to serve, after the waits the full path would make first
    (``FastPolls.serve_later``)."""

    target: LiveTarget
    expires_at: float | None = None  # wall clock: the gate's credential ends its wait by then


def seconds_left(expires_at: float | None, now: float) -> float | None:
    """How long a live read may still run on the credential the gate admitted it with
    (``edge.web.live_reads.credential_left``'s rule)."""
    return None if expires_at is None else max(0.0, expires_at - now)


Step = AnsweredNow | Parked | Waits | HandedOff
Released = Callable[[Outcome], None]


class FastPolls:
    def __init__(
        self,
        settings: Settings,
        hub: LiveHub,
        logs: LogsNow,
        cors: OriginCors,
        encode: Encode,
        targets: LiveTargets,
        *,
        gated: bool,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # With --auth every read is the gate's first (``edge.web.own_gate``), then served
        # with its admission.
        self.enabled = settings.fast_path
        self._gated = gated
        self._settings = settings
        self._hub = hub
        self._logs = logs
        self._cors = cors
        self._encode = encode
        self._clock = clock
        self._targets = targets
        # Pre-bound children (one lock each per use): parked and waiting long-polls count in
        # edge_open_connections and edge_request_duration_seconds as the full path's do.
        self._open = hub.metrics.open_requests(RequestKind.LONG_POLL)
        self._duration = hub.metrics.duration(RequestKind.LONG_POLL)
        # What each target got, for the second it was decided in.
        self._decided: dict[LiveTarget, Decided] = {}
        # Plain counters, folded into the Prometheus ones at scrape time.
        self.answered: dict[int, int] = {}
        self.gone = 0
        self.served_bytes = 0
        self.refused_sse = 0  # SSE viewers past --max-viewers, answered by the connection
        self._folded_refused_sse = 0
        self._folded: dict[int, int] = {}
        self._folded_gone = 0
        self._folded_served = 0

    def serve(
        self,
        head: RequestHead,
        sink: Sink,
        released: Released,
        admission: RequestAdmission | None = None,
    ) -> Step:
        """Serve the long-poll ``head`` (see the module rules); ``released`` hears how a parked
        one ends, with what ``LongPollFanout.wait`` would return. With ``--auth``,
        ``admission`` is the gate's yes to it (None: the full path's)."""
        if admission is None:
            target = None if self._gated else self._targets.of(head, LONG_POLL)
        else:
            target = self._targets.admitted(head, LONG_POLL, admission)
        if target is None:
            return HANDED_OFF
        expires_at = admission.expires_at if admission is not None else None
        key, offset, client_cursor, framing, _ = target
        if self._cors.unknown_for(framing.origin):
            return HANDED_OFF  # relayed: the origin's answer teaches the edge its CORS headers
        waits = Waits(target, expires_at)
        if not is_offset_token(offset):
            return waits  # -1 and now: a fill, a probe
        now = self._clock()
        log = self._logs.log(key, now)
        if log is None:
            return waits  # nothing held yet, or the shared tier is asked first
        instance = log.instance
        cors = self._cors.for_request(framing.origin)
        second = int(now)
        decided = self._decided.get(target)
        if (
            decided is None
            or decided.second != second
            or decided.log is not log
            or decided.tail is not log.tail
            or decided.cors is not cors
            or decided.lifetime_known != instance.lifetime_known
            or instance.bypassed(now)  # the origin forbade keeping it since: the plan's to say
            or self._hub.draining.is_set()  # a drain answers every wait at once
        ):
            decided = self._decide(target, log, cors, second)
            if decided is None:
                return waits
        if decided.data is not None:
            return AnsweredNow(
                data=decided.data, keep_alive=head.keep_alive, status=decided.status,
                body_bytes=decided.body_bytes,
            )  # fmt: skip
        hub = self._hub
        tail = hub.tails.running(key)
        if tail is None or tail is not decided.upstream:
            return waits  # ended or failing: another is started
        hub.tails.watch(key)
        loop = asyncio.get_running_loop()
        parked = Parked(target=target, tail=tail, since=loop.time(), expires_at=expires_at)
        self._open.inc()

        def on_release(outcome: Outcome) -> None:
            self._give_back(parked)
            if isinstance(outcome, AlreadyWritten):
                self._count(outcome.status, 0)
            released(outcome)

        wait = self._settings.long_poll_timeout_seconds
        left = seconds_left(expires_at, now)
        if left is not None:
            wait = min(wait, left)  # as ``LiveHub.long_poll``'s ``max_seconds``
        deadline = loop.time() + wait
        parked.waiter = hub.polls.park(
            key, tail, offset, cursor_class(client_cursor), deadline,
            Socket(sink=sink, framing=framing), on_release,
        )  # fmt: skip
        return parked

    def serve_later(
        self,
        target: LiveTarget,
        raw: bytes,
        sink: Sink,
        done: Done,
        expires_at: float | None = None,
    ) -> asyncio.Task[None]:
        """Serve a long-poll that must wait first (a fill, a probe, a tail to start), as the
        full path does (``LiveHub.start``, ``LiveHub.long_poll``), in a task of its own.
        ``done`` hears how it ended: True, answered (the connection goes on); False, cut;
        ``raw`` (its head): nothing was written, and the full path is to answer it (a bypass
        relays it; an origin failure it answers as it always has)."""
        return asyncio.get_running_loop().create_task(
            self._later(target, raw, sink, done, expires_at)
        )

    async def _later(
        self, target: LiveTarget, raw: bytes, sink: Sink, done: Done, expires_at: float | None
    ) -> None:
        key, offset, client_cursor, framing, credentials = target
        hub = self._hub
        ended: Ending | HandOn = Ending.CUT
        self._open.inc()
        began = asyncio.get_running_loop().time()
        try:
            try:
                start = await hub.start(key, offset, None, credentials)
                if isinstance(start, str):
                    outcome = await hub.long_poll(
                        key, start, client_cursor, credentials,
                        max_seconds=seconds_left(expires_at, self._clock()),
                        socket=Socket(sink=sink, framing=framing),
                    )  # fmt: skip
                else:
                    outcome = start
            except OriginError as error:
                ended = HandOn(raw, error)
                return
            match outcome:
                case Bypass():
                    ended = HandOn(raw, outcome)
                case AlreadyWritten():
                    self._count(outcome.status, 0)
                    ended = written(outcome.keep_alive)
                case Answer():
                    try:
                        data = self._encode(outcome, framing)
                    except ValueError:
                        ended = HandOn(raw, outcome)  # headers only aiohttp rewrites
                        return
                    self._count(outcome.status, len(outcome.body))
                    sink.send(data)
                    ended = written(framing.keep_alive)
                case _:
                    assert_never(outcome)
        except Exception:
            logger.exception("a long-poll failed; its connection is cut")
        finally:
            self._open.dec()
            if not isinstance(ended, HandOn):  # handed on: the full path measures it
                self._duration.observe(asyncio.get_running_loop().time() - began)
            done(ended)

    def _decide(
        self, target: LiveTarget, log: StreamLog, cors: object, second: int
    ) -> Decided | None:
        """What ``target`` gets now, by the catch-up plan and the hub's own ``settle``: an
        answer's bytes, or a wait at the tail; None: the full path's."""
        key, offset, client_cursor, framing, _ = target
        plan = self._logs.hit(key, offset)
        if plan is None:
            return None  # a fill first
        hub = self._hub
        tail = hub.tails.get(key)
        if tail is None:
            return None  # the full path starts one
        outcome = hub.settle(
            key, tail, offset, cursor=hub.cursor_for(client_cursor), waited=False,
            expired=False, coverage=plan.coverage,
        )  # fmt: skip
        instance = log.instance
        data: bytes | None = None
        status = body_bytes = 0
        match outcome:
            case Answer():
                try:
                    data = self._encode(outcome, framing)
                except ValueError:
                    return None  # aiohttp turns it into the error it always did
                status, body_bytes = outcome.status, len(outcome.body)
            case Pending.WAIT:
                pass
            case Pending.GAP | Pending.GONE:
                return None
            case _:
                assert_never(outcome)
        decided = Decided(
            log=log, tail=log.tail, cors=cors, second=second,
            lifetime_known=instance.lifetime_known, upstream=tail, data=data, status=status,
            body_bytes=body_bytes,
        )  # fmt: skip
        if instance.expires_at is None and instance.ttl_seconds is None:
            # (A lifetime that counts down changes an answer's headers within the second.)
            decisions = self._decided
            if len(decisions) >= MEMO_ENTRIES and target not in decisions:
                decisions.clear()  # the audience moved on: what it asks now is met at once
            decisions[target] = decided
        return decided

    def written(self, answered: AnsweredNow) -> None:
        """An answer given at once was written (counted only then: a refusal came first)."""
        self._count(answered.status, answered.body_bytes)

    def leave(self, parked: Parked) -> None:
        """Its client left before its answer: off the board, its tail given back."""
        if not parked.left:
            self.gone += 1
            self.withdraw(parked)

    def withdraw(self, parked: Parked) -> None:
        """Off the board unanswered (its client left, or it was refused at --max-viewers after
        the park), its tail given back: at most once."""
        if parked.waiter is not None:
            self._hub.polls.unpark(parked.waiter)
        self._give_back(parked)

    def _give_back(self, parked: Parked) -> None:
        if not parked.left:
            parked.left = True
            self._hub.tails.unwatch(parked.key, parked.tail)
            self._open.dec()
            self._duration.observe(asyncio.get_running_loop().time() - parked.since)

    def refusal(self, origin: str | None, kind: RequestKind = RequestKind.LONG_POLL) -> bytes:
        """The 503 of a live read past ``--max-viewers``; the connection closes after it."""
        headers = CIMultiDict([("Retry-After", "5")])
        self._cors.add_missing(headers, origin)
        headers["Content-Type"] = "text/plain; charset=utf-8"
        if kind is RequestKind.LONG_POLL:
            self._count(503, 0)
        else:
            self.refused_sse += 1
        head = serialise(503, list(headers.items()), len(REFUSED_TEXT))
        return head + date_line(int(self._clock())) + CLOSE_TRAILER + REFUSED_TEXT

    def _count(self, status: int, body_bytes: int) -> None:
        self.answered[status] = self.answered.get(status, 0) + 1
        self.served_bytes += body_bytes

    def fold_into(self, metrics: Metrics) -> None:
        """Add what was counted since the last scrape to the Prometheus counters."""
        for status, count in list(self.answered.items()):
            last = self._folded.get(status, 0)
            if count > last:
                metrics.request_count(RequestKind.LONG_POLL, status).inc(count - last)
                self._folded[status] = count
        if self.gone > self._folded_gone:
            metrics.client_gone(RequestKind.LONG_POLL).inc(self.gone - self._folded_gone)
            self._folded_gone = self.gone
        if self.refused_sse > self._folded_refused_sse:
            refused = self.refused_sse - self._folded_refused_sse
            metrics.request_count(RequestKind.SSE, 503).inc(refused)
            self._folded_refused_sse = self.refused_sse
        if self.served_bytes > self._folded_served:
            metrics.served_bytes.inc(self.served_bytes - self._folded_served)
            self._folded_served = self.served_bytes
