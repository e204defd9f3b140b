"""The two aiohttp applications: stream traffic (every path) and the admin listener."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from aiohttp import web

from edge.config import Settings
from edge.metrics import Metrics
from edge.origin import OriginClient
from edge.protocol.reads import classify
from edge.web.admin import ReadinessProbe, add_admin_routes
from edge.web.proxy import Relay

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
ORIGIN = web.AppKey("origin", OriginClient)
RELAY = web.AppKey("relay", Relay)

# Status recorded for a request whose client went away before it was answered (nginx's 499).
CLIENT_CLOSED = 499


async def handle_stream_request(request: web.Request) -> web.StreamResponse:
    metrics = request.app[METRICS]
    kind = classify(
        request.method, request.path, request.query_string, request.headers.items()
    ).kind
    open_gauge = metrics.open_connections.labels(kind=kind.value)
    open_gauge.inc()
    started = time.perf_counter()
    code = CLIENT_CLOSED
    try:
        response = await request.app[RELAY].forward(request, kind)
        code = response.status
        return response
    finally:
        open_gauge.dec()
        metrics.request_duration.labels(kind=kind.value).observe(time.perf_counter() - started)
        metrics.requests.labels(kind=kind.value, code=str(code)).inc()


def create_app(settings: Settings, metrics: Metrics, origin: OriginClient) -> web.Application:
    """The stream application. ``origin`` is started and closed with the app."""
    app = web.Application()
    app[SETTINGS] = settings
    app[METRICS] = metrics
    app[ORIGIN] = origin
    app[RELAY] = Relay(origin=origin, metrics=metrics)

    async def origin_lifetime(_: web.Application) -> AsyncIterator[None]:
        await origin.start()
        yield
        await origin.close()

    app.cleanup_ctx.append(origin_lifetime)
    app.router.add_route("*", "/{tail:.*}", handle_stream_request)
    return app


def create_admin_app(settings: Settings, metrics: Metrics) -> web.Application:
    app = web.Application()
    add_admin_routes(app, metrics, ReadinessProbe(settings))
    return app
