"""Start and stop the real processes the tests, the demo and the benchmarks run against.

Each process prints one JSON line on stdout when it listens (the origin launcher in
``deploy/origin/origin.mjs`` and ``edge serve`` both do), so ports are chosen by the kernel
(port 0) and read back: no free-port races. Everything a process prints after that goes to a log
file under ``logs_dir``. A process is stopped by its own pid: SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent
ORIGIN_DIR = REPO / "deploy" / "origin"
START_TIMEOUT_SECONDS = 30.0


class ProcessFailed(RuntimeError):
    pass


def _drain(stream: IO[bytes], sink: Path) -> None:
    with sink.open("ab") as out:
        for line in iter(stream.readline, b""):
            out.write(line)
            out.flush()


def _read_ready_line(
    proc: subprocess.Popen[bytes], log: Path, timeout: float
) -> tuple[dict[str, Any], threading.Thread]:
    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    buffered = b""
    try:
        while b"\n" not in buffered:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or proc.poll() is not None:
                break
            if selector.select(remaining):
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                buffered += chunk
    finally:
        selector.close()
    line, _, rest = buffered.partition(b"\n")
    try:
        ready: dict[str, Any] = json.loads(line)
    except ValueError:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise ProcessFailed(f"{proc.args!r} did not start: stdout={buffered!r}\n{tail}") from None
    with log.open("ab") as out:
        out.write(rest)
    drainer = threading.Thread(target=_drain, args=(proc.stdout, log), daemon=True)
    drainer.start()
    return ready, drainer


@dataclass
class Process:
    name: str
    proc: subprocess.Popen[bytes]
    ready: dict[str, Any]
    log: Path
    drainer: threading.Thread

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, signum)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait, then SIGKILL. Returns the exit code."""
        self.signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._close_pipe()
        return code

    def kill(self) -> int:
        self.signal(signal.SIGKILL)
        code = self.proc.wait()
        self._close_pipe()
        return code

    def _close_pipe(self) -> None:
        self.drainer.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def own_log(logs_dir: Path, name: str) -> Path:
    """A log file no other process has written: ``name.log``, or ``name-2.log`` and on when
    an earlier process of that name (another test's, a restart) has one, so what a caller
    reads in its process's log is that process's alone."""
    logs_dir.mkdir(parents=True, exist_ok=True)
    log = logs_dir / f"{name}.log"
    suffix = 2
    while log.exists():
        log = logs_dir / f"{name}-{suffix}.log"
        suffix += 1
    log.touch()
    return log


def _spawn(
    name: str, argv: list[str], logs_dir: Path, env: dict[str, str] | None = None
) -> Process:
    log = own_log(logs_dir, name)
    with log.open("ab") as stderr:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, env=env
        )
    ready, drainer = _read_ready_line(proc, log, START_TIMEOUT_SECONDS)
    return Process(name=name, proc=proc, ready=ready, log=log, drainer=drainer)


@dataclass
class Origin:
    """The reference origin (``@durable-streams/server``) with its request counter."""

    process: Process
    data_dir: Path | None = None

    @property
    def url(self) -> str:
        return str(self.process.ready["url"])

    @property
    def stats_url(self) -> str:
        return str(self.process.ready["stats"])

    def counts(self, path: str | None = None) -> dict[str, Any]:
        query = f"?path={urllib.request.quote(path)}" if path else ""
        with urllib.request.urlopen(f"{self.stats_url}/counts{query}", timeout=5) as response:
            counts: dict[str, Any] = json.load(response)
        return counts

    def reset_counts(self) -> None:
        request = urllib.request.Request(f"{self.stats_url}/reset", method="POST")
        with urllib.request.urlopen(request, timeout=5):
            pass

    def stop(self) -> int:
        return self.process.stop()


def start_origin(
    logs_dir: Path,
    *,
    long_poll_timeout_ms: int = 30_000,
    data_dir: Path | None = None,
    port: int = 0,
    name: str = "origin",
) -> Origin:
    if not (ORIGIN_DIR / "node_modules").is_dir():
        raise ProcessFailed(f"run `npm ci` in {ORIGIN_DIR} first (make bootstrap does)")
    node = shutil.which("node") or "node"
    argv = [
        node,
        str(ORIGIN_DIR / "origin.mjs"),
        "--port",
        str(port),
        "--long-poll-timeout-ms",
        str(long_poll_timeout_ms),
    ]
    if data_dir is not None:
        argv += ["--data-dir", str(data_dir)]
    return Origin(process=_spawn(name, argv, logs_dir), data_dir=data_dir)


@dataclass
class Edge:
    process: Process
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return str(self.process.ready["listen"])

    @property
    def admin_url(self) -> str:
        return str(self.process.ready["admin"])

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"{self.admin_url}/metrics", timeout=5) as response:
            return response.read().decode()

    def stop(self) -> int:
        return self.process.stop()


def start_mcp_upstream(
    logs_dir: Path, seen_file: Path, *, name: str = "mcp-upstream", stateful: bool = False
) -> Process:
    """The official MCP SDK's server with a slow tool (``devstack/mcp_upstream.py``),
    an agent backend for resume routes; ``ready["url"]`` is its endpoint. Every request it
    receives is recorded in ``seen_file``. ``stateful``: sessions in memory, not stateless."""
    script = REPO / "devstack" / "mcp_upstream.py"
    argv = [sys.executable, str(script), "0", str(seen_file)]
    return _spawn(name, [*argv, "--stateful"] if stateful else argv, logs_dir)


def workers_under_test() -> str:
    """How many worker processes launched edges run: ``EDGE_TEST_WORKERS`` (``make
    test-workers2`` sets 2), else 1, so tests see one process unless asked. Explicit, never the
    edge's own default (one per CPU), which would vary with the machine."""
    return os.environ.get("EDGE_TEST_WORKERS", "1")


def start_edge(
    origin_url: str,
    logs_dir: Path,
    *extra_args: str,
    name: str = "edge",
    listen: str = "127.0.0.1:0",
    admin_listen: str = "127.0.0.1:0",
    launcher: tuple[str, ...] = ("-m", "edge"),
    env: dict[str, str] | None = None,
) -> Edge:
    """``edge serve`` as a process; ``--workers`` is ``workers_under_test()`` unless ``extra_args``
    name it (a test that depends on one process's state pins ``--workers 1``). ``launcher``: what
    runs it (``loadtest.join --gc-pauses`` wraps it in ``loadtest.gcwatch``). ``env``: ``EDGE_*``
    variables it gets (none of the caller's own reach it), e.g. the CDN API tokens."""
    workers = [] if "--workers" in extra_args else ["--workers", workers_under_test()]
    argv = [
        sys.executable,
        *launcher,
        "serve",
        "--origin",
        origin_url,
        "--listen",
        listen,
        "--admin-listen",
        admin_listen,
        *workers,
        *extra_args,
    ]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_")}
    environment.update(env or {})
    environment["PYTHONPATH"] = str(REPO) + os.pathsep + environment.get("PYTHONPATH", "")
    return Edge(process=_spawn(name, argv, logs_dir, environment), args=list(extra_args))


def new_logs_dir(prefix: str = "edge-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


@dataclass
class Redis:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def free_port() -> int:
    """A loopback port free now (the one helper every launcher and test uses)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_listening(port: int) -> bool:
    """Does something accept connections on loopback ``port``?"""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(
    logs_dir: Path,
    *,
    port: int | None = None,
    name: str = "redis",
    extra_args: tuple[str, ...] = (),
    pick_port: Callable[[], int] = free_port,
    config_file: Path | None = None,
) -> Redis:
    """Debian's redis-server on loopback, persistence off. ``port`` reuses a known port (a
    restart); otherwise ``pick_port`` picks a free one, retrying if another process takes it
    first. ``extra_args`` are more ``--name value`` settings (cluster mode, replication);
    ``config_file`` is read first (a sentinel's, which it rewrites)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ProcessFailed("redis-server not found (make bootstrap installs it)")
    logs_dir.mkdir(parents=True, exist_ok=True)
    log = logs_dir / f"{name}.log"
    for _ in range(5):
        chosen = port or pick_port()
        argv = [
            binary,
            *([str(config_file)] if config_file is not None else []),
            "--port",
            str(chosen),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            # Where it writes files (a replica saves what its primary sends as dump.rdb): the
            # logs, never the directory it was started from (a checkout). extra_args may move it.
            "--dir",
            str(logs_dir),
            *extra_args,
        ]
        with log.open("ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            if _answers_ping(chosen):
                return Redis(proc=proc, port=chosen, log=log)
            time.sleep(0.05)
        proc.kill()
        proc.wait()
    raise ProcessFailed(f"redis-server did not start; see {log}")
