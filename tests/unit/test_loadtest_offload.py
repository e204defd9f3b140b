"""``make loadtest``'s figures (``loadtest.offload``): what reached the origin out of what the
clients made, between two samples, and the words the summary and the progress line use."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from loadtest.offload import (
    EdgeCounts,
    LatencyRow,
    Sample,
    latency_lines,
    parse_edge_metrics,
    progress_line,
    read_samples,
    seconds_of,
    share,
    share_lines,
)

METRICS = """\
# HELP edge_served_bytes_total Body bytes sent to clients.
# TYPE edge_served_bytes_total counter
edge_served_bytes_total 5000.0
edge_served_bytes_created 1.7e+09
edge_origin_bytes_total 250.0
edge_cache_requests_total{result="hit"} 90.0
edge_cache_requests_total{result="delta"} 2.0
edge_cache_requests_total{result="miss"} 3.0
edge_cache_requests_total{result="bypass"} 5.0
edge_requests_total{code="200",kind="catchup"} 100.0
"""


def sample(
    seconds: float,
    requests: int,
    origin: int | None,
    *,
    served: float = 0.0,
    fetched: float = 0.0,
    hits: float = 0.0,
    misses: float = 0.0,
    failures: int = 0,
    edges: bool = True,
) -> Sample:
    return Sample(
        seconds=seconds,
        users=10,
        requests=requests,
        failures=failures,
        deliveries=requests * 3,
        origin_requests=origin,
        edges=EdgeCounts(
            served_bytes=served, origin_bytes=fetched, cache={"hit": hits, "miss": misses}
        )
        if edges
        else None,
        latency_ms={"SSE delivery": (4.0, 25.0)},
    )


def test_an_edges_counters_are_read_from_its_metrics_text() -> None:
    counts = parse_edge_metrics(METRICS)
    assert counts.served_bytes == 5000.0
    assert counts.origin_bytes == 250.0
    assert counts.cache == {"hit": 90.0, "delta": 2.0, "miss": 3.0, "bypass": 5.0}
    both = counts + parse_edge_metrics(METRICS)
    assert both.served_bytes == 10_000.0
    assert both.cache["hit"] == 180.0


def test_the_share_is_the_last_sample_minus_the_first() -> None:
    first = sample(0.0, 100, 40, served=1_000, fetched=500, hits=1, misses=1)
    last = sample(60.0, 10_100, 240, served=1_001_000, fetched=10_500, hits=901, misses=101)
    result = share(first, last, writes=150)
    assert result.client_requests == 10_000
    assert result.origin_requests == 200
    assert result.request_share == 0.02
    assert result.byte_share == 0.01
    assert result.hit_ratio == 0.9
    lines = share_lines(result)
    assert lines[0] == (
        "origin share  2.0% of requests reached the origin: 200 of 10,000 that clients made"
    )
    assert "150 of those 200 are the agent's appends" in lines[1]
    assert lines[2].strip() == "1.0% of bytes: 10.0 KB from the origin for 1.0 MB served to clients"
    assert lines[3].startswith("hit ratio     90.0% of catch-up reads answered by an edge alone")


def test_an_unknown_counter_reads_n_a_never_zero() -> None:
    first = sample(0.0, 0, None, edges=False)
    last = sample(10.0, 0, None, edges=False)
    result = share(first, last, writes=0)
    assert result.request_share is None
    assert result.byte_share is None
    assert result.hit_ratio is None
    text = "\n".join(share_lines(result))
    assert "origin share  n/a" in text
    assert "bytes n/a" in text
    assert "hit ratio     n/a" in text
    # Known counters with nothing to divide by are n/a too.
    quiet = share(sample(0.0, 5, 7), sample(1.0, 5, 7), writes=0)
    assert quiet.request_share is None
    assert share_lines(quiet)[0].startswith("origin share  n/a of requests")


counters = st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**9))


@settings(max_examples=50, deadline=None)
@given(st.lists(counters, min_size=3, max_size=3))
def test_shares_of_adjacent_intervals_add_up_to_the_whole(
    steps: list[tuple[int, int, int]],
) -> None:
    """Cumulative samples: the counts from a to c are those from a to b plus b to c."""
    totals = [0, 0, 0]
    samples = []
    for i, (requests, origin, served) in enumerate(steps):
        totals = [totals[0] + requests, totals[1] + origin, totals[2] + served]
        samples.append(sample(float(i), totals[0], totals[1], served=float(totals[2])))
    a, b, c = samples
    whole, first, second = share(a, c, 0), share(a, b, 0), share(b, c, 0)
    assert whole.client_requests == first.client_requests + second.client_requests
    assert whole.origin_requests == (first.origin_requests or 0) + (second.origin_requests or 0)
    assert whole.served_bytes == (first.served_bytes or 0) + (second.served_bytes or 0)


def test_samples_survive_the_timeline_file() -> None:
    written = [sample(0.0, 1, 2, served=3.0), sample(1.5, 4, None, edges=False)]
    assert read_samples([s.to_json() for s in written] + [""]) == written


def test_the_progress_line_gives_elapsed_users_rate_and_failures() -> None:
    before = sample(10.0, 1_000, 1, failures=0)
    now = sample(12.0, 3_000, 2, failures=2)
    line = progress_line(now, previous=before, target_users=200, run_seconds=60.0)
    assert line == ("0:12 / 1:00  users 10/200  1,000 requests/s  3,000 SSE events/s  failures 2")
    late = progress_line(sample(61.0, 3_000, 2), previous=now, target_users=200, run_seconds=60)
    assert late.startswith("1:01 / 1:00 (stopping)  users 10/200  0 requests/s")


def test_latencies_come_with_what_they_time_known_ones_first() -> None:
    rows = [
        LatencyRow(kind="GET", name="zzz", count=1, failures=1, p50_ms=1, p99_ms=2),
        LatencyRow(kind="SSE", name="delivery", count=1_000, failures=0, p50_ms=4, p99_ms=25),
    ]
    lines = latency_lines(rows)
    assert lines[1].split()[:5] == ["SSE", "delivery", "4", "25", "1,000"]
    assert "from its send to a viewer decoding it" in lines[1]
    assert lines[2].split()[:2] == ["GET", "zzz"]
    assert lines[2].endswith("(1 failed)")


def test_run_times_in_locusts_spelling() -> None:
    assert seconds_of("90") == 90
    assert seconds_of("60s") == 60
    assert seconds_of("5m") == 300
    assert seconds_of("1h30m") == 5400
    assert seconds_of("soon") is None
    assert seconds_of("5m later") is None
