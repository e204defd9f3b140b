"""Long-polls waiting at a stream's tail, grouped so that one answer is built for all of them.

Rules this module owns:

* Waiters are grouped by what their answer is made of: the stream (its log key), the upstream
  tail they wait on, and the offset they read from. Everything in a long-poll answer but its
  ``Stream-Cursor`` follows from those and the log, so a group is answered once.
* Inside a group, waiters differ only by their cursor's ``answer_class`` (edge.protocol.cursor):
  one cursor is computed per class, at release, against the interval of that moment.
* A waiter's timeout is its own: ``due(now)`` gives only waiters whose own deadline has passed,
  never one that arrived later. The adapter looks at deadlines a little after they pass, so that
  waiters arriving together time out together: a timeout is answered late by at most that, never
  early.
* Waiters keep their arrival order inside a group (they are answered in it).

Pure: plain values, the clock an argument, no event loop. ``edge.live.polls`` is its adapter.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from edge.protocol.cursor import answer_class

T = TypeVar("T")


@dataclass(eq=False, kw_only=True, slots=True)
class Waiter(Generic[T]):
    key: Hashable  # the stream's log key
    source: Hashable  # what it waits on (the upstream tail): one answer per source and offset
    offset: str
    cursor: int | None  # edge.protocol.cursor.cursor_class of the client's cursor
    deadline: float
    ticket: T  # what the adapter needs to answer it
    joined: bool = field(default=False, init=False)

    @property
    def group(self) -> tuple[Hashable, str]:
        return (self.source, self.offset)


class Board(Generic[T]):
    def __init__(self) -> None:
        # key -> group -> waiters in arrival order (a dict is an ordered set)
        self._keys: dict[Hashable, dict[tuple[Hashable, str], dict[Waiter[T], None]]] = {}
        self._deadlines: list[tuple[float, int, Waiter[T]]] = []
        self._order = itertools.count()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def streams(self) -> list[Hashable]:
        return list(self._keys)

    def join(self, waiter: Waiter[T]) -> None:
        if waiter.joined:
            return
        groups = self._keys.setdefault(waiter.key, {})
        groups.setdefault(waiter.group, {})[waiter] = None
        heapq.heappush(self._deadlines, (waiter.deadline, next(self._order), waiter))
        waiter.joined = True
        self._count += 1

    def leave(self, waiter: Waiter[T]) -> bool:
        """Take ``waiter`` off the board; False if it was not on it."""
        if not waiter.joined:
            return False
        waiter.joined = False
        self._count -= 1
        groups = self._keys[waiter.key]
        members = groups[waiter.group]
        del members[waiter]
        if not members:
            del groups[waiter.group]
            if not groups:
                del self._keys[waiter.key]
        # Its deadline entry stays in the heap and is skipped when reached (it is not joined).
        if len(self._deadlines) > 2 * self._count + 64:
            self._deadlines = [entry for entry in self._deadlines if entry[2].joined]
            heapq.heapify(self._deadlines)
        return True

    def groups(self, key: Hashable) -> list[list[Waiter[T]]]:
        """Every group waiting on ``key``, each in arrival order (a snapshot: leaving is safe)."""
        return [list(members) for members in self._keys.get(key, {}).values()]

    def next_deadline(self) -> float | None:
        while self._deadlines and not self._deadlines[0][2].joined:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    def due(self, now: float) -> list[list[Waiter[T]]]:
        """Waiters whose own deadline is at or before ``now``, by group, still on the board."""
        found: dict[tuple[Hashable, Hashable, str], list[Waiter[T]]] = {}
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, waiter = heapq.heappop(self._deadlines)
            if waiter.joined:
                found.setdefault((waiter.key, *waiter.group), []).append(waiter)
        return list(found.values())


def by_answer_class(waiters: list[Waiter[T]], *, current: int) -> dict[int | None, list[Waiter[T]]]:
    """Waiters whose cursors get an answer by the same rule, at interval ``current``."""
    classes: dict[int | None, list[Waiter[T]]] = {}
    for waiter in waiters:
        classes.setdefault(answer_class(waiter.cursor, current=current), []).append(waiter)
    return classes
