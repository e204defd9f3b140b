"""Single-flight: identical work in flight is done once, and every caller gets its result.

Rules this module owns:

* The shared work runs as its own task, shielded from its callers: a client that goes away while
  waiting cancels only its own wait, never the fetch the other waiters depend on.
* With ``join``, a caller that finds another's work in flight waits for it at most its bound; past
  it the caller is told so (``Overdue``) and answers on its own, while the work goes on for those
  still waiting. Bounding the work itself is the work's job (the caller that started it waits
  for its end: ``Led``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Led(Generic[V]):
    """This caller started the work, and waited for its end."""

    value: V


@dataclass(frozen=True, slots=True)
class Joined(Generic[V]):
    """Another caller's work, which ended within this caller's bound."""

    value: V


@dataclass(frozen=True, slots=True)
class Overdue:
    """Another caller's work outlived this caller's bound; it goes on without this caller."""

    waited_seconds: float


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
            task = self._start(key, work)
        return await asyncio.shield(task), collapsed

    async def join(
        self, key: K, work: Callable[[], Awaitable[V]], *, wait_seconds: float
    ) -> Led[V] | Joined[V] | Overdue:
        """``work`` for ``key``, started here (``Led``: waited for to its end) or found in
        flight (``Joined`` if it ends within ``wait_seconds``, else ``Overdue``)."""
        task = self._flights.get(key)
        if task is None:
            return Led(await asyncio.shield(self._start(key, work)))
        # asyncio.wait neither cancels the task when the bound passes nor when this caller is
        # cancelled: the work stays whole for the callers still waiting on it.
        done, _ = await asyncio.wait({task}, timeout=wait_seconds)
        if not done:
            return Overdue(waited_seconds=wait_seconds)
        return Joined(task.result())

    def _start(self, key: K, work: Callable[[], Awaitable[V]]) -> asyncio.Task[V]:
        task = asyncio.ensure_future(work())
        self._flights[key] = task
        task.add_done_callback(lambda done: self._finish(key, done))
        return task

    def _finish(self, key: K, task: asyncio.Task[V]) -> None:
        if self._flights.get(key) is task:
            del self._flights[key]
        if not task.cancelled():
            task.exception()  # retrieved here, so an error nobody awaited is not logged as lost
