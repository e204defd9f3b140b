"""What ``make loadtest`` says about what the edge saved: samples, origin share, the words.

Values in, text out: no sockets, no locust, no clock (the locustfile samples, ``run.py``
prints, ``chart.py`` draws).

Rules this module owns:

* A sample holds cumulative counters, so any two samples give the figures between them: the
  first sample is taken once the test's streams are set up (setup traffic is not load) and the
  last one when the test stops; the summary is the last minus the first.
* Client requests are what locust's users made (its stats), minus what is not a request of
  its own: ``SSE delivery`` (an event read on a connection already counted) and ``SSE
  stream`` (a failure of such a connection). Origin requests are what the origin's stats port
  counted (every request that reached it: the edges' fills, their live tails, every write).
* Bytes are the edges' own counters: body bytes served to clients
  (``edge_served_bytes_total``) against body bytes received from the origin
  (``edge_origin_bytes_total``), summed over every edge.
* The hit ratio is over catch-up reads (``edge_cache_requests_total``): ``hit`` out of all
  results; ``delta`` (only the new bytes asked for) is counted apart, not as a hit.
* A share with nothing to divide by is ``None`` and reads "n/a", never 0 % or 100 %.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# Locust entries that are not requests of their own (see the rules above).
NOT_REQUESTS = frozenset({("SSE", "delivery"), ("SSE", "stream")})
CACHE_RESULTS = ("hit", "delta", "miss", "bypass")

# What each latency figure locust reports means, in the order the summary prints them.
LATENCY_MEANINGS: dict[tuple[str, str], str] = {
    ("SSE", "delivery"): "an agent's append, from its send to a viewer decoding it (end to end)",
    ("GET", "catch-up -1"): "a whole read of a closed 200-item stream (edge hits after the first)",
    ("GET", "catch-up 304"): "a revalidation with If-None-Match (a 304, no body)",
    ("GET", "long-poll"): "includes waiting at the tail for the agent's next append",
    ("POST", "append"): "a write: through HAProxy and an edge to the origin and back",
    ("SSE", "connect"): "an SSE viewer's request until the answer's headers",
    ("GET", "offset=now"): "a long-poller's first read: where the tail is now",
}

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, kw_only=True)
class EdgeCounts:
    """One or more edges' counters from ``/metrics`` (summed over edges)."""

    served_bytes: float = 0.0
    origin_bytes: float = 0.0
    cache: Mapping[str, float] = field(default_factory=dict)  # result -> catch-up reads

    def __add__(self, other: EdgeCounts) -> EdgeCounts:
        results = set(self.cache) | set(other.cache)
        return EdgeCounts(
            served_bytes=self.served_bytes + other.served_bytes,
            origin_bytes=self.origin_bytes + other.origin_bytes,
            cache={r: self.cache.get(r, 0.0) + other.cache.get(r, 0.0) for r in results},
        )


def parse_edge_metrics(text: str) -> EdgeCounts:
    """The counters this module needs from one edge's Prometheus text."""
    served = origin = 0.0
    cache: dict[str, float] = {}
    for line in text.splitlines():
        found = _SAMPLE.match(line)
        if found is None:
            continue
        name, labels, value = found.group(1), found.group(2) or "", float(found.group(3))
        if name == "edge_served_bytes_total":
            served += value
        elif name == "edge_origin_bytes_total":
            origin += value
        elif name == "edge_cache_requests_total":
            result = dict(_LABEL.findall(labels)).get("result", "")
            cache[result] = cache.get(result, 0.0) + value
    return EdgeCounts(served_bytes=served, origin_bytes=origin, cache=cache)


@dataclass(frozen=True, kw_only=True)
class Sample:
    """Where the run stood at ``seconds`` after its start (cumulative counts)."""

    seconds: float
    users: int
    requests: int  # client requests (locust), without deliveries
    failures: int
    deliveries: int  # SSE events viewers decoded
    origin_requests: int | None  # the origin's stats port; None if it did not answer
    edges: EdgeCounts | None  # None if an edge did not answer
    # (type, name) -> (p50 ms, p99 ms) of the requests since the previous sample
    latency_ms: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> Sample:
        raw: dict[str, Any] = json.loads(line)
        edges = raw.pop("edges")
        latency = {k: (float(v[0]), float(v[1])) for k, v in raw.pop("latency_ms").items()}
        return cls(
            **raw,
            edges=None if edges is None else EdgeCounts(**edges),
            latency_ms=latency,
        )


def latency_key(kind: str, name: str) -> str:
    return f"{kind} {name}"


def ratio(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def percent(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{100 * value:.{digits}f}%"


@dataclass(frozen=True, kw_only=True)
class Share:
    """What reached the origin out of what the clients made, between two samples."""

    seconds: float
    client_requests: int
    origin_requests: int | None
    writes: int  # client appends: each one reaches the origin, whatever the edge does
    failures: int
    served_bytes: float | None
    origin_bytes: float | None
    cache: Mapping[str, float]

    @property
    def request_share(self) -> float | None:
        if self.origin_requests is None:
            return None
        return ratio(self.origin_requests, self.client_requests)

    @property
    def byte_share(self) -> float | None:
        if self.served_bytes is None or self.origin_bytes is None:
            return None
        return ratio(self.origin_bytes, self.served_bytes)

    @property
    def hit_ratio(self) -> float | None:
        return ratio(self.cache.get("hit", 0.0), sum(self.cache.values()))


def share(first: Sample, last: Sample, writes: int) -> Share:
    origin = (
        None
        if first.origin_requests is None or last.origin_requests is None
        else last.origin_requests - first.origin_requests
    )
    served = origin_bytes = None
    cache: dict[str, float] = {}
    if first.edges is not None and last.edges is not None:
        served = last.edges.served_bytes - first.edges.served_bytes
        origin_bytes = last.edges.origin_bytes - first.edges.origin_bytes
        cache = {
            r: last.edges.cache.get(r, 0.0) - first.edges.cache.get(r, 0.0)
            for r in set(last.edges.cache) | set(first.edges.cache)
        }
    return Share(
        seconds=last.seconds - first.seconds,
        client_requests=last.requests - first.requests,
        origin_requests=origin,
        writes=writes,
        failures=last.failures - first.failures,
        served_bytes=served,
        origin_bytes=origin_bytes,
        cache=cache,
    )


def size(count: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count:.0f} B"


def share_lines(result: Share) -> list[str]:
    """The summary's first lines: origin share of requests and bytes, and the hit ratio."""
    if result.origin_requests is None:
        requests = (
            f"origin share  n/a of {result.client_requests:,} client requests "
            "(the origin's stats port did not answer)"
        )
    else:
        requests = (
            f"origin share  {percent(result.request_share)} of requests reached the origin: "
            f"{result.origin_requests:,} of {result.client_requests:,} that clients made"
        )
    lines = [requests]
    if result.origin_requests is not None and result.writes:
        lines.append(
            f"              ({result.writes:,} of those {result.origin_requests:,} are the "
            "agent's appends, which every edge passes on)"
        )
    if result.served_bytes is None or result.origin_bytes is None:
        lines.append("              bytes n/a (an edge's /metrics did not answer)")
    else:
        lines.append(
            f"              {percent(result.byte_share)} of bytes: {size(result.origin_bytes)} "
            f"from the origin for {size(result.served_bytes)} served to clients"
        )
    counts = ", ".join(f"{r} {result.cache.get(r, 0.0):,.0f}" for r in CACHE_RESULTS)
    lines.append(
        f"hit ratio     {percent(result.hit_ratio)} of catch-up reads answered by an edge "
        f"alone ({counts})"
    )
    return lines


@dataclass(frozen=True, kw_only=True)
class LatencyRow:
    kind: str
    name: str
    count: int
    failures: int
    p50_ms: float
    p99_ms: float


def latency_lines(rows: Iterable[LatencyRow]) -> list[str]:
    """One line per locust entry: p50 and p99 over the whole run, and what the figure means."""
    by_key = {(r.kind, r.name): r for r in rows}
    ordered = [by_key[k] for k in LATENCY_MEANINGS if k in by_key]
    ordered += [r for k, r in sorted(by_key.items()) if k not in LATENCY_MEANINGS]
    lines = [f"{'latency':<18} {'p50 ms':>7} {'p99 ms':>7} {'count':>8}  what it times"]
    for row in ordered:
        meaning = LATENCY_MEANINGS.get((row.kind, row.name), "")
        failed = f" ({row.failures:,} failed)" if row.failures else ""
        lines.append(
            f"  {latency_key(row.kind, row.name):<16} {row.p50_ms:>7,.0f} {row.p99_ms:>7,.0f} "
            f"{row.count:>8,}  {meaning}{failed}"
        )
    return lines


_SPAN = re.compile(r"(\d+)\s*([hms])")


def seconds_of(span: str) -> float | None:
    """A locust ``--run-time`` (``90``, ``60s``, ``5m``, ``1h30m``) in seconds; None if not one."""
    text = span.strip().lower()
    if text.isdigit():
        return float(text)
    parts = _SPAN.findall(text)
    if not parts or _SPAN.sub("", text).strip():
        return None
    scale = {"h": 3600, "m": 60, "s": 1}
    return float(sum(int(n) * scale[unit] for n, unit in parts))


def clock(seconds: float) -> str:
    whole = max(0, round(seconds))
    return f"{whole // 60:d}:{whole % 60:02d}"


def progress_line(
    sample: Sample, *, previous: Sample | None, target_users: int, run_seconds: float | None
) -> str:
    """The live line: elapsed, users, requests/s and failures (since the previous sample)."""
    rate = deliveries = 0.0
    if previous is not None and sample.seconds > previous.seconds:
        dt = sample.seconds - previous.seconds
        rate = (sample.requests - previous.requests) / dt
        deliveries = (sample.deliveries - previous.deliveries) / dt
    total = f" / {clock(run_seconds)}" if run_seconds else ""
    stopping = " (stopping)" if run_seconds and sample.seconds > run_seconds else ""
    return (
        f"{clock(sample.seconds)}{total}{stopping}  users {sample.users}/{target_users}  "
        f"{rate:,.0f} requests/s  {deliveries:,.0f} SSE events/s  "
        f"failures {sample.failures:,}"
    )


def read_samples(lines: Sequence[str]) -> list[Sample]:
    return [Sample.from_json(line) for line in lines if line.strip()]
