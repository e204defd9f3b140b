"""The admin listener: ``/metrics``, ``/healthz`` (process alive), ``/readyz`` (origin ready),
``POST /purge``.

It never shares a port with stream traffic, so a scrape or a probe cannot queue behind viewers.

* ``/readyz`` is ready only when the origin answers its probe with 2xx or 3xx: ``OPTIONS /`` by
  default (a Durable Streams origin answers CORS preflights on any path; the reference origin
  answers 404 to ``HEAD /``), or ``GET --origin-health-path``.
* ``/purge`` makes the edge forget a stream everywhere, so it is guarded: with
  ``--admin-token`` (alias ``--purge-token``) it needs ``Authorization: Bearer <token>`` (401
  otherwise); without one it is open only on a loopback admin listener and refused (403) on any
  other. ``/metrics``, ``/healthz`` and ``/readyz`` stay open, as Prometheus and probes expect,
  unless ``--admin-protect all`` asks for the token there too.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CONTENT_TYPE_LATEST

from edge.config import Settings
from edge.lifecycle import StreamLifecycle
from edge.metrics import Metrics
from edge.protocol.paths import BadTarget, normalise_path
from edge.web.proxy import EdgeResponse

# Probes from a load balancer arrive every few seconds from several checkers; one origin
# round trip per second is enough to answer all of them.
READINESS_CACHE_SECONDS = 1.0
READINESS_TIMEOUT_SECONDS = 2.0


class ReadinessProbe:
    """Is the origin ready? One probe per ``READINESS_CACHE_SECONDS``, ready on 2xx/3xx only."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        path = settings.origin_health_path
        self._method = "OPTIONS" if path is None else "GET"
        self._path = path or "/"
        self._url = settings.origin_base + self._path
        self._session: aiohttp.ClientSession | None = None
        self._checked_at = float("-inf")
        self._last: tuple[bool, str] = (False, "not checked yet")

    async def lifetime(self, _: web.Application) -> AsyncIterator[None]:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=READINESS_TIMEOUT_SECONDS)
        )
        yield
        await self._session.close()

    async def check(self) -> tuple[bool, str]:
        now = time.monotonic()
        if now - self._checked_at < READINESS_CACHE_SECONDS or self._session is None:
            return self._last
        probe = f"{self._method} {self._path}"
        try:
            async with self._session.request(
                self._method, self._url, allow_redirects=False
            ) as response:
                status = response.status
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            self._last = (False, f"origin unreachable: {type(error).__name__}")
        else:
            if 200 <= status < 400:
                self._last = (True, f"origin answered {status} to {probe}")
            else:
                hint = "" if self.settings.origin_health_path else "; see --origin-health-path"
                self._last = (False, f"origin answered {status} to {probe}{hint}")
        self._checked_at = now
        return self._last


@dataclass(frozen=True, kw_only=True, slots=True)
class PurgeRefusal:
    status: int
    reason: str


def purge_refusal(
    *, token: str | None, admin_on_loopback: bool, authorization: str | None
) -> PurgeRefusal | None:
    """Why a purge request may not proceed, or None when it may."""
    if token is None:
        if admin_on_loopback:
            return None
        return PurgeRefusal(
            status=403,
            reason="purge is disabled: the admin listener is reachable from other machines; "
            "set --admin-token (EDGE_ADMIN_TOKEN) and send Authorization: Bearer <token>",
        )
    scheme, _, credentials = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(
        credentials.strip().encode("utf-8", "surrogateescape"), token.encode()
    ):
        return None
    return PurgeRefusal(status=401, reason="purge needs Authorization: Bearer <--admin-token>")


def purge_target(request: web.Request, settings: Settings) -> str | web.Response:
    """The stream a ``POST /purge`` names (as the origin names it, aliases included), or the
    refusal to send: no or a wrong token, no ``?path=``, a path the origin cannot name."""
    refusal = purge_refusal(
        token=settings.purge_token,
        admin_on_loopback=settings.admin_on_loopback,
        authorization=request.headers.get("Authorization"),
    )
    if refusal is not None:
        headers = {"WWW-Authenticate": "Bearer"} if refusal.status == 401 else None
        return EdgeResponse(status=refusal.status, text=refusal.reason + "\n", headers=headers)
    path = request.query.get("path", "")
    if not path.startswith("/") or path.startswith("//"):
        # "//x" would parse as a host name and purge "/": refuse it, as the origin cannot name it.
        return EdgeResponse(status=400, text="purge needs ?path=/the/stream/path\n")
    try:
        return normalise_path(path)
    except BadTarget:
        return EdgeResponse(status=400, text="purge needs a stream path the origin can name\n")


def admin_guard(settings: Settings) -> Middleware:
    """With ``--admin-protect all``, every admin path but ``/purge`` (which checks the token
    itself, with its own answers) needs the admin token too."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if settings.admin_protect == "all" and request.path != "/purge":
            refusal = purge_refusal(
                token=settings.purge_token,
                admin_on_loopback=settings.admin_on_loopback,
                authorization=request.headers.get("Authorization"),
            )
            if refusal is not None:
                return EdgeResponse(
                    status=401,
                    text="the admin listener needs Authorization: Bearer <--admin-token>\n",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return await handler(request)

    return guard


def add_admin_routes(
    app: web.Application,
    metrics: Metrics,
    probe: ReadinessProbe,
    lifecycle: StreamLifecycle,
    draining: asyncio.Event,
) -> None:
    settings = probe.settings

    app.middlewares.append(admin_guard(settings))

    async def healthz(_: web.Request) -> web.Response:
        return EdgeResponse(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        ready, detail = await probe.check()
        # Redis being down degrades the edge (no shared tier) but does not make it unready; a
        # draining edge is unready at once, so load balancers stop sending it new viewers.
        body = {
            "ready": ready and not draining.is_set(),
            "origin": detail,
            "redis": lifecycle.shared_state,
            "draining": draining.is_set(),
        }
        ready = bool(body["ready"])
        return EdgeResponse(
            status=200 if ready else 503,
            text=json.dumps(body) + "\n",
            content_type="application/json",
        )

    async def metrics_page(_: web.Request) -> web.Response:
        response = EdgeResponse(body=metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def purge(request: web.Request) -> web.Response:
        path = purge_target(request, settings)
        if isinstance(path, web.Response):
            return path
        dropped = lifecycle.forget(path)
        # Durable: every replica, including ones partitioned now, stops serving it. If the shared
        # tier has not taken it yet, say so (it keeps being retried): 202, not 200.
        durable = await lifecycle.forgotten_everywhere(path)
        return EdgeResponse(
            text=json.dumps({"purged": path, "segments": dropped, "durable": durable}),
            content_type="application/json",
            status=200 if durable else 202,
        )

    app.cleanup_ctx.append(probe.lifetime)
    app.router.add_post("/purge", purge)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
