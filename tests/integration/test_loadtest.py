"""A short `make loadtest`: locust against the loopback cluster, with no failure."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from devstack.processes import REPO


def test_a_short_locust_run_has_no_failures(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "loadtest.run", "--users", "24", "--spawn-rate", "12"]
    command += ["--duration", "10s", "--results", str(tmp_path)]
    result = subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "report.html").exists()
    with (run_dir / "locust_stats.csv").open() as handle:
        rows = {(row["Type"], row["Name"]): row for row in csv.DictReader(handle)}
    for name in (
        ("SSE", "delivery"),
        ("GET", "catch-up -1"),
        ("GET", "long-poll"),
        ("POST", "append"),
    ):
        assert int(rows[name]["Request Count"]) > 0, name
        assert int(rows[name]["Failure Count"]) == 0, name
    assert int(rows[("", "Aggregated")]["Failure Count"]) == 0
