"""Single-flight: identical work in flight is done once, and every caller gets its result.

The shared work runs as its own task, shielded from its callers: a client that goes away while
waiting cancels only its own wait, never the fetch the other waiters depend on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    def __init__(self) -> None:
        self._flights: dict[K, asyncio.Task[V]] = {}

    def in_flight(self, key: K) -> bool:
        return key in self._flights

    async def run(self, key: K, work: Callable[[], Awaitable[V]]) -> tuple[V, bool]:
        """The result of ``work`` for ``key``, and whether it was shared with an earlier caller."""
        task = self._flights.get(key)
        collapsed = task is not None
        if task is None:
            task = asyncio.ensure_future(work())
            self._flights[key] = task
            task.add_done_callback(lambda done: self._finish(key, done))
        return await asyncio.shield(task), collapsed

    def _finish(self, key: K, task: asyncio.Task[V]) -> None:
        if self._flights.get(key) is task:
            del self._flights[key]
        if not task.cancelled():
            task.exception()  # retrieved here, so an error nobody awaited is not logged as lost
