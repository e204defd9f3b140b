"""The stream listener's aiohttp site, whose client connections a ``ConnectionTracker`` bounds.

Rules this module owns:

* ``loop.create_server`` gets a factory wrapping ``runner.server`` (aiohttp's ``web.Server``
  protocol factory) in the connection protocol of ``edge.web.connection_protocol``.
* It relies on aiohttp's public API plus the attributes ``BaseSite`` leaves to its subclasses
  (``_runner``, ``_backlog``, ``_server``): ``BaseSite.stop`` closes ``_server`` and
  ``runner.addresses`` reads it (tests/integration/test_bounds.py pins them).
* The tracker's sweep runs while the site does: started after the server is listening, stopped
  (closing the connections aiohttp never saw) before ``BaseSite.stop``.
* With ``reuse_port`` (``edge.workers``), every worker binds the same port.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

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
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self._reuse_port = reuse_port  # edge.workers: every worker binds the same port
        self.tracker = tracker

    @property
    def name(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        # BaseSite.stop closes it and runner.addresses reads it (tests/integration/test_bounds.py
        # pins both).
        self._server = await loop.create_server(
            protocol_factory(self.tracker, server),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_port=self._reuse_port,
        )
        self.tracker.start()

    async def stop(self) -> None:
        await self.tracker.stop()
        await super().stop()
