"""The capacity plan's arithmetic (loadtest/capacity.py): the bounded-load placement model the
scaled run is checked against, and the plan's formulas."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from loadtest.capacity import (
    MEASURED,
    Audience,
    BoundedLoadRing,
    plan,
    predicted_p99_ms,
    simulate,
    viewers_per_core,
)


def test_the_bound_is_each_servers_share_of_the_factor_times_the_connections() -> None:
    """lb_chash.c's chash_server_is_eligible: ⌈(served + 1) x factor⌉ slots, shared by weight,
    never 0 for a server."""
    ring = BoundedLoadRing(3, 1.5, random.Random(0))
    assert all(ring._eligible(s) for s in range(3))  # nothing served: each may take one
    ring.served = [1, 0, 0]
    assert not ring._eligible(0)  # ⌈2 x 1.5⌉ = 3 slots over 3 servers: one each
    ring.served = [300, 300, 299]
    # ⌈900 x 1.5⌉ = 1350 slots, 450 each: all eligible; at 450 a server is full.
    assert all(ring._eligible(s) for s in range(3))
    ring.served = [450, 225, 224]
    assert not ring._eligible(0)
    assert ring._eligible(1)


@settings(max_examples=60, deadline=None)
@given(
    streams=st.integers(1, 40),
    per_stream=st.integers(1, 12),
    replicas=st.integers(2, 5),
    factor=st.sampled_from([1.1, 1.25, 1.5, 2.0]),
    seed=st.integers(0, 2**16),
)
def test_placements_keep_every_viewer_and_no_replica_passes_the_bound(
    streams: int, per_stream: int, replicas: int, factor: float, seed: int
) -> None:
    placement = simulate(streams, per_stream, replicas, factor, seed)
    viewers = streams * per_stream
    assert sum(placement.viewers_before) == viewers
    assert sum(placement.viewers_after) == viewers  # the killed replica's viewers all moved
    assert (
        placement.viewers_after[placement.viewers_before.index(max(placement.viewers_before))] == 0
    )
    # The bound at the last placement (HAProxy lets every server hold at least one).
    bound = max(1, math.ceil(math.ceil(viewers * factor) / replicas))
    assert max(placement.viewers_before) <= bound + 1
    # One tail per stream at least, never more than one per replica.
    assert streams <= placement.tails_before <= streams * replicas
    assert streams <= placement.tails_after <= streams * (replicas - 1)


def test_one_stream_alone_settles_on_r_over_the_factor_replicas() -> None:
    for replicas in (2, 3, 4, 6):
        placement = simulate(1, 3000, replicas, 1.5, seed=replicas)
        serving = sum(1 for v in placement.viewers_before if v)
        assert serving == math.ceil(replicas / 1.5), (replicas, placement)
        assert placement.tails_before == serving


def test_many_streams_spread_over_every_replica_with_few_extra_tails() -> None:
    placement = simulate(300, 5, 3, 1.5, seed=1)
    assert min(placement.viewers_before) > 0
    assert placement.tails_before <= 300 * 1.05  # the cold start's few spills only


def test_the_plan_sizes_a_one_stream_audience_for_the_replicas_it_lands_on() -> None:
    audience = Audience(viewers=1_000_000, streams=1)
    result = plan(audience, cores_per_replica=4)
    per_replica = viewers_per_core(MEASURED) * 4
    # The stream settles on ⌈R / 1.5⌉ replicas: those carry it, within the per-replica figure.
    assert math.ceil(result.replicas / 1.5) * per_replica >= audience.viewers
    assert result.replicas_per_hot_stream == math.ceil(result.replicas / 1.5)
    assert result.origin_live_connections == result.replicas_per_hot_stream * 4  # a tail a worker
    assert result.viewers_per_replica <= per_replica


def test_the_plan_for_many_small_runs_is_one_origin_tail_each() -> None:
    audience = Audience(viewers=50_000, streams=10_000)
    result = plan(audience, cores_per_replica=1)
    per_replica = viewers_per_core(MEASURED)
    assert result.replicas >= math.ceil(50_000 / per_replica)
    assert result.viewers_per_replica <= per_replica
    # One tail a run, plus the cold start's few spills.
    assert 10_000 <= result.origin_live_connections <= 10_100
    assert result.replicas_per_hot_stream == 1
    # Two workers a replica: each worker holding a viewer of a run follows it (5 viewers over
    # 2 workers: both hold one 15 times in 16).
    two = plan(audience, cores_per_replica=2)
    assert 10_000 * 1.9 <= two.origin_live_connections <= 10_100 * 2


def test_the_per_core_viewer_figure_is_the_latency_model_solved_for_viewers() -> None:
    """predicted_p99_ms and viewers_per_core are one model read both ways, and it reproduces
    the pinned runs it was fitted to within 10%."""
    for p99 in (150.0, 200.0, 400.0):
        viewers = viewers_per_core(MEASURED, p99)
        assert abs(predicted_p99_ms(viewers) - p99) < 0.1
    for viewers, measured_p99 in ((5_000, 142.5), (7_500, 196.7), (10_000, 233.6)):
        assert abs(predicted_p99_ms(viewers) - measured_p99) / measured_p99 < 0.1
    assert predicted_p99_ms(MEASURED.viewers_per_core) <= MEASURED.p99_ms
