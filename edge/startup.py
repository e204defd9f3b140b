"""What starting the edge needs in every process shape: one process, a supervisor, a worker.

Rules this module owns:

* A start-up failure a user can fix (a port in use, a host that does not resolve) is a
  ``StartupError`` whose one-line message names the flag (``why`` says it for a socket error);
  ``edge.cli`` prints it and exits 2.
* ``check_redis`` pings once at start-up, so an unreachable Redis is reported at once; the edge
  starts anyway.
* ``run_loop`` runs a process's main coroutine on uvloop where it is installed.
* ``raise_open_file_limit`` lifts the soft open-file limit to the hard one before anything is
  split by it (``edge.web.descriptors``); a worker inherits its supervisor's.
* ``settle_heap`` runs once a serving process is set up, before it takes its first request:
  what start-up made (modules, the application) is frozen out of every later collection, and
  the cyclic collector looks at its oldest generation a tenth as often (``GC_OLD_THRESHOLD``).

``edge.server`` (a process serving streams) and ``edge.workers`` (the supervisor and its
workers) both use these, and neither imports the other for them.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import resource
import socket
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit

from aiohttp import web

from edge.config import Address, RedisTarget
from edge.store.redis_modes import REDIS_ERRORS, connect

logger = logging.getLogger(__name__)

T = TypeVar("T")

# The cyclic collector's third threshold: how many collections of the middle generation come
# between two looks at the oldest (CPython's default is 10). Each viewer that joins leaves ~65
# objects that live (its connection, request, response, viewer), so a join storm grows the heap
# steadily, and at the default a full collection, a pause of the whole process as long as the
# heap is big, comes each time it has grown by a quarter: 2 of up to ~160 ms while 2,000
# viewers joined on this 2-core machine (loadtest.join --gc-pauses). Ten times as many makes
# full collections at most a tenth as frequent per allocation (none in that storm); the young
# collections, which free what dies young, are as frequent and as short as before.
GC_OLD_THRESHOLD = 100

# The start-up Redis check: long enough for a TLS handshake, short enough not to stall a start.
REDIS_STARTUP_PING_SECONDS = 1.0


class StartupError(Exception):
    """The edge cannot start; the message names the flag and says why, on one line."""


def raise_open_file_limit() -> int:
    """Lift the soft open-file limit to the hard one (as Go's runtime does): a systemd default
    of 1024 would otherwise cap a proxy at a few hundred viewers. Returns the soft limit now
    (-1: unlimited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return -1 if soft == resource.RLIM_INFINITY else soft


def bound_url(runner: web.AppRunner, requested: Address) -> str:
    """The URL actually bound (port 0 picks a free port)."""
    for address in runner.addresses:
        if isinstance(address, tuple):
            host = address[0]
            shown = f"[{host}]" if ":" in host else host
            return f"http://{shown}:{address[1]}"
    return f"http://{requested}"


def why(error: OSError, address: Address) -> str:
    if isinstance(error, socket.gaierror):
        return f"cannot resolve host {address.host!r}"
    reasons = {
        errno.EADDRINUSE: "address already in use",
        errno.EADDRNOTAVAIL: "address not available on this machine",
        errno.EACCES: "permission denied",
    }
    return reasons.get(error.errno or 0) or error.strerror or str(error)


def _redis_location(target: RedisTarget) -> str:
    """Where Redis is, without credentials, for a log line."""
    places = []
    for url in target.urls:
        parts = urlsplit(url)
        places.append(
            parts.path if parts.scheme == "unix" else f"{parts.hostname}:{parts.port or 6379}"
        )
    where = ",".join(places)
    if target.mode == "sentinel":
        return f"the primary {target.sentinel_service!r} of the sentinels at {where}"
    if target.mode == "cluster":
        return f"the cluster of seeds {where}"
    return where


async def check_redis(target: RedisTarget) -> bool:
    """One PING at start-up (in cluster mode, of every primary; in sentinel mode, of the
    primary the sentinels name), so an unreachable Redis is reported at once rather than
    noticed by its metrics. Redis is optional at runtime: the edge starts anyway, without the
    shared tier until it answers."""
    link = connect(target, timeout_seconds=REDIS_STARTUP_PING_SECONDS)
    try:
        await asyncio.wait_for(link.ping(), REDIS_STARTUP_PING_SECONDS * 2)
    except REDIS_ERRORS as error:
        logger.warning(
            "--redis-url: Redis at %s does not answer (%s); serving without the shared tier "
            "until it does",
            _redis_location(target),
            type(error).__name__,
        )
        return False
    finally:
        await link.aclose()
    return True


def settle_heap() -> None:
    """Collect what start-up left, move what survives (modules, the application, the metrics)
    to the permanent generation so no collection walks it again (``gc.freeze``), and look at
    the oldest generation a tenth as often (``GC_OLD_THRESHOLD``)."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, GC_OLD_THRESHOLD)


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency everywhere but Windows
        return asyncio.run(main)
    return uvloop.run(main)
