"""The stream listener's aiohttp site, whose client connections a ``ConnectionTracker`` bounds.

Rules this module owns:

* Its listening sockets are an ``edge.web.accept_loop.AcceptLoop``, which drains the backlog a
  readable pass at a time, given a factory wrapping ``runner.server`` (aiohttp's ``web.Server``
  protocol factory) in the connection protocol of ``edge.web.connection_protocol``, and the room
  the tracker's table has (its cap plus the heads read at the cap, less the connections whose
  descriptors are held).
* It relies on aiohttp's public API plus the attributes ``BaseSite`` leaves to its subclasses
  (``_runner``, ``_backlog``, ``_server``): ``BaseSite.stop`` closes ``_server`` and
  ``runner.addresses`` reads its ``sockets`` (tests/integration/test_bounds.py pins them).
* The tracker's sweep runs while the site does: started after the server is listening, stopped
  (closing the connections aiohttp never saw) before ``BaseSite.stop``.
* With ``reuse_port`` (``edge.workers``), every worker binds the same port.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from edge.web.accept_loop import AcceptLoop
from edge.web.connection_protocol import protocol_factory
from edge.web.connection_tracker import ConnectionTracker


class BoundedSite(web.BaseSite):
    """A TCP site whose connections a ``ConnectionTracker`` bounds."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        tracker: ConnectionTracker,
        *,
        backlog: int,
        reuse_port: bool = False,
        accepted: Callable[[int], None] = lambda _: None,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self._reuse_port = reuse_port  # edge.workers: every worker binds the same port
        self.tracker = tracker
        self._accepted = accepted  # how many each readable pass took (edge_accepts_per_pass)

    @property
    def name(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        # BaseSite.stop closes it and runner.addresses reads it (tests/integration/test_bounds.py
        # pins both).
        self._server = await AcceptLoop.bind(
            self._host,
            self._port,
            protocol_factory(self.tracker, server),
            backlog=self._backlog,
            reuse_port=self._reuse_port,
            room=self._room,
            accepted=self._accepted,
        )
        self.tracker.start()

    def _room(self) -> int:
        limits = self.tracker.table.limits
        # What is held, not what the table counts: a connection the table let go of (expired,
        # evicted) keeps its descriptor until its close completes, a pass or two later.
        return limits.max_connections + limits.at_cap - self.tracker.held

    async def stop(self) -> None:
        # Nothing new first, then what is in progress ends (``ConnectionTracker.stop``).
        await super().stop()
        await self.tracker.stop()
