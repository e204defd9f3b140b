"""One stream request, from its target to the handler its classification names.

Rules this module owns:

* A request's target is checked before anything else: one the edge refuses is a 400 that never
  reaches the origin (``edge.protocol.paths``); a request that already passed through the edge
  is a 508 (a loop); ``OPTIONS *`` is answered by the edge.
* With ``--auth jwt|forward``, one decision (``edge.web.gatekeeper.admit``) comes before all of
  that follows: a refusal never reaches the origin, and an authorized read is classified into
  the shared scope with the edge's own credential upstream.
* Reads are classified and cached by the stream's normalised path and the credential scope the
  configured ``--scope-headers``/``--scope-cookies`` give; the cache's own origin requests carry
  exactly those credentials (``edge.web.asked``), pass-through requests every client header.
* Once a request is classified, the connection table hears its kind (``ConnectionTracker.
  request_kind``) before anything is done for it: a live reader past the cap is answered 503
  with ``Retry-After`` and the CORS headers the origin gives its ``Origin``, and its connection
  closes; a live reader's slot is given back when its handler ends, whatever the outcome.
* A client that leaves before its answer is written is counted in ``edge_clients_gone_total``,
  never as an answered request (``edge_requests_total``), and logged at DEBUG: leaving is what
  viewers do, and a dashboard must not read it as failing.
* A request on a resume route (``--resume-route``) is the resume routes' alone, before the gate
  and the classification: it is about an agent backend, not a stream. The connection table
  holds it as a live reader (its answer may stream as long as the backend works).
* The origin's control API is relayed as it is; a live read whose CORS answer is unknown for its
  ``Origin`` is relayed so that the origin's answer teaches the edge.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import assert_never

from aiohttp import web
from aiohttp.typedefs import Handler

from edge.answer import Answer, Bypass, Result
from edge.auth.gate import RequestAdmission
from edge.config import ResumeRoute
from edge.origin import OriginError
from edge.protocol.headers import names_this_proxy
from edge.protocol.paths import BadTarget
from edge.protocol.reads import Classified, RequestKind, classify
from edge.web.asked import Asked, asked_of, origin_failed, to_response
from edge.web.catchup_reads import relay_bypass, serve_catchup, serve_head, write_served
from edge.web.connection_tracker import CONNECTIONS, Found, let_go
from edge.web.front import Served
from edge.web.gatekeeper import GATE, admit
from edge.web.keys import CORS, METRICS, RELAY, RESUME, SETTINGS
from edge.web.live_reads import serve_long_poll, serve_sse
from edge.web.proxy import ClientGone, EdgeResponse, edge_answer, request_origin, request_target

logger = logging.getLogger(__name__)

# The status of the answer aiohttp is handed for a client that went away (nginx's 499); it is
# never written, and never counted as an answered request.
CLIENT_CLOSED = 499


async def dispatch(
    request: web.Request, asked: Asked, classified: Classified, handed: Handed | None = None
) -> web.StreamResponse:
    read, kind = classified.read, classified.kind
    relay = request.app[RELAY]
    found = handed.take() if handed is not None else None
    if found is not None:
        # The connection already asked the cache (``edge.web.fast_polls.HandOn``): what it
        # found is answered as this path answers it, and nothing is asked twice.
        match found:
            case Bypass():
                if kind is RequestKind.CATCHUP:
                    logger.info("relaying without caching: %s", found)
                    request.app[METRICS].cache_result(Result.BYPASS.value).inc()
                return await relay_bypass(request, kind, found)
            case OriginError():
                return origin_failed(request, asked, found)
            case Answer():
                return to_response(request, asked, found)
            case Served(answer=answer, headers=headers):
                return await write_served(request, asked, answer, headers)
            case _:
                assert_never(found)
    match kind:
        case RequestKind.CONTROL:
            # The origin's control API: relayed as it is, whatever it asks (PROTOCOL.md 6).
            return await relay.forward(
                request, kind, cache_status="edge; fwd=bypass; detail=control"
            )
        case RequestKind.SSE | RequestKind.LONG_POLL:
            if request.app[CORS].unknown_for(asked.origin):
                # Its CORS headers are the origin's to say for this Origin: its answer teaches
                # the edge.
                return await relay.forward(
                    request, kind, cache_status="edge; fwd=bypass; detail=cors"
                )
            if read is not None and read.plain and read.offset is not None:
                serve = serve_sse if kind is RequestKind.SSE else serve_long_poll
                return await serve(request, asked, classified)
        case RequestKind.CATCHUP:
            if read is not None:
                if read.plain and read.offset != "now":
                    return await serve_catchup(request, asked, classified)
                request.app[METRICS].cache_result(Result.BYPASS.value).inc()
        case RequestKind.HEAD:
            if read is not None and read.plain:
                known = await serve_head(request, asked, read)
                if known is not None:
                    return known
        case RequestKind.WRITE | RequestKind.OTHER:
            pass
        case _:
            assert_never(kind)
    forward = "method" if kind is RequestKind.WRITE else "bypass"
    return await relay.forward(request, kind, cache_status=f"edge; fwd={forward}")


def refuse_for_room(request: web.Request, origin: str | None) -> web.Response:
    """A live reader past the cap: 503 a browser's EventSource can read, and the connection
    closes after it (a refused viewer holds no room while it waits to retry)."""
    refused = edge_answer(
        503, "edge is at --max-viewers", request.app[CORS], [("Retry-After", "5")], origin=origin
    )
    refused.force_close()
    return refused


class Handed:
    """What the connection found for this request before it handed it here: taken off the
    tracker first, so it never waits for another request; taken once by what answers it, and
    let go (its fill share given back) if nothing does."""

    __slots__ = ("_found",)

    def __init__(self, found: Found | None) -> None:
        self._found = found

    def take(self) -> Found | None:
        found, self._found = self._found, None
        return found

    def let_go(self) -> None:
        found = self.take()
        if found is not None:
            let_go(found)


async def handle_stream_request(request: web.Request) -> web.StreamResponse:
    transport = request.transport
    connections = request.app[CONNECTIONS]
    handed = Handed(connections.take_found(transport) if transport is not None else None)
    try:
        return await _handle(request, handed)
    finally:
        handed.let_go()


async def _handle(request: web.Request, handed: Handed) -> web.StreamResponse:
    metrics = request.app[METRICS]
    settings = request.app[SETTINGS]
    cors = request.app[CORS]
    origin = request_origin(request)
    try:
        target = request_target(request)
    except BadTarget as bad:
        metrics.request_count(RequestKind.OTHER, 400).inc()
        return edge_answer(400, str(bad), cors, origin=origin)
    if names_this_proxy(request.headers.getall("Via", ())):
        # Round a loop (a CDN in front whose backend leads back to it): relaying it again
        # would only go round once more.
        metrics.request_count(RequestKind.OTHER, 508).inc()
        return edge_answer(
            508, "loop detected: this request already passed through the edge",
            cors, [("Cache-Control", "no-store")], origin=origin,
        )  # fmt: skip
    if target.asterisk:
        # OPTIONS * asks about the server, not a stream: the origin's own answer to any OPTIONS.
        metrics.request_count(RequestKind.OTHER, 204).inc()
        server_options = EdgeResponse(status=204)
        cors.add_missing(server_options.headers, origin)
        return server_options
    route = request.app[RESUME].route_for(target.stream)
    if route is not None:
        return await _on_resume_route(request, route, origin)
    admitted: RequestAdmission | None = None
    gate = request.app.get(GATE)
    if gate is not None:
        decision = await admit(request, gate, cors)
        if isinstance(decision, web.StreamResponse):
            kind = classify(request.method, target.stream, target.query, ()).kind
            metrics.full_path(kind).inc()  # aiohttp's handler was entered for it
            metrics.request_count(kind, decision.status).inc()
            return decision
        admitted, target = decision, decision.target  # its target without token parameters
    asked = asked_of(request, settings, target=target, origin=origin, admitted=admitted)
    classified = classify(
        request.method,
        asked.target.stream,
        asked.target.query,
        asked.headers,
        scope_headers=settings.scope_headers,
        scope_cookies=settings.scope_cookies,
        scope=admitted.scope if admitted is not None else None,
    )
    kind = classified.kind
    metrics.full_path(kind).inc()
    connections, transport = request.app[CONNECTIONS], request.transport
    # Decided before the first await for it, so concurrent arrivals cannot overshoot a cap.
    if transport is not None and connections.request_kind(transport, kind) is not None:
        metrics.request_count(kind, 503).inc()
        return refuse_for_room(request, asked.origin)
    open_gauge = metrics.open_requests(kind)
    open_gauge.inc()
    started = time.perf_counter()
    code: int | None = None  # None: the client left (or the handler failed) first
    try:
        response = await dispatch(request, asked, classified, handed)
        code = response.status
        return response
    except ClientGone:
        logger.debug(
            "client left before its answer to %s %r was written",
            request.method,
            asked.target.upstream,
        )
        metrics.client_gone(kind).inc()
        # Never sent: the transport is closing, and aiohttp drops an answer it cannot write.
        return EdgeResponse(status=CLIENT_CLOSED)
    except asyncio.CancelledError:
        metrics.client_gone(kind).inc()  # aiohttp cancels a handler whose client left
        raise
    except Exception:
        code = 500  # what aiohttp answers for a handler that fails
        raise
    finally:
        if transport is not None:
            connections.live_ended(transport)
        open_gauge.dec()
        metrics.duration(kind).observe(time.perf_counter() - started)
        if code is not None:
            metrics.request_count(kind, code).inc()


async def _on_resume_route(
    request: web.Request, route: ResumeRoute, origin: str | None
) -> web.StreamResponse:
    """An agent backend's request, not a stream of the origin: relayed (and kept) by the resume
    routes, whose backend authorizes its own callers. Its answer may stream for as long as the
    backend works, so the connection table holds it as a live reader: the cap, and a client's
    half-close ends it."""
    metrics, connections, transport = (
        request.app[METRICS],
        request.app[CONNECTIONS],
        request.transport,
    )
    if transport is not None and connections.request_kind(transport, RequestKind.SSE) is not None:
        metrics.request_count(RequestKind.OTHER, 503).inc()
        return refuse_for_room(request, origin)
    try:
        response = await request.app[RESUME].handle(request, route)
    except ClientGone:
        metrics.client_gone(RequestKind.OTHER).inc()
        return EdgeResponse(status=CLIENT_CLOSED)  # never sent (see ``_handle``)
    except asyncio.CancelledError:
        metrics.client_gone(RequestKind.OTHER).inc()
        raise
    finally:
        if transport is not None:
            connections.live_ended(transport)
    metrics.request_count(RequestKind.OTHER, response.status).inc()
    return response


@web.middleware
async def asterisk_form(request: web.Request, handler: Handler) -> web.StreamResponse:
    """``OPTIONS *`` matches no path route; it still belongs to the stream handler."""
    if request.raw_path == "*":
        return await handle_stream_request(request)
    return await handler(request)
