"""The capacity plan's arithmetic (docs/scaling.md, "Capacity plan"), in one place.

    python -m loadtest.capacity            # the plan for the two audiences of issue 19
    python -m loadtest.capacity --viewers 250000 --streams 1 --cores 8

Pure: figures measured per replica (``MEASURED``, each with the command that produced it) and an
audience in, a plan out. ``loadtest.fleet`` prints the same functions' predictions beside what its
scaled run measures, so the document and the run cannot disagree about the formulas.

The routing rule the predictions assume is the shipped one (``deploy/haproxy/haproxy.cfg``):
``balance uri path-only`` + ``hash-type consistent`` + ``hash-balance-factor 150``. HAProxy lets a
replica take a new connection while it serves fewer than ``factor x (connections + 1) / R``; so
one stream alone fills replicas up to the bound and overflows to the next, and ends on
``⌈R / factor⌉`` of them, while many streams spread over all R by their hash.
"""

from __future__ import annotations

import argparse
import bisect
import math
import random
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Measured:
    """What one replica was measured to do on this project's machine (docs/benchmarks.md)."""

    send_us: float  # edge CPU per event written to one SSE viewer (µs), unsaturated
    round_trip_ms: float  # append -> viewer with one viewer: agent, edge, origin, tail, back
    p99_ms: float  # the delivery p99 the plan holds each replica to
    viewers_per_core: int  # SSE viewers one worker (one core) carried within p99_ms
    memory_per_viewer_kb: float
    base_rss_mb: float  # one worker with no viewer, before --cache-bytes fills
    hits_per_core: int  # stored catch-up answers (100 B) per second, one worker
    source: str


# From the pinned runs of 2026-12-01 on a quiet machine (docs/benchmarks.md, "Fan-out on one
# pinned core" and "Cached hits ... 22:46"): `python -m loadtest.fanout --pin --viewers 2500
# 5000 7500 10000 --targets edge --edge-workers 1 --seconds 15` gave p99 37 / 142 / 197 / 234 ms
# at 0.56 / 0.95 / 0.97 / 0.96 cores and RSS 110 / 156 / 201 / 247 MB (20 appends/s);
# `python -m loadtest.hits --edge-args "--workers 1" --duration 3 --runs 3 --cells 100B
# tail2KB` gave 42,772 hits/s.
MEASURED = Measured(
    send_us=11.2,  # 0.56 cores / (2,500 viewers x 20 events/s)
    round_trip_ms=30.0,  # fitted: p99 - 2 x viewers x send_us at 5,000 and 7,500 viewers
    p99_ms=200.0,
    viewers_per_core=7_500,  # p99 197 ms
    memory_per_viewer_kb=18.3,  # (247 - 110) MB / 7,500 viewers
    base_rss_mb=65.0,  # 110 MB - 2,500 x 18.3 KB
    hits_per_core=42_772,
    source="pinned quiet-machine runs of 2026-12-01",
)


def predicted_p99_ms(viewers_per_worker: int, measured: Measured = MEASURED) -> float:
    """A worker writes each batch to its viewers one send at a time, and a batch that arrives
    while one is being written waits for it (then carries everything that came meanwhile, so
    batches coalesce rather than queue): the last viewer of a batch sees an event up to two
    batch-writes plus the round trip after its append, whatever the append rate once the
    worker is busy. (Checked: 10,000 viewers -> 2 x 112 + 30 = 254 ms predicted, 234 measured;
    7,500: 198 predicted, 197 measured; 5,000: 142, 142.)"""
    return 2 * viewers_per_worker * measured.send_us / 1000 + measured.round_trip_ms


BALANCE_FACTOR = 1.5  # hash-balance-factor 150


@dataclass(frozen=True)
class Audience:
    viewers: int
    streams: int

    @property
    def hottest(self) -> int:
        """Viewers of the largest stream (the audience spread evenly over its streams)."""
        return math.ceil(self.viewers / self.streams)


@dataclass(frozen=True)
class Plan:
    replicas: int
    cores_per_replica: int
    memory_per_replica_mb: float
    origin_live_connections: int  # the bound: S plus the extra replicas hot streams spread to
    replicas_per_hot_stream: int
    redis_shards: int
    viewers_per_replica: int  # at most (the load bound)


def viewers_per_core(measured: Measured, p99_ms: float | None = None) -> int:
    """The viewers one worker carries within ``p99_ms`` (the measured figure by default): from
    ``predicted_p99_ms`` solved for the viewer count."""
    if p99_ms is None:
        return measured.viewers_per_core
    return int((p99_ms - measured.round_trip_ms) * 1000 / (2 * measured.send_us))


def replicas_one_stream_spreads_over(replicas: int, factor: float = BALANCE_FACTOR) -> int:
    """How many replicas one stream's viewers end on when it is (nearly) the whole load."""
    return min(replicas, math.ceil(replicas / factor))


def plan(
    audience: Audience,
    cores_per_replica: int,
    measured: Measured = MEASURED,
    factor: float = BALANCE_FACTOR,
    cache_mb: float = 256.0,
) -> Plan:
    per_replica = viewers_per_core(measured) * cores_per_replica
    needed = max(1, math.ceil(audience.viewers / per_replica))
    hot_share = audience.hottest / audience.viewers
    if hot_share > 0.5:
        # One stream is most of the load: it settles on ⌈R / factor⌉ replicas, the others idle
        # for it, so R is sized for those to carry it.
        replicas = max(needed, math.ceil(needed * factor))
        while math.ceil(replicas / factor) * per_replica < audience.hottest:
            replicas += 1
        hot_replicas = replicas_one_stream_spreads_over(replicas, factor)
        load_bound = math.ceil(audience.viewers / hot_replicas)
        # Each of a replica's workers (one per core) follows the stream for its own viewers.
        live = hot_replicas * cores_per_replica
    else:
        # Many streams spread over all R by their hash, each on one replica (far below the
        # bound); the busiest replica is the hash's unevenness above the mean, taken from
        # simulated placements of this audience, and R grows until the busiest fits.
        per_stream = max(1, audience.viewers // audience.streams)
        replicas = needed
        while True:
            placements = [
                simulate(audience.streams, per_stream, replicas, factor, seed) for seed in range(3)
            ]
            load_bound = max(max(p.viewers_before) for p in placements)
            if load_bound <= per_replica:
                break
            replicas += 1
        hot_replicas = 1
        # A replica of W workers (one per core) follows a stream once per worker that holds
        # one of its k viewers (the kernel spreads connections over workers at random):
        # W x (1 - (1 - 1/W)^k) tails a stream, which is why many small runs want one-core
        # replicas.
        workers = cores_per_replica
        per_stream_tails = workers * (1 - (1 - 1 / workers) ** per_stream)
        live = math.ceil(max(p.tails_before for p in placements) * per_stream_tails)
    memory = measured.base_rss_mb * cores_per_replica + (
        load_bound * measured.memory_per_viewer_kb / 1024
    )
    return Plan(
        replicas=replicas,
        cores_per_replica=cores_per_replica,
        memory_per_replica_mb=memory + cache_mb * cores_per_replica,
        origin_live_connections=live,
        replicas_per_hot_stream=hot_replicas,
        # Every key of a stream is one slot; a shard holds tens of GB and ~100k commands/s,
        # and the edge writes a stream's segments once per fill: one shard with a replica
        # covers both audiences; shards are for memory (the streams' recent segments).
        redis_shards=1,
        viewers_per_replica=load_bound,
    )


class BoundedLoadRing:
    """HAProxy's ``hash-type consistent`` with ``hash-balance-factor`` (lb_chash.c), on a ring
    of random points: 16 per weight unit per server; a key goes to the server whose point is
    closest, then along the ring to the first server under its bound, which is its weight's
    share of ``⌈(connections + 1) x factor⌉`` (never 0). HAProxy places the points by a hash of
    the server id and the key by sdbm with avalanche: uniform on the ring, as here."""

    def __init__(self, replicas: int, factor: float, rng: random.Random, weight: int = 100):
        self.factor_percent = round(factor * 100)
        self.weight = weight * 16  # HAProxy's effective weight (BE_WEIGHT_SCALE)
        points = [
            (rng.getrandbits(32), server) for server in range(replicas) for _ in range(weight * 16)
        ]
        points.sort()
        self.keys = [key for key, _ in points]
        self.owners = [server for _, server in points]
        self.alive = list(range(replicas))
        self.served = [0] * replicas
        self.stream_keys: dict[int, int] = {}
        self.rng = rng

    def _eligible(self, server: int) -> bool:
        total_weight = self.weight * len(self.alive)
        slots_total = ((sum(self.served) + 1) * self.factor_percent + 99) // 100
        per_weight, remainder = divmod(slots_total, total_weight)
        cumulative = self.alive.index(server) * self.weight
        slots = self.weight * per_weight + (
            (cumulative + self.weight) * remainder // total_weight
            - cumulative * remainder // total_weight
        )
        return self.served[server] < max(1, slots)

    def place(self, stream: int) -> int:
        key = self.stream_keys.setdefault(stream, self.rng.getrandbits(32))
        n = len(self.keys)
        after = bisect.bisect_left(self.keys, key) % n
        before = (after - 1) % n
        index = (
            before
            if (key - self.keys[before]) % 2**32 <= (self.keys[after] - key) % 2**32
            else after
        )
        for step in range(n):
            server = self.owners[(index + step) % n]
            if server in self.alive and self._eligible(server):
                self.served[server] += 1
                return server
        raise RuntimeError("no server")

    def remove(self, server: int) -> None:
        """The server is down: its points leave the ring (HAProxy's health check)."""
        self.alive.remove(server)
        self.served[server] = 0
        kept = [(k, o) for k, o in zip(self.keys, self.owners, strict=True) if o != server]
        self.keys = [k for k, _ in kept]
        self.owners = [o for _, o in kept]


@dataclass(frozen=True)
class Placement:
    """One simulated run: viewers per replica and live (stream, replica) pairs, before and after
    the replica serving the most viewers is lost."""

    viewers_before: tuple[int, ...]
    viewers_after: tuple[int, ...]  # the killed replica's entry is 0
    tails_before: int
    tails_after: int


def simulate(streams: int, per_stream: int, replicas: int, factor: float, seed: int) -> Placement:
    """Viewers arrive interleaved (viewer v watches stream v % streams, as ``loadtest.fleet``
    connects them); then the busiest replica dies and its viewers arrive again in random order."""
    rng = random.Random(seed)
    ring = BoundedLoadRing(replicas, factor, rng)
    viewers = [(v % streams, ring.place(v % streams)) for v in range(streams * per_stream)]
    before = tuple(ring.served)
    tails_before = len(set(viewers))
    victim = before.index(max(before))
    moving = [stream for stream, server in viewers if server == victim]
    staying = [(stream, server) for stream, server in viewers if server != victim]
    ring.remove(victim)
    rng.shuffle(moving)
    moved = [(stream, ring.place(stream)) for stream in moving]
    return Placement(
        viewers_before=before,
        viewers_after=tuple(ring.served),
        tails_before=tails_before,
        tails_after=len(set(staying + moved)),
    )


@dataclass(frozen=True)
class FleetPrediction:
    """What ``loadtest.fleet`` should see for one scenario: the range (5th to 95th percentile)
    of ``runs`` simulated placements, and the fleet's send work."""

    tails_before: tuple[int, int]  # origin live connections while every replica is up
    tails_after: tuple[int, int]  # after the busiest replica died and its viewers moved
    busiest_before: tuple[int, int]  # viewers on the busiest replica
    serving_before: tuple[int, int]  # replicas with viewers
    busiest_after: tuple[int, int]
    edge_cpu_cores: float  # the fleet's sends alone: viewers x rate x send_us


def _range(values: list[int]) -> tuple[int, int]:
    ordered = sorted(values)
    return ordered[int(len(ordered) * 0.05)], ordered[
        min(len(ordered) - 1, int(len(ordered) * 0.95))
    ]


def fleet_prediction(
    streams: int,
    per_stream: int,
    replicas: int,
    events_per_second: float,
    measured: Measured = MEASURED,
    factor: float = BALANCE_FACTOR,
    runs: int = 40,
) -> FleetPrediction:
    placements = [simulate(streams, per_stream, replicas, factor, seed) for seed in range(runs)]
    viewers = streams * per_stream
    return FleetPrediction(
        tails_before=_range([p.tails_before for p in placements]),
        tails_after=_range([p.tails_after for p in placements]),
        busiest_before=_range([max(p.viewers_before) for p in placements]),
        serving_before=_range([sum(1 for v in p.viewers_before if v) for p in placements]),
        busiest_after=_range([max(p.viewers_after) for p in placements]),
        edge_cpu_cores=viewers * events_per_second * measured.send_us / 1e6,
    )


AUDIENCES = {
    "one million viewers of one run": (Audience(viewers=1_000_000, streams=1), 4),
    "10,000 runs with 5 viewers each": (Audience(viewers=50_000, streams=10_000), 1),
    "10,000 runs with 5 viewers each, on 2-core replicas": (
        Audience(viewers=50_000, streams=10_000),
        2,
    ),
}


def render(name: str, audience: Audience, result: Plan) -> str:
    return (
        f"{name}: {result.replicas} replicas x {result.cores_per_replica} cores "
        f"(≤ {result.viewers_per_replica:,} viewers each), "
        f"{result.memory_per_replica_mb:,.0f} MB a replica, "
        f"{result.origin_live_connections:,} origin live connections "
        f"({result.replicas_per_hot_stream} replica(s) per stream), "
        f"{result.redis_shards} Redis shard(s)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.capacity", description=__doc__)
    parser.add_argument("--viewers", type=int)
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--cores", type=int, default=2, help="cores per replica")
    args = parser.parse_args(argv)
    print(f"per-replica figures: {MEASURED}")
    if args.viewers:
        audience = Audience(args.viewers, args.streams)
        print(render("audience", audience, plan(audience, args.cores)))
        return 0
    for name, (audience, cores) in AUDIENCES.items():
        print(render(name, audience, plan(audience, cores)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
