"""The two aiohttp applications: stream traffic (every path) and the admin listener."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from aiohttp import web
from multidict import CIMultiDict

from edge.catchup import Answer, CatchupCache, SegmentTooLarge
from edge.config import Settings
from edge.metrics import Metrics
from edge.origin import OriginClient, OriginError
from edge.protocol.headers import AUTHORIZATION, COOKIE, VIA_PSEUDONYM
from edge.protocol.reads import Classified, RequestKind, classify
from edge.store.shared import SharedTier
from edge.web.admin import ReadinessProbe, add_admin_routes
from edge.web.proxy import Relay, origin_error_response, stream_path

log = logging.getLogger(__name__)

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
RELAY = web.AppKey("relay", Relay)
CACHE = web.AppKey("cache", CatchupCache)

# Status recorded for a request whose client went away before it was answered (nginx's 499).
CLIENT_CLOSED = 499


class EdgeResponse(web.Response):
    """An answer the edge made itself; like relayed ones, it carries no aiohttp ``Server``."""

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()
        self.headers.popall("Server", None)


def to_response(answer: Answer, metrics: Metrics) -> web.Response:
    headers = CIMultiDict(answer.headers)
    headers.add("Cache-Status", answer.cache_status)
    headers.add("Via", f"1.1 {VIA_PSEUDONYM}")
    metrics.served_bytes.inc(len(answer.body))
    return EdgeResponse(status=answer.status, body=answer.body, headers=headers)


async def serve_catchup(request: web.Request, classified: Classified) -> web.StreamResponse:
    """A catch-up read from the cache; the origin is asked only for what the cache lacks."""
    read = classified.read
    assert read is not None
    metrics = request.app[METRICS]
    try:
        answer = await request.app[CACHE].read(
            read,
            credentials=[
                (n, v) for n, v in request.headers.items() if n.lower() in (AUTHORIZATION, COOKIE)
            ],
            if_none_match=request.headers.get("If-None-Match"),
            accept_encoding=request.headers.get("Accept-Encoding"),
        )
    except SegmentTooLarge as too_large:
        log.info("relaying without caching: %s", too_large)
        metrics.cache_requests.labels(result="bypass").inc()
        return await request.app[RELAY].forward(
            request, classified.kind, cache_status="edge; fwd=bypass; detail=too-large"
        )
    except OriginError as error:
        metrics.origin_errors.labels(reason=error.reason).inc()
        return origin_error_response(error)
    metrics.cache_requests.labels(result=answer.result).inc()
    return to_response(answer, metrics)


async def dispatch(request: web.Request, classified: Classified) -> web.StreamResponse:
    read = classified.read
    if classified.kind is RequestKind.CATCHUP and read is not None:
        if read.plain and read.offset != "now":
            return await serve_catchup(request, classified)
        request.app[METRICS].cache_requests.labels(result="bypass").inc()
    forward = "method" if classified.kind is RequestKind.WRITE else "bypass"
    return await request.app[RELAY].forward(
        request, classified.kind, cache_status=f"edge; fwd={forward}"
    )


async def handle_stream_request(request: web.Request) -> web.StreamResponse:
    metrics = request.app[METRICS]
    classified = classify(
        request.method, stream_path(request), request.query_string, request.headers.items()
    )
    kind = classified.kind
    open_gauge = metrics.open_connections.labels(kind=kind.value)
    open_gauge.inc()
    started = time.perf_counter()
    code = CLIENT_CLOSED
    try:
        response = await dispatch(request, classified)
        code = response.status
        return response
    finally:
        open_gauge.dec()
        metrics.request_duration.labels(kind=kind.value).observe(time.perf_counter() - started)
        metrics.requests.labels(kind=kind.value, code=str(code)).inc()


def create_app(settings: Settings, metrics: Metrics, origin: OriginClient) -> web.Application:
    """The stream application. The origin client and the cache tiers live and die with it."""
    app = web.Application()
    app[SETTINGS] = settings
    app[METRICS] = metrics
    shared = (
        SharedTier(
            settings.redis_url,
            metrics,
            ttl_seconds=settings.redis_ttl_seconds,
            timeout_seconds=settings.redis_timeout_seconds,
        )
        if settings.redis_url
        else None
    )
    cache = CatchupCache(settings, origin, metrics, shared=shared)
    app[CACHE] = cache
    app[RELAY] = Relay(origin=origin, metrics=metrics, observe=cache.observe)

    async def lifetime(_: web.Application) -> AsyncIterator[None]:
        await origin.start()
        yield
        await cache.close()
        if shared is not None:
            await shared.close()
        await origin.close()

    app.cleanup_ctx.append(lifetime)
    app.router.add_route("*", "/{tail:.*}", handle_stream_request)
    return app


def create_admin_app(settings: Settings, metrics: Metrics, cache: CatchupCache) -> web.Application:
    app = web.Application()
    add_admin_routes(app, metrics, ReadinessProbe(settings), cache)
    return app
