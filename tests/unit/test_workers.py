"""--workers: how the edge's bounds are shared among workers, the restart backoff, and how one
worker's decisions to forget a stream are told to its siblings."""

from __future__ import annotations

import asyncio
import contextvars
import json
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from edge.config import Address, Settings, per_worker
from edge.instances import Instances, build
from edge.instances.door import InstanceChanged
from edge.instances.forgetting import Forgetting, Unsettled
from edge.log.stream_log import LogKey
from edge.metrics import Metrics
from edge.origin import OriginClient
from edge.protocol.reads import PUBLIC_SCOPE
from edge.store.local import LocalTier
from edge.web.wiring import CatchupParts, build_catchup
from edge.workers.bootstrap import Bootstrap, encode, read_bootstrap
from edge.workers.mirror import Mirror
from edge.workers.siblings import (
    Siblings,
    Transport,
    at_supervisors_request,
    decode_forgot,
    encode_forgot,
    replay_forgets,
    should_tell,
)
from edge.workers.siblings import encode as encode_observation
from edge.workers.supervisor import MAX_RESTART_DELAY_SECONDS, parse_report, restart_delay

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
    # Per-process defaults (0: derived from each worker's open-file limit) stay 0.
    derived = per_worker(
        replace(edge, max_connections=0, upstream_max_connections=0, max_viewers=0)
    )
    assert (derived.max_connections, derived.upstream_max_connections, derived.max_viewers) == (
        0,
        0,
        0,
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


# --- telling siblings what a worker forgot ---

OFFSET_5 = "0000000000000000_0000000000000005"
OFFSET_9 = "0000000000000000_0000000000000009"


def test_unsettled_lists_what_is_under_way_per_stream_until_done() -> None:
    unsettled: Unsettled[str] = Unsettled()
    assert unsettled.of("/a") == ()
    unsettled.add("/a", "one")
    unsettled.add("/a", "two")
    unsettled.add("/b", "three")
    assert sorted(unsettled.of("/a")) == ["one", "two"]
    unsettled.done("/a", "one")
    unsettled.done("/a", "one")  # twice: nothing more happens
    unsettled.done("/c", "never added")
    assert unsettled.of("/a") == ("two",)
    unsettled.done("/a", "two")
    assert unsettled.of("/a") == ()
    assert unsettled.of("/b") == ("three",)


class Told:
    """A teller that records each forgetting and hands back a telling the test finishes."""

    def __init__(self) -> None:
        self.keys: list[LogKey] = []
        self.forgettings: list[Forgetting] = []
        self.tellings: list[asyncio.Future[None]] = []

    def __call__(self, forgetting: Forgetting) -> asyncio.Future[None]:
        self.keys.append(forgetting.key)
        self.forgettings.append(forgetting)
        telling: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.tellings.append(telling)
        return telling


def _instances() -> tuple[Instances, LocalTier, Told]:
    settings = BASE
    local = LocalTier(1 << 20)
    instances = build(settings, local, OriginClient(settings), Metrics(), clock=lambda: 1000.0)
    told = Told()
    instances.forgetter.tellers.append(told)
    return instances, local, told


async def test_every_cause_of_forgetting_is_told_once_through_one_place() -> None:
    instances, local, told = _instances()
    public = LogKey(stream="/s", scope=PUBLIC_SCOPE)
    scoped = LogKey(stream="/s", scope="token-1")
    instances.forgetter.forget("/s", reason="admin_purge")
    instances.forgetter.stream_gone(public)
    instances.forgetter.stream_gone(scoped)
    instances.writes.observe("DELETE", "/s", 204, [], [], started=instances.ticket())
    instances.writes.observe("PUT", "/s", 201, [], [], started=instances.ticket())
    instances.writes.observe("GET", "/s", 404, [], [], started=instances.ticket())
    # A live upstream whose tail went back: another stream at the path.
    instance = local.instance_for("/s")
    with pytest.raises(InstanceChanged):
        instances.door.record_live(
            public, OFFSET_9, OFFSET_5, b"", up_to_date=True, closed=False,
            instance=instance, started=instances.ticket(),
        )  # fmt: skip
    assert told.keys == [public, public, scoped, public, public, public, public]
    # Each says why (a webhook's reason), and that this process is the one to tell downstream.
    assert [f.reason for f in told.forgettings] == [
        "admin_purge", "gone", "gone", "deleted", "created", "gone", "new_instance",
    ]  # fmt: skip
    assert all(f.tells_downstream for f in told.forgettings)
    # A 404 for a stream this process held nothing of says so (only the shared tier may know).
    assert not told.forgettings[1].held_here
    # What every process hears from the shared tier itself is not told.
    instances.forgetter.forgotten_elsewhere("/s", "another-generation")
    instances.forgetter.resync()
    assert len(told.keys) == 7


@pytest.mark.parametrize(
    ("held_type", "same_type", "other_type"),
    [
        ("application/json", "application/json", "text/plain"),
        # The origin keeps a stream's Content-Type whole: another charset is another stream,
        # while case and spaces are only spelling.
        ("text/plain", "Text/Plain", "text/plain; charset=iso-8859-1"),
    ],
)
async def test_a_head_answered_as_another_content_type_is_another_instance(
    held_type: str, same_type: str, other_type: str
) -> None:
    """A HEAD answer names the stream's content type and states its whole lifetime: of another
    type, it is another stream's lifetime, not to be learned for the instance held."""
    instances, local, told = _instances()
    held = local.instance_for("/s")
    held.content_type = held_type
    instances.writes.observe(
        "HEAD", "/s", 200, [], [("Content-Type", same_type), ("Stream-TTL", "60")],
        started=instances.ticket(),
    )  # fmt: skip
    assert local.current(held)
    assert held.ttl_seconds == 60.0
    assert told.keys == []
    instances.writes.observe(
        "HEAD", "/s", 200, [], [("Content-Type", other_type), ("Stream-TTL", "5")],
        started=instances.ticket(),
    )  # fmt: skip
    assert not local.current(held)
    assert held.ttl_seconds == 60.0  # the other stream's lifetime was not learned for it
    assert [f.reason for f in told.forgettings] == ["new_instance"]


async def test_settled_waits_for_the_tellings_of_its_stream_only() -> None:
    instances, _local, told = _instances()
    await instances.forgetter.settled("/s")  # nothing under way: at once
    instances.forgetter.forget("/s", reason="admin_purge")
    instances.forgetter.forget("/other", reason="admin_purge")
    waiting = asyncio.ensure_future(instances.forgetter.settled("/s"))
    await asyncio.sleep(0)
    assert not waiting.done()
    told.tellings[1].set_result(None)  # /other's
    await asyncio.sleep(0)
    assert not waiting.done()
    told.tellings[0].set_result(None)
    await asyncio.wait_for(waiting, 1)
    await asyncio.wait_for(instances.forgetter.settled("/s"), 1)  # done tellings are not kept


async def test_what_is_done_at_the_supervisors_request_is_told_downstream_only_if_named() -> None:
    instances, _local, told = _instances()
    with at_supervisors_request():
        instances.forgetter.forget("/s", reason="admin_purge")
        instances.writes.observe("DELETE", "/s", 204, [], [], started=instances.ticket())
    with at_supervisors_request(tells_downstream=True):  # the one worker the supervisor names
        instances.forgetter.forget("/s", reason="admin_purge")
    instances.forgetter.forget("/s", reason="admin_purge")
    assert [f.tells_downstream for f in told.forgettings] == [False, False, True, True]


def test_a_forgot_message_round_trips_and_anything_else_is_not_one() -> None:
    key = LogKey(stream="/v1/stream/a b", scope="token-1")
    assert decode_forgot(json.loads(encode_forgot(key, held=True))) == key
    assert decode_forgot({"method": "GET", "stream": "/x"}) is None  # an observation
    assert decode_forgot([1]) is None
    with pytest.raises(ValueError, match="names a stream"):
        decode_forgot({"kind": "forgot", "stream": 3, "scope": PUBLIC_SCOPE})


def test_a_forgetting_is_told_unless_the_supervisor_tells_it_or_a_replay_repeats_it() -> None:
    key = LogKey(stream="/s", scope=PUBLIC_SCOPE)
    assert should_tell(key, at_supervisors_request=False, replayed=None)
    assert should_tell(key, at_supervisors_request=False, replayed="/other")
    assert not should_tell(key, at_supervisors_request=False, replayed="/s")
    assert not should_tell(key, at_supervisors_request=True, replayed=None)
    # Replays that forget on the sibling as they did here...
    assert replay_forgets("DELETE", 204)
    assert replay_forgets("put", 201)
    assert replay_forgets("GET", 404)
    assert replay_forgets("HEAD", 404)
    # A 404 or 410 to any request: the stream is gone (issue 27).
    for method in ("GET", "HEAD", "POST", "PUT", "DELETE"):
        assert replay_forgets(method, 404)
        assert replay_forgets(method, 410)
    # ...and those that do not (a write below the tail is judged only by who relayed it).
    assert not replay_forgets("POST", 204)
    assert not replay_forgets("PUT", 200)
    assert not replay_forgets("PUT", 409)
    assert not replay_forgets("DELETE", 409)


def test_a_worker_is_cleared_to_listen_only_after_its_reachable_report() -> None:
    reachable = b'{"event": "reachable", "admin": "http://127.0.0.1:9"}\n'
    assert parse_report(reachable, "reachable")["admin"] == "http://127.0.0.1:9"
    # A worker that listened before reporting where it is reached is a failed start.
    listening = b'{"event": "listening", "admin": "http://127.0.0.1:9", "listen": "x"}\n'
    with pytest.raises(ValueError, match="expected a 'reachable'"):
        parse_report(listening, "reachable")
    with pytest.raises(ValueError, match="names its admin"):
        parse_report(b'{"event": "reachable"}', "reachable")
    with pytest.raises(ValueError):  # noqa: PT011 - json's own error: no message to match
        parse_report(b"", "reachable")


async def test_siblings_tell_through_their_transport_and_never_echo() -> None:
    """Two workers whose transport is an in-process supervisor: each message is told once, by
    the worker that learned it, and what a sibling applies is not told back."""
    caches = [build_catchup(BASE, OriginClient(BASE), Metrics()) for _ in range(2)]
    sent: list[tuple[int, bytes]] = []
    workers: list[Siblings] = []

    def transport(index: int) -> Transport:
        async def tell(body: bytes) -> None:
            sent.append((index, body))
            # The other worker, in a context of its own (as in its own process).
            await asyncio.create_task(workers[1 - index].apply(body), context=contextvars.Context())

        return tell

    for index, cache in enumerate(caches):
        siblings = Siblings(
            forgetter=cache.forgetter, local=cache.local, observe=cache.lifecycle.observe,
            tell=transport(index),
        )  # fmt: skip
        cache.forgetter.tellers.append(siblings.forgot)
        workers.append(siblings)
    held = [cache.local.instance_for("/s") for cache in caches]

    # A DELETE relayed by worker 0: its own purge is covered by the replay, told once.
    await workers[0].observe("DELETE", "/s", 204, [], [], caches[0].ticket())
    assert sent == [(0, encode_observation("DELETE", "/s", 204, [], [], held=True))]
    assert all(not cache.local.current(old) for cache, old in zip(caches, held, strict=True))

    # A forgetting worker 1 decides (a 404 to a credentialed fill) is told as such.
    scoped = LogKey(stream="/s", scope="token-1")
    caches[1].forgetter.stream_gone(scoped)
    await caches[1].forgetter.settled("/s")
    assert sent[1:] == [(1, encode_forgot(scoped, held=True))]

    # What the supervisor asks of every worker itself (a purge) is not told.
    with at_supervisors_request():
        caches[0].lifecycle.forget("/s")
    await caches[0].forgetter.settled("/s")
    assert len(sent) == 2

    # Nothing to tell with (not serving yet, or stopped): observed here alone.
    cache = build_catchup(BASE, OriginClient(BASE), Metrics())
    alone = Siblings(
        forgetter=cache.forgetter, local=cache.local, observe=cache.lifecycle.observe,
        tell=lambda _: None,
    )  # fmt: skip
    cache.forgetter.tellers.append(alone.forgot)
    before = cache.local.instance_for("/t")
    await alone.observe("PUT", "/t", 201, [], [], cache.ticket())
    assert not cache.local.current(before)
    assert alone.forgot(Forgetting(key=LogKey(stream="/t", scope="token-1"), reason="gone")) is None
    assert len(sent) == 2


class Recorded:
    """A teller that records each forgetting and gives nothing to wait for (as the CDN's)."""

    def __init__(self) -> None:
        self.forgettings: list[Forgetting] = []

    def __call__(self, forgetting: Forgetting) -> None:
        self.forgettings.append(forgetting)


def _two_workers() -> tuple[list[CatchupParts], list[Siblings], list[Recorded]]:
    """Two workers told of each other through an in-process supervisor, each with a teller that
    records what it forgets."""
    caches = [build_catchup(BASE, OriginClient(BASE), Metrics()) for _ in range(2)]
    workers: list[Siblings] = []
    tolds = [Recorded(), Recorded()]

    def transport(index: int) -> Transport:
        async def tell(body: bytes) -> None:
            await asyncio.create_task(workers[1 - index].apply(body), context=contextvars.Context())

        return tell

    for index, cache in enumerate(caches):
        siblings = Siblings(
            forgetter=cache.forgetter, local=cache.local, observe=cache.lifecycle.observe,
            tell=transport(index),
        )  # fmt: skip
        cache.forgetter.tellers.append(siblings.forgot)
        cache.forgetter.tellers.append(tolds[index])
        workers.append(siblings)
    return caches, workers, tolds


async def test_a_404_on_a_worker_that_held_nothing_is_told_downstream_by_those_that_held() -> None:
    caches, workers, tolds = _two_workers()
    public = LogKey(stream="/s", scope=PUBLIC_SCOPE)
    caches[1].local.log_for(public)  # worker 1 served the stream; worker 0 never did
    caches[0].forgetter.stream_gone(public)
    await caches[0].forgetter.settled("/s")
    (decided,) = tolds[0].forgettings
    (replayed,) = tolds[1].forgettings
    assert (decided.held_here, replayed.held_here) == (False, True)
    assert replayed.tells_downstream  # the one that may have served it downstream purges it
    # Neither held it (a scanner's path): the sibling does not tell; the decider alone may,
    # only if the shared tier says some replica held it (edge.cdn.purger).
    caches[0].forgetter.stream_gone(LogKey(stream="/scanned", scope=PUBLIC_SCOPE))
    await caches[0].forgetter.settled("/scanned")
    assert not tolds[1].forgettings[-1].tells_downstream
    assert tolds[0].forgettings[-1].tells_downstream
    # A write's forgetting is its relaying worker's to tell, whoever held the stream.
    await workers[0].observe("DELETE", "/s", 204, [], [], caches[0].ticket())
    assert tolds[0].forgettings[-1].reason == "deleted"
    assert tolds[0].forgettings[-1].tells_downstream
    assert tolds[1].forgettings[-1].reason == "deleted"
    assert not tolds[1].forgettings[-1].tells_downstream


async def test_a_404_after_a_known_lifetime_ended_is_an_expiry() -> None:
    instances, local, told = _instances()  # its clock says 1000
    instance = local.instance_for("/s")
    instance.learn_lifetime(10.0, None)
    instance.touched_origin(900.0)
    instances.forgetter.stream_gone(LogKey(stream="/s", scope=PUBLIC_SCOPE))
    assert told.forgettings[-1].reason == "expired"
