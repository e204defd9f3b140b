"""The two aiohttp applications: stream traffic (every path) and the admin listener.

Rules this module owns:

* A request's target is checked before anything else: one the edge refuses is a 400 that never
  reaches the origin (``edge.protocol.paths``).
* Reads are classified and cached by the stream's normalised path and the credential scope the
  configured ``--scope-headers``/``--scope-cookies`` give; the cache's own origin requests carry
  exactly those credentials (``credentials_of``), pass-through requests every client header.
* With ``--auth jwt|forward``, one decision (``edge.web.gatekeeper.admit``) comes before all of
  that: a refusal never reaches the origin, and an authorized read is classified into the shared
  scope with the edge's own credential upstream.
* A client that leaves before its answer is written is counted in ``edge_clients_gone_total``,
  never as an answered request (``edge_requests_total``), and logged at DEBUG: leaving is what
  viewers do, and a dashboard must not read it as failing.
* Once a request is classified, the connection table hears its kind (``ConnectionTracker.
  request_kind``) before anything is done for it: a live reader past the cap is answered 503
  with ``Retry-After`` and the CORS headers the origin gives its ``Origin``, and its connection
  closes; a live reader's slot is given back when its handler ends, whatever the outcome.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import resource
import socket
import time
from collections.abc import AsyncIterator

from aiohttp import HttpVersion11, web
from aiohttp.typedefs import Handler
from multidict import CIMultiDict

from edge.answer import Answer
from edge.auth.gate import Gate
from edge.catchup import CatchupCache, FillOverdue, RelayInstead
from edge.cdn.purger import CdnPurger
from edge.config import Settings
from edge.live.answers import sse_encoding
from edge.live.hub import LiveHub
from edge.live.polls import AlreadyWritten, Framing, Socket
from edge.live.viewers import Viewer
from edge.log.stream_log import LogKey
from edge.metrics import Metrics
from edge.origin import BodyTooLarge, OriginClient, OriginError
from edge.protocol.headers import names_this_proxy
from edge.protocol.paths import BadTarget
from edge.protocol.reads import Classified, Read, RequestKind, classify, scope_credentials
from edge.store.shared import SharedTier
from edge.web.admin import ReadinessProbe, add_admin_routes
from edge.web.connection_tracker import CONNECTIONS, ConnectionTracker
from edge.web.descriptors import budget_for, limits_for
from edge.web.fastpath import FastPath
from edge.web.front import CatchupFront, CorsUnknown, catchup_request
from edge.web.gatekeeper import GATE, admit, reader_scope, seconds_left, shared_credentials
from edge.web.proxy import (
    ClientGone,
    EdgeResponse,
    EdgeStreamResponse,
    OriginCors,
    Relay,
    edge_answer,
    origin_error_response,
    reader_only,
    request_origin,
    request_target,
)
from edge.web.wire import VIA, AlreadyWrittenResponse, client_headers, encode

logger = logging.getLogger(__name__)

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
RELAY = web.AppKey("relay", Relay)
CACHE = web.AppKey("cache", CatchupCache)
HUB = web.AppKey("hub", LiveHub)
CORS = web.AppKey("cors", OriginCors)
FAST = web.AppKey("fast", FastPath)
FRONT = web.AppKey("front", CatchupFront)
PURGER = web.AppKey("purger", CdnPurger)  # only with --cdn-purge


# The status of the answer aiohttp is handed for a client that went away (nginx's 499); it is
# never written, and never counted as an answered request.
CLIENT_CLOSED = 499


def credentials_of(request: web.Request) -> list[tuple[str, str]]:
    """The client's headers a cache fill or a live tail sends upstream for this request's scope:
    the configured credential headers, the Cookie cut down to the configured cookies; for a
    read the edge authorized, the edge's own ``--origin-header`` instead."""
    shared = shared_credentials(request)
    if shared is not None:
        return shared
    settings = request.app[SETTINGS]
    return scope_credentials(
        request.headers.items(),
        scope_headers=settings.scope_headers,
        scope_cookies=settings.scope_cookies,
    )


def answer_headers_for(request: web.Request, answer: Answer) -> CIMultiDict[str]:
    """Every header of the edge's answer but those aiohttp adds (Content-Length, Date)."""
    return client_headers(
        answer, request.app[CORS], request_origin(request), reader_only=reader_only(request)
    )


def to_response(
    request: web.Request, answer: Answer, headers: CIMultiDict[str] | None = None
) -> web.Response:
    if headers is None:
        headers = answer_headers_for(request, answer)
    request.app[METRICS].served_bytes.inc(len(answer.body))
    return EdgeResponse(status=answer.status, body=answer.body, headers=headers)


def origin_failed(request: web.Request, error: OriginError) -> web.Response:
    request.app[METRICS].origin_errors.labels(reason=error.reason).inc()
    logger.warning(
        "origin error for %s %r: %s", request.method, request_target(request).upstream, error
    )
    return origin_error_response(error, request.app[CORS], request_origin(request))


async def serve_catchup(request: web.Request, classified: Classified) -> web.StreamResponse:
    """A catch-up read from the cache; the origin is asked only for what the cache lacks."""
    read = classified.read
    assert read is not None
    metrics = request.app[METRICS]
    catchup = catchup_request(
        request_target(request),
        read,
        list(request.headers.items()),
        version=(request.version.major, request.version.minor),
        credentials=credentials_of(request),
        reader_only=reader_only(request),
        cors=request.app[CORS],
    )
    try:
        answer, headers = await request.app[FRONT].answer(catchup)
    except BodyTooLarge as uncacheable:
        logger.info("relaying without caching: %s", uncacheable)
        metrics.cache_result("bypass").inc()
        return await relay_uncached(request, classified, uncacheable)
    except OriginError as error:
        return origin_failed(request, error)
    metrics.cache_result(answer.result).inc()
    response = to_response(request, answer, headers)
    if answer.hold is None:
        return response
    # Bytes fresh from the origin count in --fill-buffer-bytes until they are written.
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionResetError as gone:
        raise ClientGone from gone
    finally:
        answer.hold.release()
    return response


async def serve_head(request: web.Request, read: Read) -> web.StreamResponse | None:
    """A HEAD the edge answers itself, when it knows the whole stream (``CatchupCache.head``);
    None: the origin answers it. A conditional HEAD is the origin's to judge."""
    if "If-None-Match" in request.headers or request.app[CORS].unknown_for(request_origin(request)):
        return None
    catchup = catchup_request(
        request_target(request), read, list(request.headers.items()),
        version=(request.version.major, request.version.minor),
        credentials=credentials_of(request), reader_only=reader_only(request),
        cors=request.app[CORS], head=True,
    )  # fmt: skip
    known = await request.app[FRONT].head(catchup)
    if known is None:
        return None
    answer, headers = known
    request.app[METRICS].cache_result(answer.result).inc()
    return EdgeResponse(status=answer.status, headers=headers)


async def start_offset(
    request: web.Request, key: LogKey, offset: str, last_event_id: str | None
) -> str | Answer:
    """Where a live read starts: ``now`` is the tail; a ``Last-Event-ID`` further on than the URL
    wins, so a browser EventSource reconnecting to its original URL resumes exactly (even one
    opened at ``offset=now``: its Last-Event-ID is where it left off, not the tail now)."""
    if offset == "now" and last_event_id and last_event_id != "now":
        return last_event_id
    if offset == "now":
        resolved = await request.app[HUB].tail_now(key, credentials_of(request))
        if isinstance(resolved, Answer):
            return resolved
        offset = resolved
    if last_event_id and last_event_id != "now" and last_event_id > offset:
        offset = last_event_id
    return offset


async def serve_long_poll(request: web.Request, classified: Classified) -> web.StreamResponse:
    read = classified.read
    assert read is not None
    assert read.offset is not None
    hub = request.app[HUB]
    key = LogKey(stream=read.stream, scope=read.scope)
    try:
        offset = await start_offset(request, key, read.offset, None)
        if isinstance(offset, Answer):
            return to_response(request, offset)
        transport = request.transport
        socket = (
            Socket(
                transport=transport,
                framing=Framing(
                    version=(request.version.major, request.version.minor),
                    keep_alive=request.keep_alive,
                    reader_only=reader_only(request),
                    origin=request_origin(request),
                ),
            )
            if transport is not None
            else None
        )
        answer = await hub.long_poll(
            key,
            offset,
            read.cursor,
            credentials_of(request),
            max_seconds=seconds_left(request),
            socket=socket,
        )
    except BodyTooLarge as uncacheable:
        # A backlog bigger than the edge keeps in one piece (or an answer that is not the
        # cache's to give): the origin answers it directly.
        return await relay_uncached(request, classified, uncacheable)
    except OriginError as error:
        return origin_failed(request, error)
    if isinstance(answer, AlreadyWritten):
        return AlreadyWrittenResponse(answer)  # released with its group: on the wire already
    return to_response(request, answer)


async def relay_uncached(
    request: web.Request, classified: Classified, why: BodyTooLarge
) -> web.StreamResponse:
    if isinstance(why, CorsUnknown):
        detail = "cors"
    elif isinstance(why, FillOverdue):
        detail = "fill-overdue"
    else:
        detail = "not-cacheable" if isinstance(why, RelayInstead) else "too-large"
    return await request.app[RELAY].forward(
        request,
        classified.kind,
        cache_status=f"edge; fwd=bypass; detail={detail}",
        validators=False,  # the origin's tags do not tell stream instances apart
    )


def refuse_for_room(request: web.Request) -> web.Response:
    """A live reader past the cap: 503 a browser's EventSource can read, and the connection
    closes after it (a refused viewer holds no room while it waits to retry)."""
    refused = edge_answer(
        503,
        "edge is at --max-viewers",
        request.app[CORS],
        [("Retry-After", "5")],
        origin=request_origin(request),
    )
    refused.force_close()
    return refused


async def serve_sse(request: web.Request, classified: Classified) -> web.StreamResponse:
    read = classified.read
    assert read is not None
    assert read.offset is not None
    hub, metrics, settings = request.app[HUB], request.app[METRICS], request.app[SETTINGS]
    key = LogKey(stream=read.stream, scope=read.scope)
    credentials = credentials_of(request)
    try:
        offset = await start_offset(request, key, read.offset, read.last_event_id)
        if isinstance(offset, Answer):
            return to_response(request, offset)
        refused = await hub.known_from(key, offset, credentials)
    except BodyTooLarge as uncacheable:
        return await relay_uncached(request, classified, uncacheable)
    except OriginError as error:
        return origin_failed(request, error)
    if refused is not None:
        return to_response(request, refused)
    log = hub.cache.local.log_for(key)
    response = EdgeStreamResponse(status=200)
    cors = request.app[CORS]
    response.headers.extend(cors.grant(request_origin(request)))  # first, as the origin sends
    response.headers.extend(log.header_template)
    cors.mark_vary(response.headers)
    response.headers["Content-Type"] = "text/event-stream"
    # No cache keeps it (no-store), and no proxy buffers or alters it (PROTOCOL-NOTES trap 4).
    response.headers["Cache-Control"] = "no-cache, no-store, no-transform"
    response.headers["X-Accel-Buffering"] = "no"
    if sse_encoding(log.content_type) == "base64":
        response.headers["stream-sse-data-encoding"] = "base64"
    response.headers["Cache-Status"] = "edge; hit; detail=live"
    response.headers["Via"] = VIA
    try:
        await response.prepare(request)
    except ConnectionResetError as gone:
        raise ClientGone from gone
    if request.transport is not None:
        # Bound what one viewer can hold, in this process and in the kernel; past it the
        # viewer's writes wait and it lags, reading the log at its own pace.
        request.transport.set_write_buffer_limits(high=settings.sse_buffer_bytes)
        sock = request.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, settings.sse_buffer_bytes)

    async def write(frame: bytes) -> None:
        await response.write(frame)
        metrics.served_bytes.inc(len(frame))

    loop = asyncio.get_running_loop()
    assert request.transport is not None
    ends = [loop.time() + settings.sse_max_seconds] if settings.sse_max_seconds else []
    credential_left = seconds_left(request)
    if credential_left is not None:
        ends.append(loop.time() + credential_left)  # ended cleanly when its token expires
    viewer = Viewer(
        key=key,
        offset=offset,
        transport=request.transport,
        # aiohttp frames HTTP/1.1 bodies without a length as chunks; direct writes must too.
        chunked=request.version >= HttpVersion11,
        client_cursor=read.cursor,
        fixed_cursor=hub.fixed_cursor(read.cursor),
        rotate_at=min(ends) if ends else None,
        last_write=loop.time(),
    )
    metrics.sse_viewers.inc()
    try:
        await hub.fanout.serve(viewer, credentials, write)
        await response.write_eof()
    except ConnectionError:
        pass  # the viewer left; it resumes by offset wherever it reconnects
    except (OriginError, BodyTooLarge) as error:
        # Headers are gone already: end the connection; the client resumes by offset.
        if isinstance(error, OriginError):
            metrics.origin_errors.labels(reason=error.reason).inc()
        request.transport.abort()
    finally:
        metrics.sse_viewers.dec()
    return response


async def dispatch(request: web.Request, classified: Classified) -> web.StreamResponse:
    read = classified.read
    kind = classified.kind
    if kind is RequestKind.CONTROL:
        # The origin's control API: relayed as it is, whatever it asks (PROTOCOL.md 6).
        return await request.app[RELAY].forward(
            request, kind, cache_status="edge; fwd=bypass; detail=control"
        )
    live = kind in (RequestKind.SSE, RequestKind.LONG_POLL)
    if live and request.app[CORS].unknown_for(request_origin(request)):
        # Its CORS headers are the origin's to say for this Origin: its answer teaches the edge.
        return await request.app[RELAY].forward(
            request, kind, cache_status="edge; fwd=bypass; detail=cors"
        )
    if read is not None and read.plain and read.offset is not None:
        if kind is RequestKind.SSE:
            return await serve_sse(request, classified)
        if kind is RequestKind.LONG_POLL:
            return await serve_long_poll(request, classified)
    if kind is RequestKind.CATCHUP and read is not None:
        if read.plain and read.offset != "now":
            return await serve_catchup(request, classified)
        request.app[METRICS].cache_result("bypass").inc()
    if kind is RequestKind.HEAD and read is not None and read.plain:
        known = await serve_head(request, read)
        if known is not None:
            return known
    forward = "method" if classified.kind is RequestKind.WRITE else "bypass"
    return await request.app[RELAY].forward(
        request, classified.kind, cache_status=f"edge; fwd={forward}"
    )


async def handle_stream_request(request: web.Request) -> web.StreamResponse:
    metrics = request.app[METRICS]
    settings = request.app[SETTINGS]
    try:
        target = request_target(request)
    except BadTarget as bad:
        metrics.request_count(RequestKind.OTHER, 400).inc()
        return edge_answer(400, str(bad), request.app[CORS], origin=request_origin(request))
    if names_this_proxy(request.headers.getall("Via", ())):
        # Round a loop (a CDN in front whose backend leads back to it): relaying it again
        # would only go round once more.
        metrics.request_count(RequestKind.OTHER, 508).inc()
        return edge_answer(
            508, "loop detected: this request already passed through the edge",
            request.app[CORS], [("Cache-Control", "no-store")], origin=request_origin(request),
        )  # fmt: skip
    if target.asterisk:
        # OPTIONS * asks about the server, not a stream: the origin's own answer to any OPTIONS.
        metrics.request_count(RequestKind.OTHER, 204).inc()
        server_options = EdgeResponse(status=204)
        request.app[CORS].add_missing(server_options.headers, request_origin(request))
        return server_options
    refused = await admit(request, request.app[CORS])
    if refused is not None:
        kind = classify(request.method, target.stream, target.query, ()).kind
        metrics.request_count(kind, refused.status).inc()
        return refused
    target = request_target(request)  # without token parameters
    classified = classify(
        request.method,
        target.stream,
        target.query,
        request.headers.items(),
        scope_headers=settings.scope_headers,
        scope_cookies=settings.scope_cookies,
        scope=reader_scope(request),
    )
    kind = classified.kind
    connections, transport = request.app[CONNECTIONS], request.transport
    # Decided before the first await for it, so concurrent arrivals cannot overshoot a cap.
    if transport is not None and connections.request_kind(transport, kind) is not None:
        metrics.request_count(kind, 503).inc()
        return refuse_for_room(request)
    open_gauge = metrics.open_requests(kind)
    open_gauge.inc()
    started = time.perf_counter()
    code: int | None = None  # None: the client left (or the handler failed) first
    try:
        response = await dispatch(request, classified)
        code = response.status
        return response
    except ClientGone:
        logger.debug(
            "client left before its answer to %s %r was written", request.method, target.upstream
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


@web.middleware
async def asterisk_form(request: web.Request, handler: Handler) -> web.StreamResponse:
    """``OPTIONS *`` matches no path route; it still belongs to the stream handler."""
    if request.raw_path == "*":
        return await handle_stream_request(request)
    return await handler(request)


def create_app(
    settings: Settings,
    metrics: Metrics,
    origin: OriginClient,
    *,
    connections: ConnectionTracker | None = None,
) -> web.Application:
    """The stream application. The origin client and the cache tiers live and die with it.
    ``connections``: the stream listener's tracker (``edge.server`` makes it from its
    descriptor budget); without one, a tracker of this process's limit, whose table sees only
    the kinds of requests (a test server has no connection hook)."""
    app = web.Application(middlewares=[asterisk_form])
    app[SETTINGS] = settings
    app[METRICS] = metrics
    if connections is None:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        limit = -1 if soft == resource.RLIM_INFINITY else soft
        connections = ConnectionTracker(limits_for(settings, budget_for(settings, limit)))
    app[CONNECTIONS] = connections
    cors = OriginCors()
    app[CORS] = cors
    origin.listen_to_answers(cors.remember)
    redis_target = settings.redis_target
    shared = (
        SharedTier(
            redis_target,
            metrics,
            ttl_seconds=settings.redis_ttl_seconds,
            timeout_seconds=settings.redis_timeout_seconds,
        )
        if redis_target is not None
        else None
    )
    cache = CatchupCache(settings, origin, metrics, shared=shared)
    hub = LiveHub(settings, cache, origin, metrics)
    # Long-polls released together are written directly, framed as aiohttp would frame them.
    hub.polls.encode = functools.partial(encode, cors=cors)
    app[CACHE] = cache
    app[HUB] = hub
    app[RELAY] = Relay(
        origin=origin,
        metrics=metrics,
        cors=cors,
        observe=cache.observe,
        ticket=cache.instances.tickets.ticket,
    )
    gate = Gate(settings, metrics) if settings.auth_mode != "none" else None
    if gate is not None:
        app[GATE] = gate
    fast = FastPath(settings, cache.local, cors, gate=gate)
    app[FAST] = fast
    app[FRONT] = CatchupFront(cache=cache, fast=fast, cors=cors)
    metrics.fold_at_scrape(fast.fold_into)
    purger = CdnPurger(settings, cache.instances.forgetter, metrics) if settings.cdn_purge else None
    if purger is not None:
        app[PURGER] = purger
        cache.instances.forgetter.tellers.append(purger.forgot)

    async def lifetime(_: web.Application) -> AsyncIterator[None]:
        await origin.start()
        if gate is not None:
            await gate.start()
        if shared is not None:
            await shared.start()  # before the listener opens: readiness knows Redis from the first
            forgetter = cache.instances.forgetter
            shared.listen_for_purges(forgetter.forgotten_elsewhere, forgetter.resync)
        if purger is not None:
            await purger.start()
        yield
        if purger is not None:
            await purger.close()  # drained: within --drain-seconds of start_draining
        await hub.close()
        if gate is not None:
            await gate.close()
        await cache.close()
        if shared is not None:
            await shared.close()
        await origin.close()

    app.cleanup_ctx.append(lifetime)
    app.router.add_route("*", "/{tail:.*}", handle_stream_request)
    return app


def create_admin_app(
    settings: Settings, metrics: Metrics, stream_app: web.Application
) -> web.Application:
    app = web.Application()
    hub = stream_app[HUB]
    add_admin_routes(app, metrics, ReadinessProbe(settings), stream_app[CACHE], hub.draining)
    return app
