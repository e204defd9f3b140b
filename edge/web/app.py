"""The two aiohttp applications: stream traffic (every path) and the admin listener.

Rules this module owns:

* The stream application is built by the composition root (``edge.web.wiring``); this module
  only registers what the handlers use, the lifetime of what the root built, and the routes:
  every path of every method goes to ``edge.web.dispatch.handle_stream_request``, and so does
  ``OPTIONS *``.
* The admin listener serves health, readiness, metrics and purges of the stream application it
  stands beside.
"""

from __future__ import annotations

from aiohttp import web

from edge.config import Settings
from edge.metrics import Metrics
from edge.origin import OriginClient
from edge.web.admin import ReadinessProbe, add_admin_routes
from edge.web.connection_table import Limits
from edge.web.connection_tracker import CONNECTIONS
from edge.web.dispatch import asterisk_form, handle_stream_request
from edge.web.gatekeeper import GATE
from edge.web.keys import CORS, FAST, FRONT, HUB, METRICS, PURGER, RELAY, RESUME, SETTINGS
from edge.web.proxy import answer_http10_as_http11
from edge.web.wiring import WIRED, lifetime, wire


def create_app(
    settings: Settings,
    metrics: Metrics,
    origin: OriginClient,
    *,
    limits: Limits | None = None,
) -> web.Application:
    """The stream application. The origin client and the cache tiers live and die with it.
    ``limits``: the stream listener's connection limits (``edge.server`` makes them from its
    descriptor budget; the root builds its tracker, ``app[CONNECTIONS]``); without them, those
    of this process's limit, for a tracker whose table sees only the kinds of requests (a test
    server has no connection hook)."""
    wired = wire(settings, metrics, origin, limits=limits)
    app = web.Application(middlewares=[asterisk_form])
    app[WIRED] = wired
    app[SETTINGS] = settings
    app[METRICS] = metrics
    app[CONNECTIONS] = wired.connections
    app[CORS] = wired.cors
    app[HUB] = wired.hub
    app[RELAY] = wired.relay
    app[FAST] = wired.fast
    app[FRONT] = wired.front
    app[RESUME] = wired.resume
    if wired.gate is not None:
        app[GATE] = wired.gate
    if wired.purger is not None:
        app[PURGER] = wired.purger

    app.on_response_prepare.append(answer_http10_as_http11)
    app.cleanup_ctx.append(lambda _: lifetime(wired))
    app.router.add_route("*", "/{tail:.*}", handle_stream_request)
    return app


def create_admin_app(
    settings: Settings, metrics: Metrics, stream_app: web.Application
) -> web.Application:
    app = web.Application()
    wired = stream_app[WIRED]
    add_admin_routes(app, metrics, ReadinessProbe(settings), wired.lifecycle, wired.hub.draining)
    return app


__all__ = ["FAST", "HUB", "METRICS", "PURGER", "SETTINGS", "create_admin_app", "create_app"]
