"""A stream instance's lifetime (``Stream-TTL``, ``Stream-Expires-At``): learned, or asked.

Rules this module owns:

* Lifetimes are learned from writes, HEAD answers and any origin answer that carries them
  (``learn_lifetime``); an answer that states the whole lifetime (a HEAD, a creating PUT) and
  names none says the stream does not expire.
* A stream known only from reads is asked once (HEAD, ``probe_lifetime``: one question per
  instance at a time); a HEAD does not renew a sliding TTL at the origin (PROTOCOL.md 5.1).
  Its answer is evidence like any other (``heard``: a 404 forgets the stream).
* A HEAD answer of another content type than the instance held states another stream's
  lifetime: the instance is forgotten, not given it (``headed``).
* Bytes the shared tier gives are served only once this process knows their instance's
  lifetime (``confirm_lifetime``): a sliding TTL counts from this process's own reads of the
  origin, so an instance it never read there asks the origin first, which renews it or says
  404. An origin that cannot say within ``--upstream-connect-timeout`` leaves what is held
  served, as without a shared tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from edge.config import Settings
from edge.instances.forgetting import Forgetter
from edge.log.stream_log import LogKey, StreamInstance, names_another_instance
from edge.metrics import Metrics
from edge.origin import OriginClient, OriginError
from edge.protocol.headers import first_value, own_request_headers, stated_lifetime
from edge.store.local import LocalTier

logger = logging.getLogger(__name__)


class Heard(Protocol):
    """What an answer to the lifetime probe says of the stream (``Door.evidence``)."""

    def __call__(
        self,
        key: LogKey,
        status: int,
        headers: Sequence[tuple[str, str]],
        *,
        started: int,
        instance: StreamInstance | None = None,
    ) -> object: ...


def _unheard(
    key: LogKey,
    status: int,
    headers: Sequence[tuple[str, str]],
    *,
    started: int,
    instance: StreamInstance | None = None,
) -> object:
    raise RuntimeError("Lifetimes.heard is set by edge.instances.build")


def learn_lifetime(
    instance: StreamInstance,
    headers: Sequence[tuple[str, str]],
    *,
    complete: bool = False,
) -> None:
    """Learn the lifetime ``headers`` state. ``complete``: they state all of it (a HEAD
    answer, a creating PUT), so stating none means the stream does not expire."""
    ttl, expires_at = stated_lifetime(headers)
    if complete or ttl is not None or expires_at is not None:
        instance.learn_lifetime(ttl, expires_at)


class Lifetimes:
    def __init__(
        self,
        settings: Settings,
        local: LocalTier,
        origin: OriginClient,
        metrics: Metrics,
        forgetter: Forgetter,
        ticket: Callable[[], int],
    ) -> None:
        self._settings = settings
        self._local = local
        self._origin = origin
        self._metrics = metrics
        self._forgetter = forgetter
        self._ticket = ticket
        self.heard: Heard = _unheard  # the door's ``evidence``, set by ``edge.instances.build``
        self._background: set[asyncio.Task[None]] = set()
        # The lifetime asked of the origin (HEAD), one question per instance at a time.
        self._probing: dict[StreamInstance, asyncio.Task[None]] = {}

    def headed(self, instance: StreamInstance, headers: Sequence[tuple[str, str]]) -> None:
        """A HEAD answer states the stream's whole lifetime, and its content type: of another
        type, it is another stream's lifetime (forget the instance held), not this one's."""
        if names_another_instance(instance, first_value(headers, "content-type")):
            logger.info(
                "%s answered a HEAD as another content type: a new instance", instance.stream
            )
            self._forgetter.forget(instance.stream, reason="new_instance")
            return
        learn_lifetime(instance, headers, complete=True)

    def probe_lifetime(
        self, key: LogKey, instance: StreamInstance, credentials: Sequence[tuple[str, str]]
    ) -> asyncio.Task[None]:
        """A stream known only from reads: ask the origin (HEAD, once per instance at a time)
        whether it expires, so the edge neither serves it past its end nor advertises it for a
        year. A HEAD does not renew a sliding TTL at the origin (PROTOCOL.md 5.1)."""
        task = self._probing.get(instance)
        if task is not None:
            return task
        task = asyncio.ensure_future(self._head_lifetime(key, instance, tuple(credentials)))
        self._probing[instance] = task
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def confirm_lifetime(
        self, key: LogKey, instance: StreamInstance, credentials: Sequence[tuple[str, str]]
    ) -> None:
        """Learn the lifetime of an instance this process holds bytes of without having asked
        the origin (the shared tier gave them): before they are served, as the origin may have
        expired it since the replica that filled them last touched it. Once its lifetime is
        known, an expiring instance counts from this process's own touches (none yet: its next
        read asks the origin, which renews it); a 404 forgets it. An origin that cannot say
        (unreachable, or no answer within ``--upstream-connect-timeout``: a HEAD is answered at
        once) leaves what is held served, as without a shared tier."""
        if instance.lifetime_known:
            return
        # Shielded: a reader that leaves, or stops waiting, does not cancel the question.
        asked = asyncio.shield(self.probe_lifetime(key, instance, credentials))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asked, self._settings.upstream_connect_timeout_seconds)

    async def _head_lifetime(
        self, key: LogKey, instance: StreamInstance, credentials: tuple[tuple[str, str], ...]
    ) -> None:
        started = self._ticket()
        try:
            upstream = await self._origin.open(
                "HEAD", instance.stream, own_request_headers(credentials), live=False
            )
            upstream.close()
        except OriginError:
            return
        finally:
            self._probing.pop(instance, None)
        self._metrics.origin_requests.labels(kind="head", code=str(upstream.status)).inc()
        headers = list(upstream.headers.items())
        self.heard(key, upstream.status, headers, started=started, instance=instance)
        if upstream.status == 200 and self._local.current(instance):
            self.headed(instance, headers)

    async def close(self) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
