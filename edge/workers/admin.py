"""The supervisor's admin listener (``--admin-listen``): one edge, however many workers.

Rules this module owns:

* ``/metrics``: every worker first writes a snapshot of its metrics into the multiprocess files
  (``POST /metrics/refresh`` on its private admin listener, all at once, each given
  ``WORKER_CALL_SECONDS``; ``edge.workers.mirror``), then prometheus-client's
  ``MultiProcessCollector`` renders the files, with the supervisor's own ``edge_workers`` and
  ``edge_worker_restarts_total``. A worker that does not answer in time is rendered with its
  last snapshot.
* ``/readyz`` is 200 when the edge is not draining, at least one worker listens, and every
  listening worker is ready (each probes the origin itself). A worker being restarted does not
  make the edge unready: the kernel gives its connections to the others. The body says how many
  workers are up and what each reported.
* ``POST /purge`` keeps the single-process contract: the same guard (``--admin-token``, or a
  loopback admin listener), the same 400s, then the purge goes to every worker (with the
  supervisor's private token) and the answer is 200 only when every worker purged it durably,
  202 when all purged and some still retry the shared tier, 503 when a worker did not confirm
  (a purge is idempotent: retry it). One worker, the first reachable, is named to purge the CDN
  too (``TELLS_DOWNSTREAM_PARAM``): a purge is sent downstream once, not once per worker. A
  worker whose admin listener is not recorded holds
  nothing to purge: it has not run, or is starting empty and takes no stream connection
  before it is recorded (edge.workers.supervisor).
* ``/healthz``: the supervisor is alive (it restarts workers itself).
* Workers reach the supervisor on a second, private loopback listener (``start_internal``),
  never on ``--admin-listen``: ``POST /observed`` relays a write one worker saw to the others
  (edge.workers.siblings).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from edge.config import Address, Settings
from edge.metrics import Metrics
from edge.startup import StartupError, bound_url, why
from edge.web.admin import admin_guard, purge_target

logger = logging.getLogger(__name__)

WORKER_CALL_SECONDS = 3.0  # above a worker's own origin probe timeout (2 s)
# In the query of the ``POST /purge`` the supervisor sends to the one worker it names to purge
# the CDN as well (edge.workers.siblings).
TELLS_DOWNSTREAM_PARAM = "tells_downstream"


class EdgeFamilies(Collector):
    """The workers' multiprocess files, plus every family the edge defines that no worker has a
    sample of yet (a labelled counter nothing touched): a single-process edge exports those as
    HELP and TYPE lines, and dashboards and alerts may name them before they count anything."""

    def __init__(self, metrics_dir: str) -> None:
        self._files = MultiProcessCollector(None, path=metrics_dir)  # type: ignore[no-untyped-call]
        # The edge's metric set, defined once in edge.metrics; never updated here.
        self._schema = [
            Metric(family.name, family.documentation, family.type)
            for family in Metrics().registry.collect()
        ]

    def collect(self) -> Iterator[Metric]:
        seen = set()
        for family in self._files.collect():  # type: ignore[no-untyped-call]
            seen.add(family.name)
            yield family
        for family in self._schema:
            if family.name not in seen:
                yield family


@dataclass
class Worker:
    """One worker process as the supervisor runs it (edge.workers.supervisor) and this
    listener reports it."""

    index: int
    proc: asyncio.subprocess.Process | None = None
    admin: str | None = None  # its private admin URL, from when it is reachable until it exits
    listening: asyncio.Event = field(default_factory=asyncio.Event)  # on the stream port
    started_at: float = 0.0
    failures: int = 0  # consecutive exits without STABLE_SECONDS of life
    forwarder: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


@dataclass
class Fleet:
    """What the admin listener knows of the workers (the supervisor keeps it current)."""

    settings: Settings
    workers: Sequence[Worker]
    token: str
    metrics_dir: str
    draining: asyncio.Event = field(default_factory=asyncio.Event)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    session: aiohttp.ClientSession | None = None

    def __post_init__(self) -> None:
        self.registry.register(EdgeFamilies(self.metrics_dir))
        self.restarts = Counter(
            "edge_worker_restarts",
            "Worker processes the supervisor restarted after they exited (--workers).",
            registry=self.registry,
        )
        up = Gauge(
            "edge_workers",
            "Worker processes listening now, of --workers.",
            registry=self.registry,
        )
        up.set_function(lambda: sum(1 for w in self.workers if w.listening.is_set()))

    @property
    def authorization(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def call(
        self, worker: Worker, method: str, path: str, data: bytes | None = None
    ) -> tuple[int, dict[str, Any] | None]:
        """One request to a worker's private admin listener: (status, JSON body or None);
        status 0 when it did not answer."""
        admin = worker.admin
        if admin is None or self.session is None:
            return 0, None
        try:
            async with (
                asyncio.timeout(WORKER_CALL_SECONDS),
                self.session.request(
                    method, admin + path, headers=self.authorization, data=data
                ) as response,
            ):
                body = await response.read()
                try:
                    parsed = json.loads(body) if body else None
                except ValueError:
                    parsed = None
                return response.status, parsed if isinstance(parsed, dict) else None
        except (aiohttp.ClientError, TimeoutError, OSError):
            return 0, None


def _readiness(fleet: Fleet, reports: list[tuple[int, dict[str, Any] | None]]) -> dict[str, Any]:
    listening = [
        (w, r) for w, r in zip(fleet.workers, reports, strict=True) if w.listening.is_set()
    ]
    each = [
        {
            **(body or {"origin": "no answer"}),
            "worker": w.index,
            "pid": w.proc.pid if w.proc is not None else None,
            "admin": w.admin,  # private, loopback: its /metrics is this worker alone
            "ready": status == 200,
        }
        for w, (status, body) in listening
    ]
    ready = bool(each) and all(e["ready"] for e in each) and not fleet.draining.is_set()
    first_unready = next((e for e in each if not e["ready"]), each[0] if each else None)
    redis_states = {str(e.get("redis")) for e in each}
    return {
        "ready": ready,
        "origin": first_unready.get("origin", "no answer") if first_unready else "no worker",
        "redis": "down" if "down" in redis_states else next(iter(redis_states), "unknown"),
        "draining": fleet.draining.is_set(),
        "workers": len(fleet.workers),
        "workers_up": len(listening),
        "per_worker": each,
    }


async def _purge_one(fleet: Fleet, worker: Worker, query: str) -> dict[str, Any]:
    if worker.admin is None:
        return {
            "worker": worker.index,
            "status": 200,
            "segments": 0,
            "durable": True,
            "detail": "not reachable yet: holds nothing",
        }
    status, body = await fleet.call(worker, "POST", "/purge?" + query)
    body = body or {}
    return {
        "worker": worker.index,
        "status": status,
        "segments": int(body.get("segments", 0)),
        "durable": bool(body.get("durable", False)),
    }


def add_routes(app: web.Application, fleet: Fleet) -> None:
    settings = fleet.settings
    app.middlewares.append(admin_guard(settings))

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        reports = await asyncio.gather(*(fleet.call(w, "GET", "/readyz") for w in fleet.workers))
        body = _readiness(fleet, list(reports))
        return web.Response(
            status=200 if body["ready"] else 503,
            text=json.dumps(body) + "\n",
            content_type="application/json",
        )

    async def metrics_page(_: web.Request) -> web.Response:
        await asyncio.gather(*(fleet.call(w, "POST", "/metrics/refresh") for w in fleet.workers))
        response = web.Response(body=generate_latest(fleet.registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def purge(request: web.Request) -> web.Response:
        path = purge_target(request, settings)
        if isinstance(path, web.Response):
            return path
        query = request.rel_url.with_query({"path": path}).query_string
        named = next((w for w in fleet.workers if w.admin is not None), None)
        results = await asyncio.gather(
            *(
                _purge_one(
                    fleet, w, query + f"&{TELLS_DOWNSTREAM_PARAM}=1" if w is named else query
                )
                for w in fleet.workers
            )
        )
        statuses = {r["status"] for r in results}
        status = 200 if statuses == {200} else 202 if statuses <= {200, 202} else 503
        return web.json_response(
            {
                "purged": path,
                "segments": sum(r.get("segments", 0) for r in results),
                "durable": status == 200,
                "workers": results,
            },
            status=status,
        )

    async def lifetime(_: web.Application) -> AsyncIterator[None]:
        fleet.session = aiohttp.ClientSession()
        yield
        await fleet.session.close()

    app.cleanup_ctx.append(lifetime)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
    app.router.add_post("/purge", purge)


def add_internal_routes(app: web.Application, fleet: Fleet) -> None:
    """The supervisor's private loopback listener: what workers ask of it."""

    async def observed(request: web.Request) -> web.Response:
        # One worker relayed a change (edge.workers.siblings): every other reachable worker
        # replays it before that worker answers its client.
        if request.headers.get("Authorization") != fleet.authorization["Authorization"]:
            return web.Response(status=401)
        sender = request.query.get("worker", "")
        body = await request.read()
        others = [w for w in fleet.workers if str(w.index) != sender and w.admin is not None]
        told = await asyncio.gather(*(fleet.call(w, "POST", "/observe", body) for w in others))
        missed = [w.index for w, (status, _) in zip(others, told, strict=True) if status != 204]
        if missed:
            logger.warning("workers %s were not told of a write", missed)
            return web.Response(status=502, text=f"workers {missed} did not confirm\n")
        return web.Response(status=204)

    app.router.add_post("/observed", observed)


async def start_internal(fleet: Fleet) -> tuple[web.AppRunner, str]:
    app = web.Application()
    add_internal_routes(app, fleet)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, bound_url(runner, Address(host="127.0.0.1", port=0))


async def start_admin(fleet: Fleet) -> tuple[web.AppRunner, str]:
    """The admin listener on ``--admin-listen``; StartupError when it cannot bind."""
    app = web.Application()
    add_routes(app, fleet)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    address = fleet.settings.admin_listen
    try:
        await web.TCPSite(runner, address.host, address.port).start()
    except OSError as error:
        await runner.cleanup()
        raise StartupError(f"--admin-listen {address}: {why(error, address)}") from None
    return runner, bound_url(runner, address)
