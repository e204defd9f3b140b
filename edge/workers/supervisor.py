"""The supervisor of ``--workers N``: one stream port, N worker processes, one admin listener.

Rules this module owns:

* The port. The supervisor resolves ``--listen`` and holds a *bound, never listening*
  ``SO_REUSEPORT`` socket on it for its whole life: with port 0 that is how the real port is
  chosen, and it keeps the port this edge's while workers come and go (another user's process,
  or one without ``SO_REUSEPORT``, cannot take it; the kernel gives connections only to
  listening sockets, so the placeholder receives none). Each worker binds and listens on its own
  ``SO_REUSEPORT`` socket once it is ready to accept, and the kernel spreads connections over
  them by a hash of the 4-tuple. A worker's socket dies with it, so a dead worker's share goes to
  the others at once, and a starting worker gets connections only once it accepts. (Handing
  workers listening sockets made here would leave a dead worker's socket open in the
  supervisor, collecting connections nobody accepts until the restart.) Before reserving, one
  plain bind checks that nobody listens on the port: ``SO_REUSEPORT`` alone would silently share
  it with another edge of the same user.
* A worker takes stream connections only once its siblings can reach it, at the first start as
  at a restart: it reports its admin listener (``reachable``), the supervisor records it (from
  then on every write or forgetting a sibling relays is replayed on it: edge.workers.siblings)
  and only then writes ``CLEARED`` on its pipe, and the worker starts listening on the stream
  port (``listening``). A worker whose admin URL is not recorded has served nothing and holds
  nothing.
* Workers start together; the edge is listening (the one ``{"event": "listening"}`` line on
  stdout, with the real port and the supervisor's admin URL) only when every worker is. A worker
  that fails to start then is a start-up failure of the edge (exit 2). Its start-up summary's
  limits line says what the edge holds (``edge.web.descriptors.holds_line``), for every worker.
* A worker that exits while the edge is not stopping is restarted: at once the first time, then
  after doubling delays up to ``MAX_RESTART_DELAY_SECONDS``, so a crash loop does not spin; a
  worker that stayed up ``STABLE_SECONDS`` starts the count again. Its live gauges leave the
  multiprocess files (``mark_process_dead``); its counters stay, so totals never go back.
* SIGTERM or SIGINT drains: ``/readyz`` turns 503 at once, every worker gets SIGTERM (each drains
  as a single edge does), and the supervisor waits ``--drain-seconds`` plus
  ``DRAIN_SLACK_SECONDS``; a worker still running then is killed. Exit 0 only when every worker
  exited 0 in time.
* The multiprocess directory is private to this edge (created here before any worker starts,
  removed on exit), so two edges on one machine never mix their metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import replace

from prometheus_client import multiprocess

from edge import __version__
from edge.config import Address, Settings, per_worker
from edge.startup import StartupError, check_redis, raise_open_file_limit, why
from edge.summary import limits_summary, startup_lines
from edge.web.descriptors import budget_for, holds_line
from edge.workers.admin import Fleet, Worker, start_admin, start_internal
from edge.workers.bootstrap import CLEARED, Bootstrap, encode

logger = logging.getLogger(__name__)

CHILD = "from edge.workers.child import main; main()"
START_TIMEOUT_SECONDS = 30.0
DRAIN_SLACK_SECONDS = 5.0
FIRST_RESTART_DELAY_SECONDS = 0.1
SECOND_RESTART_DELAY_SECONDS = 0.5
MAX_RESTART_DELAY_SECONDS = 30.0
STABLE_SECONDS = 30.0


class WorkerFailed(Exception):
    """A worker exited (or said nothing) before it listened."""


def reserve_port(address: Address) -> tuple[list[socket.socket], int]:
    """Placeholders holding ``address`` (every address the host resolves to) and the port."""
    try:
        infos = socket.getaddrinfo(
            address.host,
            address.port,
            type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE,
        )
        held: list[socket.socket] = []
        port = address.port
        try:
            for family, kind, proto, _, sockaddr in dict.fromkeys(infos):
                target = (sockaddr[0], port, *sockaddr[2:])
                with socket.socket(family, kind, proto) as probe:
                    # SO_REUSEADDR as asyncio's listeners have it: TIME_WAIT is not a conflict.
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    _v6only(probe, family)
                    probe.bind(target)
                    port = probe.getsockname()[1]
                placeholder = socket.socket(family, kind, proto)
                held.append(placeholder)
                placeholder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                placeholder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                _v6only(placeholder, family)
                placeholder.bind((sockaddr[0], port, *sockaddr[2:]))
        except BaseException:
            for sock in held:
                sock.close()
            raise
    except OSError as error:
        raise StartupError(f"--listen {address}: {why(error, address)}") from None
    return held, port


def _v6only(sock: socket.socket, family: int) -> None:
    if family == socket.AF_INET6:  # as asyncio's create_server: one socket per family
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)


def restart_delay(failures: int) -> float:
    """Seconds before restarting a worker after ``failures`` exits in a row (1 = the first)."""
    if failures <= 1:
        return FIRST_RESTART_DELAY_SECONDS
    return min(MAX_RESTART_DELAY_SECONDS, SECOND_RESTART_DELAY_SECONDS * 2.0 ** (failures - 2))


class Supervisor:
    def __init__(self, settings: Settings, port: int, metrics_dir: str) -> None:
        self.settings = settings
        self.metrics_dir = metrics_dir
        self.internal = ""  # the private listener workers reach (start_internal)
        token = secrets.token_urlsafe(32)
        # Each worker: its share of the bounds, the reserved port, a private loopback admin
        # listener whose /purge needs a token only this supervisor knows.
        self.worker_settings = replace(
            per_worker(settings),
            listen=Address(host=settings.listen.host, port=port),
            admin_listen=Address(host="127.0.0.1", port=0),
            purge_token=token,
            workers=1,
        )
        self.workers = [Worker(index=i) for i in range(settings.workers)]
        self.fleet = Fleet(
            settings=settings, workers=self.workers, token=token, metrics_dir=metrics_dir
        )
        self.stopping = False
        self._wake = asyncio.Event()
        self._watchers: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        results = await asyncio.gather(
            *(self._spawn(worker) for worker in self.workers), return_exceptions=True
        )
        failed = [(w, r) for w, r in zip(self.workers, results, strict=True) if r is not None]
        if failed:
            await self._kill_all()
            worker, error = failed[0]
            raise StartupError(f"worker {worker.index} did not start: {error}")
        self._watchers = [asyncio.ensure_future(self._watch(worker)) for worker in self.workers]

    async def _spawn(self, worker: Worker) -> None:
        """Start ``worker`` and return once it listens; WorkerFailed if it does not."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        worker.proc, worker.admin, worker.started_at = proc, None, time.monotonic()
        assert proc.stdin is not None
        assert proc.stdout is not None
        bootstrap = Bootstrap(
            index=worker.index,
            settings=self.worker_settings,
            metrics_dir=self.metrics_dir,
            supervisor=self.internal,
        )
        # The pipe stays open: the worker exits when it closes (this process is gone).
        proc.stdin.write(encode(bootstrap))
        try:
            await proc.stdin.drain()
            reachable = await _report(proc.stdout, "reachable")
            # Recorded before the worker may listen: a write relayed from now on reaches it.
            worker.admin = str(reachable["admin"])
            proc.stdin.write(CLEARED)
            await proc.stdin.drain()
            await _report(proc.stdout, "listening")
        except (TimeoutError, ValueError, KeyError, TypeError, ConnectionError) as error:
            worker.admin = None
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            code = await proc.wait()
            multiprocess.mark_process_dead(proc.pid, self.metrics_dir)  # type: ignore[no-untyped-call]
            reason = "no report line in time" if isinstance(error, TimeoutError) else None
            raise WorkerFailed(reason or f"exited with code {code} (see its error above)") from None
        worker.listening.set()
        logger.debug("worker %d (pid %d) listening, admin %s", worker.index, proc.pid, worker.admin)
        # Nothing else is expected on a worker's stdout; whatever comes goes to stderr.
        worker.forwarder = asyncio.ensure_future(_forward(proc.stdout, worker.index))

    async def _watch(self, worker: Worker) -> None:
        while True:
            assert worker.proc is not None
            code: int | None = await worker.proc.wait()
            worker.listening.clear()
            worker.admin = None
            multiprocess.mark_process_dead(worker.proc.pid, self.metrics_dir)  # type: ignore[no-untyped-call]
            if self.stopping:
                return
            lived = time.monotonic() - worker.started_at
            worker.failures = 1 if lived >= STABLE_SECONDS else worker.failures + 1
            while True:
                delay = restart_delay(worker.failures)
                logger.warning(
                    "worker %d (pid %d) exited with code %s after %.1f s; restarting in %.1f s",
                    worker.index,
                    worker.proc.pid,
                    code,
                    lived,
                    delay,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
                if self._wake.is_set():  # drain() began while this one waited
                    return
                self.fleet.restarts.inc()
                try:
                    await self._spawn(worker)
                    break
                except WorkerFailed as error:
                    logger.warning("worker %d did not start: %s", worker.index, error)
                    worker.failures += 1
                    lived, code = 0.0, worker.proc.returncode

    async def drain(self) -> bool:
        """SIGTERM every worker; True when all exited 0 within the drain time."""
        self.stopping = True
        self._wake.set()
        self.fleet.draining.set()
        running = [w.proc for w in self.workers if w.proc is not None and w.running]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        deadline = self.settings.drain_seconds + DRAIN_SLACK_SECONDS
        waits = [asyncio.ensure_future(proc.wait()) for proc in running]
        clean = True
        if waits:
            _, pending = await asyncio.wait(waits, timeout=deadline)
            if pending:
                clean = False
                logger.error(
                    "%d workers still running after %.0f s: killed", len(pending), deadline
                )
                await self._kill_all()
            clean = clean and all(proc.returncode == 0 for proc in running)
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        await self._kill_all()  # one being restarted just now got no SIGTERM
        return clean

    async def _kill_all(self) -> None:
        for worker in self.workers:
            if worker.proc is not None and worker.running:
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.kill()
                await worker.proc.wait()


def parse_report(line: bytes, event: str) -> dict[str, object]:
    """A worker's report line on its stdout, which must be ``event``; ValueError if not."""
    report = json.loads(line)
    if not isinstance(report, dict) or report.get("event") != event:
        raise ValueError(f"expected a {event!r} report from the worker")
    if not isinstance(report.get("admin"), str):
        raise ValueError("a worker's report names its admin listener")
    return report


async def _report(stdout: asyncio.StreamReader, event: str) -> dict[str, object]:
    line = await asyncio.wait_for(stdout.readline(), START_TIMEOUT_SECONDS)
    return parse_report(line, event)


async def _forward(stdout: asyncio.StreamReader, index: int) -> None:
    while line := await stdout.readline():
        print(f"worker-{index} stdout: {line.decode(errors='replace').rstrip()}", file=sys.stderr)


async def supervise(settings: Settings) -> int:
    placeholders, port = reserve_port(settings.listen)
    metrics_dir = tempfile.mkdtemp(prefix="edge-metrics-")
    try:
        supervisor = Supervisor(settings, port, metrics_dir)
        admin_runner, admin_url = await start_admin(supervisor.fleet)
        internal_runner, supervisor.internal = await start_internal(supervisor.fleet)
        try:
            redis_target = settings.redis_target
            if redis_target is not None:
                await check_redis(redis_target)  # once for the edge, not once per worker
            await supervisor.start()
            host = settings.listen.host
            shown = f"[{host}]" if ":" in host else host
            ready = {
                "event": "listening",
                "listen": f"http://{shown}:{port}",
                "admin": admin_url,
                "origin": settings.origin,
                "workers": settings.workers,
            }
            # Stop handlers before the line that says the edge is up (a launcher may signal
            # the moment it reads it).
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
            print(json.dumps(ready), flush=True)
            # Workers inherit this process's limit (raised to the hard one) and split it alike.
            each = budget_for(supervisor.worker_settings, raise_open_file_limit())
            holds = holds_line(each, workers=settings.workers)
            lines = startup_lines(
                settings,
                listen=str(ready["listen"]),
                admin=admin_url,
                version=__version__,
                limits=limits_summary(holds, settings),
            )
            logger.info("%s", "\n".join(lines))
            await stop.wait()
            logger.info("stopping: draining %d workers", settings.workers)
            clean = await supervisor.drain()
        finally:
            await internal_runner.cleanup()
            await admin_runner.cleanup()
        return 0 if clean else 1
    finally:
        for sock in placeholders:
            sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
