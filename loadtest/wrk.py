"""Run Debian's ``wrk`` once and read its report, for ``loadtest.hits``.

Rules this module owns:
* One run is ``wrk -t1 -cC -dDs --latency --timeout 10s [-H ...] [-s SCRIPT] URL [ARGS]`` on
  the load cores; its figures are requests/s and the p50/p99 of its latency distribution, in
  milliseconds. The timeout is 10 s, not wrk's 2 s: a request wrk gives up on is left out of
  its latency distribution, so a short timeout would flatter a slow server's p99.
* A run whose report shows non-2xx/3xx answers or socket errors says so (``errors``): the table
  flags it rather than pass off a fast stream of errors as speed.
* A report that cannot be read is an error, never a zero.
* A header whose value changes per request (``rotation_script``: distinct tokens round-robin)
  is set by a Lua script that builds every request once, in ``init``, and hands them out in
  turn: the per-request cost to wrk is one Lua call, not a format.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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


# args: the header's name and a file with one value a line. Every request is wrk's own (-H
# headers included) with that header set, built once per thread.
ROTATION_LUA = """\
local requests = {}
local index = 0

function init(args)
   local name, path = args[1], args[2]
   for value in io.lines(path) do
      local headers = {}
      for key, existing in pairs(wrk.headers) do headers[key] = existing end
      headers[name] = value
      requests[#requests + 1] = wrk.format(nil, nil, headers)
   end
   if #requests == 0 then error("no values in " .. path) end
end

function request()
   index = index % #requests + 1
   return requests[index]
end
"""


@dataclass(frozen=True, kw_only=True)
class Script:
    path: Path
    args: tuple[str, ...] = ()


def rotation_script(directory: Path, header: str, values: Sequence[str]) -> Script:
    """A script that sends ``header: value`` with each of ``values`` in turn, round-robin."""
    if not values or any("\n" in v or "\r" in v for v in values):
        raise ValueError("rotation values must be non-empty single lines")
    directory.mkdir(parents=True, exist_ok=True)
    lua = directory / "rotate-header.lua"
    lua.write_text(ROTATION_LUA)
    listed = directory / f"rotate-{header.lower()}.txt"
    listed.write_text("".join(f"{v}\n" for v in values))
    return Script(path=lua, args=(header, str(listed)))


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
    script: Script | None = None,
) -> WrkRun:
    binary = wrk_binary()
    if binary is None:
        raise WrkFailed("wrk not found (make bootstrap installs Debian's wrk)")
    argv = [binary, "-t1", f"-c{connections}", f"-d{max(1, round(duration_s))}s"]
    argv += ["--latency", "--timeout", "10s"]
    for name, value in headers.items():
        argv += ["-H", f"{name}: {value}"]
    if script is not None:
        argv += ["-s", str(script.path)]
    argv.append(url)
    if script is not None:
        argv += script.args  # the script's init(args) gets them after the URL
    with pinned(cores):
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=duration_s + 60, check=False
        )
    if done.returncode != 0:
        raise WrkFailed(f"{' '.join(argv)} exited {done.returncode}: {done.stderr}{done.stdout}")
    return parse(done.stdout)
