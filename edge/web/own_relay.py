"""Reads the cache relays, and what the connection found for a read and could not write
through its own paths, served by the stream listener's own connection protocol: no read goes
through aiohttp's request handler.

Rules this module owns:

* What becomes of a classified request is one decision (``route_of``), made by aiohttp's
  handler (``edge.web.dispatch``) and by the connection alike: the cache's to serve
  (``Serve``), or relayed with a ``Cache-Status`` (``Relayed``).
* A plain ``GET``/``HEAD`` head no own path answered (``plan`` with nothing found) is the
  connection's when its route is a relay (``offset=now``, a read with unknown parameters, a
  live read whose CORS answer is unknown for its ``Origin``, a control path) or a HEAD (the
  edge's own answer when it knows the whole stream, ``CatchupFront.head``, else relayed). A
  target ``parse_target`` refuses never gets here: the connection wrote its 400
  (``edge.protocol.http1.RefusedHead``).
* With ``--auth jwt|forward`` a read is the relay's only with the admission the connection's
  gate decided for it (``edge.web.own_gate``), served as the full path serves that admission
  (``edge.web.proxy.ask_of``, ``edge.web.asked.asked_of``): its target without ``token``
  parameters, classified into the policy's scope, upstream with the headers
  ``RequestAdmission.relay_headers`` gives (the edge's credential for a read), its answer
  ``private`` to its reader (``Relay.relayed_head``'s ``reader_only``, ``client_headers``'s), the
  edge's own HEAD looked up with the edge's credential. Nothing is decided again here.
* What an own path found and could not write (``HandOn.found``) is written here as the full
  path writes it: a ``Bypass`` relayed without validators (counted a cache bypass for a
  catch-up), an origin failure as ``origin_error_response``, an answer whose headers carry the
  origin's ``Date`` with that ``Date`` (``edge.protocol.http1.dated_answer_head``).
* A relay sends what ``Relay.forward`` sends (``Relay.open``: the same request headers, the
  same observer, the same counters) and writes the headers ``Relay.relayed_head`` decides, as
  aiohttp frames the relay's answer (``edge.protocol.http1.relayed_answer_head``), through the
  connection's ``send``/``drain`` alone. The head is read whole again for it
  (``parse_whole_head``): the hit path's parse keeps only the headers it consults.
* A body the origin cuts mid-way aborts the connection (a truncated body must never look
  complete); a client that leaves cancels the task, and the origin's answer is closed with it
  (cancelling the origin's work).
* Counted as the full path counts the same request: ``edge_requests_total{kind,code}``, the open
  gauge, ``edge_request_duration_seconds``, a client gone, a bypass; never
  ``edge_full_path_requests_total``.
* Bytes fresh from the origin (a ``Served`` holding a ``--fill-buffer-bytes`` share) give
  their share back once written, or when nobody will write them (``let_go``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Literal, Protocol, assert_never

import aiohttp

from edge.answer import Answer, Bypass, Result
from edge.auth.gate import RequestAdmission
from edge.config import Settings
from edge.memory import TRIMMER
from edge.metrics import Metrics
from edge.origin import OriginClient, OriginError, OriginMalformed
from edge.protocol.headers import first_value
from edge.protocol.http1 import (
    LAST_CHUNK,
    BodyFraming,
    bodiless,
    chunk,
    dated_answer_head,
    parse_whole_head,
    relayed_answer_head,
)
from edge.protocol.paths import BadTarget, parse_target
from edge.protocol.reads import NOW, Classified, RequestKind, classify, scope_credentials
from edge.web.fast_polls import Done, Ending, written
from edge.web.front import CatchupFront, Served, catchup_request
from edge.web.proxy import LIVE_KINDS, OriginCors, Relay, RelayAsk, origin_error_response
from edge.web.wire import client_headers

logger = logging.getLogger(__name__)

# What a connection found for a read and hands on (``edge.web.fast_polls.HandOn``).
Found = Bypass | OriginError | Answer | Served


def let_go(found: Found) -> None:
    """What a connection found and no one will write: its fill share is given back."""
    if isinstance(found, Served) and found.answer.hold is not None:
        found.answer.hold.release()


class Serve(Enum):
    """The cache's to serve (``edge.web.dispatch``'s handlers, or the connection's own)."""

    CATCHUP = "catchup"
    LIVE = "live"
    HEAD = "head"  # the edge's own answer if it knows the whole stream, else ``RELAYED_HEAD``


@dataclass(frozen=True, slots=True)
class Relayed:
    """Relayed to the origin with this ``Cache-Status``; ``validators=False`` for a read the
    cache was asked and does not answer; ``bypass``: counted as a cache bypass."""

    cache_status: str
    validators: bool = True
    bypass: bool = False


Route = Serve | Relayed
RELAYED_HEAD = Relayed("edge; fwd=bypass")


def route_of(classified: Classified, *, cors_unknown: bool) -> Route:
    """What becomes of a request classified as ``classified``; ``cors_unknown``: the origin's
    CORS answer for its ``Origin`` is unknown (its answer teaches the edge)."""
    read, kind = classified.read, classified.kind
    match kind:
        case RequestKind.CONTROL:
            # The origin's control API: relayed as it is, whatever it asks (PROTOCOL.md 6).
            return Relayed("edge; fwd=bypass; detail=control")
        case RequestKind.SSE | RequestKind.LONG_POLL:
            if cors_unknown:
                return Relayed("edge; fwd=bypass; detail=cors")
            if read is not None and read.plain and read.offset is not None:
                return Serve.LIVE
        case RequestKind.CATCHUP:
            if read is not None:
                if read.plain and read.offset != NOW:
                    return Serve.CATCHUP
                return Relayed("edge; fwd=bypass", bypass=True)
        case RequestKind.HEAD:
            if read is not None and read.plain:
                return Serve.HEAD
        case RequestKind.WRITE:
            return Relayed("edge; fwd=method")
        case RequestKind.OTHER:
            pass
        case _:
            assert_never(kind)
    return RELAYED_HEAD


def bypass_relay(bypass: Bypass, kind: RequestKind) -> Relayed:
    """The client's own request, relayed: the cache does not answer it (``bypass.why``); the
    origin's tags do not tell stream instances apart."""
    return Relayed(
        f"edge; fwd=bypass; detail={bypass.why.value}",
        validators=False,
        bypass=kind is RequestKind.CATCHUP,
    )


def declared_length(value: str | None) -> int:
    """A relayed answer's ``Content-Length`` (the origin client checked it is a length)."""
    return int(value) if value is not None and value.strip().isdigit() else 0


# What the connection's own relay gives a read: relayed, the edge's own HEAD (else relayed), or
# what an own path found written as the full path writes it.
Step = Relayed | Literal[Serve.HEAD] | OriginError | Answer | Served


class RelayConnection(Protocol):
    def send(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Planned:
    """A read the connection serves here: ``kind`` (a live one is admitted first), from
    ``origin``, and what it gets (``step``)."""

    kind: RequestKind
    origin: str | None
    ask: RelayAsk
    classified: Classified
    keep_alive: bool
    step: Step
    client_headers: tuple[tuple[str, str], ...]  # as sent (``ask``'s are as sent upstream)
    admission: RequestAdmission | None  # the gate's yes to it (``--auth``)

    @property
    def live(self) -> bool:
        return self.kind in LIVE_KINDS and isinstance(self.step, Relayed)


class OwnRelay:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        relay: Relay,
        front: CatchupFront,
        cors: OriginCors,
        *,
        gated: bool,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.enabled = settings.fast_path
        # With --auth every read is the gate's first: one without an admission is aiohttp's.
        self._gated = gated
        self._settings = settings
        self._metrics = metrics
        # Replaced by a worker's (``edge.workers.siblings``: its observer tells the others).
        self.relay = relay
        self._front = front
        self._cors = cors
        self._clock = clock

    def plan(
        self,
        raw: bytes,
        found: Found | None,
        peer: str | None,
        admission: RequestAdmission | None = None,
    ) -> Planned | None:
        """What the connection does with the head ``raw`` (from ``peer``'s address): with
        nothing ``found``, a read no own path answered; else what an own path found for it.
        With ``--auth``, ``admission`` is the gate's yes to it (see the module rules). None:
        aiohttp's handler answers it (the caller lets ``found`` go)."""
        if self._gated and admission is None:
            return None  # the gate's decision is the full path's
        whole = parse_whole_head(raw)
        try:
            target = parse_target(whole.target, whole.method)
        except BadTarget:
            target = None
        if target is None or target.asterisk:
            return None
        if admission is not None:
            target = admission.target  # without its token parameters
        settings, headers = self._settings, whole.headers
        classified = classify(
            whole.method, target.stream, target.query, headers,
            scope_headers=settings.scope_headers, scope_cookies=settings.scope_cookies,
            scope=admission.scope if admission is not None else None,
        )  # fmt: skip
        kind, origin = classified.kind, first_value(headers, "origin")
        step: Step
        if found is not None:
            step = bypass_relay(found, kind) if isinstance(found, Bypass) else found
        else:
            route = route_of(classified, cors_unknown=self._cors.unknown_for(origin))
            if route is Serve.CATCHUP or route is Serve.LIVE:
                return None  # the own paths handed it off: the full path's to serve
            step = route
        # An authorized read goes upstream with the edge's credential (``ask_of``'s rule).
        shared = admission is not None and admission.shared
        ask = RelayAsk(
            method=whole.method, target=target,
            headers=headers if admission is None else admission.relay_headers(headers),
            client_address=peer, scheme="http", host=first_value(headers, "host"),
            version=(1, 0) if whole.http10 else (1, 1),
            credentialed=shared
            or any(n.lower() in ("authorization", "cookie") for n, _ in headers),
            reader_only=shared,
        )  # fmt: skip
        return Planned(
            kind=kind, origin=origin, ask=ask, classified=classified,
            keep_alive=whole.keep_alive, step=step, client_headers=tuple(headers),
            admission=admission,
        )  # fmt: skip

    def start(
        self, planned: Planned, connection: RelayConnection, done: Done
    ) -> asyncio.Task[None]:
        """Serve ``planned`` in a task; ``done`` hears how its answer ended."""
        begun: list[bool] = []
        task = asyncio.get_running_loop().create_task(self._serve(planned, connection, done, begun))
        step = planned.step
        if isinstance(step, Served) and step.answer.hold is not None:
            # Cancelled before it ran (its client left at once), it never reaches its
            # ``finally``: the fill share it holds is given back here then.
            task.add_done_callback(lambda _: None if begun else let_go(step))
        return task

    async def _serve(
        self, planned: Planned, connection: RelayConnection, done: Done, begun: list[bool]
    ) -> None:
        begun.append(True)
        metrics, kind = self._metrics, planned.kind
        opened = metrics.open_requests(kind)
        opened.inc()
        began = time.perf_counter()
        code: int | None = None  # None: the client left (or it failed) first
        ended = Ending.CUT
        try:
            try:
                code, whole = await self._answer(planned, connection)
            except OriginMalformed as malformed:
                # Raised before any of its answer was written: the edge's 502 instead.
                metrics.origin_errors.labels(reason=malformed.reason).inc()
                logger.warning(
                    "origin answer for %r not passed on: %s", planned.ask.target.upstream, malformed
                )
                code, whole = self._write_error(malformed, planned, connection), True
            ended = written(planned.keep_alive) if whole else Ending.CUT
        except asyncio.CancelledError:
            metrics.client_gone(kind).inc()  # its connection was lost
            raise
        except ConnectionError:
            code = None
            metrics.client_gone(kind).inc()
        except Exception:
            logger.exception("a relayed read failed; its connection is cut")
        finally:
            opened.dec()
            metrics.duration(kind).observe(time.perf_counter() - began)
            if code is not None:
                metrics.request_count(kind, code).inc()
            done(ended)

    async def _answer(self, planned: Planned, connection: RelayConnection) -> tuple[int, bool]:
        """Write ``planned``'s answer: its status, and whether it was written whole."""
        step, metrics = planned.step, self._metrics
        match step:
            case Relayed():
                if step.bypass:
                    metrics.cache_result(Result.BYPASS.value).inc()
                if not step.validators:
                    logger.info("relaying without caching: %s", planned.ask.target.upstream)
                return await self._relay(planned, step, connection)
            case Serve.HEAD:
                known = await self._known_head(planned)
                if known is None:
                    return await self._relay(planned, RELAYED_HEAD, connection)
                metrics.cache_result(known.answer.result.value).inc()
                head = self._dated(known.answer.status, known, 0, planned, head=True)
                connection.send(head)
                return known.answer.status, True
            case OriginError():
                metrics.origin_errors.labels(reason=step.reason).inc()
                logger.warning(
                    "origin error for %s %r: %s",
                    planned.ask.method,
                    planned.ask.target.upstream,
                    step,
                )
                return self._write_error(step, planned, connection), True
            case Answer():
                headers = client_headers(
                    step, self._cors, planned.origin, reader_only=planned.ask.reader_only
                )
                return self._write_answer(step, Served(answer=step, headers=headers), planned,
                                          connection), True  # fmt: skip
            case Served(answer=answer):
                try:
                    metrics.cache_result(answer.result.value).inc()
                    status = self._write_answer(answer, step, planned, connection)
                    if answer.hold is not None:
                        await connection.drain()
                finally:
                    if answer.hold is not None:
                        answer.hold.release()
                return status, True
            case _:
                assert_never(step)

    async def _known_head(self, planned: Planned) -> Served | None:
        """The edge's own answer to a HEAD, when it knows the whole stream; a conditional
        HEAD, or one whose CORS answer is unknown, is the origin's to judge."""
        ask, read, sent = planned.ask, planned.classified.read, planned.client_headers
        if read is None or first_value(sent, "if-none-match") is not None:
            return None
        if self._cors.unknown_for(planned.origin):
            return None
        admission, settings = planned.admission, self._settings
        # What the cache's origin requests carry for it (``asked_of``'s rule): for a shared
        # read the edge authorized, the edge's own credential.
        credentials = (
            admission.upstream
            if admission is not None and admission.shared
            else scope_credentials(
                sent, scope_headers=settings.scope_headers, scope_cookies=settings.scope_cookies
            )
        )
        request = catchup_request(
            ask.target, read, sent, version=ask.version, credentials=credentials,
            reader_only=ask.reader_only, cors=self._cors, head=True,
        )  # fmt: skip
        return await self._front.head(request)

    def _dated(
        self, status: int, served: Served, length: int, planned: Planned, *, head: bool = False
    ) -> bytes:
        """The head of an answer the edge passes on; ``OriginMalformed`` if its headers (the
        origin's) cannot be written."""
        try:
            return dated_answer_head(
                status, list(served.headers.items()), length, keep_alive=planned.keep_alive,
                now_seconds=int(self._clock()), head=head,
            )  # fmt: skip
        except ValueError as unwritable:
            raise OriginMalformed(str(unwritable)) from unwritable

    def _write_answer(
        self, answer: Answer, served: Served, planned: Planned, connection: RelayConnection
    ) -> int:
        body = b"" if bodiless(answer.status) else answer.body
        self._metrics.served_bytes.inc(len(answer.body))
        head = planned.ask.method == "HEAD"
        connection.send(
            self._dated(answer.status, served, len(body), planned, head=head)
            + (b"" if head else body)
        )
        return answer.status

    def _write_error(
        self, error: OriginError, planned: Planned, connection: RelayConnection
    ) -> int:
        response = origin_error_response(error, self._cors, planned.origin)
        body = response.body
        assert isinstance(body, bytes)
        head = planned.ask.method == "HEAD"
        connection.send(
            dated_answer_head(
                response.status, list(response.headers.items()), len(body),
                keep_alive=planned.keep_alive, now_seconds=int(self._clock()), head=head,
            ) + (b"" if head else body)
        )  # fmt: skip
        return response.status

    async def _relay(
        self, planned: Planned, relayed: Relayed, connection: RelayConnection
    ) -> tuple[int, bool]:
        relay, ask, kind = self.relay, planned.ask, planned.kind
        try:
            upstream = await relay.open(ask, kind, validators=relayed.validators)
        except OriginError as error:
            return self._write_error(error, planned, connection), True
        try:
            return upstream.status, await self._pass_on(planned, relayed, upstream, connection)
        finally:
            relay.close(upstream)

    async def _pass_on(
        self,
        planned: Planned,
        relayed: Relayed,
        upstream: aiohttp.ClientResponse,
        connection: RelayConnection,
    ) -> bool:
        """Write the origin's answer as it streams; False: the origin cut it mid-way."""
        relay, ask, metrics = self.relay, planned.ask, self._metrics
        headers = relay.relayed_head(
            ask, upstream, planned.kind, relayed.cache_status, validators=relayed.validators
        )
        try:
            head, framing = relayed_answer_head(
                upstream.status, upstream.reason, list(headers.items()),
                head=ask.method == "HEAD", keep_alive=planned.keep_alive,
                now_seconds=int(self._clock()), close_delimited=ask.version < (1, 1),
            )  # fmt: skip
        except ValueError as unwritable:
            raise OriginMalformed(str(unwritable)) from unwritable
        connection.send(head)
        left = declared_length(headers.get("Content-Length"))
        try:
            async for data in OriginClient.body_chunks(upstream):
                metrics.origin_bytes.inc(len(data))
                match framing:
                    case BodyFraming.CHUNKED:
                        connection.send(chunk(data))
                    case BodyFraming.LENGTH:
                        data = data[:left]  # bytes past the declared length are not sent
                        left -= len(data)
                        if data:
                            connection.send(data)
                    case BodyFraming.TO_CLOSE:
                        connection.send(data)  # the connection closes after it (keep_alive)
                    case BodyFraming.NONE:
                        continue
                    case _:
                        assert_never(framing)
                metrics.served_bytes.inc(len(data))
                TRIMMER.passed(len(data))
                await connection.drain()
        except OriginError as error:
            metrics.origin_errors.labels(reason=error.reason).inc()
            logger.warning("origin failed mid-body for %r: %s", ask.target.upstream, error)
            return False
        if framing is BodyFraming.CHUNKED:
            connection.send(LAST_CHUNK)
        await connection.drain()
        return True
