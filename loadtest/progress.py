"""The live progress line of ``make loadtest`` and its timeline of samples, from locust's own
event hooks and stats.

Rules this module owns:

* Only the process that holds the run's whole stats samples (locust's local runner, or the
  master with ``--processes``); workers only send their stats to it, as locust does.
* The clock starts when ``test_start`` does, as locust's ``--run-time`` does (this module's
  first listener is registered when the locustfile imports it, before the locustfile's own).
* The first sample is taken at ``test_start`` after the test's streams are set up (the
  locustfile's listener runs first), the last at ``test_stop``; one every second between, each
  written to the timeline file (JSON lines, ``loadtest.offload.Sample``) as it is taken, so a
  run cut short still leaves what it had.
* The progress line goes to stdout: rewritten in place on a terminal, a new line every
  ``LOG_EVERY_SECONDS`` elsewhere (a log or a pipe), and once more at the end.
* A counter that could not be read (an edge or the origin did not answer within a second) is
  recorded as unknown, never as zero.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, TextIO

import gevent
import requests
from locust import events
from locust.env import Environment
from locust.runners import LocalRunner, MasterRunner
from locust.stats import (
    StatsEntry,
    calculate_response_time_percentile,
    diff_response_time_dicts,
)

from loadtest.offload import (
    NOT_REQUESTS,
    EdgeCounts,
    Sample,
    latency_key,
    parse_edge_metrics,
    progress_line,
)

SAMPLE_EVERY_SECONDS = 1.0
LOG_EVERY_SECONDS = 5.0
SCRAPE_TIMEOUT_SECONDS = 1.0


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    parser.add_argument("--origin-stats", default="", help="the origin's stats URL (/counts)")
    parser.add_argument("--edge-admin", default="", help="edges' admin URLs, comma-separated")
    parser.add_argument("--timeline", default="", help="write a sample a second here (JSON)")


class Progress:
    def __init__(self, environment: Environment, out: TextIO = sys.stdout) -> None:
        options = environment.parsed_options
        self.environment = environment
        self.origin_stats: str = options.origin_stats
        self.edge_admins = [u for u in options.edge_admin.split(",") if u]
        self.timeline = Path(options.timeline) if options.timeline else None
        self.target_users = int(options.num_users or 0)
        self.run_seconds = float(options.run_time) if options.run_time else None
        self.out = out
        self.interactive = out.isatty()
        self.http = requests.Session()
        self.started = 0.0
        self.previous: Sample | None = None
        self.logged_at = -LOG_EVERY_SECONDS
        self.response_times: dict[str, dict[int, int]] = {}
        self.loop: gevent.Greenlet[Any, Any] | None = None

    def start(self) -> None:
        if self.timeline is not None:
            self.timeline.write_text("")
        self.tick()
        self.loop = gevent.spawn(self._run)

    def stop(self) -> None:
        if self.loop is None:
            return
        self.loop.kill(block=True)
        self.loop = None
        self.tick(final=True)

    def _run(self) -> None:
        while True:
            gevent.sleep(SAMPLE_EVERY_SECONDS)
            self.tick()

    def tick(self, *, final: bool = False) -> None:
        sample = self.sample()
        if self.timeline is not None:
            with self.timeline.open("a") as handle:
                handle.write(sample.to_json() + "\n")
        line = progress_line(
            sample,
            previous=self.previous,
            target_users=self.target_users,
            run_seconds=self.run_seconds,
        )
        if self.interactive:
            self.out.write(f"\r{line}\x1b[K" + ("\n" if final else ""))
        elif final or sample.seconds - self.logged_at >= LOG_EVERY_SECONDS:
            self.out.write(line + "\n")
            self.logged_at = sample.seconds
        self.out.flush()
        self.previous = sample

    def sample(self) -> Sample:
        stats = self.environment.stats
        requests_made = failures = deliveries = 0
        latency: dict[str, tuple[float, float]] = {}
        for (name, kind), entry in list(stats.entries.items()):
            if (kind, name) == ("SSE", "delivery"):
                deliveries += entry.num_requests
            elif (kind, name) not in NOT_REQUESTS:
                requests_made += entry.num_requests
            failures += entry.num_failures
            recent = self._recent_latency(latency_key(kind, name), entry)
            if recent is not None:
                latency[latency_key(kind, name)] = recent
        runner = self.environment.runner
        return Sample(
            seconds=time.monotonic() - self.started,
            users=runner.user_count if runner is not None else 0,
            requests=requests_made,
            failures=failures,
            deliveries=deliveries,
            origin_requests=self._origin_requests(),
            edges=self._edges(),
            latency_ms=latency,
        )

    def _recent_latency(self, key: str, entry: StatsEntry) -> tuple[float, float] | None:
        """p50 and p99 of this entry's requests since the previous sample."""
        now = dict(entry.response_times)
        recent = diff_response_time_dicts(now, self.response_times.get(key, {}))
        self.response_times[key] = now
        count = sum(recent.values())
        if count == 0:
            return None
        return (
            float(calculate_response_time_percentile(recent, count, 0.50)),
            float(calculate_response_time_percentile(recent, count, 0.99)),
        )

    def _origin_requests(self) -> int | None:
        if not self.origin_stats:
            return None
        try:
            answer = self.http.get(f"{self.origin_stats}/counts", timeout=SCRAPE_TIMEOUT_SECONDS)
            answer.raise_for_status()
            return int(answer.json()["total"])
        except (requests.RequestException, ValueError, KeyError):
            return None

    def _edges(self) -> EdgeCounts | None:
        if not self.edge_admins:
            return None
        total = EdgeCounts()
        for admin in self.edge_admins:
            try:
                answer = self.http.get(f"{admin}/metrics", timeout=SCRAPE_TIMEOUT_SECONDS)
                answer.raise_for_status()
            except requests.RequestException:
                return None
            total = total + parse_edge_metrics(answer.text)
        return total


_progress: list[Progress] = []


@events.test_start.add_listener
def _start_the_clock(**_: Any) -> None:
    for progress in _progress:
        progress.started = time.monotonic()


@events.init.add_listener
def _on_init(environment: Environment, **_: Any) -> None:
    if isinstance(environment.runner, (LocalRunner, MasterRunner)):
        _progress.append(Progress(environment))


def _start(**_: Any) -> None:
    for progress in _progress:
        progress.start()


def _stop(**_: Any) -> None:
    for progress in _progress:
        progress.stop()


def install() -> None:
    """Register the sampling listeners; call after the listener that sets up the streams, so
    that setup comes before the first sample."""
    events.test_start.add_listener(_start)
    events.test_stop.add_listener(_stop)
