"""The public conformance suite, run through the edge, fails nothing the origin alone does not.

Both runs happen here, concurrently, against two fresh origins (long-poll timeout 3 s keeps the
suite near a minute): the origin-alone run is the baseline the edge is judged against, measured
in the same run so a new origin or suite version cannot silently move it. The set we measured by
hand is pinned in ``deploy/origin/conformance/origin-baseline-failures.txt`` for reference.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devstack.processes import ORIGIN_DIR, Edge, Origin, start_edge, start_origin

pytestmark = pytest.mark.conformance

LONG_POLL_MS = 3000
SUITE_TIMEOUT_SECONDS = 400


@dataclass(frozen=True)
class SuiteResult:
    passed: frozenset[str]
    failed: frozenset[str]
    skipped: frozenset[str]


def start_suite(base_url: str, report: Path, log: Path) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ,
        CONFORMANCE_BASE_URL=base_url,
        CONFORMANCE_LONG_POLL_TIMEOUT_MS=str(LONG_POLL_MS),
    )
    npx = shutil.which("npx") or "npx"
    with log.open("wb") as out:
        return subprocess.Popen(
            [npx, "vitest", "run", "--reporter=json", f"--outputFile={report}"],
            cwd=ORIGIN_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def read_report(report: Path, log: Path) -> SuiteResult:
    assert report.exists(), f"vitest wrote no report; its output:\n{log.read_text()[-3000:]}"
    data = json.loads(report.read_text())
    by_status: dict[str, set[str]] = {"passed": set(), "failed": set(), "skipped": set()}
    for file_result in data["testResults"]:
        for test in file_result["assertionResults"]:
            status = test["status"] if test["status"] in by_status else "skipped"
            by_status[status].add(test["fullName"])
    return SuiteResult(**{k: frozenset(v) for k, v in by_status.items()})


@pytest.fixture
def fresh_pair(logs_dir: Path) -> Iterator[tuple[Origin, Origin, Edge]]:
    alone = start_origin(logs_dir, long_poll_timeout_ms=LONG_POLL_MS, name="conformance-origin")
    behind = start_origin(logs_dir, long_poll_timeout_ms=LONG_POLL_MS, name="conformance-upstream")
    edge = start_edge(
        behind.url,
        logs_dir,
        "--long-poll-timeout",
        str(LONG_POLL_MS / 1000),
        name="conformance-edge",
    )
    yield alone, behind, edge
    edge.stop()
    behind.stop()
    alone.stop()


def test_conformance_through_the_edge_matches_the_origin_alone(
    fresh_pair: tuple[Origin, Origin, Edge], tmp_path: Path
) -> None:
    alone, _, edge = fresh_pair
    runs = {
        "origin": (alone.url, tmp_path / "origin.json", tmp_path / "origin.log"),
        "edge": (edge.url, tmp_path / "edge.json", tmp_path / "edge.log"),
    }
    procs = {name: start_suite(*run) for name, run in runs.items()}
    for proc in procs.values():
        proc.wait(timeout=SUITE_TIMEOUT_SECONDS)
    origin_result = read_report(*runs["origin"][1:])
    edge_result = read_report(*runs["edge"][1:])

    total = len(edge_result.passed | edge_result.failed | edge_result.skipped)
    print(
        f"\nconformance: origin alone {len(origin_result.passed)} passed, "
        f"{len(origin_result.failed)} failed; through edge {len(edge_result.passed)} passed, "
        f"{len(edge_result.failed)} failed, of {total}"
    )
    for name in sorted(edge_result.failed):
        print(f"  edge fails (origin too: {name in origin_result.failed}): {name}")
    assert len(edge_result.passed) > 300, "the suite did not really run"
    assert edge_result.passed | edge_result.failed == origin_result.passed | origin_result.failed
    assert edge_result.failed <= origin_result.failed, sorted(
        edge_result.failed - origin_result.failed
    )
    # The edge pairs every SSE data event with its control event, which the origin alone does
    # not (it may send several data events before one control).
    pairing = {
        name for name in edge_result.passed if "pairs every data event with a control" in name
    }
    assert len(pairing) == 2, pairing
