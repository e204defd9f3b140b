"""Run the edge: the stream listener and the admin listener in one event loop until a signal."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from urllib.parse import urlsplit

from aiohttp import web

from edge.config import Address, Settings
from edge.metrics import Metrics
from edge.origin import OriginClient
from edge.web.app import HUB, create_admin_app, create_app

log = logging.getLogger(__name__)

# Viewers arrive in herds (a shared demo link); the default backlog of 128 would refuse them.
LISTEN_BACKLOG = 4096


def _bound_url(runner: web.AppRunner, requested: Address) -> str:
    """The URL actually bound (port 0 picks a free port)."""
    for address in runner.addresses:
        if isinstance(address, tuple):
            host = address[0]
            shown = f"[{host}]" if ":" in host else host
            return f"http://{shown}:{address[1]}"
    return f"http://{requested}"


async def _start(app: web.Application, address: Address, settings: Settings) -> web.AppRunner:
    runner = web.AppRunner(
        app,
        # A client that disconnects cancels its handler, and so its upstream request.
        handler_cancellation=True,
        access_log=log if log.isEnabledFor(logging.DEBUG) else None,
        shutdown_timeout=settings.drain_seconds,
    )
    await runner.setup()
    site = web.TCPSite(runner, address.host, address.port, backlog=LISTEN_BACKLOG)
    await site.start()
    return runner


async def serve(settings: Settings) -> None:
    metrics = Metrics()
    origin = OriginClient(settings)
    stream_app = create_app(settings, metrics, origin)
    stream_runner = await _start(stream_app, settings.listen, settings)
    admin_app = create_admin_app(settings, metrics, stream_app)
    admin_runner = await _start(admin_app, settings.admin_listen, settings)

    ready = {
        "event": "listening",
        "listen": _bound_url(stream_runner, settings.listen),
        "admin": _bound_url(admin_runner, settings.admin_listen),
        "origin": settings.origin,
    }
    # One machine-readable line on stdout: launchers (tests, demo) read the bound ports from it.
    print(json.dumps(ready), flush=True)
    log.info(
        "edge listening on %s (admin %s), origin %s",
        ready["listen"],
        ready["admin"],
        urlsplit(settings.origin).netloc,
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    log.info("stopping: draining for up to %.0f s", settings.drain_seconds)
    # Live readers end cleanly first (clients resume elsewhere by offset); then the runner stops
    # accepting and waits for what is left, up to --drain-seconds.
    stream_app[HUB].start_draining()
    await stream_runner.cleanup()
    await admin_runner.cleanup()


def run(settings: Settings) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency everywhere but Windows
        asyncio.run(serve(settings))
    else:
        uvloop.run(serve(settings))
