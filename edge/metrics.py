"""Every Prometheus metric the edge exports, defined once.

Each ``Metrics`` owns its own registry, so several edges (tests, one process) never collide.
Label values are closed sets: ``kind`` is a ``RequestKind``, ``reason`` one of ``ORIGIN_ERRORS``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from edge.protocol.reads import RequestKind

ORIGIN_ERRORS = ("connect", "timeout", "reset", "protocol")
CACHE_RESULTS = ("hit", "delta", "miss", "bypass")
# What became of a stream's purge at a CDN target (edge.cdn.purger).
CDN_PURGE_RESULTS = ("ok", "error", "dropped", "gave_up", "abandoned")
# What became of a request carrying one of the edge's ids on a resume route (edge.resume):
# served from its stream, or found nothing (unknown, expired, another credential's, not an id).
RESUME_RESULTS = ("served", "not_found", "error")
# How an answer whose pump went silent past its lease was ended by a reader: the reader wrote
# the owed errors and the close (fencing the pump off), or the origin refused even that and the
# reader gave its client the errors itself, or the reader could not read the log at all (the
# origin away) and cut its client short, to resume once it can be read.
RESUME_LAPSED_RESULTS = ("fenced", "unwritable", "unreadable")
# Why an SSE answer on a resume route was not kept (wholly, or past a cap).
RESUME_UNKEPT_REASONS = ("origin", "pumps", "bytes", "seconds")

# A readable pass of the stream listener accepts at most edge.web.backlog.ACCEPTS_PER_PASS.
ACCEPTS_PER_PASS_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128)
# Long-polls last up to ~30 s and SSE connections minutes, so the buckets reach far.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


Usage = Callable[[], dict[str, tuple[int, int]]]


@dataclass(frozen=True, kw_only=True, slots=True)
class ListenerStats:
    """The stream listener's client connections as the tracker counts them, read at scrape."""

    open: int
    limit: int  # --max-connections in effect
    live: int  # live readers (SSE viewers, long-polls) in progress
    live_limit: int  # the live-reader cap in effect
    closed: Mapping[str, int]  # closed by the edge, by reason
    refusals: Mapping[tuple[str, str], int]  # refused, by (request kind, reason)


ConnectionStats = Callable[[], ListenerStats]


class ScrapeTimeCollector(Collector):
    """What is read at scrape time, not counted per request: every structure inside
    ``--cache-bytes``, the event loop's tasks, the stream listener's connections."""

    def __init__(self) -> None:
        self.usage: Usage | None = None
        self.fill_bytes: Callable[[], int] | None = None
        self.connections: ConnectionStats | None = None

    def collect(self) -> Iterator[Metric]:
        size = GaugeMetricFamily(
            "edge_budget_bytes",
            "Bytes each structure holds within the --cache-bytes budget (segment, log, "
            "instance, derived), and fill: bytes origin answers being read hold now (bounded "
            "by --fill-buffer-bytes).",
            labels=["structure"],
        )
        entries = GaugeMetricFamily(
            "edge_budget_entries",
            "Entries each structure holds within the --cache-bytes budget.",
            labels=["structure"],
        )
        if self.usage is not None:
            for structure, (used, count) in self.usage().items():
                size.add_metric([structure], used)
                entries.add_metric([structure], count)
        if self.fill_bytes is not None:
            size.add_metric(["fill"], self.fill_bytes())
        yield size
        yield entries
        tasks = GaugeMetricFamily(
            "edge_event_loop_tasks", "Tasks alive in the edge's event loop (leak detector)."
        )
        with contextlib.suppress(RuntimeError):  # scraped outside the loop: nothing to count
            tasks.add_metric([], len(asyncio.all_tasks()))
        yield tasks
        if self.connections is not None:
            yield from _listener_families(self.connections())


def _listener_families(stats: ListenerStats) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "edge_client_connections",
        "Open client connections on the stream listener.",
        value=stats.open,
    )
    yield GaugeMetricFamily(
        "edge_client_connections_limit",
        "--max-connections in effect (derived from the open-file limit when 0).",
        value=stats.limit,
    )
    yield GaugeMetricFamily(
        "edge_live_readers",
        "Live readers (SSE viewers and long-polls) in progress, counted against their cap.",
        value=stats.live,
    )
    yield GaugeMetricFamily(
        "edge_live_readers_limit",
        "The live-reader cap in effect: --max-viewers, or what the connections leave after the "
        "short requests' reserve.",
        value=stats.live_limit,
    )
    closed_family = CounterMetricFamily(
        "edge_client_connections_closed",
        "Client connections the edge closed itself, by reason: header_timeout, "
        "keepalive_timeout, body_timeout (a request body slower than --body-timeout), evicted "
        "(the longest idle, to make room at --max-connections), "
        "refused (a plain 503: no room even to read the request).",
        labels=["reason"],
    )
    for reason, count in stats.closed.items():
        closed_family.add_metric([reason], count)
    yield closed_family
    refusals = CounterMetricFamily(
        "edge_refusals",
        "Requests the edge turned away for room (503 with Retry-After), by request kind (sse, "
        "long_poll, write, catchup, head, other; unknown: gone before its request line) and "
        "reason (viewers: the live-reader cap; connections: every connection busy).",
        labels=["kind", "reason"],
    )
    for (kind, reason), count in stats.refusals.items():
        refusals.add_metric([kind, reason], count)
    yield refusals


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        self._scrape_time = ScrapeTimeCollector()
        self.registry.register(self._scrape_time)
        self.requests = Counter(
            "edge_requests",
            "Client requests answered, by kind and status code.",
            ["kind", "code"],
            registry=self.registry,
        )
        self.resume_streams = Counter(
            "edge_resume_streams",
            "SSE answers on resume routes kept in a stream at the origin (edge.resume).",
            registry=self.registry,
        )
        self.resume_unkept = Counter(
            "edge_resume_unkept",
            "SSE answers on resume routes relayed without ids (wholly, or past a cap), by why: "
            "the origin refused their stream, or a --resume-max-* cap.",
            ["reason"],
            registry=self.registry,
        )
        self.resumes = Counter(
            "edge_resumes",
            "Requests on resume routes carrying a Last-Event-ID, by result.",
            ["result"],
            registry=self.registry,
        )
        self.resume_append_seconds = Histogram(
            "edge_resume_append_seconds",
            "Time the origin took to take one append of a resume route's events.",
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.resume_lapsed = Counter(
            "edge_resume_lapsed",
            "Answers on resume routes whose pump went silent past --resume-lease, ended by a "
            "reader, by how.",
            ["result"],
            registry=self.registry,
        )
        self.resume_pumps = Gauge(
            "edge_resume_pumps",
            "Upstream answers being copied into their streams now.",
            registry=self.registry,
        )
        # Apart from the answered requests, so a dashboard never reads leaving as failing:
        # leaving is what viewers do (a long-poll's client gone before its release, a reader
        # that hung up before its answer was written).
        self.clients_gone = Counter(
            "edge_clients_gone",
            "Client requests whose client left before their answer was written, by kind.",
            ["kind"],
            registry=self.registry,
        )
        self.request_duration = Histogram(
            "edge_request_duration_seconds",
            "Time from request arrival to the end of the response, by kind.",
            ["kind"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.origin_requests = Counter(
            "edge_origin_requests",
            "Requests the edge sent to the origin that got a response, by kind and status code.",
            ["kind", "code"],
            registry=self.registry,
        )
        self.origin_errors = Counter(
            "edge_origin_errors",
            "Origin requests that failed without a response (or mid-body), by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.open_connections = Gauge(
            "edge_open_connections",
            "Client requests in progress, by kind.",
            ["kind"],
            registry=self.registry,
        )
        self.cache_requests = Counter(
            "edge_cache_requests",
            "Catch-up reads by what the cache did: hit (answered alone), delta (asked the origin "
            "only for the missing tail), miss (asked for everything), bypass (not cacheable).",
            ["result"],
            registry=self.registry,
        )
        self.collapsed_requests = Counter(
            "edge_collapsed_requests",
            "Requests that shared an origin request already in flight, by kind.",
            ["kind"],
            registry=self.registry,
        )
        self.cache_bytes = Gauge(
            "edge_cache_bytes",
            "Bytes held by the local tier: everything within --cache-bytes.",
            registry=self.registry,
        )
        self.cache_segments = Gauge(
            "edge_cache_segments", "Segments held by the local tier.", registry=self.registry
        )
        self.cache_evictions = Counter(
            "edge_cache_evictions",
            "Segments evicted from the local tier to stay within --cache-bytes.",
            registry=self.registry,
        )
        self.origin_bytes = Counter(
            "edge_origin_bytes",
            "Body bytes received from the origin.",
            registry=self.registry,
        )
        self.served_bytes = Counter(
            "edge_served_bytes",
            "Body bytes sent to clients.",
            registry=self.registry,
        )
        self.redis_up = Gauge(
            "edge_redis_up",
            "1 while the shared tier is in use, 0 until Redis first answers and while its "
            "circuit breaker is open.",
            registry=self.registry,
        )
        self.redis_operations = Counter(
            "edge_redis_operations",
            "Shared-tier operations by op (get, put, purge, ping, ...) and result "
            "(hit, miss, ok, error, skipped).",
            ["op", "result"],
            registry=self.registry,
        )
        self.sse_viewers = Gauge(
            "edge_sse_viewers", "SSE viewers connected.", registry=self.registry
        )
        self.long_polls_waiting = Gauge(
            "edge_long_polls_waiting",
            "Long-polls waiting at the tail for new data.",
            registry=self.registry,
        )
        self.live_tails = Gauge(
            "edge_live_tails",
            "Streams followed live by one upstream reader each.",
            registry=self.registry,
        )
        self.tail_reconnects = Counter(
            "edge_tail_reconnects",
            "Upstream live readers that reconnected, by reason (closed_by_origin, connect, "
            "timeout, reset, protocol, refused).",
            ["reason"],
            registry=self.registry,
        )
        self.viewers_lagging = Gauge(
            "edge_viewers_lagging",
            "SSE viewers behind the tail (catching up from the log at their own pace).",
            registry=self.registry,
        )
        self.sse_events_sent = Counter(
            "edge_sse_events_sent",
            "SSE events written to viewers (data and control).",
            registry=self.registry,
        )
        self.delivery_latency = Histogram(
            "edge_delivery_latency_seconds",
            "Time from a batch arriving at the edge to it being written to a viewer.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.auth_decisions = Counter(
            "edge_auth_decisions",
            "Authorization decisions in --auth jwt/forward mode, by mode and result (allowed, "
            "missing, malformed, invalid, expired, not_yet_valid, forbidden, denied by the "
            "auth service, unavailable: 503, the edge could not judge).",
            ["mode", "result"],
            registry=self.registry,
        )
        self.auth_upstream_requests = Counter(
            "edge_auth_upstream_requests",
            "Requests to the JWKS document (kind=jwks) and the auth service (kind=forward), by "
            "result (ok, denied: a 401/403 verdict, error, timeout).",
            ["kind", "result"],
            registry=self.registry,
        )
        self.auth_upstream_duration = Histogram(
            "edge_auth_upstream_duration_seconds",
            "Time the JWKS document or the auth service took to answer, by kind.",
            ["kind"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        )
        self.auth_keys = Gauge(
            "edge_auth_keys",
            "Signing keys in the JWKS the edge verifies tokens with (--auth jwt).",
            registry=self.registry,
        )
        for kind in ("jwks", "forward"):
            self.auth_upstream_duration.labels(kind=kind)
        self.fast_path_answers = Counter(
            "edge_fast_path_answers",
            "Catch-up hits answered from stored, pre-serialised responses (also counted in "
            "edge_requests_total and edge_cache_requests_total; folded in at scrape time).",
            registry=self.registry,
        )
        self.full_path_requests = Counter(
            "edge_full_path_requests",
            "Stream requests the listener's connections handed to aiohttp's request handler, "
            "by kind: writes, relays and what the connection cannot answer without waiting "
            "(a fill, a first live read of a stream); the rest, --auth reads and refusals "
            "included, is answered by the connections themselves.",
            ["kind"],
            registry=self.registry,
        )
        self.refresh_ahead = Counter(
            "edge_refresh_ahead",
            "Background refills of an at-tail answer's tail, started by a read in the last tenth "
            "of --tail-freshness, by how they ended (edge.refresh_ahead.Refreshed).",
            ["result"],
            registry=self.registry,
        )
        self.cdn_purges = Counter(
            "edge_cdn_purges",
            "Purges of forgotten streams at the CDN targets of --cdn-purge, one per stream and "
            "send, by kind and result: ok (acknowledged), error (failed or unanswered: "
            "retried), dropped (past the cap of owed purges), gave_up (failing for an hour), "
            "abandoned (still owed when a drain ended).",
            ["kind", "result"],
            registry=self.registry,
        )
        self.cdn_purges_pending = Gauge(
            "edge_cdn_purges_pending",
            "Streams owed a purge at the CDN targets of --cdn-purge, by kind (waiting for the "
            "forgetting to be in effect, due, in flight, retried, or owed the double purge).",
            ["kind"],
            registry=self.registry,
        )
        self.accepts_per_pass = Histogram(
            "edge_accepts_per_pass",
            "Connections the stream listener accepted in each pass of the event loop that found "
            "it readable (it takes what the kernel has queued, a bounded number a pass; 0: "
            "another took it first).",
            buckets=ACCEPTS_PER_PASS_BUCKETS,
            registry=self.registry,
        )
        # Label children bound once: a labels() lookup per request costs more than the count.
        self._children: dict[tuple[str, ...], Any] = {}
        self._folders: list[Callable[[Metrics], None]] = []
        for result in CACHE_RESULTS:
            self.cache_requests.labels(result=result)
        for kind in RequestKind:
            self.request_duration.labels(kind=kind.value)
            self.open_connections.labels(kind=kind.value)
        for reason in ORIGIN_ERRORS:
            self.origin_errors.labels(reason=reason)

    def track_budget(self, usage: Usage, fill_bytes: Callable[[], int]) -> None:
        self._scrape_time.usage, self._scrape_time.fill_bytes = usage, fill_bytes
        self.cache_bytes.set_function(lambda: sum(used for used, _ in usage().values()))
        self.cache_segments.set_function(lambda: usage()["segment"][1])

    def track_connections(self, stats: ConnectionStats) -> None:
        self._scrape_time.connections = stats

    def _child(self, key: tuple[str, ...], make: Callable[[], Any]) -> Any:
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = make()
        return child

    def request_count(self, kind: RequestKind, code: int) -> Counter:
        return cast(
            Counter,
            self._child(
                ("requests", kind, str(code)),
                lambda: self.requests.labels(kind=kind.value, code=str(code)),
            ),
        )

    def client_gone(self, kind: RequestKind) -> Counter:
        return cast(
            Counter,
            self._child(("gone", kind), lambda: self.clients_gone.labels(kind=kind.value)),
        )

    def duration(self, kind: RequestKind) -> Histogram:
        return cast(
            Histogram,
            self._child(("duration", kind), lambda: self.request_duration.labels(kind=kind.value)),
        )

    def full_path(self, kind: RequestKind) -> Counter:
        return cast(
            Counter,
            self._child(("full", kind), lambda: self.full_path_requests.labels(kind=kind.value)),
        )

    def open_requests(self, kind: RequestKind) -> Gauge:
        return cast(
            Gauge,
            self._child(("open", kind), lambda: self.open_connections.labels(kind=kind.value)),
        )

    def cache_result(self, result: str) -> Counter:
        return cast(
            Counter, self._child(("cache", result), lambda: self.cache_requests.labels(result))
        )

    def fold_at_scrape(self, folder: Callable[[Metrics], None]) -> None:
        """``folder`` adds plain counts kept elsewhere to these metrics before each render."""
        self._folders.append(folder)

    def fold(self) -> None:
        """Bring in what is counted elsewhere (``fold_at_scrape``): before any export."""
        for folder in self._folders:
            folder(self)

    def render(self) -> bytes:
        self.fold()
        return generate_latest(self.registry)
