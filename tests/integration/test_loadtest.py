"""A short `make loadtest` (locust against the loopback cluster, with no failure), and smoke runs
of the speed benchmarks: they print checked figures; how fast is for docs/benchmarks.md."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert sorted(p.name for p in run_dir.glob("*.json")) == ["cluster.json", "locust_stats.json"]
    out = result.stdout.splitlines()
    # While it ran: progress lines (not a terminal here: one every few seconds), then the end.
    progress = [line for line in out if re.match(r"^\d+:\d\d / 0:10", line)]
    assert len(progress) >= 2, result.stdout
    assert re.search(
        r"users 24/24  [\d,]+ requests/s  [\d,]+ SSE events/s  failures 0", "\n".join(progress)
    )
    # The summary leads with what reached the origin, out of what the clients made.
    summary = out[
        out.index("24 users, 10s, through HAProxy to 2 edges in front of one origin") + 1 :
    ]
    share = re.fullmatch(
        r"origin share  (\d+\.\d)% of requests reached the origin: ([\d,]+) of ([\d,]+) that "
        r"clients made",
        summary[0],
    )
    assert share is not None, summary
    origin, clients = (int(share.group(i).replace(",", "")) for i in (2, 3))
    assert 0 < origin < clients
    assert float(share.group(1)) == pytest.approx(100 * origin / clients, abs=0.06)
    assert re.search(r"of bytes: .* from the origin for .* served to clients", result.stdout)
    assert re.search(r"^hit ratio     \d+\.\d% of catch-up reads", result.stdout, re.M)
    assert any(line.startswith("  SSE delivery") and "end to end" in line for line in out)
    chart = run_dir / "loadtest.png"
    assert f"chart         {chart}" in out
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert chart.stat().st_size > 20_000
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


def _need_wrk_and_nginx() -> None:
    from loadtest.nginx import nginx_binary
    from loadtest.wrk import wrk_binary

    if wrk_binary() is None or nginx_binary() is None:
        pytest.skip(
            "wrk or nginx is not installed (make bootstrap installs Debian's wrk and nginx)"
        )


def _row(text: str, first_cell: str) -> list[str]:
    (line,) = [x for x in text.splitlines() if x.startswith(f"| {first_cell} |")]
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_the_hits_benchmark_prints_a_table_of_checked_figures(tmp_path: Path) -> None:
    """A smoke test of the script, not of speed: one cell, one short run per server."""
    _need_wrk_and_nginx()
    output = tmp_path / "benchmarks.md"
    command = [sys.executable, "-m", "loadtest.hits", "--duration", "1", "--runs", "1"]
    command += ["--cells", "100B", "--connections", "8", "--output", str(output)]
    result = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    cells = _row(result.stdout, "100 B")
    # cell, served as, then req/s and p99 for origin, edge, nginx, two ratios and the spread
    assert cells[1] == "identity/identity/identity"
    rps = [float(cells[i].replace(",", "")) for i in (2, 4, 6)]
    p99 = [float(cells[i]) for i in (3, 5, 7)]
    assert all(x > 0 for x in rps + p99), cells
    assert float(cells[8].rstrip("\u00d7")) == pytest.approx(rps[1] / rps[0], rel=0.02, abs=0.01)
    assert float(cells[9].rstrip("\u00d7")) == pytest.approx(rps[1] / rps[2], rel=0.02, abs=0.01)
    written = output.read_text()
    assert written.startswith("# Benchmarks")
    assert "## Cached hits: origin, edge, nginx (" in written
    assert _row(written, "100 B") == cells


def test_the_ceiling_benchmark_prints_the_edge_beside_nginx_return_200(tmp_path: Path) -> None:
    """A smoke test of the script, not of speed: one short run per server."""
    _need_wrk_and_nginx()
    output = tmp_path / "benchmarks.md"
    output.write_text("# Benchmarks\n\nFigures.\n")
    command = [sys.executable, "-m", "loadtest.ceiling", "--duration", "1", "--runs", "1"]
    command += ["--connections", "8", "--output", str(output)]
    result = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    edge, nginx = (
        _row(result.stdout, "edge, a stored 100 B hit"),
        _row(result.stdout, "nginx `return 200` (100 B)"),
    )
    rps = [float(row[1].replace(",", "")) for row in (edge, nginx)]
    assert all(x > 0 for x in rps)
    assert all(float(row[3]) > 0 for row in (edge, nginx))
    ratio = re.search(r"edge / nginx `return 200`: \*\*([\d.]+)\u00d7\*\*", result.stdout)
    assert ratio is not None, result.stdout
    assert float(ratio.group(1)) == pytest.approx(rps[0] / rps[1], rel=0.02, abs=0.01)
    per_core = re.search(r"CPU per request, nginx / edge: \*\*([\d.]+)\u00d7\*\*", result.stdout)
    assert per_core is not None, result.stdout
    cpu = [float(row[3]) for row in (edge, nginx)]
    assert float(per_core.group(1)) == pytest.approx(cpu[1] / cpu[0], rel=0.05, abs=0.01)
    assert "## A 100 B hit against the per-core ceiling" in output.read_text()


def test_the_hits_benchmark_times_the_tail_and_an_auth_edge(tmp_path: Path) -> None:
    """The at-tail cell (nginx: the micro-cache) and a cell on an edge of its own (--auth jwt,
    nginx n/a), checked and timed briefly; --no-write leaves docs/benchmarks.md alone."""
    _need_wrk_and_nginx()
    docs = REPO / "docs" / "benchmarks.md"
    before = docs.read_bytes() if docs.exists() else None
    command = [sys.executable, "-m", "loadtest.hits", "--duration", "1", "--runs", "1"]
    command += ["--cells", "tail2KB", "jwt1", "--connections", "8", "--no-write"]
    result = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    tail = _row(result.stdout, "2 KB open stream at its tail (nginx: 1 s micro-cache)")
    assert tail[1] == "identity/identity/identity"
    assert all(float(tail[i].replace(",", "")) > 0 for i in (2, 4, 6)), tail
    jwt = _row(result.stdout, "100 B, --auth jwt, one token")
    assert jwt[1] == "identity/identity/n/a"
    assert jwt[6:8] == ["n/a", "n/a"], jwt
    assert jwt[9] == "n/a", jwt
    assert float(jwt[8].rstrip("\u00d7")) > 0
    assert "Issue 17 targets (reported, not asserted)" in result.stdout
    assert "jwt edge: servers" in result.stdout
    assert (docs.read_bytes() if docs.exists() else None) == before


def test_the_hits_benchmark_fails_clearly_on_an_edge_flag_it_does_not_know(
    tmp_path: Path,
) -> None:
    _need_wrk_and_nginx()
    command = [sys.executable, "-m", "loadtest.hits", "--edge-args", "--no-such-flag 3"]
    command += ["--no-write"]
    result = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert "the edge did not start with --edge-args '--no-such-flag 3'" in result.stderr
    assert "--no-such-flag" in result.stderr.split("\n", 1)[1]


def test_the_long_poll_benchmark_checks_every_waiter(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "loadtest.longpoll", "--waiters", "40", "--rounds", "1"]
    command += ["--output", str(tmp_path / "benchmarks.md")]
    result = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for target in ("origin", "edge"):
        cells = _row(result.stdout, target)
        assert cells[1:4] == ["40", "40/40", "40"], cells
        p50, p99, peak = (float(x) for x in cells[4:7])
        assert 0 < p50 <= p99 <= peak, cells
    assert "## Long-poll release (" in (tmp_path / "benchmarks.md").read_text()


def test_the_join_storm_benchmark_checks_every_viewer() -> None:
    """A smoke test of the script, not of speed: 50 viewers join each server, every one's bytes
    checked against the stream's."""
    command = [sys.executable, "-m", "loadtest.join", "--viewers", "50", "--no-write"]
    command += ["--follow", "1"]
    result = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=90, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for target in ("origin", "edge"):
        cells = _row(result.stdout, target + " | sse")
        assert cells[2:3] + cells[7:8] == ["50", "50/50"], cells
        ttfb_p50, ttfb_p99, live_p50, live_p99 = (float(x) for x in cells[3:7])
        assert 0 < ttfb_p50 <= ttfb_p99, cells
        assert 0 < live_p50 <= live_p99, cells
        assert int(cells[8]) > 0, cells  # origin reads
    assert "edge / origin, p99: TTFB" in result.stdout
    assert "| server | connect + catch-up | SSE open | close | a whole join |" in result.stdout


def test_the_long_poll_audience_benchmark_checks_every_viewer(tmp_path: Path) -> None:
    """A smoke test of the script, not of speed: 30 viewers follow a stream through the origin,
    a one-worker edge and nginx while 40 appends go in; every viewer's bytes checked."""
    _need_wrk_and_nginx()
    output = tmp_path / "benchmarks.md"
    command = [sys.executable, "-m", "loadtest.audience", "--viewers", "30", "--seconds", "2"]
    command += ["--targets", "origin", "edge-w1", "nginx", "--output", str(output)]
    result = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    gets = {}
    for target in ("origin", "edge-w1", "nginx"):
        cells = _row(result.stdout, f"30 | {target}")
        assert [cells[2], cells[12]] == ["30/30", "40/40"], cells
        p50, p99, peak = (float(x.replace(",", "")) for x in cells[3:6])
        assert 0 < p50 <= p99 <= peak, cells
        assert float(cells[6].replace(",", "")) > 0, cells  # answers/s
        gets[target] = int(cells[10].replace(",", ""))
    # Each viewer's re-polls reach the origin through nginx, not through the edge.
    assert gets["edge-w1"] < gets["nginx"], gets
    assert "## Long-poll audience (" in output.read_text()


def test_the_resume_cost_benchmark_checks_every_answer(tmp_path: Path) -> None:
    """A smoke test of the script, not of speed: 10-event answers on a resume route, each
    checked (every event once, in order, with an edge id, then the result), their costs
    counted; a resume on the relaying edge costs the origin nothing, one elsewhere a read."""
    output = tmp_path / "benchmarks.md"
    command = [sys.executable, "-m", "loadtest.resume_cost", "--events", "10", "--rounds", "1"]
    command += ["--output", str(output)]
    result = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=110, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    paced = _row(result.stdout, "10 events, 20 ms apart")
    assert paced[1] == "11", paced  # 10 events and the result
    # The creation, an append per upstream read (the result may share the last event's; events
    # read together, as on a busy machine, are appended together), the close.
    assert "1 PUT" in paced[2], paced
    posts = re.search(r"\b(\d+) POST\b", paced[2])
    assert posts is not None, paced
    assert 2 <= int(posts.group(1)) <= 12, paced
    for cell in paced[3:8]:
        assert int(cell.replace(",", "")) > 0, paced
    here = _row(result.stdout, "a resume on the same edge: the whole replayed")
    assert here[1:5] == ["10", "none", "0", "0"], here
    elsewhere = _row(result.stdout, "a resume on another edge: the whole replayed")
    assert "GET" in elsewhere[2], elsewhere
    assert "## What one resumable answer costs (issue 30; " in output.read_text()
