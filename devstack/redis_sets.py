"""Real Redis topologies on loopback for the tests: a Redis Cluster and a Sentinel set.

* ``start_redis_cluster``: six ``redis-server --cluster-enabled yes`` nodes joined by
  ``redis-cli --cluster create ... --cluster-replicas 1``: three primaries, each with a
  replica. ``cluster-node-timeout`` is short (``CLUSTER_NODE_TIMEOUT_MS``) so a killed primary's
  replica is promoted within a few seconds.
* ``start_sentinel_set``: a primary, its replica and three ``redis-server --sentinel``
  processes watching it (quorum 2), with a short ``down-after-milliseconds``.

Every process is Debian's ``redis-server``, started and stopped by its own pid
(``devstack.processes.start_redis``); a killed node can be started again on its port, and
rejoins as a replica of whoever was promoted in its place.
"""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from devstack.processes import ProcessFailed, Redis, start_redis

CLUSTER_NODE_TIMEOUT_MS = 1000
SENTINEL_DOWN_AFTER_MS = 1000
SENTINEL_FAILOVER_TIMEOUT_MS = 5000
SENTINEL_SERVICE = "edge-primary"
# A cluster node also listens on its port + 10000 (the cluster bus): both must be free and
# below 65536, so cluster ports come from a range of their own.
CLUSTER_PORTS = range(21000, 29000)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cluster_port() -> int:
    for _ in range(200):
        port = random.choice(CLUSTER_PORTS)
        if _port_free(port) and _port_free(port + 10000):
            return port
    raise ProcessFailed("no free port pair for a cluster node")


def _client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=2)


def _ask(port: int, *command: str) -> object:
    client = _client(port)
    try:
        return client.execute_command(*command)
    finally:
        client.close()


def _wait(what: str, check: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except (redis.RedisError, OSError) as error:
            last = error
        time.sleep(0.1)
    raise ProcessFailed(f"{what} within {seconds} s (last error: {last!r})")


@dataclass
class RedisClusterSet:
    """Six cluster nodes; ``seeds`` is what ``--redis-url`` takes in cluster mode."""

    nodes: list[Redis]
    logs_dir: Path
    _extra: dict[int, tuple[str, ...]] = field(default_factory=dict)
    _rejoining: list[int] = field(default_factory=list)

    @property
    def seeds(self) -> str:
        return ",".join(f"redis://127.0.0.1:{node.port}" for node in self.nodes[:3])

    def node(self, port: int) -> Redis:
        return next(node for node in self.nodes if node.port == port)

    def alive(self) -> list[Redis]:
        return [node for node in self.nodes if node.proc.poll() is None]

    def primary_of(self, key: str) -> int:
        """The port of the node serving ``key``'s slot now, as the cluster says."""
        for node in self.alive():
            try:
                client = redis.RedisCluster(host="127.0.0.1", port=node.port, socket_timeout=2)
            except (redis.RedisError, OSError):
                continue
            try:
                return int(client.get_node_from_key(key).port)
            finally:
                client.close()
        raise ProcessFailed("no cluster node answers")

    def replica_of(self, primary_port: int) -> int | None:
        role = _ask(primary_port, "ROLE")
        assert isinstance(role, list)
        replicas = role[2] if len(role) > 2 else []
        return int(replicas[0][1]) if replicas else None

    def kill(self, port: int) -> None:
        node = self.node(port)
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait()

    def wait_promoted(self, key: str, away_from: int, seconds: float = 15.0) -> int:
        """Until ``key``'s slot is served by a node other than ``away_from`` and the cluster
        says ok; that node's port."""
        promoted: list[int] = []

        def served_elsewhere() -> bool:
            port = self.primary_of(key)
            if port == away_from:
                return False
            info = _ask(port, "CLUSTER", "INFO")
            text = info.decode() if isinstance(info, bytes) else str(info)
            promoted[:] = [port]
            return "cluster_state:ok" in text

        _wait(f"the cluster never moved {key!r} off {away_from}", served_elsewhere, seconds)
        return promoted[0]

    def restart(self, port: int) -> None:
        """Start a killed node again on its port: it rejoins as a replica (``settle`` waits
        until it has)."""
        old = self.node(port)
        again = start_redis(
            self.logs_dir, port=port, name=f"cluster-{port}-again", extra_args=self._extra[port]
        )
        self.nodes[self.nodes.index(old)] = again
        self._rejoining.append(port)

    def settle(self) -> None:
        """Until every restarted node is a replica in sync again: the set is whole."""
        while self._rejoining:
            port = self._rejoining.pop(0)
            _wait(f"node {port} never rejoined", lambda: _in_sync(port), 20.0)  # noqa: B023

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _role(port: int) -> str:
    role = _ask(port, "ROLE")
    assert isinstance(role, list)
    kind = role[0]
    return kind.decode() if isinstance(kind, bytes) else str(kind)


def _in_sync(port: int) -> bool:
    return _role(port) == "slave" and _link_up(port)


def _link_up(port: int) -> bool:
    info = _client(port).info("replication")
    return info.get("master_link_status") == "up"


def start_redis_cluster(logs_dir: Path, *, primaries: int = 3) -> RedisClusterSet:
    """``primaries`` primaries with one replica each, every slot covered, state ok."""
    cli = shutil.which("redis-cli")
    if cli is None:
        raise ProcessFailed("redis-cli not found (make bootstrap installs redis-server)")
    conf_dir = logs_dir / "cluster-conf"
    conf_dir.mkdir(parents=True, exist_ok=True)
    nodes: list[Redis] = []
    extra: dict[int, tuple[str, ...]] = {}
    try:
        for index in range(primaries * 2):
            args = (
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(conf_dir / f"nodes-{index}.conf"),
                "--cluster-node-timeout",
                str(CLUSTER_NODE_TIMEOUT_MS),
                "--dir",
                str(conf_dir),
            )
            node = start_redis(
                logs_dir, name=f"cluster-{index}", extra_args=args, pick_port=_cluster_port
            )
            nodes.append(node)
            extra[node.port] = args
        created = subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{node.port}" for node in nodes),
                "--cluster-replicas",
                "1",
                "--cluster-yes",
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )
        (logs_dir / "cluster-create.log").write_bytes(created.stdout + created.stderr)
        if created.returncode != 0:
            raise ProcessFailed(f"redis-cli --cluster create failed: {created.stdout[-800:]!r}")
        cluster = RedisClusterSet(nodes=nodes, logs_dir=logs_dir, _extra=extra)

        def settled() -> bool:
            for node in nodes:
                info = _ask(node.port, "CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text or "cluster_known_nodes:6" not in text:
                    return False
            return sum(_role(node.port) == "slave" and _link_up(node.port) for node in nodes) == 3

        _wait("the cluster never settled", settled, 30.0)
        return cluster
    except BaseException:
        for node in nodes:
            node.stop()
        raise


@dataclass
class SentinelSet:
    """A primary, a replica and three sentinels; ``urls`` is what ``--redis-url`` takes in
    sentinel mode (with ``--redis-sentinel-service``, ``service``)."""

    data: list[Redis]
    sentinels: list[Redis]
    logs_dir: Path
    service: str = SENTINEL_SERVICE
    _rejoining: list[int] = field(default_factory=list)

    @property
    def urls(self) -> str:
        return ",".join(f"redis://127.0.0.1:{s.port}" for s in self.sentinels)

    def node(self, port: int) -> Redis:
        return next(node for node in self.data if node.port == port)

    def primary_port(self) -> int:
        """The primary as a majority of the living sentinels names it."""
        named: dict[int, int] = {}
        for sentinel in self.sentinels:
            if sentinel.proc.poll() is not None:
                continue
            try:
                addr = _ask(sentinel.port, "SENTINEL", "get-master-addr-by-name", self.service)
            except (redis.RedisError, OSError):
                continue
            if isinstance(addr, list) and len(addr) == 2:
                port = int(addr[1])
                named[port] = named.get(port, 0) + 1
        port, votes = max(named.items(), key=lambda item: item[1], default=(0, 0))
        if votes < 2:
            raise ProcessFailed(f"the sentinels do not agree on a primary: {named}")
        return port

    def kill(self, port: int) -> None:
        node = self.node(port)
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait()

    def wait_promoted(self, away_from: int, seconds: float = 20.0) -> int:
        """Until the sentinels name a primary other than ``away_from`` and it says it is one."""
        promoted: list[int] = []

        def moved() -> bool:
            port = self.primary_port()
            promoted[:] = [port]
            return port != away_from and _role(port) == "master"

        _wait(f"the sentinels never replaced {away_from}", moved, seconds)
        return promoted[0]

    def restart(self, port: int) -> None:
        """Start a killed data node again, as a replica of the primary now (as the sentinels
        would make it, without waiting for them to notice); ``settle`` waits until it syncs."""
        old = self.node(port)
        primary = self.primary_port()
        again = start_redis(
            self.logs_dir,
            port=port,
            name=f"sentinel-data-{port}-again",
            extra_args=("--replicaof", "127.0.0.1", str(primary)),
        )
        self.data[self.data.index(old)] = again
        self._rejoining.append(port)

    def settle(self) -> None:
        """Until every restarted node is a replica in sync and the sentinels know it: the set
        is whole."""
        while self._rejoining:
            port = self._rejoining.pop(0)
            _wait(
                f"node {port} never became a replica again",
                lambda: _in_sync(port) and self._replica_known(port),  # noqa: B023 - called here
                20.0,
            )

    def _replica_known(self, port: int) -> bool:
        """Every sentinel lists ``port`` as a replica it does not think down."""
        for sentinel in self.sentinels:
            client = _client(sentinel.port)
            try:
                replicas = client.sentinel_slaves(self.service)
            finally:
                client.close()
            if not any(r["port"] == port and not r["is_sdown"] for r in replicas):
                return False
        return True

    def stop(self) -> None:
        for process in [*self.sentinels, *self.data]:
            process.stop()


def start_sentinel_set(logs_dir: Path, *, service: str = SENTINEL_SERVICE) -> SentinelSet:
    started: list[Redis] = []
    try:
        primary = start_redis(logs_dir, name="sentinel-primary")
        started.append(primary)
        replica = start_redis(
            logs_dir,
            name="sentinel-replica",
            extra_args=("--replicaof", "127.0.0.1", str(primary.port)),
        )
        started.append(replica)
        _wait("the replica never synced", lambda: _link_up(replica.port), 15.0)
        sentinels: list[Redis] = []
        for index in range(3):
            conf = logs_dir / f"sentinel-{index}.conf"
            conf.write_text(
                f"sentinel monitor {service} 127.0.0.1 {primary.port} 2\n"
                f"sentinel down-after-milliseconds {service} {SENTINEL_DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {service} {SENTINEL_FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {service} 1\n"
            )
            sentinel = start_redis(
                logs_dir, name=f"sentinel-{index}", config_file=conf, extra_args=("--sentinel",)
            )
            started.append(sentinel)
            sentinels.append(sentinel)
        found = SentinelSet(data=[primary, replica], sentinels=sentinels, logs_dir=logs_dir)

        def acquainted() -> bool:
            for sentinel in sentinels:
                others = _ask(sentinel.port, "SENTINEL", "sentinels", service)
                replicas = _ask(sentinel.port, "SENTINEL", "replicas", service)
                if not isinstance(others, list) or len(others) != 2:
                    return False
                if not isinstance(replicas, list) or len(replicas) != 1:
                    return False
            return found.primary_port() == primary.port

        _wait("the sentinels never found each other and the replica", acquainted, 30.0)
        return found
    except BaseException:
        for process in started:
            process.stop()
        raise
