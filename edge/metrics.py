"""Every Prometheus metric the edge exports, defined once.

Each ``Metrics`` owns its own registry, so several edges (tests, one process) never collide.
Label values are closed sets: ``kind`` is a ``RequestKind``, ``reason`` one of ``ORIGIN_ERRORS``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from edge.protocol.reads import RequestKind

ORIGIN_ERRORS = ("connect", "timeout", "reset", "protocol")

# Long-polls last up to ~30 s and SSE connections minutes, so the buckets reach far.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "edge_requests",
            "Client requests answered, by kind and status code.",
            ["kind", "code"],
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
        for kind in RequestKind:
            self.request_duration.labels(kind=kind.value)
            self.open_connections.labels(kind=kind.value)
        for reason in ORIGIN_ERRORS:
            self.origin_errors.labels(reason=reason)

    def render(self) -> bytes:
        return generate_latest(self.registry)
