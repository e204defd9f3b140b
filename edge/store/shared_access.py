"""The shared tier's guarded way to Redis: bounded, counted, and behind a circuit breaker.

Rules this module owns:

* Every operation is bounded by ``timeout_seconds`` and guarded by a circuit breaker: Redis down
  or slow means service from the local tier and the origin, with no client error, until a probe
  after the cooldown finds it back.
* At most ``MAX_REDIS_COMMANDS`` operations are in flight at once; the others wait for one to
  end, within their own bound. The connections the edge holds to Redis follow that bound, not
  the busiest moment it ever had (redis-py's pool keeps every connection it ever opened).
* Redis is **up** only once it has answered (``start`` pings it before the edge takes traffic)
  and while the breaker is closed; until then readiness and ``edge_redis_up`` say down and
  nothing waits on it. While it is not up, a ping every ``PROBE_SECONDS`` (as the breaker
  allows) finds it, so it comes up without waiting for traffic.
* Every operation is counted (``edge_redis_operations_total{op,result}``); the first failure
  while up is logged at WARNING, the way back at INFO.
* In a cluster, one breaker guards all shards: a shard that fails (its primary died, its
  replica not yet promoted) degrades the whole tier to local + origin until the probe, which
  pings every primary, finds them all back (``edge.store.redis_modes``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from edge.config import RedisTarget
from edge.metrics import Metrics
from edge.store.breaker import BreakerState, CircuitBreaker
from edge.store.redis_modes import REDIS_ERRORS, connect

# The shared tier's own logger: operators read (and alert on) its lines under that name.
logger = logging.getLogger("edge.store.shared")

# Commands (or one purge's or write's sequence of them) in flight at once, each on a connection
# of its own: redis-py's pool never closes one, so without this bound it would keep as many as
# the busiest moment so far needed (a soak's descriptors grew step by step).
MAX_REDIS_COMMANDS = 64
PROBE_SECONDS = 1.0

Errors = REDIS_ERRORS


class GuardedRedis:
    def __init__(
        self,
        target: RedisTarget,
        metrics: Metrics,
        *,
        timeout_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.link = connect(target, timeout_seconds=timeout_seconds)
        self.client = self.link.commands
        self.timeout = timeout_seconds
        self.commands = asyncio.Semaphore(MAX_REDIS_COMMANDS)
        self._metrics = metrics
        self._clock = clock
        self._breaker = CircuitBreaker()
        # Redis has answered once: a closed breaker alone says only that nothing failed yet.
        self._reached = False
        self._prober: asyncio.Task[None] | None = None
        metrics.redis_up.set(0)

    @property
    def up(self) -> bool:
        return self._reached and self._breaker.state is BreakerState.CLOSED

    def allow(self) -> bool:
        """May an operation that the breaker gates be tried now?"""
        return self._breaker.allow(self._clock())

    async def start(self) -> None:
        """Ping Redis once, so reachability is known before readiness is asked, then keep
        pinging while it is not up."""
        await self._ping()
        self._prober = asyncio.ensure_future(self._probe_while_down())

    async def _ping(self) -> None:
        if not self.allow():
            return
        try:
            async with asyncio.timeout(self.timeout), self.commands:
                await self.link.ping()
        except Errors as error:
            self.failed("ping", error)
            return
        self.succeeded()
        self.count("ping", "ok")

    async def _probe_while_down(self) -> None:
        while True:
            await asyncio.sleep(PROBE_SECONDS)
            if not self.up:
                await self._ping()

    async def stop_probing(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)

    async def aclose(self) -> None:
        await self.link.aclose()

    def count(self, op: str, result: str) -> None:
        self._metrics.redis_operations.labels(op=op, result=result).inc()

    def failed(self, op: str, error: BaseException) -> None:
        was_up = self.up
        self._breaker.failure(self._clock())
        self.count(op, "error")
        self._metrics.redis_up.set(1 if self.up else 0)
        if was_up and not self.up:
            logger.warning("shared tier unavailable, serving from local + origin: %r", error)

    def succeeded(self) -> None:
        if not self.up:
            logger.info("shared tier is back" if self._reached else "shared tier reached")
        self._reached = True
        self._breaker.success()
        self._metrics.redis_up.set(1)

    async def mget(self, op: str, *names: str) -> list[object] | None:
        if not self.allow():
            self.count(op, "skipped")
            return None
        try:
            async with asyncio.timeout(self.timeout), self.commands:
                values = await self.client.mget(list(names))
        except Errors as error:
            self.failed(op, error)
            return None
        self.succeeded()
        return list(values)

    async def discard(self, name: str) -> None:
        try:
            async with asyncio.timeout(self.timeout), self.commands:
                await self.client.delete(name)
        except Errors as error:
            self.failed("delete", error)
