"""The stream lifecycle as the relay, the sibling workers and the admin listener see it.

Rules this module owns:

* A relayed answer is observed (``Writes.observe``) before it goes out; a DELETE or a creating
  PUT is answered once its forgetting is durable (``Forgetter.forgotten_everywhere``), or after
  ``PURGE_WAIT_SECONDS`` (the purge keeps being retried).
* An operator's purge (the admin listener's ``POST /purge``) makes the edge forget the stream
  with the reason ``admin_purge``; whether that is durable is asked separately, so its answer
  can say so.
* Readiness names the shared tier's state: ``disabled`` (no ``--redis``), ``up`` or ``down``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edge.instances.forgetting import Forgetter
from edge.instances.writes import Writes
from edge.store.shared import SharedTier


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamLifecycle:
    writes: Writes
    forgetter: Forgetter
    shared: SharedTier | None = None

    @property
    def shared_state(self) -> str:
        if self.shared is None:
            return "disabled"
        return "up" if self.shared.up else "down"

    async def observe(
        self,
        method: str,
        stream: str,
        status: int,
        request_headers: Sequence[tuple[str, str]],
        response_headers: Sequence[tuple[str, str]],
        started: int,
    ) -> None:
        """What a relayed answer tells (the relay's ``Observer``)."""
        if self.writes.observe(
            method, stream, status, request_headers, response_headers, started=started
        ):
            await self.forgetter.forgotten_everywhere(stream)

    def forget(self, stream: str) -> int:
        """An operator's purge: the segments the edge forgot here."""
        return self.forgetter.forget(stream, reason="admin_purge")

    async def forgotten_everywhere(self, stream: str) -> bool:
        """Whether the forgetting of ``stream`` is durable (every replica stops serving it)."""
        return await self.forgetter.forgotten_everywhere(stream)
