"""The chart ``make loadtest`` writes next to its report: latency and offload over time.

Rules this module owns:

* It draws only what the timeline's samples hold (``loadtest.offload.Sample``), with
  matplotlib (no display: the Agg backend), one PNG.
* Rates and shares are per interval between consecutive samples, plotted at the interval's
  end; an interval where a counter was unknown (an edge or the origin did not answer) is left
  out of that line, never drawn as zero.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # after the backend is chosen

from loadtest.offload import Sample, latency_key, ratio

# The latency lines drawn, by locust entry; the rest are in the summary and locust's report.
CHARTED = (("SSE", "delivery"), ("GET", "catch-up -1"), ("POST", "append"))


def _interval_values(
    samples: Sequence[Sample],
) -> tuple[list[float], list[float], list[float | None], list[float | None], list[float | None]]:
    """Per interval: its end, client requests/s, origin requests/s, origin share of requests
    and of bytes (None where unknown)."""
    ends: list[float] = []
    client_rate: list[float] = []
    origin_rate: list[float | None] = []
    request_share: list[float | None] = []
    byte_share: list[float | None] = []
    for before, after in itertools.pairwise(samples):
        dt = after.seconds - before.seconds
        if dt <= 0:
            continue
        clients = after.requests - before.requests
        ends.append(after.seconds)
        client_rate.append(clients / dt)
        if before.origin_requests is None or after.origin_requests is None:
            origin_rate.append(None)
            request_share.append(None)
        else:
            origin = after.origin_requests - before.origin_requests
            origin_rate.append(origin / dt)
            request_share.append(ratio(origin, clients))
        if before.edges is None or after.edges is None:
            byte_share.append(None)
        else:
            byte_share.append(
                ratio(
                    after.edges.origin_bytes - before.edges.origin_bytes,
                    after.edges.served_bytes - before.edges.served_bytes,
                )
            )
    return ends, client_rate, origin_rate, request_share, byte_share


def _known(
    xs: Sequence[float], ys: Sequence[float | None], scale: float = 1.0
) -> tuple[list[float], list[float]]:
    pairs = [(x, y * scale) for x, y in zip(xs, ys, strict=True) if y is not None]
    return [x for x, _ in pairs], [y for _, y in pairs]


def write_chart(
    samples: Sequence[Sample], path: Path, title: str, load_seconds: float | None = None
) -> Path:
    """Latency (p50, p99 per interval), requests/s at the edges and at the origin, and the
    origin's share of requests and bytes, over the run's seconds; ``load_seconds`` marks where
    the users were told to stop."""
    figure, (latency, load, offload) = plt.subplots(
        3, 1, figsize=(10, 9), sharex=True, constrained_layout=True
    )
    figure.suptitle(title)
    for kind, name in CHARTED:
        key = latency_key(kind, name)
        points = [(s.seconds, s.latency_ms[key]) for s in samples if key in s.latency_ms]
        if not points:
            continue
        xs = [x for x, _ in points]
        (line,) = latency.plot(xs, [p[1] for _, p in points], label=f"{key} p99")
        latency.plot(
            xs, [p[0] for _, p in points], linestyle="--", color=line.get_color(),
            label=f"{key} p50",
        )  # fmt: skip
    latency.set_ylabel("latency (ms)")
    latency.set_yscale("symlog", linthresh=10)
    latency.legend(loc="best", fontsize="small", ncols=2)
    latency.grid(True, alpha=0.3)

    ends, client_rate, origin_rate, request_share, byte_share = _interval_values(samples)
    load.plot(ends, client_rate, label="client requests/s (what locust's users made)")
    load.plot(*_known(ends, origin_rate), label="requests/s that reached the origin")
    load.set_ylabel("requests/s")
    load.legend(loc="best", fontsize="small")
    load.grid(True, alpha=0.3)

    offload.plot(*_known(ends, request_share, 100), label="origin share of requests")
    offload.plot(*_known(ends, byte_share, 100), label="origin share of bytes")
    offload.set_ylabel("origin share (%)")
    offload.set_ylim(bottom=0)
    offload.set_xlabel("seconds since the load started")
    offload.legend(loc="best", fontsize="small")
    offload.grid(True, alpha=0.3)
    if load_seconds is not None:
        for axes in (latency, load, offload):
            axes.axvline(load_seconds, color="grey", linestyle=":", linewidth=1)
        offload.annotate(
            " users stop", (load_seconds, 1), xycoords=("data", "axes fraction"),
            va="top", fontsize="small", color="grey",
        )  # fmt: skip

    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
