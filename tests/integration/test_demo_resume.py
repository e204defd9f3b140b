"""``make demo ARGS=--resume`` runs end to end: an MCP tool call through HAProxy in front of two
edges survives the SIGKILL of the replica serving it, and the demo says so, or says FAILED."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devstack.demo", "--resume", *args],
        cwd=REPO, capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip


def test_the_resume_demo_survives_a_replica_kill() -> None:
    """Fails if the demo's client misses or repeats a progress notification or the result, if
    a resume is served by the replica it should not be (the drained one, the killed one), if
    the tool runs twice or a Last-Event-ID reaches the SDK server (the demo's own checks, each
    printed), or if the story is not told in its order."""
    run = demo("--steps", "10", "--delay", "0.5")
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    assert "RESULT        ok" in out
    assert "FAIL " not in out
    took = re.search(r"(edge-\d) took the call", out)
    killed = re.search(r"(edge-\d) \(relaying the answer\) SIGKILLed mid-call", out)
    resumes = re.findall(r"served by (edge-\d)", out)
    assert took is not None, out
    assert killed is not None, out
    other = "edge-2" if took.group(1) == "edge-1" else "edge-1"
    # The first resume on the other replica, the second (after the kill) on the survivor.
    assert resumes == [other, took.group(1)], out
    assert killed.group(1) == other
    assert "every progress notification once, in order (10 of 10)" in out
    assert "'counted 10 for demo'" in out
    steps = iter(line for line in out.splitlines() if line.startswith("["))
    for step in ("took the call", "drops", "drained", "resumes", "served by", "SIGKILLed",
                 "marks", "resumes", "served by"):  # fmt: skip
        assert any(step in line for line in steps), f"{step!r} not in its place: {out}"


def test_the_resume_demo_fails_loudly_when_its_story_breaks_off() -> None:
    """The story bounded by --deadline: cut short, the demo says RESULT FAILED and exits 1.
    Fails if a demo that did not finish could still report ok or exit 0."""
    run = demo("--steps", "8", "--delay", "0.6", "--deadline", "0.5")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "the demo broke off: TimeoutError" in run.stdout
    assert run.stdout.rstrip().endswith("RESULT        FAILED")
