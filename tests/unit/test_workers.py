"""--workers: how the edge's bounds are shared among workers, and the restart backoff."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from edge.config import Address, Settings, per_worker
from edge.workers.child import Bootstrap, encode, read_bootstrap
from edge.workers.mirror import Mirror
from edge.workers.supervisor import MAX_RESTART_DELAY_SECONDS, restart_delay

MiB = 1024 * 1024

BASE = Settings(
    origin="http://o",
    listen=Address(host="127.0.0.1", port=0),
    admin_listen=Address(host="127.0.0.1", port=0),
    purge_token="s3cret",
)


def test_one_worker_is_the_edge_itself() -> None:
    assert per_worker(BASE) is BASE


def test_the_edges_bounds_are_divided_so_the_totals_hold() -> None:
    edge = replace(
        BASE,
        workers=4,
        cache_bytes=256 * MiB,
        fill_buffer_bytes=64 * MiB,
        max_viewers=20_000,
        max_connections=1000,
        upstream_max_connections=10,
    )
    share = per_worker(edge)
    assert share.cache_bytes == 64 * MiB
    assert share.fill_buffer_bytes == 16 * MiB
    assert share.max_viewers == 5000
    assert share.max_connections == 250
    assert share.upstream_max_connections == 2
    # Per-process defaults (0: derived from the open-file limit, or unlimited) stay 0.
    assert (
        per_worker(replace(edge, max_connections=0, upstream_max_connections=0)).max_connections
        == 0
    )
    # Everything else is the same edge.
    assert share.origin == edge.origin
    assert share.purge_token == "s3cret"
    assert share.max_response_bytes == edge.max_response_bytes


def test_a_share_never_drops_to_zero_and_segments_fit_one_workers_cache() -> None:
    edge = replace(BASE, workers=16, max_viewers=3, max_connections=5, cache_bytes=256 * MiB)
    share = per_worker(edge)
    assert share.max_viewers == 1
    assert share.max_connections == 1
    assert share.cache_bytes == 16 * MiB
    # --max-segment-bytes (32 MiB) could not be held by a 16 MiB cache: capped there.
    assert share.max_segment_bytes == 16 * MiB


def test_restarts_back_off_up_to_a_cap() -> None:
    delays = [restart_delay(n) for n in range(1, 12)]
    assert delays[0] <= 0.1  # the first restart is at once
    assert delays == sorted(delays)
    assert delays[-1] == MAX_RESTART_DELAY_SECONDS
    assert delays[2] > delays[1] > delays[0]


def test_the_bootstrap_round_trips_with_the_secret() -> None:
    import io

    bootstrap = Bootstrap(
        index=1, settings=replace(BASE, workers=1), metrics_dir="/tmp/x", supervisor="http://x"
    )
    stream = io.BytesIO(encode(bootstrap) + b"left for the orphan watch")
    assert read_bootstrap(stream) == bootstrap
    assert stream.read() == b"left for the orphan watch"


def _two_workers_rendered(tmp_path: Path) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Two workers' registries snapshotted into one directory, read back by prometheus-client's
    own MultiProcessCollector: what the supervisor renders."""
    for pid, (requests, viewers, redis_up, durations) in enumerate(
        [(3, 5, 1, [0.002, 0.2]), (4, 7, 0, [0.002])], start=100
    ):
        registry = CollectorRegistry()
        Counter("edge_requests", "r", ["kind"], registry=registry).labels(kind="catchup").inc(
            requests
        )
        Gauge("edge_sse_viewers", "v", registry=registry).set(viewers)
        Gauge("edge_redis_up", "u", registry=registry).set(redis_up)
        histogram = Histogram("edge_d_seconds", "d", buckets=(0.01, 1.0), registry=registry)
        for value in durations:
            histogram.observe(value)
        mirror = Mirror(str(tmp_path), pid)
        mirror.write(registry.collect())
        mirror.close()
    rendered: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    collector = MultiProcessCollector(None, path=str(tmp_path))  # type: ignore[no-untyped-call]
    for family in collector.collect():
        for sample in family.samples:
            series = rendered.setdefault(sample.name, {})
            series[tuple(sorted(sample.labels.items()))] = sample.value
    return rendered


def test_worker_snapshots_combine_as_one_edge(tmp_path: Path) -> None:
    rendered = _two_workers_rendered(tmp_path)
    assert rendered["edge_requests_total"] == {(("kind", "catchup"),): 7}
    assert rendered["edge_sse_viewers"] == {(): 12}  # livesum
    assert rendered["edge_redis_up"] == {(): 0}  # livemin: one worker without Redis shows
    buckets = rendered["edge_d_seconds_bucket"]
    assert buckets[(("le", "0.01"),)] == 2  # cumulative again, over both workers
    assert buckets[(("le", "1.0"),)] == 3
    assert buckets[(("le", "+Inf"),)] == 3
    assert rendered["edge_d_seconds_count"] == {(): 3}
    assert abs(rendered["edge_d_seconds_sum"][()] - 0.204) < 1e-9
    assert "edge_requests_created" not in rendered


def test_a_dead_workers_counts_stay_and_its_gauges_go(tmp_path: Path) -> None:
    _two_workers_rendered(tmp_path)
    mark_process_dead(101, str(tmp_path))  # type: ignore[no-untyped-call]
    collector = MultiProcessCollector(None, path=str(tmp_path))  # type: ignore[no-untyped-call]
    values = {s.name: s.value for f in collector.collect() for s in f.samples if not s.labels}
    assert values["edge_sse_viewers"] == 5
    counters = {
        s.name: s.value for f in collector.collect() for s in f.samples if f.type == "counter"
    }
    assert counters["edge_requests_total"] == 7
