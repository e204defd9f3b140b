"""The stream instances this replica knows, and their lifecycle (DESIGN.md "a stream's identity"),
as five small objects around the pure core (``edge.log.stream_log``, ``edge.log.intake``):

* ``Door`` (``door``): the one door for what the origin says (``take_in``, ``evidence``,
  ``record_live``);
* ``Forgetter`` (``forgetting``): forgetting a stream here, purging the shared tier, telling
  siblings and the CDN, and waiting until that is in effect;
* ``Generations`` (``generations``): agreeing with other replicas through the shared tier;
* ``Lifetimes`` (``lifetimes``): learning or asking an instance's lifetime;
* ``Writes`` (``writes``): what pass-through traffic (writes, DELETE, HEAD) tells.

Rules this module owns:

* ``build`` is the one place these objects are made and wired; each is handed only what it
  uses, and a caller takes the one it needs from ``Instances``.
* The one cycle, an answer that asks the origin for a lifetime whose answer is an answer
  (``Door`` → ``Lifetimes`` → ``Door.evidence``), is closed here, by ``Lifetimes``'s
  ``heard``, not by reaching back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edge.config import Settings
from edge.instances.door import Door
from edge.instances.forgetting import Forgetter
from edge.instances.generations import Generations
from edge.instances.lifetimes import Lifetimes
from edge.instances.tickets import Tickets
from edge.instances.writes import Writes
from edge.log.stream_log import LogKey, StreamInstance
from edge.metrics import Metrics
from edge.origin import OriginClient
from edge.store.local import LocalTier
from edge.store.shared import SharedTier


@dataclass(frozen=True, kw_only=True, slots=True)
class Instances:
    tickets: Tickets
    forgetter: Forgetter
    generations: Generations
    lifetimes: Lifetimes
    door: Door
    writes: Writes

    async def close(self) -> None:
        await self.lifetimes.close()


def build(
    settings: Settings,
    local: LocalTier,
    origin: OriginClient,
    metrics: Metrics,
    *,
    shared: SharedTier | None = None,
    clock: Callable[[], float] = time.time,
) -> Instances:
    tickets = Tickets()
    ticket = tickets.ticket
    forgetter = Forgetter(local, shared=shared, clock=clock)
    generations = Generations(local, forgetter, ticket, shared=shared, clock=clock)

    def heard(
        key: LogKey,
        instance: StreamInstance,
        status: int,
        headers: Sequence[tuple[str, str]],
        started: int,
    ) -> object:
        return door.evidence(key, status, headers, started=started, instance=instance)

    lifetimes = Lifetimes(settings, local, origin, metrics, forgetter, ticket, heard)
    door = Door(local, forgetter, generations, lifetimes, ticket, clock=clock)
    writes = Writes(settings, local, forgetter, door, lifetimes, ticket, clock=clock)
    return Instances(
        tickets=tickets,
        forgetter=forgetter,
        generations=generations,
        lifetimes=lifetimes,
        door=door,
        writes=writes,
    )
