"""``make loadtest``: start the loopback cluster, run locust headless against HAProxy, report.

    python -m loadtest.run --users 200 --spawn-rate 50 --duration 60s

Saves locust's HTML report and CSVs under ``results/<timestamp>/``, prints the summary (every
request name with count, failures, median and p99), and exits non-zero if any request failed.
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


def summary(stats_csv: Path) -> tuple[str, int]:
    """A table of locust's per-name stats, and the total failure count."""
    lines = [f"{'type':<6} {'name':<14} {'count':>8} {'fails':>6} {'p50 ms':>8} {'p99 ms':>8}"]
    failures = 0
    with stats_csv.open() as handle:
        for row in csv.DictReader(handle):
            lines.append(
                f"{row['Type']:<6} {row['Name']:<14} {row['Request Count']:>8} "
                f"{row['Failure Count']:>6} {row['50%']:>8} {row['99%']:>8}"
            )
            if row["Name"] != "Aggregated":
                failures += int(row["Failure Count"])
    return "\n".join(lines), failures


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
    cluster = start_cluster(out / "logs", replicas=args.replicas)
    try:
        print(json.dumps(cluster.describe()), flush=True)
        command = [
            sys.executable, "-m", "locust",
            "-f", str(REPO / "loadtest" / "locustfile.py"),
            "--headless", "--host", cluster.url,
            "--users", str(args.users), "--spawn-rate", str(args.spawn_rate),
            "--run-time", args.duration, "--stop-timeout", "5",
            "--agent-rate", str(args.agent_rate),
            "--csv", str(out / "locust"), "--html", str(out / "report.html"),
            "--only-summary", "--loglevel", "WARNING",
        ]  # fmt: skip
        if args.processes != 1:
            command += ["--processes", str(args.processes)]
        locust = subprocess.run(command, cwd=REPO, check=False)
    finally:
        cluster.stop()
    table, failures = summary(out / "locust_stats.csv")
    print(
        f"\nlocust: {args.users} users, {args.duration}, through HAProxy to {args.replicas} edges"
    )
    print(table)
    print(f"\nreport: {out / 'report.html'}  csv: {out}/locust_*.csv")
    return 1 if failures or locust.returncode not in (0, 1) else (1 if failures else 0)


if __name__ == "__main__":
    sys.exit(main())
