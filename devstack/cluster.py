"""``make cluster``: the deployment topology on loopback, without Docker.

The reference origin (with a data dir), Debian's redis-server (one, or with ``redis_mode=
"cluster"`` a six-node Redis Cluster, ``devstack.redis_sets``), N edge replicas sharing it,
and Debian's HAProxy in front, health-checking each replica's ``/readyz`` on its admin port and
routing each stream to one replica the way ``deploy/haproxy/haproxy.cfg`` does (its
``balance``/``hash-type``/``hash-balance-factor`` lines are read from that file, so both
route alike; ``routing`` overrides them for a comparison), and the resume routes' paths (its
``acl resume_route`` and ``backend edges_any``, read from it too) to any replica. HAProxy's
runtime API listens on a socket of its own (``Cluster.haproxy_command``: a test drains a
replica with it). ``make loadtest`` and the
multi-replica tests use it; ``python -m devstack.cluster`` prints the URLs and keeps it up
until Ctrl-C. With ``tls`` (``--tls``), HAProxy also serves the fleet over HTTPS with ALPN
``h2,http/1.1`` (HTTP/1.1 to the replicas, as the deployed config's ``streams_tls`` frontend
does), with a certificate made at start (``devstack.tls``) or given (``--tls-cert``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from devstack.processes import (
    Edge,
    Origin,
    ProcessFailed,
    Redis,
    free_port,
    start_edge,
    start_origin,
    start_redis,
)
from devstack.redis_sets import RedisClusterSet, start_redis_cluster
from devstack.tls import make_certificate

HAPROXY_TEMPLATE = """\
# Written by devstack/cluster.py for a loopback cluster; deploy/haproxy/haproxy.cfg is the
# compose version of the same idea.
global
    # Two file descriptors per proxied connection, within this machine's 20,000 limit.
    maxconn 9000
    # The runtime API (`set server edges_any/edge-1 state drain`); not in the deployed config.
    stats socket {stats_socket} mode 600 level admin

defaults
    mode http
    option http-server-close
    option redispatch
    retries 3
    timeout connect 2s
    # A replica that is slow on a busy machine is not a dead one (a dead one refuses at once).
    timeout check 2s
    timeout client 300s
    timeout server 300s
    timeout tunnel 300s
    timeout http-keep-alive 5s

frontend streams
    bind 127.0.0.1:{port}
{resume_routes}
    default_backend edges
    # Which replica answered (tests place streams by it); not in the deployed config.
    http-response set-header X-Edge-Replica %[srv_name]
{tls_frontend}
backend edges
{routing}
    option httpchk GET /readyz
    http-check expect status 200
{servers}

backend edges_any
{any_routing}
    option httpchk GET /readyz
    http-check expect status 200
{servers}
"""


# The deployed config's HTTPS frontend on loopback: browsers speak HTTP/2 to it (one connection,
# many streams), the replicas still HTTP/1.1.
TLS_FRONTEND = """
frontend streams_tls
    bind 127.0.0.1:{port} ssl crt {certificate} alpn h2,http/1.1
{resume_routes}
    default_backend edges
    http-response set-header X-Edge-Replica %[srv_name]
"""


DEPLOYED_HAPROXY = Path(__file__).resolve().parent.parent / "deploy" / "haproxy" / "haproxy.cfg"
ROUTING_DIRECTIVES = ("balance", "hash-type", "hash-balance-factor")
# Backend options copied as they are: how HAProxy forwards the replicas' answers.
FORWARDING_OPTIONS = ("http-no-delay",)


def deployed_routing(backend: str = "edges") -> tuple[str, ...]:
    """The routing lines of ``deploy/haproxy/haproxy.cfg``'s ``edges`` backend (or another), the
    server weight its ``default-server`` gives (the points each server has on the hash ring),
    and its forwarding options (``option http-no-delay``)."""
    lines: list[str] = []
    in_backend = False
    for line in DEPLOYED_HAPROXY.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if line and not line[0].isspace():
            in_backend = words[:2] == ["backend", backend]
        elif in_backend and (
            (words[:1] and words[0] in ROUTING_DIRECTIVES)
            or (words[:1] == ["option"] and " ".join(words[1:]) in FORWARDING_OPTIONS)
        ):
            lines.append(" ".join(words))
        elif in_backend and words[:1] == ["default-server"] and "weight" in words:
            lines.append(f"default-server weight {words[words.index('weight') + 1]}")
    if not lines or not lines[0].startswith("balance "):
        raise ProcessFailed(f"no balance line in {DEPLOYED_HAPROXY}'s backend {backend}")
    return tuple(lines)


def deployed_resume_routes() -> tuple[str, ...]:
    """The lines of ``deploy/haproxy/haproxy.cfg``'s ``frontend streams`` that send the resume
    routes' paths to ``backend edges_any`` (its ``acl`` and ``use_backend`` lines)."""
    lines: list[str] = []
    in_frontend = False
    for line in DEPLOYED_HAPROXY.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if line and not line[0].isspace():
            in_frontend = words[:2] == ["frontend", "streams"]
        elif in_frontend and words[:1] and words[0] in ("acl", "use_backend"):
            lines.append(" ".join(words))
    if not any(line.startswith("use_backend edges_any") for line in lines):
        raise ProcessFailed(f"no use_backend edges_any in {DEPLOYED_HAPROXY}'s frontend streams")
    return tuple(lines)


@dataclass
class Cluster:
    origin: Origin
    redis: Redis | RedisClusterSet
    edges: list[Edge]
    haproxy: subprocess.Popen[bytes]
    url: str
    logs_dir: Path
    https_url: str | None = None
    edge_args: tuple[str, ...] = ()
    _haproxy_log: Path = field(default_factory=Path)
    # HAProxy's runtime API, alone in a directory of its own (removed by stop()).
    stats_socket: Path | None = None

    def replica_name(self, edge: Edge) -> str:
        """The replica's server name in HAProxy (``edge-1``...), as ``X-Edge-Replica`` says it."""
        return f"edge-{self.edges.index(edge) + 1}"

    def replica_named(self, name: str) -> Edge:
        (edge,) = [edge for edge in self.edges if self.replica_name(edge) == name]
        return edge

    def haproxy_command(self, command: str) -> str:
        """One command of HAProxy's runtime API (``set server edges_any/edge-1 state drain``,
        ``show servers state edges_any``); its answer."""
        if self.stats_socket is None:
            raise ProcessFailed("this cluster's HAProxy has no runtime API socket")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as api:
            api.settimeout(10)
            api.connect(str(self.stats_socket))
            api.sendall(command.encode() + b"\n")
            answer = b""
            while chunk := api.recv(65536):
                answer += chunk
        return answer.decode()

    def stop(self) -> None:
        if self.haproxy.poll() is None:
            self.haproxy.terminate()
            try:
                self.haproxy.wait(10)
            except subprocess.TimeoutExpired:
                self.haproxy.kill()
                self.haproxy.wait()
        for edge in self.edges:
            edge.stop()
        self.redis.stop()
        self.origin.stop()
        if self.stats_socket is not None:
            shutil.rmtree(self.stats_socket.parent, ignore_errors=True)

    @property
    def redis_args(self) -> tuple[str, ...]:
        """The ``edge serve`` flags that name this cluster's Redis."""
        if isinstance(self.redis, RedisClusterSet):
            return ("--redis-url", self.redis.seeds, "--redis-mode", "cluster")
        return ("--redis-url", self.redis.url)

    def describe(self) -> dict[str, object]:
        tls = {} if self.https_url is None else {"https_url": self.https_url}
        return {
            "url": self.url,
            **tls,
            "origin": self.origin.url,
            "origin_stats": self.origin.stats_url,
            "redis": self.redis_args[1],
            "edges": [{"url": e.url, "admin": e.admin_url} for e in self.edges],
            "logs": str(self.logs_dir),
            "haproxy_api": str(self.stats_socket),
        }


def _wait_until_routed(
    url: str, replicas: int, haproxy: subprocess.Popen[bytes], log: Path, seconds: float = 20.0
) -> None:
    """Until HAProxy answers with a replica behind it (its own 503 means none is up yet)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if haproxy.poll() is not None:
            raise ProcessFailed(f"haproxy exited: {log.read_text(errors='replace')[-1500:]}")
        try:
            with urllib.request.urlopen(f"{url}/__cluster_probe?offset=now", timeout=2) as r:
                if r.headers.get("Via"):
                    return
        except urllib.error.HTTPError as error:
            if error.headers.get("Via"):  # the origin's 404, relayed by an edge
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise ProcessFailed(f"HAProxy at {url} never reached any of {replicas} replicas")


def start_cluster(
    logs_dir: Path,
    *,
    replicas: int = 2,
    edge_args: tuple[str, ...] = (),
    long_poll_timeout_ms: int = 30_000,
    routing: tuple[str, ...] | None = None,
    redis_mode: str = "standalone",
    origin_on_disk: bool = True,
    tls: bool = False,
    tls_cert: Path | None = None,
) -> Cluster:
    """``origin_on_disk=False``: the reference origin's in-memory store. Its file-backed store
    keeps 100 file handles and, with more streams than that written at once, answers appends
    to existing streams 404 and reads behind their own writes (measured: 805 of 1,800 appends
    at 300 streams written once a second, none at 50, none in memory), which the edges rightly
    take for deleted or recreated streams; the scaled run (``loadtest.fleet``) writes 300.

    ``tls``: an HTTPS frontend too (``Cluster.https_url``), with ``tls_cert`` (one PEM with the
    certificate and its key, as HAProxy reads it) or one made for localhost/127.0.0.1."""
    haproxy_bin = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(haproxy_bin).exists():
        raise ProcessFailed("haproxy not found (make bootstrap installs it)")
    logs_dir.mkdir(parents=True, exist_ok=True)
    origin = start_origin(
        logs_dir,
        long_poll_timeout_ms=long_poll_timeout_ms,
        data_dir=logs_dir / "origin-data" if origin_on_disk else None,
        name="cluster-origin",
    )
    redis: Redis | RedisClusterSet
    if redis_mode == "cluster":
        redis = start_redis_cluster(logs_dir / "redis-cluster")
        shared: tuple[str, ...] = ("--redis-url", redis.seeds, "--redis-mode", "cluster")
    else:
        redis = start_redis(logs_dir, name="cluster-redis")
        shared = ("--redis-url", redis.url)
    edges = [
        start_edge(origin.url, logs_dir, *shared, *edge_args, name=f"cluster-edge-{i + 1}")
        for i in range(replicas)
    ]
    port = free_port()
    servers = "\n".join(
        f"    server edge-{i + 1} {e.url.removeprefix('http://')} check "
        f"port {e.admin_url.rsplit(':', 1)[1]} inter 500ms fall 2 rise 1"
        for i, e in enumerate(edges)
    )
    resume_routes = "\n".join(f"    {line}" for line in deployed_resume_routes())
    tls_frontend, https_url = "", None
    if tls or tls_cert is not None:
        certificate = tls_cert or make_certificate(logs_dir / "tls" / "localhost.pem")
        tls_port = free_port()
        tls_frontend = TLS_FRONTEND.format(
            port=tls_port, certificate=certificate.resolve(), resume_routes=resume_routes
        )
        https_url = f"https://127.0.0.1:{tls_port}"
    config = logs_dir / "haproxy.cfg"
    lines = deployed_routing() if routing is None else routing
    # A socket's path must fit in 108 bytes, which a test's logs directory may not.
    stats_socket = Path(tempfile.mkdtemp(prefix="edge-haproxy-")) / "api.sock"
    config.write_text(
        HAPROXY_TEMPLATE.format(
            port=port,
            servers=servers,
            routing="\n".join(f"    {line}" for line in lines),
            any_routing="\n".join(f"    {line}" for line in deployed_routing("edges_any")),
            resume_routes=resume_routes,
            stats_socket=stats_socket,
            tls_frontend=tls_frontend,
        )
    )
    log = logs_dir / "haproxy.log"
    with log.open("ab") as out:
        haproxy = subprocess.Popen(
            [haproxy_bin, "-db", "-f", str(config)],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
        )
    url = f"http://127.0.0.1:{port}"
    cluster = Cluster(
        origin=origin,
        redis=redis,
        edges=edges,
        haproxy=haproxy,
        url=url,
        logs_dir=logs_dir,
        https_url=https_url,
        edge_args=edge_args,
        _haproxy_log=log,
        stats_socket=stats_socket,
    )
    try:
        _wait_until_routed(url, replicas, haproxy, log)
    except ProcessFailed:
        cluster.stop()
        raise
    return cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make cluster", description=__doc__)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--edge-arg", action="append", default=[], help="extra `edge serve` flag")
    parser.add_argument(
        "--redis-mode", choices=("standalone", "cluster"), default="standalone",
        help="one redis-server, or a Redis Cluster of three primaries with a replica each",
    )  # fmt: skip
    parser.add_argument(
        "--tls", action="store_true",
        help="also serve HTTPS (ALPN h2,http/1.1) with a self-signed certificate made at start "
        "for localhost and 127.0.0.1; its URL is https_url",
    )  # fmt: skip
    parser.add_argument(
        "--tls-cert", type=Path, metavar="PEM",
        help="serve HTTPS with this certificate instead (one PEM: certificate, then key); "
        "implies --tls",
    )  # fmt: skip
    args = parser.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="edge-cluster-"))
    cluster = start_cluster(
        logs,
        replicas=args.replicas,
        edge_args=tuple(args.edge_arg),
        redis_mode=args.redis_mode,
        tls=args.tls,
        tls_cert=args.tls_cert,
    )
    print(json.dumps(cluster.describe(), indent=2), flush=True)
    print(f"\nstreams through HAProxy: {cluster.url}   (Ctrl-C stops everything)", flush=True)
    if cluster.https_url is not None:
        print(
            f"HTTPS (HTTP/2 or HTTP/1.1): {cluster.https_url}   (self-signed unless --tls-cert: "
            "curl -k, or accept it in the browser)",
            flush=True,
        )
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        while not stopping:
            time.sleep(0.5)
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
