"""The composition root: every object of the stream application, built once and handed what it
uses through its constructor.

Rules this module owns:

* Only this module builds the tiers (``LocalTier``, ``SharedTier``), the stream instances
  (``edge.instances.build``: their door, forgetter, generations, lifetimes, writes and
  ticket), the fill budget, the compressor, the fills, the catch-up service, the live hub,
  the refresh-ahead (handed to both the catch-up service and the fast path), the relay, the
  gate, the fast path, the stream listener's connection tracker (handed the
  fast path), the catch-up front, the CDN purger and the resume routes. Each gets the parts it
  uses; none reaches through another for them.
* Who hears of a forgetting is decided here, in the order given: the live hub (its tails and
  readers end: ``LiveHub`` subscribes to the forgetter it is handed), the CDN purger (with
  ``--cdn-purge``), then whatever a worker adds (``edge.workers.siblings``). These are
  appended, not handed in: each of them uses the forgetter it hears from.
* The lifetime opens in dependency order and closes in reverse: the origin client first, then
  the gate, the shared tier (before the listener opens: readiness knows Redis from the first)
  and the purger; the purger closes first (drained within ``--drain-seconds``), the origin
  client last.
"""

from __future__ import annotations

import functools
import resource
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from aiohttp import web

from edge.auth.gate import Gate
from edge.catchup import CatchupCache
from edge.cdn.purger import CdnPurger
from edge.config import Settings
from edge.fill_budget import FillBudget
from edge.fills import Fills
from edge.instances import build
from edge.instances.door import Door
from edge.instances.forgetting import Forgetter
from edge.instances.generations import Generations
from edge.instances.lifetimes import Lifetimes
from edge.instances.writes import Writes
from edge.lifecycle import StreamLifecycle
from edge.live.hub import LiveHub
from edge.metrics import Metrics
from edge.origin import OriginClient
from edge.refresh_ahead import RefreshAhead
from edge.store.local import Compressor, LocalTier
from edge.store.shared import SharedTier
from edge.web.connection_table import Limits
from edge.web.connection_tracker import ConnectionTracker
from edge.web.descriptors import budget_for, limits_for
from edge.web.fast_catchup import FastCatchup
from edge.web.fast_polls import FastPolls, LiveTargets, LogsNow
from edge.web.fast_sse import FastSse
from edge.web.fastpath import FastPath
from edge.web.front import CatchupFront
from edge.web.own_gate import OwnGate
from edge.web.own_relay import OwnRelay
from edge.web.proxy import OriginCors, Relay
from edge.web.resume_pump import Pumps
from edge.web.resume_routes import ResumeRoutes
from edge.web.wire import encode


@dataclass(frozen=True, kw_only=True, slots=True)
class CatchupParts:
    """The catch-up service and the parts it shares with the rest of the edge (the stream
    instances' parts one by one: each consumer is handed the ones it uses)."""

    local: LocalTier
    ticket: Callable[[], int]  # the stream instances' ticket (``edge.instances``)
    forgetter: Forgetter
    generations: Generations | None
    lifetimes: Lifetimes
    door: Door
    writes: Writes
    fill_budget: FillBudget
    compressor: Compressor
    fills: Fills
    ahead: RefreshAhead  # at-tail answers renewed before their window ends (both paths)
    catchup: CatchupCache
    lifecycle: StreamLifecycle


def build_catchup(
    settings: Settings,
    origin: OriginClient,
    metrics: Metrics,
    *,
    shared: SharedTier | None = None,
    clock: Callable[[], float] = time.time,
) -> CatchupParts:
    local = LocalTier(settings.cache_bytes, on_evict=metrics.cache_evictions.inc)
    instances = build(settings, local, origin, metrics, shared=shared, clock=clock)
    fill_budget = FillBudget(settings.fill_buffer_bytes)
    compressor = Compressor(local)
    fills = Fills(
        settings,
        origin,
        metrics,
        local=local,
        door=instances.door,
        forgetter=instances.forgetter,
        ticket=instances.ticket,
        fill_budget=fill_budget,
        clock=clock,
    )
    ahead = RefreshAhead(metrics, fills=fills, local=local, generations=instances.generations)
    catchup = CatchupCache(
        settings,
        fills=fills,
        local=local,
        forgetter=instances.forgetter,
        generations=instances.generations,
        lifetimes=instances.lifetimes,
        compressor=compressor,
        ahead=ahead,
        clock=clock,
    )
    metrics.track_budget(local.usage, lambda: fill_budget.used)
    return CatchupParts(
        local=local,
        ticket=instances.ticket,
        forgetter=instances.forgetter,
        generations=instances.generations,
        lifetimes=instances.lifetimes,
        door=instances.door,
        writes=instances.writes,
        fill_budget=fill_budget,
        compressor=compressor,
        fills=fills,
        ahead=ahead,
        catchup=catchup,
        lifecycle=StreamLifecycle(
            writes=instances.writes, forgetter=instances.forgetter, shared=shared
        ),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Wired:
    """Every object of one stream application, as the root built them."""

    settings: Settings
    metrics: Metrics
    origin: OriginClient
    connections: ConnectionTracker
    cors: OriginCors
    shared: SharedTier | None
    local: LocalTier
    forgetter: Forgetter
    lifetimes: Lifetimes
    catchup: CatchupCache
    ahead: RefreshAhead
    lifecycle: StreamLifecycle
    hub: LiveHub
    relay: Relay  # as built: a worker's application relays through its own (``edge.workers``)
    own_relay: OwnRelay  # the connections' relay of reads (a worker's relays through its own)
    gate: Gate | None
    fast: FastPath
    front: CatchupFront
    purger: CdnPurger | None
    resume: ResumeRoutes


def default_limits(settings: Settings) -> Limits:
    """The connection limits of this process's descriptor limit, for a tracker whose table sees
    only the kinds of requests (a test server has no connection hook)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = -1 if soft == resource.RLIM_INFINITY else soft
    return limits_for(settings, budget_for(settings, limit))


def wire(
    settings: Settings,
    metrics: Metrics,
    origin: OriginClient,
    *,
    limits: Limits | None = None,
) -> Wired:
    cors = OriginCors()
    origin.listen_to_answers(cors.remember)
    redis_target = settings.redis_target
    shared = (
        SharedTier(
            redis_target,
            metrics,
            ttl_seconds=settings.redis_ttl_seconds,
            timeout_seconds=settings.redis_timeout_seconds,
        )
        if redis_target is not None
        else None
    )
    parts = build_catchup(settings, origin, metrics, shared=shared)
    # Long-polls released together are written directly, framed as aiohttp would frame them.
    hub = LiveHub(
        settings,
        metrics,
        origin,
        catchup=parts.catchup,
        fills=parts.fills,
        local=parts.local,
        door=parts.door,
        forgetter=parts.forgetter,
        ticket=parts.ticket,
        encode=functools.partial(encode, cors=cors),
    )
    relay = Relay(
        origin=origin,
        metrics=metrics,
        cors=cors,
        observe=parts.lifecycle.observe,
        ticket=parts.ticket,
    )
    gate = Gate(settings, metrics) if settings.auth_mode != "none" else None
    fast = FastPath(settings, parts.local, cors, gate=gate, ahead=parts.ahead)
    metrics.fold_at_scrape(fast.fold_into)
    targets = LiveTargets(settings)
    logs = LogsNow(settings, parts.local, parts.catchup)
    polls = FastPolls(
        settings, hub, logs, cors, functools.partial(encode, cors=cors), targets,
        gated=gate is not None,
    )  # fmt: skip
    metrics.fold_at_scrape(polls.fold_into)
    sse = FastSse(
        settings, metrics, hub, logs, cors, targets,
        functools.partial(encode, cors=cors), gated=gate is not None, clock=time.time,
    )  # fmt: skip
    front = CatchupFront(catchup=parts.catchup, fast=fast, cors=cors)
    catchup = FastCatchup(settings, metrics, front, cors, gated=gate is not None)
    own_relay = OwnRelay(settings, metrics, relay, front, cors, gated=gate is not None)
    # With --auth, the gate's decision before every read the connections serve.
    own_gate = OwnGate(gate, cors) if gate is not None else None
    if own_gate is not None:
        metrics.fold_at_scrape(own_gate.fold_into)
    # The stream listener's connections answer every read they can themselves.
    connections = ConnectionTracker(
        limits if limits is not None else default_limits(settings), fast=fast, polls=polls,
        sse=sse, catchup=catchup, gate=own_gate, relay=own_relay,
        drain_seconds=settings.drain_seconds,
    )  # fmt: skip
    purger = CdnPurger(settings, parts.forgetter, metrics) if settings.cdn_purge else None
    if purger is not None:
        parts.forgetter.tellers.append(purger.forgot)
    return Wired(
        settings=settings,
        metrics=metrics,
        origin=origin,
        connections=connections,
        cors=cors,
        shared=shared,
        local=parts.local,
        forgetter=parts.forgetter,
        lifetimes=parts.lifetimes,
        catchup=parts.catchup,
        ahead=parts.ahead,
        lifecycle=parts.lifecycle,
        hub=hub,
        relay=relay,
        own_relay=own_relay,
        gate=gate,
        fast=fast,
        front=front,
        purger=purger,
        resume=ResumeRoutes(settings, metrics, Pumps(settings, metrics, origin), cors, origin),
    )


async def lifetime(wired: Wired) -> AsyncIterator[None]:
    """Everything that opens and closes with the stream application (see the module rules)."""
    origin, gate, shared, purger = wired.origin, wired.gate, wired.shared, wired.purger
    await origin.start()
    if gate is not None:
        await gate.start()
    if shared is not None:
        await shared.start()
        shared.listen_for_purges(wired.forgetter.forgotten_elsewhere, wired.forgetter.resync)
    if purger is not None:
        await purger.start()
    await wired.resume.start()
    yield
    await wired.resume.close()  # pumps still running end here (no lease yet: docs/resume.md)
    if purger is not None:
        await purger.close()
    await wired.hub.close()
    await wired.ahead.close()
    if gate is not None:
        await gate.close()
    await wired.lifetimes.close()  # the stream instances' one open part: lifetime probes
    if shared is not None:
        await shared.close()
    await origin.close()


# The whole wiring, for the worker's sibling wiring (``edge.workers.siblings``); the parts the
# handlers use have their keys in ``edge.web.keys``, so no handler imports the root.
WIRED = web.AppKey("wired", Wired)
