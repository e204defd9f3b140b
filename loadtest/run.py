"""``make loadtest``: start the loopback cluster, run locust headless against HAProxy, report.

    python -m loadtest.run --users 200 --spawn-rate 50 --duration 60s

While locust runs, a progress line (elapsed, users, requests/s, failures; ``loadtest.progress``)
shows where it is. At the end: the origin share first (requests and bytes that reached the
origin out of those the clients made, and the edges' hit ratio; ``loadtest.offload``), then
each latency with what it times, and the files under ``results/<timestamp>/``: the chart
(``loadtest.png``, latency and offload over time), locust's HTML report and CSVs, and the
timeline of samples. Exits non-zero if any request failed.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

from devstack.cluster import start_cluster
from devstack.processes import REPO
from loadtest.chart import write_chart
from loadtest.offload import (
    LatencyRow,
    latency_lines,
    read_samples,
    seconds_of,
    share,
    share_lines,
)


def latency_rows(stats_csv: Path) -> list[LatencyRow]:
    """Locust's per-name stats (the ``Aggregated`` row left out: it mixes every kind)."""
    with stats_csv.open() as handle:
        return [
            LatencyRow(
                kind=row["Type"],
                name=row["Name"],
                count=int(row["Request Count"]),
                failures=int(row["Failure Count"]),
                p50_ms=float(row["50%"]),
                p99_ms=float(row["99%"]),
            )
            for row in csv.DictReader(handle)
            if row["Name"] != "Aggregated"
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make loadtest", description=__doc__)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--spawn-rate", type=float, default=50)
    parser.add_argument("--duration", default="60s", help="locust --run-time, e.g. 60s or 5m")
    parser.add_argument("--agent-rate", type=float, default=10.0)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument(
        "--processes", type=int, default=1, help="locust worker processes (-1: one per core)"
    )
    parser.add_argument("--results", type=Path, default=REPO / "results")
    args = parser.parse_args(argv)

    out = args.results / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    timeline = out / "timeline.jsonl"
    cluster = start_cluster(out / "logs", replicas=args.replicas)
    try:
        (out / "cluster.json").write_text(json.dumps(cluster.describe(), indent=2) + "\n")
        print(
            f"cluster: HAProxy {cluster.url} -> {args.replicas} edges (Redis shared) -> origin "
            f"{cluster.origin.url}; {args.users} users for {args.duration}",
            flush=True,
        )
        command = [
            sys.executable, "-m", "locust",
            "-f", str(REPO / "loadtest" / "locustfile.py"),
            "--headless", "--host", cluster.url,
            "--users", str(args.users), "--spawn-rate", str(args.spawn_rate),
            "--run-time", args.duration, "--stop-timeout", "5",
            "--agent-rate", str(args.agent_rate),
            "--origin-stats", cluster.origin.stats_url,
            "--edge-admin", ",".join(e.admin_url for e in cluster.edges),
            "--timeline", str(timeline),
            "--csv", str(out / "locust"), "--html", str(out / "report.html"),
            # --json-file instead of locust's own end-of-run tables: the summary below says it.
            # Locust adds ".json" itself: this writes locust_stats.json.
            "--json-file", str(out / "locust_stats"),
            "--only-summary", "--loglevel", "WARNING",
        ]  # fmt: skip
        if args.processes != 1:
            command += ["--processes", str(args.processes)]
        locust = subprocess.run(command, cwd=REPO, check=False)
    finally:
        cluster.stop()
    rows = latency_rows(out / "locust_stats.csv")
    failures = sum(r.failures for r in rows)
    samples = read_samples(timeline.read_text().splitlines()) if timeline.exists() else []
    print(
        f"\n{args.users} users, {args.duration}, through HAProxy to {args.replicas} edges "
        "in front of one origin"
    )
    if len(samples) >= 2:
        writes = sum(r.count for r in rows if (r.kind, r.name) == ("POST", "append"))
        result = share(samples[0], samples[-1], writes)
        for line in share_lines(result):
            print(line)
        print(f"failures      {failures:,} of {result.client_requests:,} client requests")
        chart = write_chart(
            samples,
            out / "loadtest.png",
            f"make loadtest: {args.users} users through {args.replicas} edges",
            seconds_of(args.duration),
        )
    else:
        print("origin share  n/a (locust took fewer than two samples)")
        chart = None
    for line in latency_lines(rows):
        print(line)
    if chart is not None:
        print(f"chart         {chart}")
    print(f"report        {out / 'report.html'}  (locust's; CSVs: {out}/locust_*.csv)")
    return 1 if failures or locust.returncode not in (0, 1) else 0


if __name__ == "__main__":
    sys.exit(main())
