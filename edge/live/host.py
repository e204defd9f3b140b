"""What the long-poll and SSE fan-outs may ask of the hub that drives them, and nothing more.

``LiveHub`` (``edge.live.hub``) makes the fan-outs and tells them of every batch; they call back
into it. They depend on these protocols, not on ``LiveHub``, so the hub imports them and
nothing imports the hub back, and each fan-out's reach into the hub is written down here: a
fan-out that needs more of the hub says so here first.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from typing import Protocol

from edge.answer import Answer, Bypass
from edge.config import Settings
from edge.live.answers import Pending
from edge.live.tail import Tail, TailRegistry
from edge.log.policy import Coverage
from edge.log.stream_log import LogKey, StreamLog
from edge.metrics import Metrics


class PollHost(Protocol):
    """What ``LongPollFanout`` needs to release a group of long-polls."""

    @property
    def metrics(self) -> Metrics: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def rng(self) -> random.Random: ...

    def settle(
        self,
        key: LogKey,
        tail: Tail,
        offset: str,
        *,
        cursor: str,
        waited: bool,
        expired: bool,
        fetched: bool = False,
    ) -> Answer | Pending:
        """The one long-poll decision: an answer now, or why there is none yet."""
        ...


class ViewerHost(Protocol):
    """What ``SseFanout`` needs to feed viewers from the log and follow the stream's tail."""

    @property
    def settings(self) -> Settings: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def draining(self) -> asyncio.Event: ...

    @property
    def tails(self) -> TailRegistry: ...

    def stream_log(self, key: LogKey) -> StreamLog | None: ...

    def cover(self, key: LogKey, offset: str, *, max_bytes: int) -> Coverage:
        """The segments the edge holds from ``offset`` on, joined, up to ``max_bytes``."""
        ...

    def tail_offset(self, key: LogKey) -> str | None: ...

    async def known_from(
        self, key: LogKey, offset: str, credentials: Sequence[tuple[str, str]]
    ) -> Answer | Bypass | None:
        """Make the log known from ``offset`` on; the origin's refusal if it refuses; a
        ``Bypass`` if the origin is to answer the read itself."""
        ...

    def frames(
        self,
        key: LogKey,
        log: StreamLog,
        coverage: Coverage,
        *,
        up_to_date: bool,
        closed: bool,
        cursor: str,
        chunked: bool,
    ) -> bytes:
        """The SSE frames of ``coverage`` (``edge.live.answers.sse_frames``), encoded once."""
        ...
