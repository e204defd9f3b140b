"""The shared tier: immutable segments in Redis, so one replica can serve what another fetched.
This module is its I/O; what is stored and under which names is ``edge.store.shared_codec``.

Rules this module owns:

* Only immutable facts are shared: segments, and the final offset of a closed stream, each
  stamped with the stream's **generation**. Where a stream's tail is now is not shared: each
  replica learns that from the origin or its own live tail.
* **Generations make purges durable.** Each stream has a generation key. A purge writes a fresh
  random generation, retried until Redis takes it (in cluster and sentinel mode, until a replica
  has it too, so a failover keeps it: ``edge.store.redis_modes``), and publishes the stream on
  one channel. A value is served only when its stamp equals the generation read *in the same
  round trip* (one ``MGET``), so a segment written before a purge, or by a replica that had not
  heard of it yet, is never served again by anyone, including replicas that were partitioned or
  started later. The generation key outlives every value it guards. A purge of a stream
  supersedes the one before it (which stops being retried): whoever waits for the older one
  (``purged``) waits for the newer, and is never cancelled by it.
* **An absent generation key means lost, never a generation.** It was never written, or Redis
  lost it (restarted empty, expired, evicted) and with it maybe a purge, or the keys a purge
  finds: an absent key must not confirm what a replica holds. A read that finds it absent
  (``generation``, ``get``) mints a fresh generation as a purge does and stores it only if the
  key is still absent (``SET NX``, the key's own slot), then adopts whatever is stored, its own
  or another replica's that won the race: every replica that holds another generation forgets
  at its next check and asks the origin. The price is once per stream and per loss: the first
  check after Redis lost the key (or after the edge first ran with this rule) has every
  replica read the stream from the origin again. A minted generation is not replicated first
  (``WAIT``): if a failover loses it, it is absent again, so minted again, and forgotten again.
  A closure read with no generation key is no closure (``get_closed``): it names none. While
  Redis cannot be asked nothing is minted: what a replica holds alone is served only within the
  bound of ``edge.log.trust`` after its last confirmation.
* Every value read is validated (``edge.store.shared_codec``); a bad one is a miss, deleted.
* Writes happen in the background and never delay a response; when too many are pending (Redis
  slow) new ones are dropped and counted, since the origin still has every byte.
* Every operation goes through ``edge.store.shared_access``: bounded, counted, at most
  ``MAX_REDIS_COMMANDS`` at once, behind one circuit breaker; the tier is **up** when it is.
  Redis down or slow means service from the local tier and the origin, with no client error.
* Every command that names several keys (``MGET``, ``EXISTS``, ``DEL``, the write pipeline)
  names one stream's, whose keys share one slot (``edge.store.shared_codec``): one node, one
  round trip, in every ``--redis-mode``.
* The same commands serve every mode; ``edge.store.redis_modes`` owns how Redis is reached.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from edge.config import RedisTarget
from edge.log.segment import Segment
from edge.log.stream_log import LogKey
from edge.metrics import Metrics
from edge.store.redis_modes import Durability
from edge.store.shared_access import Errors, GuardedRedis
from edge.store.shared_codec import (
    PURGE_CHANNEL,
    BadValue,
    Lookup,
    SharedClosure,
    closed_key,
    decode,
    decode_closed,
    decode_generation,
    encode,
    encode_closed,
    encode_purge,
    generation_key,
    index_key,
    new_generation,
    parse_purge,
    segment_key,
)

logger = logging.getLogger(__name__)

MAX_PENDING_WRITES = 256
# Purges retried at once; past it a purge stays local (and is logged): a flood of 404s must not
# grow an unbounded set of retry tasks while Redis is away.
MAX_PENDING_PURGES = 10_000
SUBSCRIBE_RETRY_SECONDS = 1.0
PURGE_RETRY_FIRST_SECONDS = 0.1
PURGE_RETRY_MAX_SECONDS = 2.0
# A purge that Redis has not taken after this long is given up (and logged): by then every value
# it guards has expired (its TTL) or the operator has been told.
PURGE_RETRY_GIVE_UP_SECONDS = 3600.0


class SharedTier:
    def __init__(
        self,
        target: RedisTarget,
        metrics: Metrics,
        *,
        ttl_seconds: int,
        timeout_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = GuardedRedis(target, metrics, timeout_seconds=timeout_seconds, clock=clock)
        self._listener: asyncio.Task[None] | None = None
        self._pending_by_stream: dict[str, set[asyncio.Task[None]]] = {}
        self._ttl = ttl_seconds
        self._timeout = timeout_seconds
        self._clock = clock
        self._pending: set[asyncio.Task[None]] = set()
        # stream -> the generation a purge is still trying to write.
        self.pending_purges: dict[str, str] = {}
        # Generations this replica issued whose purge message may still come back, so it is
        # recognised as its own (oldest first, at most MAX_PENDING_PURGES): each leaves when its
        # message is heard, or once its purge is known to send none (nothing to purge).
        self._issued: dict[str, None] = {}
        self._purges: dict[str, asyncio.Task[bool]] = {}
        # For each purge of a stream this replica held nothing of that someone is asking about
        # (``purge_found_values``): whether it found segments of it (another replica served it
        # since its last purge), None until it knows. Only while asked: a 404 for a path never
        # held purges too, and nobody asks about most of them.
        self._asked: dict[str, bool | None] = {}

    @property
    def up(self) -> bool:
        return self._redis.up

    async def start(self) -> None:
        """Ping Redis once, so reachability is known before readiness is asked, then keep
        pinging while the tier is not up."""
        await self._redis.start()

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
        await asyncio.gather(
            *(t for t in (self._listener,) if t is not None),
            self._redis.stop_probing(),
            return_exceptions=True,
        )
        for task in [*self._pending, *self._purges.values()]:
            task.cancel()
        await asyncio.gather(*self._pending, *self._purges.values(), return_exceptions=True)
        await self._redis.aclose()

    def listen_for_purges(
        self, forget: Callable[[str, str], object], resync: Callable[[], object]
    ) -> None:
        """Call ``forget(stream, generation)`` for every purge any replica (this one included)
        publishes, and ``resync()`` each time the subscription (re)starts: purges published
        while it was down were missed, so every generation must be checked again."""
        self._listener = asyncio.ensure_future(self._listen(forget, resync))

    async def _listen(
        self, forget: Callable[[str, str], object], resync: Callable[[], object]
    ) -> None:
        while True:
            try:
                async with self._redis.link.subscriber() as pubsub:
                    await pubsub.subscribe(PURGE_CHANNEL)
                    resync()
                    while True:
                        message = await pubsub.get_message(
                            ignore_subscribe_messages=True, timeout=1.0
                        )
                        if message is not None and message.get("type") == "message":
                            purged = parse_purge(message["data"])
                            if purged is not None:
                                forget(*purged)
                                self._issued.pop(purged[1], None)  # heard: told at most once
            except Errors:
                await asyncio.sleep(SUBSCRIBE_RETRY_SECONDS)

    async def generation(self, stream: str) -> str | None:
        """The stream's generation now; None when the tier cannot say."""
        values = await self._redis.mget("generation", generation_key(stream))
        if values is None:
            return None
        return await self._generation_of(stream, values[0], "generation")

    async def _generation_of(self, stream: str, blob: object, op: str) -> str | None:
        """The generation a read of the stream's key found; an absent key is lost, so a fresh
        one is minted in its place. None when the tier cannot say."""
        try:
            found = decode_generation(blob)
        except BadValue:
            self._redis.count(op, "error")
            return None
        if found is not None:
            return found
        return await self._mint(stream)

    async def _mint(self, stream: str) -> str | None:
        """Store a fresh generation for ``stream`` unless one is there by now, and return the
        one stored (another replica's, if it won the race); None when the tier cannot say."""
        name = generation_key(stream)
        try:
            async with (
                asyncio.timeout(self._timeout * 4),
                self._redis.commands,
                self._redis.client.pipeline(transaction=False) as pipe,
            ):
                # One key, so one slot and one round trip in every mode; the same TTL as a
                # purge's generation, renewed by every write it guards (``_put``).
                pipe.set(name, new_generation(), ex=self._ttl * 2, nx=True)
                pipe.get(name)
                _, stored = await pipe.execute()
        except Errors as error:
            self._redis.failed("mint", error)
            return None
        self._redis.succeeded()
        try:
            minted = decode_generation(stored)
        except BadValue:
            minted = None
        self._redis.count("mint", "ok" if minted is not None else "error")
        return minted  # None: gone again at once (expired, a flush): ask again next check

    async def get(self, key: LogKey, start: str) -> Lookup | None:
        values = await self._redis.mget("get", generation_key(key.stream), segment_key(key, start))
        if values is None:
            return None
        generation = await self._generation_of(key.stream, values[0], "get")
        if generation is None:
            return None
        if values[1] is None:
            self._redis.count("get", "miss")
            return Lookup(generation=generation, value=None)
        try:
            found, stamp = decode(values[1], start=start)
        except BadValue as error:
            # Not ours, or corrupt: a miss, never a wrong byte; and gone, so it stays a miss.
            logger.warning("dropping a bad shared value for %s: %s", key.stream, error)
            self._redis.count("get", "error")
            await self._redis.discard(segment_key(key, start))
            return Lookup(generation=generation, value=None)
        if stamp != generation:
            self._redis.count("get", "stale")
            return Lookup(generation=generation, value=None)
        self._redis.count("get", "hit")
        return Lookup(generation=generation, value=found)

    async def get_closed(self, key: LogKey, generation: str) -> SharedClosure | None:
        """How a replica saw the stream closed, in this generation, if one did."""
        values = await self._redis.mget("get", generation_key(key.stream), closed_key(key))
        if values is None or values[1] is None:
            return None
        try:
            closure, stamp = decode_closed(values[1])
            current = decode_generation(values[0])
        except BadValue as error:
            logger.warning("dropping a bad shared closure for %s: %s", key.stream, error)
            self._redis.count("get", "error")
            await self._redis.discard(closed_key(key))
            return None
        self._redis.count("get", "hit")
        # No key (current None) names no generation, so no closure is of one.
        return closure if stamp == current == generation else None

    def put(
        self,
        key: LogKey,
        segment: Segment,
        content_type: str | None,
        generation: str,
        *,
        seen_at: float,
        open_tail: bool = False,
    ) -> None:
        """Store a segment (had from the origin at ``seen_at``; ``open_tail``: its answer said
        the stream open there) in the background; never awaited by a response."""
        blob = encode(segment, content_type, generation, seen_at=seen_at, open_tail=open_tail)
        self._in_background(segment_key(key, segment.start), blob, key)

    def put_closed(self, key: LogKey, closure: SharedClosure, generation: str) -> None:
        """Closure is final within an instance, so it is as shareable as the bytes."""
        self._in_background(closed_key(key), encode_closed(closure, generation), key)

    def _in_background(self, name: str, value: bytes, key: LogKey) -> None:
        if len(self._pending) >= MAX_PENDING_WRITES or not self._redis.allow():
            self._redis.count("put", "skipped")
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
            async with (
                asyncio.timeout(self._timeout * 4),
                self._redis.commands,
                self._redis.client.pipeline(transaction=False) as pipe,
            ):
                pipe.set(name, value, ex=self._ttl)
                pipe.sadd(index_key(stream), name)
                pipe.expire(index_key(stream), self._ttl)
                # The generation must outlive every value it guards.
                pipe.expire(generation_key(stream), self._ttl * 2)
                await pipe.execute()
        except Errors as error:
            self._redis.failed("put", error)
            return
        self._redis.succeeded()
        self._redis.count("put", "ok")

    # --- purges ---

    def purge(self, stream: str, *, only_if_known: bool = False) -> str:
        """Start a durable purge of ``stream``: returns its new generation at once; the write is
        retried in the background until Redis takes it (see ``purged``). ``only_if_known``:
        only if Redis holds anything of the stream (a value or a generation)."""
        for task in list(self._pending_by_stream.pop(stream, ())):
            task.cancel()
        generation = new_generation()
        if len(self._issued) >= MAX_PENDING_PURGES:
            del self._issued[next(iter(self._issued))]
        self._issued[generation] = None
        if len(self._purges) >= MAX_PENDING_PURGES and stream not in self._purges:
            logger.error("too many purges pending in the shared tier; %s is local only", stream)
            self._redis.count("purge", "skipped")
            self._issued.pop(generation, None)  # never sent
            return generation
        self.pending_purges[stream] = generation
        previous = self._purges.pop(stream, None)
        if previous is not None:
            previous.cancel()
        purge: asyncio.Task[bool] = asyncio.ensure_future(
            self._purge_until_written(stream, generation, only_if_known)
        )
        self._purges[stream] = purge
        purge.add_done_callback(lambda done: self._purge_ended(stream, done))
        return generation

    def issued_here(self, generation: str) -> bool:
        return generation in self._issued

    def _purge_ended(self, stream: str, task: asyncio.Task[bool]) -> None:
        if self._purges.get(stream) is task:
            del self._purges[stream]
            self.pending_purges.pop(stream, None)  # written, or given up (and logged)

    async def purged(self, stream: str, timeout_seconds: float) -> bool:
        """Wait up to ``timeout_seconds`` for the purge of ``stream`` to be durable; not at all
        while the tier is not up (Redis is away or never answered: waiting would only delay
        the client)."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            task = self._purges.get(stream)
            if task is None:
                return stream not in self.pending_purges
            if not self._redis.up:
                return False
            # Waited on, never awaited: a newer purge of the stream cancels this one (``purge``),
            # and a cancellation must not reach the request waiting (a DELETE the origin applied
            # would go unanswered, as if its client had gone).
            await asyncio.wait({task}, timeout=max(0.0, deadline - time.monotonic()))
            if not task.done():
                return False
            if task.cancelled():
                continue  # superseded by a newer purge of the stream: it is the one to wait for
            return task.exception() is None and task.result()

    async def _purge_until_written(self, stream: str, generation: str, only_if_known: bool) -> bool:
        delay = PURGE_RETRY_FIRST_SECONDS
        give_up = self._clock() + PURGE_RETRY_GIVE_UP_SECONDS
        while True:
            if await self._purge_once(stream, generation, only_if_known):
                return True
            if self._clock() >= give_up:
                logger.error("purge of %s never reached the shared tier", stream)
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, PURGE_RETRY_MAX_SECONDS)

    async def _purge_once(self, stream: str, generation: str, only_if_known: bool) -> bool:
        # Not gated by the breaker: a purge must be tried even while reads are skipped.
        try:
            async with asyncio.timeout(self._timeout * 4), self._redis.commands:
                if only_if_known and not await self._redis.client.exists(
                    index_key(stream), generation_key(stream)
                ):
                    self._note_found(generation, False)
                    self._issued.pop(generation, None)  # never sent
                    return True  # nothing of it anywhere: nothing to forget
                durability = await self._redis.link.write_generation(
                    generation_key(stream), generation, self._ttl * 2
                )
                if durability is Durability.NOT_YET:
                    # Redis answers, so the breaker is not told; a failover now could lose it.
                    self._redis.count("purge", "unreplicated")
                    return False
                names = await self._redis.client.smembers(index_key(stream))
                await self._redis.client.delete(index_key(stream), *names)
                await self._redis.client.publish(PURGE_CHANNEL, encode_purge(stream, generation))
        except Errors as error:
            self._redis.failed("purge", error)
            return False
        if only_if_known:
            self._note_found(generation, bool(names))
        self._redis.succeeded()
        self._redis.count("purge", "ok")
        return True

    def _note_found(self, generation: str, found: bool) -> None:
        if generation in self._asked:
            self._asked[generation] = found

    async def purge_found_values(
        self, stream: str, generation: str, timeout_seconds: float
    ) -> bool:
        """Did the purge of a stream this replica held nothing of, the one that wrote
        ``generation``, find segments of it (another replica served it since its last purge)?
        Waits for that purge up to ``timeout_seconds``; False if it is not done by then."""
        # Asked as the purge starts (the forgetting's tellers are told as it is decided), so
        # before its first round trip to Redis can have returned.
        self._asked[generation] = None
        try:
            await self.purged(stream, timeout_seconds)
            return self._asked.get(generation) is True
        finally:
            del self._asked[generation]
