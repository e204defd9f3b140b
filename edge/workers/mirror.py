"""A worker's scrape-time metrics, copied into prometheus-client's multiprocess files.

Rules this module owns:

* In multiprocess mode the supervisor renders only the files every worker writes; a collector
  that computes its values when scraped (``Metrics.scrape_time_collectors``: the process's CPU,
  memory and descriptors, the cache budget, the event loop's tasks, the client connections)
  would be invisible there. ``Mirror.refresh`` runs those collectors in the worker and writes
  what they yield into real multiprocess metrics: gauges are set, counters advance by what
  they gained since the last refresh (so a dead worker's counts stay in the files, and the
  edge's totals never go backwards when a worker is restarted).
* The supervisor asks every worker to refresh just before it renders, so a scrape is as exact
  as in one process; it is not done on a timer, which would be up to a period stale.
* How a gauge combines across workers is its ``MODES`` entry, ``livesum`` unless named: the
  edge's bytes, tasks and connections are the sum of its workers'; a start time is the
  earliest. Only live workers count (the supervisor marks dead ones).
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web
from prometheus_client import Counter, Gauge
from prometheus_client.registry import Collector

from edge.metrics import Metrics

MODES = {"process_start_time_seconds": "livemin", "process_max_fds": "livemin"}


class Mirror:
    def __init__(self, collectors: Iterable[Collector]) -> None:
        self._collectors = tuple(collectors)
        self._gauges: dict[str, Gauge] = {}
        self._counters: dict[str, Counter] = {}
        self._counted: dict[tuple[str, tuple[str, ...]], float] = {}

    def refresh(self) -> None:
        for collector in self._collectors:
            for family in collector.collect():
                for sample in family.samples:
                    labels = tuple(sample.labels)
                    values = tuple(sample.labels.values())
                    if family.type == "counter" and sample.name == family.name + "_total":
                        self._advance(
                            family.name, family.documentation, labels, values, sample.value
                        )
                    elif family.type == "gauge":
                        gauge = self._gauge(family.name, family.documentation, labels)
                        (gauge.labels(*values) if labels else gauge).set(sample.value)

    def _gauge(self, name: str, documentation: str, labels: tuple[str, ...]) -> Gauge:
        gauge = self._gauges.get(name)
        if gauge is None:
            # registry=None: these exist only to write the files; the worker's own registry
            # keeps rendering the collectors themselves.
            gauge = self._gauges[name] = Gauge(
                name,
                documentation,
                labels,
                registry=None,
                multiprocess_mode=MODES.get(name, "livesum"),  # type: ignore[arg-type]
            )
        return gauge

    def _advance(
        self,
        name: str,
        documentation: str,
        labels: tuple[str, ...],
        values: tuple[str, ...],
        value: float,
    ) -> None:
        counter = self._counters.get(name)
        if counter is None:
            counter = self._counters[name] = Counter(name, documentation, labels, registry=None)
        key = (name, values)
        gained = value - self._counted.get(key, 0.0)
        if gained > 0:
            (counter.labels(*values) if labels else counter).inc(gained)
            self._counted[key] = value


def add_refresh_route(admin_app: web.Application, metrics: Metrics) -> None:
    """``POST /metrics/refresh`` on a worker's private admin listener: the supervisor's call
    just before it renders the files."""
    mirror = Mirror(metrics.scrape_time_collectors())

    async def refresh(_: web.Request) -> web.Response:
        mirror.refresh()
        return web.Response(status=204)

    admin_app.router.add_post("/metrics/refresh", refresh)
