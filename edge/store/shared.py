"""The shared tier: immutable segments in Redis, so one replica can serve what another fetched.

Rules this module owns:

* Only immutable facts are shared: segments, and the final offset of a closed stream. Where a
  stream's tail is now is not: each replica learns that from the origin or its own live tail.
* Writes happen in the background and never delay a response; when too many are pending (Redis
  slow) new ones are dropped and counted, since the origin still has every byte.
* Every operation is bounded by ``timeout_seconds`` and guarded by a circuit breaker: Redis down
  or slow means service from the local tier and the origin, with no client error, until a probe
  after the cooldown finds it back.
* Keys carry the scope: a credential's segments are never visible to another scope. All keys of
  a stream share a hash tag, so a purge touches one slot in a cluster.
* A purge deletes the stream's keys, cancels this replica's pending writes for it (so none lands
  after the delete), and is published on one channel: every replica drops its local copy too,
  so a deleted stream stops being served everywhere, not only where the DELETE arrived.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as redis
from redis.exceptions import RedisError

from edge.log.segment import Segment
from edge.log.stream_log import LogKey
from edge.metrics import Metrics
from edge.store.breaker import BreakerState, CircuitBreaker

log = logging.getLogger(__name__)

KEY_PREFIX = "edge:v1"
PURGE_CHANNEL = f"{KEY_PREFIX}:purge"
MAX_PENDING_WRITES = 256
SUBSCRIBE_RETRY_SECONDS = 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class SharedSegment:
    segment: Segment
    content_type: str | None


def _stream_tag(stream: str) -> str:
    return "{" + hashlib.sha256(stream.encode()).hexdigest()[:24] + "}"


def segment_key(key: LogKey, start: str) -> str:
    return f"{KEY_PREFIX}:{_stream_tag(key.stream)}:seg:{key.scope}:{start}"


def closed_key(key: LogKey) -> str:
    return f"{KEY_PREFIX}:{_stream_tag(key.stream)}:closed:{key.scope}"


def index_key(stream: str) -> str:
    return f"{KEY_PREFIX}:{_stream_tag(stream)}:keys"


def encode(segment: Segment, content_type: str | None) -> bytes:
    header = json.dumps({"start": segment.start, "end": segment.end, "ct": content_type})
    return header.encode() + b"\n" + segment.body


def decode(blob: bytes) -> SharedSegment:
    header, _, body = blob.partition(b"\n")
    meta = json.loads(header)
    return SharedSegment(
        segment=Segment(start=meta["start"], end=meta["end"], body=body),
        content_type=meta["ct"],
    )


class SharedTier:
    def __init__(
        self,
        url: str,
        metrics: Metrics,
        *,
        ttl_seconds: int,
        timeout_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client: redis.Redis = redis.Redis.from_url(
            url,
            decode_responses=False,
            socket_timeout=timeout_seconds,
            socket_connect_timeout=timeout_seconds,
            retry_on_timeout=False,
        )
        # Subscriptions wait for minutes between messages: no read timeout on that connection.
        self._subscriber: redis.Redis = redis.Redis.from_url(
            url, decode_responses=False, socket_connect_timeout=timeout_seconds
        )
        self._listener: asyncio.Task[None] | None = None
        self._pending_by_stream: dict[str, set[asyncio.Task[None]]] = {}
        self._metrics = metrics
        self._ttl = ttl_seconds
        self._timeout = timeout_seconds
        self._clock = clock
        self._breaker = CircuitBreaker()
        self._pending: set[asyncio.Task[None]] = set()
        metrics.redis_up.set(1)

    @property
    def up(self) -> bool:
        return self._breaker.state is BreakerState.CLOSED

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        await self._client.aclose()
        await self._subscriber.aclose()

    def listen_for_purges(self, forget: Callable[[str], object]) -> None:
        """Call ``forget(stream)`` for every purge any replica publishes, for as long as this
        tier lives; a lost subscription is retried every second."""
        self._listener = asyncio.ensure_future(self._listen(forget))

    async def _listen(self, forget: Callable[[str], object]) -> None:
        while True:
            try:
                async with self._subscriber.pubsub() as pubsub:
                    await pubsub.subscribe(PURGE_CHANNEL)
                    while True:
                        message = await pubsub.get_message(
                            ignore_subscribe_messages=True, timeout=1.0
                        )
                        if message is not None and message.get("type") == "message":
                            data = message["data"]
                            forget(data.decode() if isinstance(data, bytes) else str(data))
            except (RedisError, OSError, TimeoutError):
                await asyncio.sleep(SUBSCRIBE_RETRY_SECONDS)

    def _count(self, op: str, result: str) -> None:
        self._metrics.redis_operations.labels(op=op, result=result).inc()

    def _failed(self, op: str, error: BaseException) -> None:
        was_up = self.up
        self._breaker.failure(self._clock())
        self._count(op, "error")
        self._metrics.redis_up.set(1 if self.up else 0)
        if was_up and not self.up:
            log.warning("shared tier unavailable, serving from local + origin: %r", error)

    def _succeeded(self) -> None:
        if not self.up:
            log.info("shared tier is back")
        self._breaker.success()
        self._metrics.redis_up.set(1)

    async def get(self, key: LogKey, start: str) -> SharedSegment | None:
        if not self._breaker.allow(self._clock()):
            self._count("get", "skipped")
            return None
        try:
            async with asyncio.timeout(self._timeout):
                blob = await self._client.get(segment_key(key, start))
        except (RedisError, OSError, TimeoutError) as error:
            self._failed("get", error)
            return None
        self._succeeded()
        if blob is None:
            self._count("get", "miss")
            return None
        try:
            found = decode(blob if isinstance(blob, bytes) else blob.encode())
        except (ValueError, KeyError):
            self._count("get", "error")  # not ours, or corrupt: a miss, never a wrong byte
            return None
        self._count("get", "hit")
        return found

    async def get_closed(self, key: LogKey) -> str | None:
        """The final offset of a closed stream, if a replica has seen it closed."""
        if not self._breaker.allow(self._clock()):
            self._count("get", "skipped")
            return None
        try:
            async with asyncio.timeout(self._timeout):
                value = await self._client.get(closed_key(key))
        except (RedisError, OSError, TimeoutError) as error:
            self._failed("get", error)
            return None
        self._succeeded()
        self._count("get", "miss" if value is None else "hit")
        if value is None:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)

    def put(self, key: LogKey, segment: Segment, content_type: str | None) -> None:
        """Store a segment in the background; never awaited by a response."""
        self._in_background(segment_key(key, segment.start), encode(segment, content_type), key)

    def put_closed(self, key: LogKey, final_offset: str) -> None:
        """Closure is final, so it is as shareable as the bytes."""
        self._in_background(closed_key(key), final_offset.encode(), key)

    def _in_background(self, name: str, value: bytes, key: LogKey) -> None:
        if len(self._pending) >= MAX_PENDING_WRITES or not self._breaker.allow(self._clock()):
            self._count("put", "skipped")
            return
        task = asyncio.ensure_future(self._put(name, value, key.stream))
        self._pending.add(task)
        by_stream = self._pending_by_stream.setdefault(key.stream, set())
        by_stream.add(task)
        task.add_done_callback(lambda done: self._written(key.stream, done))

    def _written(self, stream: str, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        tasks = self._pending_by_stream.get(stream)
        if tasks is not None:
            tasks.discard(task)
            if not tasks:
                del self._pending_by_stream[stream]

    async def _put(self, name: str, value: bytes, stream: str) -> None:
        try:
            async with asyncio.timeout(self._timeout * 4):
                async with self._client.pipeline(transaction=False) as pipe:
                    pipe.set(name, value, ex=self._ttl)
                    pipe.sadd(index_key(stream), name)
                    pipe.expire(index_key(stream), self._ttl)
                    await pipe.execute()
        except (RedisError, OSError, TimeoutError) as error:
            self._failed("put", error)
            return
        self._succeeded()
        self._count("put", "ok")

    async def purge(self, stream: str) -> None:
        """Drop every shared segment of ``stream`` and tell the other replicas; a failure is
        counted, not raised."""
        for task in list(self._pending_by_stream.pop(stream, ())):
            task.cancel()
        if not self._breaker.allow(self._clock()):
            self._count("purge", "skipped")
            return
        try:
            async with asyncio.timeout(self._timeout * 4):
                names = await self._client.smembers(index_key(stream))
                await self._client.delete(index_key(stream), *names)
                await self._client.publish(PURGE_CHANNEL, stream.encode())
        except (RedisError, OSError, TimeoutError) as error:
            self._failed("purge", error)
            return
        self._succeeded()
        self._count("purge", "ok")
