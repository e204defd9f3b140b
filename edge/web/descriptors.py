"""How one process's open-file limit is split between what holds descriptors, so that a flood of
one kind of client can never take what another kind needs (issue 21: 20,000 SSE viewers filled
the listener and the agent's own append got 503).

Rules this module owns:

* What each kind holds: a live reader (an SSE viewer, a long-poll) one descriptor, its client
  socket (its stream's upstream tail is shared by every reader of the stream); a short request
  (a write, a catch-up read, a HEAD) two at most, its client socket and one origin connection
  for a relay or a cache fill; a connection between requests or still sending its head one.
* The split of a limit ``L`` (``budget``): ``PROCESS_DESCRIPTORS`` for the process itself
  (stdio, logs, the two listeners, the supervisor's link, Redis and its purge subscriber, the
  auth service, the event loop's own); of the rest, one ``ORIGIN_SHARE``-th for origin
  connections (the pool every relay, fill, live tail and long-poll group draws from, capped
  there: ``--upstream-max-connections`` 0 means this); the remainder for client connections,
  ``clients`` of them under the cap and ``at_cap`` more whose heads are read when every
  connection under the cap is busy. Together they never exceed ``L``.
* Within ``clients``, ``short_reserve`` connections live readers cannot take: at most
  ``clients - short_reserve`` live readers, or ``--max-viewers`` when that is lower. Beside
  the live readers at their cap, the reserve and the heads read at the cap hold short
  requests, each with its origin connection from the pool.
* An operator's ``--max-connections`` replaces the derived ``clients`` (the other figures
  follow from it); one that does not fit the limit is reported (``fits``), not silently cut.
* Without a limit (``RLIM_INFINITY``) the split is that of ``UNLIMITED_DESCRIPTORS``.

Pure: numbers in, numbers out (``edge.startup.raise_open_file_limit`` reads the limit;
``edge.server`` and the supervisor of ``--workers`` say the line).
"""

from __future__ import annotations

from dataclasses import dataclass

from edge.config import Settings
from edge.web.connection_table import Limits

# Descriptors the process keeps for itself before anything is given to clients or the origin.
PROCESS_DESCRIPTORS = 64
# Without a limit (RLIM_INFINITY), this is what the split is made of.
UNLIMITED_DESCRIPTORS = 1 << 20
# One eighth of the rest for origin connections: the short reserve's relays and fills
# (a sixteenth of the clients) plus as many again for live tails and long-poll groups.
ORIGIN_SHARE = 8
MIN_ORIGIN_CONNECTIONS = 8
# Short requests' reserve: a sixteenth of the client connections (1,057 at a limit of 20,000),
# at least MIN_SHORT_RESERVE where there are that many to give (half of a tiny cap).
SHORT_RESERVE_SHARE = 16
MIN_SHORT_RESERVE = 8
# Heads read past the cap when every connection under it is busy: a thirty-second of the cap,
# at least MIN_AT_CAP (so that a writer is told from a viewer even on a small edge).
AT_CAP_SHARE = 32
MIN_AT_CAP = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class DescriptorBudget:
    """One process's split of its open-file limit (see the module's rules)."""

    open_file_limit: int  # as the process has it (-1: unlimited)
    origin: int  # origin connections (the pool's cap)
    clients: int  # client connections under the cap (--max-connections)
    at_cap: int  # more whose heads are read when every one under the cap is busy
    short_reserve: int  # client connections live readers cannot take
    live: int  # live readers (SSE viewers, long-polls) at most
    limited_by: str  # what sets ``live``: the open-file limit, --max-viewers, --max-connections

    @property
    def short_requests(self) -> int:
        """Short requests the process holds beside its live readers at their cap."""
        return self.clients - self.live + self.at_cap

    @property
    def descriptors(self) -> int:
        """Descriptors the split accounts for, the process's own included."""
        return PROCESS_DESCRIPTORS + self.clients + self.at_cap + self.origin

    @property
    def fits(self) -> bool:
        return self.open_file_limit < 0 or self.descriptors <= self.open_file_limit

    def describe(self) -> str:
        """The split, for the start-up line."""
        return (
            f"{self.clients} client connections + {self.at_cap} heads read at the cap, "
            f"{self.origin} origin connections, {PROCESS_DESCRIPTORS} the process's own"
        )


def _short_reserve(clients: int) -> int:
    return max(min(MIN_SHORT_RESERVE, clients // 2), clients // SHORT_RESERVE_SHARE)


def budget(
    open_file_limit: int,
    *,
    max_connections: int = 0,
    max_viewers: int = 0,
    upstream_max_connections: int = 0,
) -> DescriptorBudget:
    """The split of ``open_file_limit`` for one process; a non-zero setting (one worker's share
    of the edge's) replaces the figure it names."""
    limit = UNLIMITED_DESCRIPTORS if open_file_limit < 0 else open_file_limit
    rest = max(0, limit - PROCESS_DESCRIPTORS)
    origin = upstream_max_connections or max(MIN_ORIGIN_CONNECTIONS, rest // ORIGIN_SHARE)
    if max_connections:
        clients = max_connections
        at_cap = max(min(MIN_AT_CAP, clients), clients // AT_CAP_SHARE)
    else:
        both = max(2, rest - origin)
        at_cap = max(min(MIN_AT_CAP, both // 2), both // (AT_CAP_SHARE + 1))
        clients = both - at_cap
    short_reserve = _short_reserve(clients)
    live = max(1, clients - short_reserve)
    if max_viewers and max_viewers < live:
        live, limited_by = max_viewers, "--max-viewers"
    elif max_connections:
        limited_by = f"--max-connections {max_connections}"
    elif open_file_limit < 0:
        limited_by = f"no open-file limit (split as {UNLIMITED_DESCRIPTORS})"
    else:
        limited_by = f"the open-file limit {open_file_limit}"
    return DescriptorBudget(
        open_file_limit=open_file_limit,
        origin=origin,
        clients=clients,
        at_cap=at_cap,
        short_reserve=clients - live,
        live=live,
        limited_by=limited_by,
    )


def budget_for(settings: Settings, open_file_limit: int) -> DescriptorBudget:
    """The split for one process running ``settings`` (a worker's are its share already)."""
    return budget(
        open_file_limit,
        max_connections=settings.max_connections,
        max_viewers=settings.max_viewers,
        upstream_max_connections=settings.upstream_max_connections,
    )


def limits_for(settings: Settings, each: DescriptorBudget) -> Limits:
    """What the connection table enforces of the split, with the timeouts of ``settings``."""
    return Limits(
        header_timeout_seconds=settings.header_timeout_seconds,
        keepalive_timeout_seconds=settings.keepalive_timeout_seconds,
        body_timeout_seconds=settings.body_timeout_seconds,
        max_connections=each.clients,
        max_live=each.live,
        at_cap=each.at_cap,
    )


def holds_line(each: DescriptorBudget, *, workers: int = 1) -> str:
    """The one start-up line: how many live readers and short requests the edge holds, and
    what limits it (for ``workers``, each with the split ``each``)."""
    held = (
        f"stream listener holds {each.live * workers} viewers (SSE and long-poll) and "
        f"{each.short_requests * workers} short requests (writes, catch-up reads, HEAD)"
    )
    if workers > 1:
        held += f", {workers} workers of {each.live} and {each.short_requests}"
    where = " in each worker" if workers > 1 else ""
    return f"{held}; limited by {each.limited_by}{where} ({each.describe()})"
