"""A worker process's entry point: ``python -c 'from edge.workers.child import main; main()'``.

Rules this module owns:

* The supervisor writes one ``Bootstrap`` to the worker's stdin (edge.workers.bootstrap) and
  keeps the pipe open for the worker's lifetime.
* The worker's metrics stay in-process (``PROMETHEUS_MULTIPROC_DIR`` is never set: it would
  make every update a write to a file); the directory goes to ``edge.workers.mirror``.
* When the pipe closes, the supervisor is gone (killed, even with SIGKILL): the worker exits at
  once rather than keep serving a port nobody supervises, or keep a restarted edge's port busy.
* The worker reports its admin listener (``{"event": "reachable", "admin": ...}`` on stdout)
  before it takes any stream connection, and listens on the stream port only once the
  supervisor writes ``CLEARED`` on the pipe: the supervisor has recorded where it is reached,
  so every write a sibling relays from then on reaches it. Then it reports ``listening``.
* A worker is a single-process edge (``edge.server.serve``) joined to its fleet here: its
  admin listener refreshes the supervisor's metrics files (edge.workers.mirror) and its relayed
  writes and forgettings reach its siblings (edge.workers.siblings). ``edge.server`` imports
  nothing from ``edge.workers``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from functools import partial
from typing import TYPE_CHECKING, BinaryIO

from edge.workers.bootstrap import CLEARED, Bootstrap, read_bootstrap

if TYPE_CHECKING:
    from aiohttp import web

# The exit code of a worker whose supervisor disappeared (EX_SOFTWARE would suggest a bug).
ORPHANED = 75


def _watch_supervisor(stream: BinaryIO, cleared: threading.Event) -> None:
    while chunk := stream.read(4096):
        if CLEARED in chunk:
            cleared.set()
    os._exit(ORPHANED)


def main() -> None:
    # Unbuffered: nothing past the bootstrap is read ahead.
    stdin = open(0, "rb", buffering=0, closefd=False)  # noqa: SIM115 - lives as long as we do
    bootstrap = read_bootstrap(stdin)
    settings = bootstrap.settings
    logging.basicConfig(
        level=settings.log_level,
        format=f"%(asctime)s %(levelname)s worker-{bootstrap.index} %(name)s: %(message)s",
        stream=sys.stderr,
    )
    cleared = threading.Event()
    threading.Thread(
        target=_watch_supervisor, args=(stdin, cleared), name="supervisor-watch", daemon=True
    ).start()

    # The edge itself is imported only now, with the orphan watch running: a supervisor that
    # dies during the second it takes ends this worker at once.
    from edge.startup import StartupError

    try:
        run_worker(bootstrap, cleared)
    except StartupError as error:
        print(f"edge: error: worker {bootstrap.index}: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def run_worker(bootstrap: Bootstrap, cleared: threading.Event) -> None:
    """One worker of ``--workers N``; ``cleared``: see ``edge.server.AsWorker``."""
    from edge.server import AsWorker, serve
    from edge.startup import run_loop

    worker = AsWorker(cleared=cleared, join=partial(join_fleet, bootstrap))
    run_loop(serve(bootstrap.settings, worker=worker))


def join_fleet(
    bootstrap: Bootstrap, stream_app: web.Application, admin_app: web.Application
) -> None:
    """Wire a worker's two applications to its supervisor and siblings before they start."""
    from edge.web.keys import METRICS
    from edge.workers.mirror import add_refresh_route
    from edge.workers.siblings import share_observations

    add_refresh_route(admin_app, stream_app[METRICS], bootstrap.metrics_dir)
    token = bootstrap.settings.purge_token
    assert token is not None  # the supervisor's private token
    share_observations(
        stream_app,
        admin_app,
        supervisor=bootstrap.supervisor,
        token=token,
        index=bootstrap.index,
    )
