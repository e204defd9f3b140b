"""Purges sent to the CDN by the real edge, in front of the real origin, whenever it forgets a
stream: every cause of forgetting reaches every ``--cdn-purge`` target (stand-ins that check
the documented requests: tests/cdn_stand_ins.py), once and once more after the double purge's
window, however many workers; replicas sharing Redis; a dead CDN slows nothing; what is owed
at SIGTERM goes before the edge exits. Real Varnish is tests/integration/test_cdn_varnish.py."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin, start_edge, start_redis
from edge.cdn.purger import DOUBLE_PURGE_SECONDS
from edge.protocol.purge_keys import stream_key
from tests.cdn_stand_ins import (
    CloudflareStandIn,
    FastlyStandIn,
    StandIn,
    VarnishStandIn,
    WebhookStandIn,
    eventually,
)
from tests.integration.test_cdn_purger import closed_port, silent_port
from tests.integration.test_passthrough import call, metric_value

TEXT = {"Content-Type": "text/plain"}
TOKENS = {"EDGE_FASTLY_TOKEN": "fastly-token-1", "EDGE_CLOUDFLARE_TOKEN": "cloudflare-token-1"}
KINDS = ("varnish", "webhook", "fastly", "cloudflare")


@pytest.fixture(scope="module")
def targets() -> Iterator[dict[str, StandIn]]:
    started: dict[str, StandIn] = {
        "varnish": VarnishStandIn().start(),
        "webhook": WebhookStandIn().start(),
        "fastly": FastlyStandIn("svc-1", TOKENS["EDGE_FASTLY_TOKEN"]).start(),
        "cloudflare": CloudflareStandIn("zone-1", TOKENS["EDGE_CLOUDFLARE_TOKEN"]).start(),
    }
    yield started
    for stand_in in started.values():
        stand_in.close()
    for stand_in in started.values():
        assert not stand_in.rejected, f"requests unlike the documented ones: {stand_in.rejected}"


def purge_args(targets: dict[str, StandIn]) -> list[str]:
    return [
        "--cdn-purge", f"varnish={targets['varnish'].url}/",
        "--cdn-purge", f"webhook={targets['webhook'].url}/cdn-purge",
        "--cdn-purge", "fastly=svc-1",
        "--cdn-purge", "cloudflare=zone-1",
        "--fastly-api-url", targets["fastly"].url,
        "--cloudflare-api-url", targets["cloudflare"].url + "/client/v4",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def purging_edge(origin: Origin, logs_dir: Path, targets: dict[str, StandIn]) -> Iterator[Edge]:
    # --tail-freshness 0: every at-tail read asks the origin, so a 404 is seen at once.
    # --workers 1: its new-instance case needs the worker that read the stream to see the write
    # (test_one_purge_per_forgetting_however_many_workers is the one with workers).
    started = start_edge(
        origin.url, logs_dir, *purge_args(targets), "--tail-freshness", "0", "--workers", "1",
        "--drain-seconds", "3", name="edge-cdn-purge", env=TOKENS,
    )  # fmt: skip
    yield started
    started.stop()


async def at_origin(http: aiohttp.ClientSession, origin: Origin, path: str, *parts: bytes) -> None:
    """Create (or recreate) a stream behind the edge's back: the edge forgets nothing."""
    status, _, _ = await call(http, "PUT", origin.url + path, headers=TEXT)
    assert status == 201
    for part in parts:
        status, _, _ = await call(http, "POST", origin.url + path, headers=TEXT, data=part)
        assert status == 204


async def read(http: aiohttp.ClientSession, edge: Edge, path: str) -> int:
    status, _, _ = await call(http, "GET", f"{edge.url}{path}?offset=-1")
    return status


def reasons(webhook: StandIn, stream: str) -> list[str | None]:
    return [c.reason for c in webhook.calls_for(stream_key(stream))]


async def test_every_forgetting_the_edge_decides_is_purged_at_every_target_twice(
    http: aiohttp.ClientSession, origin: Origin, purging_edge: Edge, targets: dict[str, StandIn],
    stream_path: str,
) -> None:  # fmt: skip
    edge = purging_edge
    expected: dict[str, str] = {}
    forgotten_after: dict[str, float] = {}  # taken before the request that makes it forget
    # A DELETE through the edge.
    path = stream_path + "-deleted"
    expected[path] = "deleted"
    await at_origin(http, origin, path, b"old bytes")
    assert await read(http, edge, path) == 200
    forgotten_after[path] = time.monotonic()
    assert (await call(http, "DELETE", edge.url + path))[0] == 204
    # A creating PUT through the edge.
    path = stream_path + "-created"
    expected[path] = "created"
    forgotten_after[path] = time.monotonic()
    assert (await call(http, "PUT", edge.url + path, headers=TEXT))[0] == 201
    # An operator's purge.
    path = stream_path + "-purged"
    expected[path] = "admin_purge"
    await at_origin(http, origin, path, b"x")
    assert await read(http, edge, path) == 200
    forgotten_after[path] = time.monotonic()
    assert (await call(http, "POST", f"{edge.admin_url}/purge?path={path}"))[0] == 200
    # Deleted behind the edge's back: its next read meets the origin's 404.
    path = stream_path + "-gone"
    expected[path] = "gone"
    await at_origin(http, origin, path, b"x")
    assert await read(http, edge, path) == 200
    assert (await call(http, "DELETE", origin.url + path))[0] == 204
    forgotten_after[path] = time.monotonic()
    assert await read(http, edge, path) == 404
    # Recreated behind the edge's back: an append through the edge lands below the tail the
    # edge had seen, so the edge knows it serves another instance.
    path = stream_path + "-new"
    expected[path] = "new_instance"
    await at_origin(http, origin, path, b"a long first life")
    assert await read(http, edge, path) == 200
    assert (await call(http, "DELETE", origin.url + path))[0] == 204
    await at_origin(http, origin, path)
    forgotten_after[path] = time.monotonic()
    assert (await call(http, "POST", edge.url + path, headers=TEXT, data=b"b"))[0] == 204

    def all_twice() -> bool:
        return all(
            len(targets[kind].calls_for(stream_key(s))) >= 2 for s in expected for kind in KINDS
        )

    assert await eventually(all_twice, 15), {s: reasons(targets["webhook"], s) for s in expected}
    await asyncio.sleep(DOUBLE_PURGE_SECONDS / 2)
    webhook = targets["webhook"]
    for stream, reason in expected.items():
        # Once when the forgetting is in effect, once after the window; never more.
        assert reasons(webhook, stream) == [reason, reason], stream
        for kind in KINDS:
            _, second = targets[kind].calls_for(stream_key(stream))
            assert second.at - forgotten_after[stream] >= DOUBLE_PURGE_SECONDS, (stream, kind)
    text = edge.metrics_text()
    for kind in KINDS:
        assert metric_value(text, "edge_cdn_purges_total", kind=kind, result="ok") >= 10
        assert metric_value(text, "edge_cdn_purges_pending", kind=kind) == 0


async def test_a_stream_never_served_is_not_purged_on_its_404(
    http: aiohttp.ClientSession, purging_edge: Edge, targets: dict[str, StandIn], stream_path: str
) -> None:
    """A scanner's 404s cost the CDN nothing (no shared tier here to say anyone served them)."""
    for i in range(5):
        assert await read(http, purging_edge, f"{stream_path}-{i}") == 404
    await asyncio.sleep(0.5)
    for kind in KINDS:
        assert not any(targets[kind].calls_for(stream_key(f"{stream_path}-{i}")) for i in range(5))


async def test_one_purge_per_forgetting_however_many_workers(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    """With --workers 2 the worker that decides purges (siblings replay, they do not send);
    an operator's purge, which the supervisor sends to every worker, is sent by one of them."""
    webhook = WebhookStandIn().start()
    edge = start_edge(
        origin.url, logs_dir, "--workers", "2", "--cdn-purge", f"webhook={webhook.url}/cdn-purge",
        name="edge-cdn-workers",
    )  # fmt: skip
    try:
        deleted, purged = stream_path + "-deleted", stream_path + "-purged"
        for path in (deleted, purged):
            await at_origin(http, origin, path, b"x")
            assert await read(http, edge, path) == 200
        assert (await call(http, "DELETE", edge.url + deleted))[0] == 204
        assert (await call(http, "POST", f"{edge.admin_url}/purge?path={purged}"))[0] == 200
        assert await eventually(
            lambda: len(reasons(webhook, deleted)) >= 2 and len(reasons(webhook, purged)) >= 2, 10
        )
        await asyncio.sleep(DOUBLE_PURGE_SECONDS / 2)
        assert reasons(webhook, deleted) == ["deleted", "deleted"]
        assert reasons(webhook, purged) == ["admin_purge", "admin_purge"]
    finally:
        edge.stop()
        webhook.close()
    assert not webhook.rejected


async def test_a_dead_cdn_slows_nothing_and_what_is_owed_at_sigterm_goes_before_exit(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    webhook = WebhookStandIn().start()
    with silent_port() as hanging:
        edge = start_edge(
            origin.url, logs_dir, "--cdn-purge", f"webhook={webhook.url}/cdn-purge",
            "--cdn-purge", f"webhook={closed_port()}/x", "--cdn-purge", f"varnish={hanging}/",
            "--drain-seconds", "3", name="edge-cdn-dead",
        )  # fmt: skip
        try:
            for i in range(5):
                path = f"{stream_path}-{i}"
                started = time.monotonic()
                assert (await call(http, "PUT", edge.url + path, headers=TEXT))[0] == 201
                assert (await call(http, "POST", edge.url + path, headers=TEXT, data=b"x"))[
                    0
                ] == 204
                assert await read(http, edge, path) == 200
                assert (await call(http, "DELETE", edge.url + path))[0] == 204
                spent = time.monotonic() - started
                assert spent < 1.0, f"four requests took {spent:.2f} s"
            text = edge.metrics_text()
            assert metric_value(text, "edge_cdn_purges_pending", kind="varnish") >= 5
            assert metric_value(text, "edge_cdn_purges_total", kind="webhook", result="error") >= 1
            # The live target is served meanwhile.
            assert await eventually(lambda: len(reasons(webhook, f"{stream_path}-4")) >= 1)
            # SIGTERM while a double purge is owed to the live target: sent at once.
            last = stream_path + "-last"
            assert (await call(http, "PUT", edge.url + last, headers=TEXT))[0] == 201
            assert await eventually(lambda: len(reasons(webhook, last)) == 1)
            stopping = time.monotonic()
            edge.process.signal(signal.SIGTERM)
            assert await eventually(lambda: len(reasons(webhook, last)) == 2, 5)
            assert webhook.calls_for(stream_key(last))[1].at - stopping < 1.0  # not 2 s later
            assert edge.stop() == 0
            assert time.monotonic() - stopping < 3 + 2  # --drain-seconds, then abandoned
        finally:
            edge.stop()
            webhook.close()
    # What the dead targets were still owed is told, not lost silently.
    assert "purges still owed when the drain ended" in edge.process.log.read_text()
    assert not webhook.rejected


async def test_a_404_on_a_replica_that_never_served_the_stream_is_purged_if_another_did(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path, stream_path: str
) -> None:
    """Replicas sharing Redis: replica A served the stream, then it was deleted behind the
    edge; replica B, which never held it, meets the 404. The shared tier held A's segments, so
    B purges the CDN (and A, which hears of it from Redis, does not again)."""
    redis_server = start_redis(logs_dir, name="redis-cdn")
    webhook = WebhookStandIn().start()
    args = ("--redis-url", redis_server.url, "--cdn-purge", f"webhook={webhook.url}/cdn-purge")
    replicas = [
        start_edge(origin.url, logs_dir, *args, "--workers", "1", name=f"edge-cdn-{name}")
        for name in ("a", "b")
    ]
    try:
        a, b = replicas
        await at_origin(http, origin, stream_path, b"served by a")
        assert await read(http, a, stream_path) == 200
        await asyncio.sleep(0.5)  # A writes its segment to Redis in the background
        assert (await call(http, "DELETE", origin.url + stream_path))[0] == 204
        assert await read(http, b, stream_path) == 404
        assert await eventually(lambda: len(reasons(webhook, stream_path)) == 2, 10)
        # A path no replica ever served, and the purged stream's next 404s: nothing more (the
        # CDN was purged of it; no replica has served it since).
        assert await read(http, b, stream_path + "-scanned") == 404
        assert await read(http, a, stream_path) == 404
        assert await read(http, b, stream_path) == 404
        await asyncio.sleep(DOUBLE_PURGE_SECONDS)
        assert reasons(webhook, stream_path) == ["gone", "gone"]
        assert not webhook.calls_for(stream_key(stream_path + "-scanned"))
    finally:
        for replica in replicas:
            replica.stop()
        redis_server.stop()
        webhook.close()
    assert not webhook.rejected
