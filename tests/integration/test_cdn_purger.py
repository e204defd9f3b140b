"""The CDN purger (edge.cdn.purger) in this process, against stand-ins of each receiver on
loopback (tests/cdn_stand_ins.py) that check the exact documented request: when purges go, what
they carry, how failures, rate limits, floods and shutdown are met. The whole edge, with the
real origin, is tests/integration/test_cdn_purge.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

import edge.cdn.purger as purger_module
from devstack.processes import start_redis
from edge.cdn.purger import CdnPurger
from edge.config import Address, Settings
from edge.instances.forgetting import Forgetter
from edge.log.stream_log import LogKey
from edge.metrics import Metrics
from edge.protocol.purge_keys import stream_key
from edge.store.local import LocalTier
from edge.store.shared import SharedTier
from edge.workers.siblings import at_supervisors_request
from tests.cdn_stand_ins import (
    CloudflareStandIn,
    FastlyStandIn,
    Scripted,
    StandIn,
    VarnishStandIn,
    WebhookStandIn,
    cloudflare_rate_limited,
    eventually,
)

WINDOW = 0.8  # the double purge's delay in these tests (the edge's own is 2 s)
FASTLY_TOKEN = "fastly-token-never-logged"
CLOUDFLARE_TOKEN = "cloudflare-token-never-logged"


@dataclass
class Rig:
    purger: CdnPurger
    local: LocalTier
    forgetter: Forgetter
    metrics: Metrics

    def count(self, kind: str, result: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "edge_cdn_purges_total", {"kind": kind, "result": result}
        )
        return value or 0.0

    def pending(self, kind: str) -> float:
        value = self.metrics.registry.get_sample_value("edge_cdn_purges_pending", {"kind": kind})
        return value or 0.0


@pytest.fixture
def stand_ins() -> Iterator[dict[str, StandIn]]:
    started: dict[str, StandIn] = {
        "varnish": VarnishStandIn().start(),
        "webhook": WebhookStandIn().start(),
        "fastly": FastlyStandIn("svc-1", FASTLY_TOKEN).start(),
        "cloudflare": CloudflareStandIn("zone-1", CLOUDFLARE_TOKEN).start(),
    }
    yield started
    for stand_in in started.values():
        stand_in.close()
    for stand_in in started.values():
        assert not stand_in.rejected, f"requests unlike the documented ones: {stand_in.rejected}"


def settings_for(
    stand_ins: dict[str, StandIn], *, drain_seconds: float = 2.0, **kinds: str
) -> Settings:
    """Settings whose --cdn-purge names the stand-ins (or another URL given per kind)."""
    targets = {
        "varnish": ("varnish", stand_ins["varnish"].url + "/"),
        "webhook": ("webhook", stand_ins["webhook"].url + "/cdn-purge"),
        "fastly": ("fastly", "svc-1"),
        "cloudflare": ("cloudflare", "zone-1"),
    }
    chosen = [(kind, kinds.get(kind, target)) for kind, target in targets.values()]
    return Settings(
        origin="http://127.0.0.1:9", listen=Address(host="127.0.0.1", port=0),
        admin_listen=Address(host="127.0.0.1", port=0), drain_seconds=drain_seconds,
        cdn_purge=tuple(chosen), fastly_token=FASTLY_TOKEN, cloudflare_token=CLOUDFLARE_TOKEN,
        fastly_api_url=kinds.get("fastly_api", stand_ins["fastly"].url),
        cloudflare_api_url=kinds.get("cloudflare_api", stand_ins["cloudflare"].url + "/client/v4"),
    )  # fmt: skip


@contextlib.asynccontextmanager
async def rig(settings: Settings) -> AsyncIterator[Rig]:
    metrics = Metrics()
    local = LocalTier(1 << 20)
    forgetter = Forgetter(local)
    purger = CdnPurger(settings, forgetter, metrics)
    forgetter.tellers.append(purger.forgot)
    await purger.start()
    try:
        yield Rig(purger=purger, local=local, forgetter=forgetter, metrics=metrics)
    finally:
        await purger.close()


@pytest.fixture(autouse=True)
def short_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(purger_module, "DOUBLE_PURGE_SECONDS", WINDOW)


def hold(local: LocalTier, stream: str) -> None:
    """Make this process hold something of ``stream`` (a log), as after serving it."""
    local.log_for(LogKey(stream=stream, scope="public"))


@contextlib.contextmanager
def silent_port() -> Iterator[str]:
    """A listener that takes connections and never answers: a hanging CDN endpoint."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"  # nobody listens once closed


async def test_a_forgetting_is_purged_at_every_target_at_once_and_again_after_the_window(
    stand_ins: dict[str, StandIn],
) -> None:
    stream = "/v1/stream/deleted"
    key = stream_key(stream)
    async with rig(settings_for(stand_ins)) as r:
        forgot_at = time.monotonic()
        r.forgetter.forget(stream, reason="deleted")
        assert await eventually(lambda: all(len(s.calls_for(key)) == 2 for s in stand_ins.values()))
        # A stand-in records a call before it answers; the purger counts the answer after it.
        assert await eventually(lambda: all(r.count(kind, "ok") == 2 for kind in stand_ins))
        for kind, stand_in in stand_ins.items():
            first, second = stand_in.calls_for(key)
            assert first.at - forgot_at < WINDOW, kind  # at once: in effect here at once
            assert second.at - forgot_at >= WINDOW, kind  # the double purge, after the window
        await asyncio.sleep(WINDOW * 2)
        assert all(len(s.calls_for(key)) == 2 for s in stand_ins.values())  # no more
        assert all(r.pending(kind) == 0 for kind in stand_ins)
    hook = stand_ins["webhook"].calls_for(key)[0]
    assert (hook.stream, hook.reason, hook.keys) == (stream, "deleted", (key,))
    assert stand_ins["fastly"].calls_for(key)[0].path == "/service/svc-1/purge"
    assert stand_ins["cloudflare"].calls_for(key)[0].path == "/client/v4/zones/zone-1/purge_cache"


async def test_purges_are_coalesced_batched_and_retried_after_a_rate_limit(
    stand_ins: dict[str, StandIn],
) -> None:
    cloudflare = stand_ins["cloudflare"]
    cloudflare.fail_next(cloudflare_rate_limited(retry_after=1), Scripted(status=502))
    streams = [f"/v1/stream/herd-{i}" for i in range(45)]
    async with rig(settings_for(stand_ins)) as r:
        forgot_at = time.monotonic()
        for stream in streams:
            r.forgetter.forget(stream, reason="deleted")
        for _ in range(20):  # one stream forgotten again and again: one entry
            r.forgetter.forget(streams[0], reason="deleted")
        assert await eventually(lambda: r.pending("cloudflare") == 0, 15)
        assert cloudflare.answers[:2] == [429, 502]
        assert r.count("cloudflare", "error") >= 2
        # Owed sends met: each stream purged, the last time after the double purge's window
        # (one send after it meets both needs).
        for stream in streams:
            purged = cloudflare.calls_for(stream_key(stream))
            assert purged
            assert purged[-1].at >= forgot_at + WINDOW
    calls = cloudflare.received
    assert all(len(call.keys) <= 30 for call in calls)
    assert max(len(call.keys) for call in calls) > 1  # batched, not one call per stream
    # The rate limit held every call to the target for its Retry-After, not one batch.
    limited_at = cloudflare.seen[0][0]
    assert all(at >= limited_at + 0.95 for at, _, _ in cloudflare.seen[1:])
    assert len(cloudflare.calls_for(stream_key(streams[0]))) <= 4  # coalesced, not 21 x 2
    assert {k for call in calls for k in call.keys} == {stream_key(s) for s in streams}


async def test_a_wrong_token_is_retried_with_backoff_and_never_shown(
    stand_ins: dict[str, StandIn], caplog: pytest.LogCaptureFixture
) -> None:
    fastly = FastlyStandIn("svc-1", "the-real-token").start()
    try:
        settings = settings_for(stand_ins, fastly_api=fastly.url)
        with caplog.at_level(logging.DEBUG):
            async with rig(settings) as r:
                r.forgetter.forget("/v1/stream/x", reason="deleted")
                assert await eventually(lambda: len(fastly.answers) >= 3, 10)
                # The stand-in records its answer before the purger counts it.
                assert await eventually(lambda: r.count("fastly", "error") >= 3)
                assert r.pending("fastly") == 1
        assert set(fastly.answers) == {401}
        assert fastly.received == []
        warned = [rec for rec in caplog.records if "fastly service svc-1" in rec.getMessage()]
        assert warned  # the failure is logged, once per outage, not per retry
        assert sum("a purge failed" in rec.getMessage() for rec in warned) == 1
        assert FASTLY_TOKEN not in caplog.text
        assert CLOUDFLARE_TOKEN not in caplog.text
    finally:
        fastly.rejected.clear()  # its 401s were the point
        fastly.close()


async def test_a_dead_or_hanging_target_never_delays_a_forgetting(
    stand_ins: dict[str, StandIn],
) -> None:
    with silent_port() as hanging:
        settings = settings_for(
            stand_ins, drain_seconds=1.0, webhook=closed_port() + "/x", varnish=hanging + "/"
        )
        async with rig(settings) as r:
            started = time.perf_counter()
            for i in range(200):
                r.forgetter.forget(f"/v1/stream/s{i}", reason="deleted")
            spent = time.perf_counter() - started
            assert spent < 0.5, f"200 forgettings took {spent:.3f} s"
            # The live targets are served meanwhile.
            assert await eventually(lambda: len(stand_ins["fastly"].all_keys()) >= 200)
            assert await eventually(lambda: r.count("webhook", "error") >= 1)
            closing = time.monotonic()
        # close() drained for at most --drain-seconds, then counted what was left.
        assert time.monotonic() - closing < 3.0
        assert r.count("webhook", "abandoned") == 200
        assert r.count("varnish", "abandoned") == 200


async def test_at_shutdown_what_is_owed_goes_at_once_the_double_purge_included(
    stand_ins: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(purger_module, "DOUBLE_PURGE_SECONDS", 30.0)
    key = stream_key("/v1/stream/stop")
    webhook = stand_ins["webhook"]
    async with rig(settings_for(stand_ins)) as r:
        r.forgetter.forget("/v1/stream/stop", reason="deleted")
        assert await eventually(lambda: len(webhook.calls_for(key)) == 1)
        stopping = time.monotonic()
        r.purger.start_draining()
        assert await eventually(lambda: len(webhook.calls_for(key)) == 2, 2)
        assert webhook.calls_for(key)[1].at - stopping < 1.0  # not 30 s later
        await r.purger.close()
        assert time.monotonic() - stopping < 1.5
        assert r.count("webhook", "abandoned") == 0


async def test_past_the_cap_new_purges_are_dropped_counted_and_logged(
    stand_ins: dict[str, StandIn],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(purger_module, "MAX_OWED_STREAMS", 5)
    settings = settings_for(stand_ins, drain_seconds=0.0, webhook=closed_port() + "/x")
    async with rig(settings) as r:
        for i in range(8):
            r.forgetter.forget(f"/v1/stream/s{i}", reason="deleted")
        r.forgetter.forget("/v1/stream/s0", reason="deleted")  # coalesces: never dropped
        assert r.count("webhook", "dropped") == 3
        assert r.pending("webhook") == 5
        assert r.count("fastly", "dropped") == 3  # every target has its own cap
    errors = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.ERROR]
    # Logged once per run of drops, not per drop.
    assert sum("is dropped" in m and m.startswith("webhook") for m in errors) == 1


async def test_only_whole_stream_forgettings_this_process_decided_are_sent(
    stand_ins: dict[str, StandIn],
) -> None:
    webhook = stand_ins["webhook"]
    async with rig(settings_for(stand_ins)) as r:
        held = "/v1/stream/held"
        hold(r.local, held)
        # A credential's 404 forgets its scope only: the CDN holds no credentialed answer.
        r.forgetter.stream_gone(LogKey(stream=held, scope="token-1"))
        # Carried out for the supervisor or a sibling: their decider sends.
        with at_supervisors_request():
            r.forgetter.forget(held, reason="admin_purge")
        # A 404 for a path this process never held, without a shared tier: nobody served it.
        r.forgetter.stream_gone(LogKey(stream="/v1/stream/scanned", scope="public"))
        hold(r.local, held)
        r.forgetter.stream_gone(LogKey(stream=held, scope="public"))  # this one is sent
        assert await eventually(lambda: len(webhook.received) == 2)
        await asyncio.sleep(WINDOW)
    assert [(c.stream, c.reason) for c in webhook.received] == [(held, "gone")] * 2
    assert {k for c in stand_ins["fastly"].received for k in c.keys} == {stream_key(held)}


def test_pending_gauge_and_counters_are_exported_for_each_configured_kind(
    stand_ins: dict[str, StandIn],
) -> None:
    settings = settings_for(stand_ins)
    metrics = Metrics()
    CdnPurger(settings, Forgetter(LocalTier(1 << 20)), metrics)
    text = metrics.render().decode()
    for kind in ("varnish", "webhook", "fastly", "cloudflare"):
        assert f'edge_cdn_purges_pending{{kind="{kind}"}} 0.0' in text
        for result in ("ok", "error", "dropped", "gave_up", "abandoned"):
            assert f'edge_cdn_purges_total{{kind="{kind}",result="{result}"}} 0.0' in text
    assert json.dumps(FASTLY_TOKEN) not in text


async def test_a_purge_durable_only_after_redis_came_back_is_sent_once_more_after_it(
    stand_ins: dict[str, StandIn], logs_dir: Path
) -> None:
    """Redis away when the stream is forgotten: the purge goes (at once, and after the window),
    other replicas cannot hear of it until Redis is back, so once the shared tier makes it
    durable the CDN is purged once more, a window after that."""
    redis_server = start_redis(logs_dir, name="redis-cdn-away")
    settings = replace(settings_for(stand_ins), redis_url=redis_server.url)
    target = settings.redis_target
    assert target is not None
    metrics = Metrics()
    shared = SharedTier(target, metrics, ttl_seconds=60, timeout_seconds=0.25)
    try:
        await shared.start()
    except BaseException:
        redis_server.stop()  # never leave a server running behind a failed set-up
        raise
    forgetter = Forgetter(LocalTier(1 << 20), shared=shared)
    purger = CdnPurger(settings, forgetter, metrics)
    forgetter.tellers.append(purger.forgot)
    await purger.start()
    webhook = stand_ins["webhook"]
    key = stream_key("/v1/stream/while-redis-away")
    try:
        port = redis_server.port
        redis_server.stop()
        forgetter.forget("/v1/stream/while-redis-away", reason="deleted")
        assert await eventually(lambda: len(webhook.calls_for(key)) == 2, 10)
        await asyncio.sleep(WINDOW * 2)
        assert len(webhook.calls_for(key)) == 2  # nothing more while Redis is away
        back = time.monotonic()
        redis_server = start_redis(logs_dir, port=port, name="redis-cdn-away")
        assert await eventually(lambda: len(webhook.calls_for(key)) == 3, 15)
        assert webhook.calls_for(key)[2].at - back >= WINDOW
        assert [c.reason for c in webhook.calls_for(key)] == ["deleted"] * 3
        assert await forgetter.forgotten_everywhere("/v1/stream/while-redis-away")
    finally:
        await purger.close()
        await shared.close()
        redis_server.stop()
