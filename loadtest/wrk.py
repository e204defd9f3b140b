"""Run Debian's ``wrk`` once and read its report, for ``loadtest.hits``.

Rules this module owns:
* One run is ``wrk -t1 -cC -dDs --latency --timeout 10s [-H ...] URL`` on the load cores; its
  figures are requests/s and the p50/p99 of its latency distribution, in milliseconds. The
  timeout is 10 s, not wrk's 2 s: a request wrk gives up on is left out of its latency
  distribution, so a short timeout would flatter a slow server's p99.
* A run whose report shows non-2xx/3xx answers or socket errors says so (``errors``): the table
  flags it rather than pass off a fast stream of errors as speed.
* A report that cannot be read is an error, never a zero.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from loadtest.benchkit import pinned

_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}
_LATENCY = re.compile(r"^\s*(50|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s|m)\s*$", re.M)
_RPS = re.compile(r"^Requests/sec:\s+([\d.]+)", re.M)
_REQUESTS = re.compile(r"^\s*(\d+) requests in", re.M)
_NON_2XX = re.compile(r"Non-2xx or 3xx responses:\s+(\d+)")
_SOCKET = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")


class WrkFailed(RuntimeError):
    pass


@dataclass(frozen=True, kw_only=True)
class WrkRun:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int  # non-2xx/3xx answers plus socket errors


def wrk_binary() -> str | None:
    return shutil.which("wrk")


def parse(report: str) -> WrkRun:
    rps = _RPS.search(report)
    requests = _REQUESTS.search(report)
    latencies = {
        m.group(1): float(m.group(2)) * _UNITS_MS[m.group(3)] for m in _LATENCY.finditer(report)
    }
    if rps is None or requests is None or set(latencies) != {"50", "99"}:
        raise WrkFailed(f"unreadable wrk report:\n{report}")
    errors = sum(int(n) for n in _NON_2XX.findall(report))
    for match in _SOCKET.finditer(report):
        errors += sum(int(n) for n in match.groups())
    return WrkRun(
        rps=float(rps.group(1)),
        p50_ms=latencies["50"],
        p99_ms=latencies["99"],
        requests=int(requests.group(1)),
        errors=errors,
    )


def run(
    url: str,
    *,
    headers: dict[str, str],
    connections: int,
    duration_s: float,
    cores: frozenset[int],
) -> WrkRun:
    binary = wrk_binary()
    if binary is None:
        raise WrkFailed("wrk not found (make bootstrap installs Debian's wrk)")
    argv = [binary, "-t1", f"-c{connections}", f"-d{max(1, round(duration_s))}s"]
    argv += ["--latency", "--timeout", "10s"]
    for name, value in headers.items():
        argv += ["-H", f"{name}: {value}"]
    argv.append(url)
    with pinned(cores):
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=duration_s + 60, check=False
        )
    if done.returncode != 0:
        raise WrkFailed(f"{' '.join(argv)} exited {done.returncode}: {done.stderr}{done.stdout}")
    return parse(done.stdout)
