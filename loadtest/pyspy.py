"""Profile a running edge with py-spy while wrk loads it, for ``loadtest.hits --profile``, or
until told to stop, for ``loadtest.join --profile`` (``Recorder``).

Rules this module owns:
* ``py-spy record --format raw`` (folded stacks: ``frame;frame;... count``), sampling the edge
  and its worker processes (``--subprocesses``), idle threads left out, so shares are of the
  time the edge was busy.
* A frame is named by function and file, line numbers dropped, so one function is one row.
  "self" counts samples where a frame is the innermost; "total" where it is anywhere on the
  stack (once per sample, however deep the recursion), leaving out the frames under every
  sample (the interpreter's entry, the event loop's run): they say nothing.
* "Where" sums self samples by package (``edge/web``, ``aiohttp``, ``prometheus_client``...):
  the shape of the cost at a glance. Time in C (uvloop's socket writes, the parser) shows as
  the Python frame that called it.
"""

from __future__ import annotations

import math
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from loadtest.benchkit import pinned

SAMPLE_RATE_HZ = 100


class ProfileFailed(RuntimeError):
    pass


@dataclass(frozen=True, kw_only=True)
class Frames:
    samples: int
    self_: list[tuple[str, int]]
    total: list[tuple[str, int]]
    where: list[tuple[str, int]]


def py_spy_binary() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def start(pid: int, seconds: int, output: Path, cores: frozenset[int]) -> subprocess.Popen[bytes]:
    binary = py_spy_binary()
    if binary is None:
        raise ProfileFailed("py-spy not found (it is a dev dependency: make bootstrap)")
    argv = [binary, "record", "--pid", str(pid), "--duration", str(seconds)]
    argv += ["--rate", str(SAMPLE_RATE_HZ), "--format", "raw", "--output", str(output)]
    argv += ["--subprocesses"]
    output.parent.mkdir(parents=True, exist_ok=True)
    with pinned(cores):
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@dataclass
class Recorder:
    """py-spy on a process for as long as the caller needs (``stop``), for a window whose
    length is not known in advance (``loadtest.join``: until every viewer is live)."""

    proc: subprocess.Popen[bytes]
    output: Path

    @classmethod
    def start(cls, pid: int, output: Path, seconds: float, cores: frozenset[int]) -> Recorder:
        """Recording ``pid`` for ``seconds`` at most."""
        return cls(start(pid, math.ceil(seconds), output, cores), output)

    def stop(self) -> Path:
        self.proc.send_signal(signal.SIGINT)  # py-spy writes what it has and exits
        self.proc.communicate(timeout=120)
        if not self.output.exists():
            raise ProfileFailed(f"py-spy exited {self.proc.returncode} without output")
        return self.output

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def finish(proc: subprocess.Popen[bytes], output: Path) -> None:
    out, _ = proc.communicate(timeout=120)
    if proc.returncode != 0 or not output.exists():
        raise ProfileFailed(f"py-spy exited {proc.returncode}: {out.decode(errors='replace')}")


def _name(frame: str) -> str:
    """``handle (edge/web/app.py:120)`` → ``handle (edge/web/app.py)``."""
    head, sep, where = frame.rpartition(" (")
    if not sep:
        return frame
    return f"{head} ({where.rsplit(':', 1)[0].rstrip(')')})"


def _package(name: str) -> str:
    """``handle (edge/web/app.py)`` → ``edge/web``; ``x (aiohttp/web.py)`` → ``aiohttp``."""
    where = name.rpartition(" (")[2].rstrip(")")
    parts = where.split("/")
    if parts[0] == "edge" and len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0] if len(parts) > 1 else where


def top_frames(raw: str, limit: int = 15) -> Frames:
    where: Counter[str] = Counter()
    self_counts: Counter[str] = Counter()
    total_counts: Counter[str] = Counter()
    samples = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_name(f) for f in stack.split(";") if f and not f.startswith("process ")]
        if not frames:
            continue
        samples += count
        self_counts[frames[-1]] += count
        for name in set(frames):
            total_counts[name] += count
    for name, count in self_counts.items():
        where[_package(name)] += count
    telling = Counter({k: v for k, v in total_counts.items() if v < samples})
    return Frames(
        samples=samples,
        self_=self_counts.most_common(limit),
        total=telling.most_common(limit),
        where=where.most_common(),
    )


def table(frames: Frames) -> str:
    share = 100 / max(frames.samples, 1)
    summary = ", ".join(
        f"{name} {count * share:.0f}%" for name, count in frames.where if count * share >= 0.5
    )
    lines = [
        f"Self time by package: {summary}.",
        "",
        "| self % | function (file) | | total % | function (file) |",
        "|---:|---|---|---:|---|",
    ]
    for index in range(max(len(frames.self_), len(frames.total))):
        left = frames.self_[index] if index < len(frames.self_) else ("", 0)
        right = frames.total[index] if index < len(frames.total) else ("", 0)
        lines.append(
            f"| {left[1] * share:.1f} | `{left[0]}` | | {right[1] * share:.1f} | `{right[0]}` |"
        )
    return "\n".join(lines)
