"""One stream request, from its target to the handler its classification names.

Rules this module owns:

* A request's target is checked before anything else: one the edge refuses is a 400 that never
  reaches the origin (``edge.protocol.paths``); a request that already passed through the edge
  is a 508 (a loop); ``OPTIONS *`` is answered by the edge.
* A request that repeats a field whose one value changes the answer (``Origin``,
  ``Last-Event-ID``: ``edge.protocol.headers.ANSWER_SINGLETONS``) is a 400, after the loop
  check; the connection refuses such a read alike (``edge.protocol.http1.RefusedHead``).
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
* With resume routes, a request that would write under ``--resume-stream-prefix`` (any method
  but ``GET``, ``HEAD``, ``OPTIONS``) is a 403 that never reaches the origin: the answers'
  streams are the edge's, written by its pumps to the origin directly; a client can only
  follow one.
* A request on a resume route (``--resume-route``) is the resume routes' alone, after the gate
  (with ``--auth``, judged as a request on the route's path; the admission goes with it: its
  principal binds the answers) and before the classification: it is about an agent backend,
  not a stream. The connection table holds it as a live reader (its answer may stream as long
  as the backend works).
* The origin's control API is relayed as it is; a live read whose CORS answer is unknown for its
  ``Origin`` is relayed so that the origin's answer teaches the edge: what becomes of a
  classified request is ``edge.web.own_relay.route_of``'s one decision, the connection's own
  relay's too. (Reads reach this handler only with ``--fast-path off``, or as what the
  connection cannot serve: a head whose gate decision the connection could
  not make or write, an answer it could not encode. It writes the refusals above for the
  reads it parses itself, ``OPTIONS *`` aside. With ``--auth`` the connection decides the
  gate once and finishes every read it decided, relays included: ``edge.web.own_relay``.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import assert_never

from aiohttp import web
from aiohttp.typedefs import Handler

from edge.answer import Result
from edge.auth.gate import RequestAdmission
from edge.config import ResumeRoute
from edge.protocol.headers import LOOP_TEXT, names_this_proxy, repeated_singleton, repeated_text
from edge.protocol.paths import BadTarget
from edge.protocol.reads import Classified, RequestKind, classify
from edge.web.asked import Asked, asked_of
from edge.web.catchup_reads import serve_catchup, serve_head
from edge.web.connection_tracker import CONNECTIONS
from edge.web.gatekeeper import GATE, admit
from edge.web.keys import CORS, METRICS, RELAY, RESUME, SETTINGS
from edge.web.live_reads import serve_long_poll, serve_sse
from edge.web.own_relay import RELAYED_HEAD, Relayed, Serve, route_of
from edge.web.proxy import ClientGone, EdgeResponse, edge_answer, request_origin, request_target

logger = logging.getLogger(__name__)

# What a client may do with a resume route's answer stream through the edge: follow it.
STREAM_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The status of the answer aiohttp is handed for a client that went away (nginx's 499); it is
# never written, and never counted as an answered request.
CLIENT_CLOSED = 499


async def dispatch(
    request: web.Request, asked: Asked, classified: Classified
) -> web.StreamResponse:
    read, kind = classified.read, classified.kind
    relay = request.app[RELAY]
    route = route_of(classified, cors_unknown=request.app[CORS].unknown_for(asked.origin))
    match route:
        case Serve.LIVE:
            serve = serve_sse if kind is RequestKind.SSE else serve_long_poll
            return await serve(request, asked, classified)
        case Serve.CATCHUP:
            return await serve_catchup(request, asked, classified)
        case Serve.HEAD:
            assert read is not None
            known = await serve_head(request, asked, read)
            if known is not None:
                return known
            route = RELAYED_HEAD
        case Relayed():
            if route.bypass:
                request.app[METRICS].cache_result(Result.BYPASS.value).inc()
        case _:
            assert_never(route)
    return await relay.forward(
        request, kind, cache_status=route.cache_status, validators=route.validators
    )


def refuse_for_room(request: web.Request, origin: str | None) -> web.Response:
    """A live reader past the cap: 503 a browser's EventSource can read, and the connection
    closes after it (a refused viewer holds no room while it waits to retry)."""
    refused = edge_answer(
        503, "edge is at --max-viewers", request.app[CORS], [("Retry-After", "5")], origin=origin
    )
    refused.force_close()
    return refused


async def handle_stream_request(request: web.Request) -> web.StreamResponse:
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
            508, LOOP_TEXT, cors, [("Cache-Control", "no-store")], origin=origin
        )  # fmt: skip
    repeated = repeated_singleton(request.headers.items())
    if repeated is not None:
        # Which of its values counts would be a guess (the connection refuses it alike).
        metrics.request_count(RequestKind.OTHER, 400).inc()
        return edge_answer(400, repeated_text(repeated), cors, origin=origin)
    if target.asterisk:
        # OPTIONS * asks about the server, not a stream: the origin's own answer to any OPTIONS.
        metrics.request_count(RequestKind.OTHER, 204).inc()
        server_options = EdgeResponse(status=204)
        cors.add_missing(server_options.headers, origin)
        return server_options
    if (
        settings.resume_routes
        and target.stream.startswith(settings.resume_stream_prefix)
        and request.method not in STREAM_READ_METHODS
    ):
        # The answers' streams are the edge's: its pumps write them to the origin directly.
        # Written through here, a forged event would reach every reader with the edge's id.
        metrics.request_count(RequestKind.OTHER, 403).inc()
        return edge_answer(403, "an answer's stream is written by the edge alone", cors,
                           [("Cache-Control", "no-store")], origin=origin)  # fmt: skip
    route = request.app[RESUME].route_for(target.stream)
    admitted: RequestAdmission | None = None
    gate = request.app.get(GATE)
    if gate is not None:
        decision = await admit(request, gate, cors)
        if isinstance(decision, web.StreamResponse):
            kind = (
                RequestKind.OTHER
                if route is not None
                else classify(request.method, target.stream, target.query, ()).kind
            )
            metrics.full_path(kind).inc()  # aiohttp's handler was entered for it
            metrics.request_count(kind, decision.status).inc()
            return decision
        admitted, target = decision, decision.target  # its target without token parameters
    if route is not None:
        return await _on_resume_route(request, route, origin, admitted)
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
        response = await dispatch(request, asked, classified)
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
    request: web.Request,
    route: ResumeRoute,
    origin: str | None,
    admitted: RequestAdmission | None,
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
        response = await request.app[RESUME].handle(request, route, admitted)
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
