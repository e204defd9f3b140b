"""Run the edge: the stream listener and the admin listener in one event loop until a signal.

Start-up failures a user can fix (a port in use, a host that does not resolve) are raised as
``StartupError`` (``edge.startup``) with a one-line reason naming the flag; ``edge.cli``
prints it and exits 2. ``edge.cli.run`` chooses between this and the supervisor of
``--workers N`` (``edge.workers``), whose workers run ``serve`` as an ``AsWorker``
(``edge.workers.child.run_worker``); this module imports nothing from ``edge.workers``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web

from edge import __version__
from edge.config import Address, Settings
from edge.metrics import Metrics
from edge.origin import OriginClient
from edge.startup import (
    StartupError,
    bound_url,
    check_redis,
    raise_open_file_limit,
    settle_heap,
    why,
)
from edge.summary import limits_summary, startup_lines
from edge.web.app import create_admin_app, create_app
from edge.web.bounded_site import BoundedSite
from edge.web.client_errors_log import quiet_malformed_requests
from edge.web.connection_tracker import CONNECTIONS, ConnectionTracker
from edge.web.descriptors import DescriptorBudget, budget_for, holds_line, limits_for
from edge.web.gatekeeper import TokenFreeAccessLog
from edge.web.keys import HUB, PURGER, RESUME

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Viewers arrive in herds (a shared demo link); the default backlog of 128 would refuse them.
LISTEN_BACKLOG = 4096
# aiohttp's idle timer on the stream listener, where ConnectionTracker owns idle deadlines.
AIOHTTP_KEEPALIVE_BACKSTOP_SECONDS = 24 * 3600.0


@dataclass(frozen=True, kw_only=True, slots=True)
class AsWorker:
    """``serve`` as one worker of ``--workers N`` (edge.workers.child): it shares the stream
    port with its siblings, and listens on it once ``cleared`` is set (its supervisor has
    recorded where its siblings reach it); ``join`` wires its stream and admin applications to
    its supervisor and siblings before either starts; its supervisor checks Redis at start-up,
    once for all."""

    cleared: threading.Event
    join: Callable[[web.Application, web.Application], None]


def descriptor_budget(settings: Settings) -> DescriptorBudget:
    """This process's split of its open-file limit (raised to the hard limit first); settings
    that ask for more than the limit holds are warned about, not cut."""
    limit = raise_open_file_limit()
    each = budget_for(settings, limit)
    if not each.fits:
        logger.warning(
            "--max-connections %d and --upstream-max-connections %d need %d descriptors, more "
            "than the open-file limit %d: past it, connections fail (raise the limit: README, "
            "'Limits and descriptors')",
            each.clients,
            each.origin,
            each.descriptors,
            limit,
        )
    if settings.max_viewers > each.live:
        logger.warning(
            "--max-viewers %d is more than the connections leave live readers after the short "
            "requests' reserve: this process holds %d",
            settings.max_viewers,
            each.live,
        )
    return each


async def _start(
    app: web.Application,
    address: Address,
    settings: Settings,
    *,
    flag: str,
    tracker: ConnectionTracker | None = None,
    metrics: Metrics | None = None,
) -> web.AppRunner:
    runner = await _set_up(app, settings, tracker=tracker)
    await _listen(runner, address, flag=flag, tracker=tracker, metrics=metrics)
    return runner


async def _set_up(
    app: web.Application, settings: Settings, *, tracker: ConnectionTracker | None = None
) -> web.AppRunner:
    """The application running (its lifetimes entered), not yet listening."""
    runner = web.AppRunner(
        app,
        # A client that disconnects cancels its handler, and so its upstream request.
        handler_cancellation=True,
        access_log=logger if logger.isEnabledFor(logging.DEBUG) else None,
        access_log_class=TokenFreeAccessLog,
        shutdown_timeout=settings.drain_seconds,
        # With a tracker, it alone closes idle connections: aiohttp's own timer cannot see the
        # requests a connection answers itself (edge.web.fastpath), so it stays out of the way.
        keepalive_timeout=(
            settings.keepalive_timeout_seconds + settings.header_timeout_seconds
            if tracker is None
            else AIOHTTP_KEEPALIVE_BACKSTOP_SECONDS
        ),
    )
    await runner.setup()
    return runner


async def _listen(
    runner: web.AppRunner,
    address: Address,
    *,
    flag: str,
    tracker: ConnectionTracker | None = None,
    metrics: Metrics | None = None,
    reuse_port: bool = False,
) -> None:
    """Start accepting on ``address``; StartupError (the runner cleaned up) when it cannot.
    With a ``tracker`` (the stream listener), every readable pass takes what is queued
    (``edge.web.accept_loop``); the admin listener is aiohttp's own site."""
    site: web.BaseSite
    if tracker is None:
        site = web.TCPSite(runner, address.host, address.port, backlog=LISTEN_BACKLOG)
    else:
        site = BoundedSite(
            runner,
            address.host,
            address.port,
            tracker,
            backlog=LISTEN_BACKLOG,
            reuse_port=reuse_port,
            accepted=(lambda _: None) if metrics is None else metrics.accepts_per_pass.observe,
        )
    try:
        await site.start()
    except OSError as error:
        await runner.cleanup()
        raise StartupError(f"{flag} {address}: {why(error, address)}") from None


async def _start_admin(
    admin_app: web.Application, settings: Settings, *, beside: web.AppRunner
) -> web.AppRunner:
    """The admin listener; ``beside`` (the stream runner) is cleaned up if it cannot start."""
    try:
        return await _start(admin_app, settings.admin_listen, settings, flag="--admin-listen")
    except StartupError:
        await beside.cleanup()
        raise


async def _start_worker(
    stream_app: web.Application,
    admin_app: web.Application,
    settings: Settings,
    tracker: ConnectionTracker,
    metrics: Metrics,
    cleared: threading.Event,
) -> tuple[web.AppRunner, web.AppRunner]:
    """A worker takes stream connections only once its siblings can reach it: its admin
    listener first, reported to the supervisor (one ``{"event": "reachable"}`` line), and the
    stream port once the supervisor, having recorded it, clears it to listen."""
    stream_runner = await _set_up(stream_app, settings, tracker=tracker)
    admin_runner = await _start_admin(admin_app, settings, beside=stream_runner)
    reachable = {"event": "reachable", "admin": bound_url(admin_runner, settings.admin_listen)}
    print(json.dumps(reachable), flush=True)
    await asyncio.to_thread(cleared.wait)
    try:
        await _listen(
            stream_runner,
            settings.listen,
            flag="--listen",
            tracker=tracker,
            metrics=metrics,
            reuse_port=True,
        )
    except StartupError:
        await admin_runner.cleanup()
        raise
    return stream_runner, admin_runner


async def serve(settings: Settings, *, worker: AsWorker | None = None) -> None:
    """Run one edge until SIGTERM or SIGINT, alone or as a ``worker`` of ``--workers N``."""
    quiet_malformed_requests()  # a client's malformed request is not the edge's error
    metrics = Metrics()
    each = descriptor_budget(settings)
    origin = OriginClient(settings, pool_limit=each.origin)
    stream_app = create_app(settings, metrics, origin, limits=limits_for(settings, each))
    tracker = stream_app[CONNECTIONS]
    metrics.track_connections(tracker.stats)
    # Outermost, so it sees every request the application handles.
    stream_app.middlewares.insert(0, tracker.middleware)
    admin_app = create_admin_app(settings, metrics, stream_app)
    if worker is not None:
        worker.join(stream_app, admin_app)
    if worker is None:
        stream_runner = await _start(
            stream_app, settings.listen, settings, flag="--listen", tracker=tracker, metrics=metrics
        )
        admin_runner = await _start_admin(admin_app, settings, beside=stream_runner)
    else:
        stream_runner, admin_runner = await _start_worker(
            stream_app, admin_app, settings, tracker, metrics, worker.cleared
        )
    redis_target = settings.redis_target
    if redis_target is not None and worker is None:
        await check_redis(redis_target)
    settle_heap()

    ready = {
        "event": "listening",
        "listen": bound_url(stream_runner, settings.listen),
        "admin": bound_url(admin_runner, settings.admin_listen),
        "origin": settings.origin,
    }
    # The stop handlers go in before the line that says the edge is up: a launcher may signal
    # the moment it reads it, and the default SIGTERM would kill the edge without a drain.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # One machine-readable line on stdout: launchers (tests, demo) read the bound ports from it.
    print(json.dumps(ready), flush=True)
    limits_line = limits_summary(holds_line(each), settings)
    if worker is None:
        lines = startup_lines(
            settings, listen=ready["listen"], admin=ready["admin"], version=__version__,
            limits=limits_line,
        )  # fmt: skip
        logger.info("%s", "\n".join(lines))
    else:  # its supervisor speaks for the edge; a worker's own ports are for debugging
        logger.debug("worker listening on %s (admin %s); %s", ready["listen"], ready["admin"],
                  limits_line)  # fmt: skip

    await stop.wait()
    logger.info("stopping: draining for up to %.0f s", settings.drain_seconds)
    # Live readers end cleanly first (clients resume elsewhere by offset, or by a resume
    # route's id); then the runner stops accepting and waits for what is left, up to
    # --drain-seconds, while the CDN purges still owed (and resume routes' pumps) go on.
    stream_app[HUB].start_draining()
    stream_app[RESUME].start_draining()
    purger = stream_app.get(PURGER)
    if purger is not None:
        purger.start_draining()
    await stream_runner.cleanup()
    await admin_runner.cleanup()
