"""How the shared tier reaches Redis: one server, a Redis Cluster, or the primary Sentinels name.

Rules this module owns:

* ``connect`` turns a ``RedisTarget`` into a ``RedisLink``, the only place that knows the mode:
  redis-py's own ``Redis``, ``RedisCluster`` (which follows ``MOVED``/``ASK`` and refreshes its
  slot map after a failover) or ``Sentinel.master_for`` (which asks the sentinels for the
  primary on every new connection). ``edge.store.shared`` sends the same commands in every mode.
* **Every fault of reaching Redis is one of ``REDIS_ERRORS``**, whatever redis-py raises for it
  (a connection closed under a command in flight is a RuntimeError or an AttributeError there):
  the shared tier degrades and retries, and no such fault ends a purge or reaches a request.
* Every command goes to a **primary**, never a replica: a replica may not have a purge's new
  generation yet, and would vouch for the bytes it guards.
* A command that names several keys names keys of one stream only. They share a hash tag
  (``edge.store.shared``), so they are in one slot of a cluster: one node, one round trip.
* **A generation is durable once a replica has it** (``write_generation``: ``SET`` then ``WAIT``
  on the same connection) in cluster and sentinel mode, since a failover promotes a replica and
  a write only the dead primary had would bring purged bytes back. Until one confirms it, the
  write is retried (``NOT_YET``) while any replica is connected or could still be promoted
  (for a cluster, ``CLUSTER NODES`` lists it without ``fail``; for sentinels, they do not think
  it down). Only a primary with no such replica has no better copy to make: its write is the
  only copy (``ONLY_COPY``), said once in the log. A replica confirmed failed, that comes back
  and is promoted before it syncs, can still lack a purge written meanwhile: Redis replication
  is asynchronous, and ``WAIT`` narrows that window to this. Standalone Redis has no failover:
  its write is the only copy.
* **The purge channel is classic pub/sub in every mode.** In a cluster a classic ``PUBLISH`` is
  carried to every node over the cluster bus, so one subscription to any node (primary or
  replica) hears every purge of every stream; the subscriber picks a node from the current
  slot map, and after its node dies, another. Sharded pub/sub would keep a channel's messages
  on one shard: one channel for all purges puts them all on one shard anyway, and per-stream
  channels would have every replica subscribe, on every shard, to a channel per stream it
  holds, and move those subscriptions whenever slots move. Its gain, not copying each message
  to every node, is nothing for purges, which are rare. The channel is only the fast path:
  the generation key is the truth, re-checked every second and after each (re)subscription.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, RedisClusterException, RedisError

from edge.config import RedisTarget

logger = logging.getLogger(__name__)

DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379
# ``WAIT 1``: one replica is enough for a failover to keep the write (the promoted one is the
# most up to date).
REPLICA_ACKS = 1
WAIT_SHARE_OF_TIMEOUT = 0.5

Commands = redis.Redis | RedisCluster
# What reaching Redis may raise, in every mode (redis-py's cluster errors are not RedisErrors).
# A connection closed under a command in flight is one too, however redis-py's asyncio client
# lets it out: when a node dies, the cluster client closes every connection it holds to re-learn
# the slots, and a command still using one fails with uvloop's RuntimeError ("the handler is
# closed") or an AttributeError (the connection's writer is already None), not a
# ConnectionError. Left out, such a fault ended a purge's retries for good (the purge was lost)
# and reached the request that waited for it (a DELETE the origin applied, answered 500 or not
# at all).
REDIS_ERRORS = (
    RedisError, RedisClusterException, OSError, TimeoutError, RuntimeError, AttributeError,
)  # fmt: skip


class Durability(enum.Enum):
    ON_A_REPLICA = "on_a_replica"
    ONLY_COPY = "only_copy"  # no replica to copy it to: standalone, or every replica gone
    NOT_YET = "not_yet"  # a replica is connected but did not confirm in time, or the slot moved


def _credentials(url: str) -> dict[str, Any]:
    """Username, password and TLS from a URL: the same for every node of a mode (and for the
    sentinels)."""
    parts = urlsplit(url)
    kwargs: dict[str, Any] = {}
    if parts.username:
        kwargs["username"] = unquote(parts.username)
    if parts.password:
        kwargs["password"] = unquote(parts.password)
    if parts.scheme == "rediss":
        kwargs["ssl"] = True
    return kwargs


def _database(url: str) -> int:
    """The primary's database in sentinel mode: the first URL's path, as ``redis://`` says."""
    path = urlsplit(url).path.strip("/")
    return int(path) if path.isdigit() else 0


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


def _bounded(timeout_seconds: float) -> dict[str, Any]:
    """Every command of the tier is bounded; a pooled connection that died while Redis was
    away fails once, and one immediate retry on a fresh connection keeps that from reopening
    the breaker when Redis is back."""
    return {
        "socket_timeout": timeout_seconds,
        "socket_connect_timeout": timeout_seconds,
        "retry_on_timeout": False,
        "retry": Retry(NoBackoff(), retries=1),
        "retry_on_error": [ConnectionError],
    }


class RedisLink:
    """The data client (``commands``), the purge channel's subscriber, and the mode's idea of
    a durable write. Subclasses differ only in how they reach Redis."""

    mode = "standalone"

    def __init__(self, commands: Commands, timeout_seconds: float) -> None:
        self.commands = commands
        # WAIT must answer within the socket timeout of the connection it blocks.
        self._wait_ms = max(1, int(timeout_seconds * 1000 * WAIT_SHARE_OF_TIMEOUT))
        self._told_only_copy = False

    async def ping(self) -> None:
        await self.commands.ping()

    def subscriber(self) -> contextlib.AbstractAsyncContextManager[PubSub]:
        raise NotImplementedError

    async def write_generation(self, key: str, value: str, ttl_seconds: int) -> Durability:
        await self.commands.set(key, value, ex=ttl_seconds)
        return Durability.ONLY_COPY

    async def aclose(self) -> None:
        await self.commands.aclose()

    def _judge(self, acks: object, role: object, standby: int | None) -> Durability:
        """After ``SET``: ``WAIT``'s count, ``ROLE``'s list of the replicas connected now, and
        how many replicas the topology knows that a failover could still promote (None: it
        cannot say)."""
        if isinstance(acks, int) and acks >= REPLICA_ACKS:
            self._told_only_copy = False
            return Durability.ON_A_REPLICA
        connected = role[2] if isinstance(role, list) and len(role) > 2 else None
        if connected != [] or standby != 0:
            return Durability.NOT_YET
        if not self._told_only_copy:
            logger.warning(
                "%s mode: the primary has no replica a failover could promote; purges are "
                "durable on it alone until it has one",
                self.mode,
            )
            self._told_only_copy = True
        return Durability.ONLY_COPY


def promotable_replicas(cluster_nodes: object) -> int | None:
    """How many replicas of the answering node (``myself``) a ``CLUSTER NODES`` answer lists
    that are not confirmed failed (``fail``; a suspected ``fail?`` one may still be promoted).
    None when the answer is not one."""
    if isinstance(cluster_nodes, bytes):
        cluster_nodes = cluster_nodes.decode(errors="replace")
    if not isinstance(cluster_nodes, str):
        return None
    rows = [line.split() for line in cluster_nodes.splitlines() if line.strip()]
    mine = [row[0] for row in rows if len(row) > 3 and "myself" in row[2].split(",")]
    if len(mine) != 1:
        return None
    return sum(
        1
        for row in rows
        if len(row) > 3
        and row[3] == mine[0]
        and "slave" in row[2].split(",")
        and "fail" not in row[2].split(",")
    )


class StandaloneLink(RedisLink):
    def __init__(self, url: str, timeout_seconds: float) -> None:
        super().__init__(
            redis.Redis.from_url(url, decode_responses=False, **_bounded(timeout_seconds)),
            timeout_seconds,
        )
        # Subscriptions wait for minutes between messages: no read timeout on that connection.
        self._subscriber = redis.Redis.from_url(
            url, decode_responses=False, socket_connect_timeout=timeout_seconds
        )

    def subscriber(self) -> contextlib.AbstractAsyncContextManager[PubSub]:
        return self._subscriber.pubsub()

    async def aclose(self) -> None:
        await super().aclose()
        await self._subscriber.aclose()


class SentinelLink(RedisLink):
    mode = "sentinel"

    def __init__(self, target: RedisTarget, timeout_seconds: float) -> None:
        assert target.sentinel_service is not None
        credentials = _credentials(target.first)
        self._sentinel = Sentinel(  # type: ignore[no-untyped-call]
            [_host_port(url, DEFAULT_SENTINEL_PORT) for url in target.urls],
            # A sentinel that does not answer is skipped for the next one at once (redis-py's
            # default retries it with seconds of backoff).
            sentinel_kwargs={
                "socket_timeout": timeout_seconds,
                "socket_connect_timeout": timeout_seconds,
                "retry": Retry(NoBackoff(), retries=0),
                **credentials,
            },
            decode_responses=False,
            db=_database(target.first),
            **credentials,
        )
        service = self._service = target.sentinel_service
        super().__init__(
            self._sentinel.master_for(service, **_bounded(timeout_seconds)), timeout_seconds
        )
        self._subscriber: redis.Redis = self._sentinel.master_for(
            service, socket_timeout=None, socket_connect_timeout=timeout_seconds
        )

    def subscriber(self) -> contextlib.AbstractAsyncContextManager[PubSub]:
        return self._subscriber.pubsub()

    async def write_generation(self, key: str, value: str, ttl_seconds: int) -> Durability:
        # One pipeline is one connection: WAIT counts the replicas that have this SET.
        async with self.commands.pipeline(transaction=False) as pipe:
            pipe.set(key, value, ex=ttl_seconds)
            pipe.execute_command("WAIT", REPLICA_ACKS, self._wait_ms)
            pipe.execute_command("ROLE")
            _, acks, role = await pipe.execute()
        if isinstance(acks, int) and acks >= REPLICA_ACKS:
            return self._judge(acks, role, None)
        return self._judge(acks, role, await self._standby())

    async def _standby(self) -> int | None:
        """Replicas the sentinels do not think down: one of them may be promoted next."""
        for sentinel in self._sentinel.sentinels:
            try:
                replicas = await sentinel.sentinel_slaves(self._service)
            except REDIS_ERRORS:
                continue
            return sum(1 for r in replicas if not (r.get("is_sdown") or r.get("is_odown")))
        return None

    async def aclose(self) -> None:
        await super().aclose()
        await self._subscriber.aclose()
        for sentinel in self._sentinel.sentinels:
            await sentinel.aclose()


class ClusterLink(RedisLink):
    mode = "cluster"

    def __init__(self, target: RedisTarget, timeout_seconds: float) -> None:
        self._credentials = _credentials(target.first)
        self._timeout = timeout_seconds
        self._seeds = [_host_port(url, DEFAULT_PORT) for url in target.urls]
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in self._seeds],
            decode_responses=False,
            **self._credentials,
            # Not a timeout retried: RedisCluster never retries one on the same node.
            **{k: v for k, v in _bounded(timeout_seconds).items() if k != "retry_on_timeout"},
        )
        super().__init__(cluster, timeout_seconds)
        self._cluster = cluster
        self._turn = itertools.count()

    async def ping(self) -> None:
        """Up means every primary answers: every slot can be read and written."""
        await self._cluster.initialize()
        await self._cluster.ping(target_nodes=RedisCluster.PRIMARIES)

    @contextlib.asynccontextmanager
    async def subscriber(self) -> AsyncIterator[PubSub]:
        """A subscription on one node, a different one each time: classic messages reach
        every node, and the node it had may be the one that died."""
        known = [(n.host, int(n.port)) for n in self._cluster.get_nodes()] or self._seeds
        host, port = known[next(self._turn) % len(known)]
        client = redis.Redis(
            host=host,
            port=port,
            decode_responses=False,
            socket_connect_timeout=self._timeout,
            **self._credentials,
        )
        try:
            async with client.pubsub() as pubsub:
                yield pubsub
        finally:
            await client.aclose()

    async def write_generation(self, key: str, value: str, ttl_seconds: int) -> Durability:
        cluster = self._cluster
        await cluster.initialize()
        node = cluster.get_node_from_key(key)
        # All to the slot's primary, in one pipeline: one connection, so WAIT counts the
        # replicas that have this SET.
        async with cluster.pipeline(transaction=False) as pipe:
            pipe.execute_command("SET", key, value, "EX", ttl_seconds, target_nodes=node)
            pipe.execute_command("WAIT", REPLICA_ACKS, self._wait_ms, target_nodes=node)
            pipe.execute_command("ROLE", target_nodes=node)
            pipe.execute_command("CLUSTER NODES", target_nodes=node)
            written, acks, role, nodes = await pipe.execute(
                raise_on_error=False, allow_redirections=False
            )
        if isinstance(written, BaseException):
            # The slot moved (MOVED) or the node failed: a keyed command through the cluster
            # client follows the redirect and updates its slot map (or raises the failure), so
            # the next attempt goes to the slot's primary now.
            await cluster.exists(key)
            return Durability.NOT_YET
        return self._judge(acks, role, promotable_replicas(nodes))


def connect(target: RedisTarget, *, timeout_seconds: float) -> RedisLink:
    if target.mode == "cluster":
        return ClusterLink(target, timeout_seconds)
    if target.mode == "sentinel":
        return SentinelLink(target, timeout_seconds)
    return StandaloneLink(target.first, timeout_seconds)
