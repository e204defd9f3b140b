"""A worker's metrics, written into prometheus-client's multiprocess files when scraped.

Rules this module owns:

* A worker keeps its metrics exactly as a single-process edge does: in-process values, bound
  children, scrape-time collectors, all rendered by its own registry. Live multiprocess values
  would cost every ``inc`` and ``observe`` a lock and a write to a memory-mapped file (about
  4 µs more per update, measured: several per request), on the path this edge makes fast.
* Instead, when the supervisor is about to render ``/metrics``, it asks every worker
  (``POST /metrics/refresh`` on the worker's private admin listener) and the worker writes a
  snapshot of everything its registry renders into its own files in the supervisor's
  directory, in the layout prometheus-client's ``MultiProcessCollector`` reads: counters and
  histograms under ``counter_<pid>.db`` and ``histogram_<pid>.db`` (a worker's counts as of
  its last snapshot: a dead worker's stay, so the edge's totals never go back when a worker is
  restarted; what it counted after its last snapshot is lost, as a killed process's counts
  are), gauges under ``gauge_<mode>_<pid>.db``. A scrape is as exact as in one process.
* How a gauge combines across workers is its ``MODES`` entry, ``livesum`` unless named there:
  the edge's viewers, tails, bytes, tasks and connections are the sums of its workers'; Redis is
  up only if it is up for every worker; a start time or an open-file limit is the lowest. Only
  live workers' gauges count: the supervisor removes a dead worker's gauge files
  (``mark_process_dead``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable

from aiohttp import web
from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict, mmap_key

from edge.metrics import Metrics

MODES = {
    "edge_redis_up": "livemin",
    "process_start_time_seconds": "livemin",
    "process_max_fds": "livemin",
}
Series = tuple[str, dict[str, str], float]  # a sample's name, labels and value


class Mirror:
    def __init__(self, metrics_dir: str, pid: int) -> None:
        self._dir = metrics_dir
        self._pid = pid
        self._files: dict[str, MmapedDict] = {}

    def _file(self, prefix: str) -> MmapedDict:
        file = self._files.get(prefix)
        if file is None:
            path = os.path.join(self._dir, f"{prefix}_{self._pid}.db")
            file = self._files[prefix] = MmapedDict(path)  # type: ignore[no-untyped-call]
        return file

    def write(self, families: Iterable[Metric]) -> None:
        for family in families:
            plain = [(s.name, s.labels, s.value) for s in family.samples]
            if family.type == "counter":
                # ``_created`` is bookkeeping the multiprocess exposition does not carry.
                totals = [series for series in plain if not series[0].endswith("_created")]
                self._write(family, "counter", totals)
            elif family.type == "gauge":
                self._write(family, "gauge_" + MODES.get(family.name, "livesum"), plain)
            elif family.type == "histogram":
                self._write(family, "histogram", _per_bucket(family))

    def _write(self, family: Metric, prefix: str, samples: Iterable[Series]) -> None:
        file = self._file(prefix)
        for name, labels, value in samples:
            key = mmap_key(
                family.name, name, list(labels), list(labels.values()), family.documentation
            )
            file.write_value(key, float(value), 0.0)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        for file in self._files.values():
            file.close()  # type: ignore[no-untyped-call]
        self._files.clear()


def _per_bucket(family: Metric) -> list[Series]:
    """A histogram's buckets as the files hold them: each bucket's own count, not cumulative
    (the collector adds them up again and rebuilds ``_count``)."""
    out: list[Series] = []
    below: dict[tuple[tuple[str, str], ...], float] = {}
    for sample in family.samples:
        if sample.name == family.name + "_bucket":
            series = tuple((k, v) for k, v in sample.labels.items() if k != "le")
            out.append((sample.name, dict(sample.labels), sample.value - below.get(series, 0.0)))
            below[series] = sample.value
        elif sample.name == family.name + "_sum":
            out.append((sample.name, dict(sample.labels), sample.value))
    return out


def add_refresh_route(admin_app: web.Application, metrics: Metrics, metrics_dir: str) -> None:
    """``POST /metrics/refresh`` on a worker's private admin listener: the supervisor's call
    just before it renders the files."""
    mirror = Mirror(metrics_dir, os.getpid())

    async def refresh(_: web.Request) -> web.Response:
        metrics.fold()  # the fast path's plain counts, as a single process's scrape does
        mirror.write(metrics.registry.collect())
        return web.Response(status=204)

    async def lifetime(_: web.Application) -> AsyncIterator[None]:
        yield
        mirror.close()

    admin_app.cleanup_ctx.append(lifetime)
    admin_app.router.add_post("/metrics/refresh", refresh)
