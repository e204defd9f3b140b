"""What pass-through traffic tells: every answer the origin gave to a request the cache did not
serve (a write, a DELETE, a HEAD, a relayed read).

Rules this module owns:

* A DELETE that succeeded or a 201 PUT through the edge forgets the stream everywhere; the
  caller answers once the forgetting is durable, so other replicas no longer serve the old
  instance (``observe`` says when).
* Any write may have moved the tail (even a failed one may have raced one that did): every log
  of the stream is marked stale; a successful one says how far (``Stream-Next-Offset``). The
  core judges a write (``judge_write``, from ``stream_write``): one that found the stream gone
  forgets it (as ``Forgetter.stream_gone`` rules), one that names another instance (deleted and
  recreated behind the edge) forgets the one held.
* Closed through this edge: every later read says so (read-after-write), when the close names
  the instance held.
* A creating PUT states the whole lifetime (no TTL header means none), but a fork's inherits
  its source's, which a HEAD tells; a HEAD answer is ``Lifetimes.headed``'s.
* The scope a request speaks for is the settings' (``scope_of``): a relayed answer is evidence
  in that scope.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from edge.config import Settings
from edge.instances.door import Door
from edge.instances.forgetting import Forgetter
from edge.instances.lifetimes import Lifetimes, learn_lifetime
from edge.log.intake import Decision
from edge.log.stream_log import LogKey, Mark, StreamWrite, judge_write
from edge.protocol.headers import (
    STREAM_CLOSED,
    STREAM_FORKED_FROM,
    STREAM_NEXT_OFFSET,
    first_value,
    flag,
)
from edge.protocol.reads import auth_scope, is_offset_token, speaks_for_the_stream
from edge.store.local import LocalTier

logger = logging.getLogger(__name__)


def carries_body(headers: Sequence[tuple[str, str]]) -> bool:
    """Did a request say it carries a body (a positive ``Content-Length``, or chunked)?"""
    if first_value(headers, "transfer-encoding") is not None:
        return True
    length = first_value(headers, "content-length")
    return length is not None and length.strip().isdigit() and int(length) > 0


def stream_write(
    method: str,
    status: int,
    request_headers: Sequence[tuple[str, str]],
    response_headers: Sequence[tuple[str, str]],
    floor: str | None,
    started: int,
) -> StreamWrite:
    """A write's request and answer as the core judges them (``judge_write``)."""
    body = carries_body(request_headers)
    if method == "PUT":
        named = first_value(response_headers, "content-type")
    elif method == "POST" and body:
        # A close without a body is taken whatever its Content-Type (clients send a default).
        named = first_value(request_headers, "content-type")
    else:
        named = None
    return StreamWrite(
        floor=floor,
        started=started,
        # An append of bytes (not a producer's, whose retry of a duplicate is answered with the
        # tail as it is) ends past the tail the edge knew before it started.
        appended=method == "POST" and body and first_value(request_headers, "producer-id") is None,
        content_type=named,
        answered=method == "PUT",
        status=status,
    )


class Writes:
    def __init__(
        self,
        settings: Settings,
        local: LocalTier,
        forgetter: Forgetter,
        door: Door,
        lifetimes: Lifetimes,
        ticket: Callable[[], int],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._local = local
        self._forgetter = forgetter
        self._door = door
        self._lifetimes = lifetimes
        self._ticket = ticket
        self._clock = clock

    def observe(
        self,
        method: str,
        stream: str,
        status: int,
        request_headers: Sequence[tuple[str, str]],
        response_headers: Sequence[tuple[str, str]],
        *,
        started: int,
    ) -> bool:
        """Called for every answer the origin gave to a request the cache did not serve (whose
        ticket was ``started``); True when it deleted, created or found gone the stream for
        everyone (the caller waits for the forgetting to be durable, as for a DELETE)."""
        method = method.upper()
        key = LogKey(stream=stream, scope=self.scope_of(request_headers))
        if method in ("PUT", "POST"):
            created = method == "PUT" and status == 201
            if created:
                # Created: whatever the edge knew of this path is another's.
                self._forgetter.forget(stream, reason="created")
            gone = self._written(key, method, status, request_headers, response_headers, started)
            # Like a DELETE, answered once other replicas will not serve the old instance.
            return created or (gone and speaks_for_the_stream(key.scope))
        if self._door.evidence(key, status, response_headers, started=started) is Decision.GONE:
            return speaks_for_the_stream(key.scope)
        if method == "DELETE" and status < 400:
            self._forgetter.forget(stream, reason="deleted")
            return True
        if method == "HEAD" and status == 200:
            self._lifetimes.headed(self._local.instance_for(stream), response_headers)
        return False

    def _written(
        self,
        key: LogKey,
        method: str,
        status: int,
        request_headers: Sequence[tuple[str, str]],
        response_headers: Sequence[tuple[str, str]],
        started: int,
    ) -> bool:
        """A write reached the origin. Any write may have moved the tail (even a failed one may
        have raced one that did); a successful one says how far (its ``Stream-Next-Offset``).
        A successful write that started after the edge knew the stream had reached further
        than it says went to another instance (deleted and recreated behind the edge); one
        answered 404 or 410 found the stream gone (forgotten in ``key.scope``: True)."""
        stream = key.stream
        ok = status < 300
        floor = first_value(response_headers, STREAM_NEXT_OFFSET) if ok else None
        if not is_offset_token(floor):
            floor = None
        closes = ok and flag(request_headers, STREAM_CLOSED)
        instance = self._local.instance_for(stream)
        write = stream_write(method, status, request_headers, response_headers, floor, started)
        judgement = judge_write(instance, write)
        if judgement.gone:
            self._forgetter.stream_gone(key)
            instance = self._local.instance_for(stream)
        elif judgement.another is not None:
            logger.info("%s %s: a new instance", stream, judgement.another)
            self._forgetter.forget(stream, reason="new_instance")
            instance = self._local.instance_for(stream)
        names_instance = judgement.names_instance
        ticket = self._ticket()
        if floor is not None:
            instance.reached(floor, ticket)
            if closes and instance.closed_at is None:
                instance.closed_at = Mark(offset=floor, received=ticket)
        for log in self._local.logs_of(stream):
            log.mark_stale()
            if closes and floor is not None and names_instance:
                # Closed through this edge: every later read says so (read-after-write). A
                # close that names no instance is left to the next read to ask the origin
                # (its closure mark keeps an older answer that says open from being believed).
                log.observe_tail(
                    floor, closed=True, now=self._clock(), started=ticket, received=ticket
                )
        if method == "PUT" and status in (200, 201):
            # A creating PUT states the whole lifetime: no TTL header means none. Not a fork's:
            # without one of its own, it inherits its source's (PROTOCOL.md 4.2), which a HEAD
            # tells (``Lifetimes.probe_lifetime``).
            forked = first_value(request_headers, STREAM_FORKED_FROM) is not None
            learn_lifetime(instance, request_headers, complete=status == 201 and not forked)
        return judgement.gone

    def scope_of(self, request_headers: Sequence[tuple[str, str]]) -> str:
        return auth_scope(
            request_headers,
            scope_headers=self._settings.scope_headers,
            scope_cookies=self._settings.scope_cookies,
        )
