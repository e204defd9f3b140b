"""The stream instances this replica knows, and their lifecycle (DESIGN.md "a stream's identity"),
as five small objects around the pure core (``edge.log.stream_log``, ``edge.log.intake``):

* ``Door`` (``door``): the one door for what the origin says (``take_in``, ``evidence``,
  ``record_live``);
* ``Forgetter`` (``forgetting``): forgetting a stream here, purging the shared tier, telling
  siblings and the CDN, and waiting until that is in effect;
* ``Generations`` (``generations``): agreeing with other replicas through the shared tier (made
  only with one: without it there is no one to agree with);
* ``Lifetimes`` (``lifetimes``): learning or asking an instance's lifetime;
* ``Writes`` (``writes``): what pass-through traffic (writes, DELETE, HEAD) tells.

Rules this module owns:

* ``build`` is the one place these objects are made and wired; each is handed only what it
  uses, and a caller takes the one it needs from ``Instances``.
* The one cycle, an answer that asks the origin for a lifetime whose answer is an answer
  (``Door`` → ``Lifetimes`` → ``Door.evidence``), is closed here: ``Lifetimes.heard`` is the
  door's ``evidence``, set once the door is built (the door uses the lifetimes), not reached
  back for.
* A ticket (``Instances.ticket``) is taken when a request to the origin starts and when its
  answer arrives; tickets only grow, so an answer that started before another's arrival is
  known to be older (``edge.log.stream_log``'s marks compare them). The counter is the
  replica's one order of origin exchanges, shared by every part that talks to the origin.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

from edge.config import Settings
from edge.instances.door import Door
from edge.instances.forgetting import Forgetter
from edge.instances.generations import Generations
from edge.instances.lifetimes import Lifetimes
from edge.instances.writes import Writes
from edge.metrics import Metrics
from edge.origin import OriginClient
from edge.store.local import LocalTier
from edge.store.shared import SharedTier


@dataclass(frozen=True, kw_only=True, slots=True)
class Instances:
    ticket: Callable[[], int]  # the next ticket (see the rules)
    forgetter: Forgetter
    generations: Generations | None  # only with a shared tier: whose generations to agree on
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
    ticket = itertools.count().__next__
    forgetter = Forgetter(local, shared=shared, clock=clock)
    generations = (
        Generations(local, forgetter, ticket, shared=shared, clock=clock)
        if shared is not None
        else None
    )

    lifetimes = Lifetimes(settings, local, origin, metrics, forgetter, ticket)
    door = Door(local, forgetter, generations, lifetimes, ticket, clock=clock)
    lifetimes.heard = door.evidence
    writes = Writes(settings, local, forgetter, door, lifetimes, ticket, clock=clock)
    return Instances(
        ticket=ticket,
        forgetter=forgetter,
        generations=generations,
        lifetimes=lifetimes,
        door=door,
        writes=writes,
    )
