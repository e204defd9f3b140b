"""The admin listener: ``/metrics``, ``/healthz`` (process alive), ``/readyz`` (origin reachable).

It never shares a port with stream traffic, so a scrape or a probe cannot queue behind viewers.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from edge.catchup import CatchupCache
from edge.config import Settings
from edge.metrics import Metrics

# Probes from a load balancer arrive every few seconds from several checkers; one origin
# round trip per second is enough to answer all of them.
READINESS_CACHE_SECONDS = 1.0
READINESS_TIMEOUT_SECONDS = 2.0


class ReadinessProbe:
    """Is the origin answering HTTP at all? Any status counts: 404 for ``/`` is a live origin."""

    def __init__(self, settings: Settings) -> None:
        self._url = settings.origin_base + "/"
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
        try:
            async with self._session.head(self._url, allow_redirects=False) as response:
                self._last = (True, f"origin answered {response.status}")
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            self._last = (False, f"origin unreachable: {type(error).__name__}")
        self._checked_at = now
        return self._last


def add_admin_routes(
    app: web.Application,
    metrics: Metrics,
    probe: ReadinessProbe,
    cache: CatchupCache,
    draining: asyncio.Event,
) -> None:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        ready, detail = await probe.check()
        # Redis being down degrades the edge (no shared tier) but does not make it unready; a
        # draining edge is unready at once, so load balancers stop sending it new viewers.
        body = {
            "ready": ready and not draining.is_set(),
            "origin": detail,
            "redis": cache.shared_state,
            "draining": draining.is_set(),
        }
        ready = bool(body["ready"])
        return web.Response(
            status=200 if ready else 503,
            text=json.dumps(body) + "\n",
            content_type="application/json",
        )

    async def metrics_page(_: web.Request) -> web.Response:
        response = web.Response(body=metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def purge(request: web.Request) -> web.Response:
        path = request.query.get("path", "")
        if not path.startswith("/"):
            return web.Response(status=400, text="purge needs ?path=/the/stream/path\n")
        dropped = cache.purge(path)
        return web.json_response({"purged": path, "segments": dropped})

    app.cleanup_ctx.append(probe.lifetime)
    app.router.add_post("/purge", purge)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
