"""Resume routes (``--resume-route PATH=URL``): the relay to an agent backend, and the answers
served from the durable streams that keep its SSE answers (``edge.web.resume_pump`` keeps them).

Rules this module owns:

* What a request asks for is ``edge.resume.requests``'s decision; what is kept and how it is
  given back is ``edge.resume.events``'s; ids and stream names ``edge.resume.ids``'s. This
  module only carries them out.
* A request whose answer may be kept is begun in a task of its own (``_begin``: the upstream
  request, then the pump's ``keep``), so a client that leaves at any point cancels none of it;
  the answer it began, if it is not kept, is closed. An upstream that sends no headers within
  ``--resume-max-seconds`` (the longest an answer is kept) is let go: a ``504`` to a client
  still waiting; one that left holds nothing to resume.
* Every client, the answer's own included, is answered by reading the answer's stream: an event
  is in the log before any client sees its id. The stream is read through this edge's own
  listener, as an SSE viewer with the client's credential headers, so the edge's one tail per
  stream, its cache and its shared tier serve every reader; a read that ends before the stream
  does (the edge rotates its SSE viewers) is followed by the next, from where it stopped.
* A reader that sees nothing new in an open answer's stream for ``--resume-lease`` (no event, no
  lease: the edge's own SSE heartbeats do not count) takes its pump for lost and ends the answer
  (``Pumps.end_lapsed``): the owed errors and the close written for every reader, or, if the
  origin will not take them, given to its own client, which is then ended; if the log cannot be
  read at all (the origin away), its client is cut short, told nothing, to resume with its last
  id. No reader waits without end.
* An SSE answer whose stream the origin would not create (or past ``--resume-max-pumps``) is
  relayed as it came, without ids (it works; it is not resumable). One that outgrows a cap
  midway is read from its stream up to ``UNKEPT``, then its own client gets the rest from the
  pump (``Handoff``) as events without ids; a resume elsewhere ends with the owed error.
* Without ``--auth``, an answer is bound to the request's credential scope, and its stream is
  written and read with the client's credential headers. With ``--auth jwt|forward`` the gate
  judged the request first (as one on the route's path): an answer is bound to the principal
  it names (``principal_scope``; the credential when it names none), its stream is written
  and read with the edge's ``--origin-header`` (the streams are the edge's), and read from the
  origin itself, not through this edge's listener (whose gate would judge the edge's own read
  by the client's token, which covers the route, not the stream). A ``token`` query parameter
  never goes upstream; it goes as ``Authorization: Bearer`` when no header carries one. A
  reader whose token stops being accepted (``exp`` + leeway) is cut short then, as the edge's
  live reads are: its client resumes with its last id and a fresh token.
* A resume whose stream does not exist (unknown, expired, another credential's), or whose
  offset the origin refuses (forged: the edge mints only offsets the origin gave), is a 404, the
  same for each; ``Last-Event-ID`` never goes upstream. A resume that finds nothing after its
  point in a closed answer is a ``204``: a browser's ``EventSource`` stops there, where an empty
  ``200`` would have it reconnect for ever.
* Every answer the edge makes on a route (kept answers, resumes, 204, 404, 413, 502, a CORS
  preflight) carries the CORS headers the origin gives the request's ``Origin``, widened for
  the route (``edge.resume.cors`` decides them). A kept answer passes on none of the upstream's
  own CORS headers, so its own client and every resume see the same policy.
* When the edge drains (SIGTERM), every client that holds one of the edge's ids is cut short at
  once, so it resumes on a replica that stays (its pump goes on through the drain).
* The upstream's and this edge's own listener's connections have no pool cap of their own
  (aiohttp's default, 100, would hold the next call waiting while 100 answers run): the
  connection table and ``--resume-max-pumps`` bound them.
* Everything else is a plain relay that streams both ways; a client that leaves cancels it, and
  a body cut short upstream is cut short to the client (it never looks complete).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import assert_never
from urllib.parse import quote

import aiohttp
from aiohttp import hdrs, web
from multidict import CIMultiDict

from edge.auth.credentials import present
from edge.auth.gate import RequestAdmission
from edge.auth.policy import unauthorized
from edge.config import ResumeRoute, Settings
from edge.metrics import Metrics
from edge.origin import OriginClient, OriginError
from edge.protocol.headers import cors_headers, strip_hop_by_hop, upstream_request_headers
from edge.protocol.reads import auth_scope, scope_credentials
from edge.protocol.sse import SseDecoder, encode_comment, encode_event, encode_retry
from edge.resume.cors import STREAM_HEADER, route_cors
from edge.resume.events import Replay
from edge.resume.ids import ResumePoint, credential_scope, principal_scope, stream_name
from edge.resume.requests import (
    Keep,
    NotFound,
    Preflight,
    Relay,
    Resume,
    asked_of,
    upstream_headers,
)
from edge.web.fast_polls import seconds_left
from edge.web.proxy import ClientGone, OriginCors, request_origin
from edge.web.resume_pump import Ended, Handoff, Kept, Pumps, Unreadable, Unwritable

logger = logging.getLogger(__name__)

# A request body is read whole before it goes upstream (a JSON-RPC message is small).
MAX_BODY_BYTES = 4 * 1024 * 1024
# Reads of an answer's stream in a row that failed (or brought nothing) before its client is cut
# short (it resumes with its last id).
MAX_FAILED_READS = 3
RETRY_MS = 1000
LEASE_GRACE_SECONDS = 1.0
EVENT_STREAM = "text/event-stream"
PREFLIGHT_MAX_AGE = "600"
# A reader whose token stopped being accepted mid-read: the gate's own refusal of it.
EXPIRED = unauthorized("token expired", "expired")


@dataclass(frozen=True, slots=True)
class Plain:
    """The upstream answer, to relay as it is (the caller closes it)."""

    response: aiohttp.ClientResponse


Began = Kept | Plain


class NoAnswer(Exception):
    """The upstream sent no response headers within ``--resume-max-seconds``."""


class ReadEnd(enum.Enum):
    """How one read of an answer's stream ended."""

    ENDED = "ended"  # the stream's close: the answer is whole
    ROTATED = "rotated"  # the edge's SSE viewer ended (it rotates): read on from there
    MISSING = "missing"  # no such stream (unknown, expired, another credential's) or offset
    FAILED = "failed"  # refused, broken off, or ended having brought nothing at all
    LAPSED = "lapsed"  # nothing new for a whole lease in an open stream: its pump is lost
    HANDED_OVER = "handed_over"  # the answer outgrew its caps: its own client gets the rest
    EXPIRED = "expired"  # the client's token is no longer accepted (``--auth``)


@dataclass(frozen=True, kw_only=True, slots=True)
class Bound:
    """Whom a request's answers are bound to, and how the edge reaches their streams."""

    scope: str  # names an answer's stream, with its token (``stream_name``)
    credentials: list[tuple[str, str]]  # what the stream's origin requests carry
    direct: bool  # read from the origin itself (``--auth``), not through this edge's listener
    expires_at: float | None = None  # wall clock: the client's token is refused from then


@dataclass(kw_only=True, slots=True, eq=False)  # one per client: kept in a set
class Reading:
    """One client's answer being read from its stream."""

    request: web.Request
    path: str
    bound: Bound
    replay: Replay
    passed_on: Sequence[tuple[str, str]]
    resuming: bool  # a Last-Event-ID's (edge_resumes_total), not an answer's own first read
    answer: web.StreamResponse | None = None
    gave_ids: bool = False  # the client holds one of the edge's ids: it can resume elsewhere
    news_at: float = field(default_factory=time.monotonic)  # when the log last moved on
    handoff: Handoff | None = None  # the answer's own client's: the rest past a cap


def keepable(response: aiohttp.ClientResponse) -> bool:
    """An event stream the edge can read: a 200, ``text/event-stream``, not encoded (it was
    asked for none; one that came encoded all the same is relayed as it is)."""
    encoding = response.headers.get(hdrs.CONTENT_ENCODING, "identity").strip().lower()
    return (
        response.status == 200 and response.content_type == EVENT_STREAM and encoding == "identity"
    )


class ResumeRoutes:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        pumps: Pumps,
        cors: OriginCors,
        origin: OriginClient,
    ) -> None:
        self._settings = settings
        self._origin = origin
        self._metrics = metrics
        self._pumps = pumps
        self._cors = cors
        self._readings: set[Reading] = set()
        self._draining = False
        self._upstream: aiohttp.ClientSession | None = None
        self._own: aiohttp.ClientSession | None = None

    @property
    def routes(self) -> tuple[ResumeRoute, ...]:
        return self._settings.resume_routes

    def route_for(self, path: str) -> ResumeRoute | None:
        return next((route for route in self.routes if route.holds(path)), None)

    async def start(self) -> None:
        if not self.routes:
            return
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self._settings.upstream_connect_timeout_seconds
        )
        # No pool cap of their own (aiohttp's default is 100 connections): each connection is a
        # route's request or one of its readers, bounded by --resume-max-pumps and the
        # connection table; a cap here would leave the 101st running answer's caller waiting
        # for a connection, for as long as the others run.
        self._upstream = aiohttp.ClientSession(
            auto_decompress=False, timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
        )
        self._own = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0))

    def start_draining(self) -> None:
        """The edge is stopping: every client that can resume (it holds an id) is cut short
        now, to resume on a replica that stays; the pumps go on through the drain."""
        self._draining = True
        for reading in list(self._readings):
            _cut_short_if_resumable(reading)

    async def close(self) -> None:
        await self._pumps.close()
        for session in (self._upstream, self._own):
            if session is not None:
                await session.close()

    # --- a request on a route ---------------------------------------------------------------

    async def handle(
        self, request: web.Request, route: ResumeRoute, admitted: RequestAdmission | None = None
    ) -> web.StreamResponse:
        """``admitted``: the ``--auth`` gate's yes to the request (None without ``--auth``)."""
        headers = list(request.headers.items())
        asked = asked_of(request.method, headers)
        match asked:
            case Resume(point=point):
                return await self._resume(request, point, self._bound(request, admitted))
            case NotFound():
                self._metrics.resumes.labels("not_found").inc()
                return self._not_found(request)
            case Preflight():
                return self._preflight(request)
            case Relay():
                return await self._relay(request, route, admitted, keep=False)
            case Keep():
                return await self._relay(request, route, admitted, keep=True)
            case _:
                assert_never(asked)

    def _bound(self, request: web.Request, admitted: RequestAdmission | None) -> Bound:
        settings = self._settings
        if settings.auth_mode == "none":
            return Bound(
                scope=self._scope(request), credentials=self._credentials(request), direct=False
            )
        if admitted is not None and admitted.principal is not None:
            scope = principal_scope(settings.auth_mode, admitted.principal)
        else:
            scope = credential_scope(_presented_credentials(request, self._credentials(request)))
        return Bound(
            scope=scope,
            credentials=list(settings.origin_headers),
            direct=True,
            expires_at=admitted.expires_at if admitted is not None else None,
        )

    def _scope(self, request: web.Request) -> str:
        settings = self._settings
        return auth_scope(
            request.headers.items(),
            scope_headers=settings.scope_headers,
            scope_cookies=settings.scope_cookies,
        )

    def _credentials(self, request: web.Request) -> list[tuple[str, str]]:
        settings = self._settings
        return scope_credentials(
            request.headers.items(),
            scope_headers=settings.scope_headers,
            scope_cookies=settings.scope_cookies,
        )

    async def _relay(
        self,
        request: web.Request,
        route: ResumeRoute,
        admitted: RequestAdmission | None,
        *,
        keep: bool,
    ) -> web.StreamResponse:
        upstream = self._upstream
        assert upstream is not None, "ResumeRoutes.start() was not awaited"
        body = await _read_body(request)
        if body is None:
            return self._answer(request, 413, "request body too large for a resume route")
        peer = request.transport.get_extra_info("peername") if request.transport else None
        relayed = upstream_request_headers(
            list(request.headers.items()),
            client_address=peer[0] if peer else None,
            scheme=request.scheme,
            host=request.headers.get(hdrs.HOST),
        )
        query = request.query_string
        if admitted is not None:
            # With --auth, the query the gate passed on (never a token parameter upstream),
            # and the token as the backend reads one.
            query = admitted.target.query
            relayed = _presented_credentials(request, relayed)
        if keep and self._pumps.at_cap():
            self._metrics.resume_unkept.labels("pumps").inc()
            keep = False  # relayed as it is: its client leaving ends it
        sent = upstream_headers(relayed, keep=keep)
        url = route.upstream(request.path, query)
        if not keep:
            try:
                response = await upstream.request(
                    request.method, url, headers=CIMultiDict(sent), data=body or None,
                    allow_redirects=False,
                )  # fmt: skip
            except (aiohttp.ClientError, OSError, TimeoutError) as error:
                logger.warning("resume route %s: upstream failed: %r", route.path, error)
                return self._answer(request, 502, "upstream unreachable")
            try:
                return await _stream_back(request, response)
            finally:
                response.close()
        bound = self._bound(request, admitted)
        begin = self._pumps.detached(
            self._begin(request.method, url, sent, body, bound.scope, bound.credentials)
        )
        try:
            began = await asyncio.shield(begin)
        except asyncio.CancelledError:
            # The client left; a plain answer nobody will read is closed, a kept one goes on.
            begin.add_done_callback(_close_if_plain)
            raise
        except NoAnswer:
            logger.warning("resume route %s: no answer within --resume-max-seconds", route.path)
            return self._answer(request, 504, "the upstream sent no answer")
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            logger.warning("resume route %s: upstream failed: %r", route.path, error)
            return self._answer(request, 502, "upstream unreachable")
        match began:
            case Plain(response=response):
                try:
                    return await _stream_back(request, response)
                finally:
                    response.close()
            case Kept(path=path, point=point, headers=passed_on, handoff=handoff):
                try:
                    return await self._serve(request, path, bound, point, passed_on, handoff)
                finally:
                    handoff.leave()
            case _:
                assert_never(began)

    async def _begin(
        self,
        method: str,
        url: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        scope: str,
        credentials: list[tuple[str, str]],
    ) -> Began:
        upstream = self._upstream
        assert upstream is not None
        try:
            # An answer is kept at most --resume-max-seconds: an upstream silent that long
            # before its headers is let go (its client, if it left, holds no id to resume with).
            # (0 keeps nothing past the first chunk; it does not refuse every answer.)
            with self._pumps.beginning():
                async with asyncio.timeout(self._settings.resume_max_seconds or None):
                    response = await upstream.request(
                        method, url, headers=CIMultiDict(headers), data=body or None,
                        allow_redirects=False,
                    )  # fmt: skip
        except TimeoutError as error:
            raise NoAnswer from error
        if not keepable(response):
            return Plain(response)
        kept = await self._pumps.keep(response, body, scope, credentials)
        return Plain(response) if kept is None else kept

    # --- answers read from the stream -------------------------------------------------------

    async def _resume(
        self, request: web.Request, point: ResumePoint, bound: Bound
    ) -> web.StreamResponse:
        path = self._settings.resume_stream_prefix + stream_name(point.token, bound.scope)
        return await self._serve(request, path, bound, point, [], None)

    async def _serve(
        self,
        request: web.Request,
        path: str,
        bound: Bound,
        point: ResumePoint,
        passed_on: Sequence[tuple[str, str]],
        handoff: Handoff | None,
    ) -> web.StreamResponse:
        """The answer's events from ``point`` on, read from its stream to the stream's end:
        through as many reads as it takes (the edge's SSE viewers are rotated). ``handoff``:
        this is the answer's own client, which gets what outgrows the caps directly."""
        resuming = request.headers.get("Last-Event-ID") is not None
        reading = Reading(
            request=request, path=path, bound=bound, replay=Replay(point, own=handoff is not None),
            passed_on=passed_on, resuming=resuming, handoff=handoff,
        )  # fmt: skip
        self._readings.add(reading)
        try:
            return await self._serve_reading(reading)
        finally:
            self._readings.discard(reading)

    async def _serve_reading(self, reading: Reading) -> web.StreamResponse:
        request, path, handoff, resuming = (
            reading.request, reading.path, reading.handoff, reading.resuming,
        )  # fmt: skip
        failures = 0
        while failures < MAX_FAILED_READS:
            end = await self._read_once(reading)
            match end:
                case ReadEnd.ENDED if reading.answer is None:
                    # Nothing after the client's point, and the answer is whole: the end.
                    self._metrics.resumes.labels("served").inc()
                    return self._answer(request, 204, None)
                case ReadEnd.ENDED:
                    assert reading.answer is not None
                    return reading.answer
                case ReadEnd.MISSING if reading.answer is None:
                    if resuming:
                        self._metrics.resumes.labels("not_found").inc()
                    return self._not_found(request)
                case ReadEnd.ROTATED | ReadEnd.FAILED if self._draining and reading.gave_ids:
                    break  # cut short: it resumes on a replica that stays
                case ReadEnd.EXPIRED if reading.answer is None:
                    expired = self._answer(request, 401, EXPIRED.reason)
                    expired.headers[hdrs.WWW_AUTHENTICATE] = str(EXPIRED.www_authenticate())
                    return expired
                case ReadEnd.EXPIRED:
                    break  # cut short: it resumes with its last id and a fresh token
                case ReadEnd.ROTATED:
                    failures = 0
                case ReadEnd.MISSING | ReadEnd.FAILED:
                    failures += 1
                    await asyncio.sleep(RETRY_MS / 1000)
                case ReadEnd.HANDED_OVER:
                    assert reading.answer is not None
                    assert handoff is not None
                    while (message := await handoff.get()) is not None:
                        await reading.answer.write(encode_event(message["event"], message["data"]))
                    await reading.answer.write_eof()
                    return reading.answer
                case ReadEnd.LAPSED:
                    await self._ensure_open(reading)
                    assert reading.answer is not None
                    lapsed = await self._pumps.end_lapsed(path, reading.bound.credentials)
                    match lapsed:
                        case Ended():
                            reading.news_at, failures = time.monotonic(), 0  # read on to the end
                        case Unreadable():
                            break  # cut short below, to resume once the log can be read
                        case Unwritable(owed=owed):
                            for message in owed:
                                await reading.answer.write(
                                    encode_event(message["event"], message["data"])
                                )
                            await reading.answer.write_eof()
                            return reading.answer
                        case _:
                            assert_never(lapsed)
                case _:
                    assert_never(end)
        if reading.answer is None:
            if resuming:
                self._metrics.resumes.labels("error").inc()
            return self._answer(request, 502, "the answer's stream could not be read")
        # Cut short, so that the client's reconnection (with its last id) resumes it.
        if request.transport is not None:
            request.transport.close()
        return reading.answer

    async def _read_once(self, reading: Reading) -> ReadEnd:
        """One SSE read of the stream through this edge's own listener, from where the reader
        is; its events written to the client as they come."""
        request = reading.request
        at = reading.replay.rewind()
        moved = False  # events, a lease or a heartbeat: a read that was alive, not one refused
        try:
            async with self._stream_read(reading, at.offset) as read:
                if read.status in (400, 404):
                    # 400: an offset the origin refuses is no point of the stream, so not one
                    # the edge minted: found nothing, as an unknown id.
                    return ReadEnd.MISSING
                if read.status != 200:
                    logger.warning("resume stream %s: own read got %d", reading.path, read.status)
                    return ReadEnd.FAILED
                if not reading.resuming:
                    await self._ensure_open(reading)  # the answer's own client: at once
                decoder = SseDecoder()
                lease = self._settings.resume_lease_seconds
                while True:
                    expires_in = seconds_left(reading.bound.expires_at, time.time())
                    if expires_in is not None and expires_in <= 0:
                        return ReadEnd.EXPIRED
                    # At least a second: a reader held up writing to a slow client finds what
                    # arrived meanwhile before it calls the log silent.
                    silent_for = max(
                        LEASE_GRACE_SECONDS, reading.news_at + lease - time.monotonic()
                    )
                    try:
                        chunk = await asyncio.wait_for(
                            read.content.readany(),
                            silent_for if expires_in is None else min(silent_for, expires_in),
                        )
                    except TimeoutError:
                        if expires_in is not None and expires_in < silent_for:
                            return ReadEnd.EXPIRED
                        return ReadEnd.LAPSED
                    if not chunk:
                        break
                    heartbeats = decoder.comments
                    replayed = reading.replay.feed(decoder.feed(chunk))
                    heartbeat = decoder.comments > heartbeats
                    if replayed.news:
                        reading.news_at = time.monotonic()
                    if replayed.ended and not replayed.frames and reading.answer is None:
                        return ReadEnd.ENDED  # a resume with nothing more: a 204
                    if replayed.frames or heartbeat or replayed.caught_up:
                        # A resume's answer opens once it is known not to be the end.
                        await self._ensure_open(reading)
                    answer = reading.answer
                    if answer is None:
                        continue
                    if replayed.frames:
                        moved = reading.gave_ids = True
                        await answer.write(b"".join(replayed.frames))
                    elif heartbeat:
                        moved = True
                        await answer.write(encode_comment("keep-alive"))
                    if replayed.news:
                        moved = True  # the log moved on (a lease too): a read that was alive
                    if replayed.handed_over:
                        return ReadEnd.HANDED_OVER
                    if replayed.ended:
                        await answer.write_eof()
                        return ReadEnd.ENDED
        except (aiohttp.ClientError, OSError, TimeoutError, OriginError) as error:
            if request.transport is None or request.transport.is_closing():
                raise ClientGone from error
            logger.info("resume stream %s: own read broke off: %r", reading.path, error)
            return ReadEnd.FAILED
        return ReadEnd.ROTATED if moved else ReadEnd.FAILED

    @asynccontextmanager
    async def _stream_read(
        self, reading: Reading, offset: str
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """One SSE read of the answer's stream from ``offset``: through this edge's own
        listener, or (``Bound.direct``) from the origin itself."""
        live = f"{quote(reading.path)}?offset={quote(offset, safe='')}&live=sse"
        bound = reading.bound
        if bound.direct:
            response = await self._origin.open("GET", live, bound.credentials, live=True)
            try:
                yield response
            finally:
                response.close()
            return
        own = self._own
        assert own is not None
        url = _own_url(reading.request) + live
        async with own.get(url, headers=bound.credentials) as response:
            yield response

    async def _ensure_open(self, reading: Reading) -> None:
        if reading.answer is None:
            reading.answer = await self._open_answer(
                reading.request, reading.path, reading.passed_on
            )
            if reading.resuming:
                self._metrics.resumes.labels("served").inc()
            if self._draining:
                _cut_short_if_resumable(reading)

    async def _open_answer(
        self, request: web.Request, path: str, passed_on: Sequence[tuple[str, str]]
    ) -> web.StreamResponse:
        answer = web.StreamResponse(status=200)
        for name, value in passed_on:
            if not cors_headers([(name, value)]):  # the edge's CORS, not the upstream's
                answer.headers.add(name, value)
        answer.headers[hdrs.CONTENT_TYPE] = EVENT_STREAM
        answer.headers[hdrs.CACHE_CONTROL] = "private, no-store, no-transform"
        answer.headers["X-Accel-Buffering"] = "no"
        answer.headers[STREAM_HEADER] = path
        self._add_cors(request, answer.headers)
        await answer.prepare(request)
        await answer.write(encode_retry(RETRY_MS))
        return answer

    # --- the edge's own answers, and their CORS ---------------------------------------------

    def _answer(self, request: web.Request, status: int, text: str | None) -> web.Response:
        answer = web.Response(
            status=status, text=None if text is None else text + "\n",
            headers={hdrs.CACHE_CONTROL: "no-store"},
        )  # fmt: skip
        self._add_cors(request, answer.headers)
        return answer

    def _not_found(self, request: web.Request) -> web.Response:
        return self._answer(request, 404, "no such answer")

    def _preflight(self, request: web.Request) -> web.Response:
        answer = web.Response(status=204)
        if self._add_cors(request, answer.headers):
            answer.headers["Access-Control-Max-Age"] = PREFLIGHT_MAX_AGE
        return answer

    def _add_cors(self, request: web.Request, headers: CIMultiDict[str]) -> bool:
        """The route's CORS for the request's ``Origin`` (``edge.resume.cors``); False when the
        origin grants that ``Origin`` nothing."""
        self._cors.mark_vary(headers)
        granted = route_cors(self._cors.grant(request_origin(request)))
        for name, value in granted:
            headers[name] = value
        return bool(granted)


def _cut_short_if_resumable(reading: Reading) -> None:
    """End a client's connection unfinished, so that it resumes with its last id elsewhere."""
    transport = reading.request.transport
    if reading.gave_ids and transport is not None:
        transport.close()


def _presented_credentials(
    request: web.Request, credentials: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """``credentials`` with a ``token`` query parameter as ``Authorization: Bearer``."""
    presented = present(request.query_string, request.headers.items())
    if presented.from_query and presented.token is not None:
        return [*credentials, (hdrs.AUTHORIZATION, f"Bearer {presented.token}")]
    return credentials


def _own_url(request: web.Request) -> str:
    """This edge's own listener, as the client reached it."""
    transport = request.transport
    sockname = transport.get_extra_info("sockname") if transport is not None else None
    assert sockname is not None, "a resume route's request came on a socket"
    host, port = sockname[0], sockname[1]
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"http://{authority}"


async def _read_body(request: web.Request) -> bytes | None:
    """The request's body, or None past ``MAX_BODY_BYTES``."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _close_if_plain(begin: asyncio.Future[Began]) -> None:
    if begin.cancelled() or begin.exception() is not None:
        return
    began = begin.result()
    if isinstance(began, Plain):
        began.response.close()


async def _stream_back(
    request: web.Request, response: aiohttp.ClientResponse
) -> web.StreamResponse:
    """The upstream answer, relayed as it streams (hop-by-hop aside)."""
    answer = web.StreamResponse(status=response.status, reason=response.reason)
    for name, value in strip_hop_by_hop(list(response.headers.items())):
        if name.lower() not in ("content-length", "transfer-encoding"):
            answer.headers.add(name, value)
    if response.headers.get(hdrs.CONTENT_LENGTH) is not None:
        answer.content_length = int(response.headers[hdrs.CONTENT_LENGTH])
    await answer.prepare(request)
    try:
        async for chunk in response.content.iter_any():
            await answer.write(chunk)
    except (aiohttp.ClientError, OSError, TimeoutError):
        # A truncated body must never look complete: the client's connection ends unfinished.
        if request.transport is not None:
            request.transport.abort()
        return answer
    await answer.write_eof()
    return answer
