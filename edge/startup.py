"""What starting the edge needs in every process shape: one process, a supervisor, a worker.

Rules this module owns:

* A start-up failure a user can fix (a port in use, a host that does not resolve) is a
  ``StartupError`` whose one-line message names the flag (``why`` says it for a socket error);
  ``edge.cli`` prints it and exits 2.
* ``check_redis`` pings once at start-up, so an unreachable Redis is reported at once; the edge
  starts anyway.
* ``run_loop`` runs a process's main coroutine on uvloop where it is installed.

``edge.server`` (a process serving streams) and ``edge.workers`` (the supervisor and its
workers) both use these, and neither imports the other for them.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis.asyncio as redis
from aiohttp import web
from redis.exceptions import RedisError

from edge.config import Address

log = logging.getLogger(__name__)

T = TypeVar("T")

# The start-up Redis check: long enough for a TLS handshake, short enough not to stall a start.
REDIS_STARTUP_PING_SECONDS = 1.0


class StartupError(Exception):
    """The edge cannot start; the message names the flag and says why, on one line."""


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


def _redis_location(url: str) -> str:
    """Where Redis is, without credentials, for a log line."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname}:{parts.port or 6379}"


async def check_redis(url: str) -> bool:
    """One PING at start-up, so an unreachable Redis is reported at once rather than noticed by
    its metrics. Redis is optional at runtime: the edge starts anyway, without the shared tier
    until it answers."""
    client = redis.Redis.from_url(
        url,
        socket_timeout=REDIS_STARTUP_PING_SECONDS,
        socket_connect_timeout=REDIS_STARTUP_PING_SECONDS,
        retry_on_timeout=False,
    )
    try:
        await asyncio.wait_for(client.ping(), REDIS_STARTUP_PING_SECONDS * 2)
    except (RedisError, OSError, TimeoutError) as error:
        log.warning(
            "--redis-url: Redis at %s does not answer (%s); serving without the shared tier "
            "until it does",
            _redis_location(url),
            type(error).__name__,
        )
        return False
    finally:
        await client.aclose()
    return True


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency everywhere but Windows
        return asyncio.run(main)
    return uvloop.run(main)
