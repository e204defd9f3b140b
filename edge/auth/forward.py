"""``--auth forward``: ask an auth service, as nginx ``auth_request`` and Traefik ForwardAuth do.

Rules this module owns:

* The service gets a ``GET --auth-url`` with the client's credential headers (the
  ``--scope-headers``, a ``token`` query parameter as ``Authorization: Bearer``), and the request
  it is about: ``X-Original-Method``/``X-Original-URI`` (nginx) and ``X-Forwarded-Method``,
  ``-Uri``, ``-Host``, ``-Proto``, ``-For`` (Traefik).
* The URI it is asked about is the one that is served: the stream's normalised path (as the
  origin routes it, ``Target.stream``), never the client's raw path, whose dot segments and
  percent-encoded dots a service matching prefixes would read differently, then the query
  without ``token`` parameters. A question is built from the ``Target`` the request goes on
  with, and nothing else names its stream.
* 2xx allows; with ``--auth-subject-header``, that header of the answer names the principal
  (``Grant.subject``: what resume routes bind answers to), kept with the verdict. 401 and 403
  are relayed to the client with the service's body (at most ``MAX_BODY_BYTES``),
  ``Content-Type`` and ``WWW-Authenticate``. Anything else, a connection
  failure or no answer within ``--auth-timeout`` is 503: fail closed, and never cached.
* A verdict is the service's answer about (credentials, stream, method), and is kept under
  exactly that: (credential digest, normalised stream, method), since a service decides by
  method (one may append and not delete). It is kept for the answer's ``Cache-Control:
  max-age`` but never longer than ``--auth-cache-seconds`` (revoking access takes effect within
  it, whatever the service said), ``--auth-cache-seconds`` without one; ``no-store``,
  ``no-cache`` or ``max-age=0``: not kept. The query is not part of the key: a service that
  decides by query answers ``no-store``. The LRU is bounded; identical questions in flight are
  asked once (single-flight).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from cachetools import LRUCache

from edge.auth.credentials import credential_digest
from edge.auth.policy import UNAVAILABLE, Grant, Refusal
from edge.coalesce import SingleFlight
from edge.metrics import Metrics
from edge.protocol.paths import Target

logger = logging.getLogger(__name__)

MAX_VERDICTS = 65_536
MAX_BODY_BYTES = 4096
RELAYED_HEADERS = ("content-type", "www-authenticate")
_MAX_AGE = re.compile(r"(?:^|[,\s])max-age\s*=\s*\"?(\d+)")

# (credential digest, normalised stream, method): what a verdict was given for.
VerdictKey = tuple[str, str, str]


@dataclass(frozen=True, kw_only=True, slots=True)
class Question:
    method: str  # upper-case
    target: Target  # the target the request goes on with: without token parameters
    credentials: tuple[tuple[str, str], ...]
    host: str | None
    scheme: str
    client: str | None

    @property
    def uri(self) -> str:
        """What the service is asked about: the served stream, and the query."""
        query = self.target.query
        return self.target.stream + (f"?{query}" if query else "")

    @property
    def key(self) -> VerdictKey:
        return (credential_digest(self.credentials), self.target.stream, self.method)


def lifetime_of(cache_control: str | None, cache_seconds: float) -> float:
    """How long a verdict with this ``Cache-Control`` may be reused, in seconds: what the
    service allows, at most ``cache_seconds``."""
    if cache_control is None:
        return cache_seconds
    directives = cache_control.lower()
    if "no-store" in directives or "no-cache" in directives:
        return 0.0
    found = _MAX_AGE.search(directives)
    return min(float(found.group(1)), cache_seconds) if found else cache_seconds


class ForwardAuth:
    def __init__(
        self,
        url: str,
        metrics: Metrics,
        *,
        timeout_seconds: float,
        cache_seconds: float,
        subject_header: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = url
        self._subject_header = subject_header
        self._metrics = metrics
        self._timeout = timeout_seconds
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._verdicts: LRUCache[VerdictKey, tuple[float, Grant | Refusal]] = LRUCache(
            maxsize=MAX_VERDICTS
        )
        self._flights: SingleFlight[VerdictKey, tuple[float, Grant | Refusal]] = SingleFlight()

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            # No pool limit: a herd of distinct viewers (a shared link) must not queue behind
            # each other for a connection and time out waiting; --auth-timeout is the service's.
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=self._timeout),
            skip_auto_headers=("User-Agent",),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def now(self) -> float:
        """The clock verdict lifetimes are on."""
        return self._clock()

    def remembered_until(self, question: Question) -> tuple[float, Grant | Refusal] | None:
        """The verdict kept for ``question``'s key and until when (``now``), while it lives;
        None: ask (``verdict``)."""
        key = question.key
        kept = self._verdicts.get(key)
        if kept is None:
            return None
        if self._clock() < kept[0]:
            return kept
        del self._verdicts[key]
        return None

    def remembered(self, question: Question) -> Grant | Refusal | None:
        """The verdict kept for ``question``'s key, while it lives; None: ask (``verdict``)."""
        kept = self.remembered_until(question)
        return None if kept is None else kept[1]

    async def verdict(self, question: Question) -> Grant | Refusal:
        kept = self.remembered(question)
        if kept is not None:
            return kept
        key = question.key
        (_, verdict), _ = await self._flights.run(key, lambda: self._ask_and_keep(key, question))
        return verdict

    async def _ask_and_keep(
        self, key: VerdictKey, question: Question
    ) -> tuple[float, Grant | Refusal]:
        # Kept before the flight ends, so no question arriving in between is asked again.
        until, verdict = await self._ask(question)
        if until > self._clock():
            self._verdicts[key] = (until, verdict)
        return until, verdict

    async def _ask(self, question: Question) -> tuple[float, Grant | Refusal]:
        assert self._session is not None
        headers = [
            *question.credentials,
            ("X-Original-Method", question.method),
            ("X-Original-URI", question.uri),
            ("X-Forwarded-Method", question.method),
            ("X-Forwarded-Uri", question.uri),
            ("X-Forwarded-Proto", question.scheme),
        ]
        if question.host:
            headers.append(("X-Forwarded-Host", question.host))
        if question.client:
            headers.append(("X-Forwarded-For", question.client))
        started = time.perf_counter()
        try:
            async with self._session.get(
                self._url, headers=headers, allow_redirects=False
            ) as answer:
                status = answer.status
                body = await answer.content.read(MAX_BODY_BYTES)
                relayed = tuple(
                    (name, value)
                    for name, value in answer.headers.items()
                    if name.lower() in RELAYED_HEADERS
                )
                cache_control = answer.headers.get("Cache-Control")
                subject = answer.headers.get(self._subject_header) if self._subject_header else None
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            result = "timeout" if isinstance(error, TimeoutError) else "error"
            self._metrics.auth_upstream_requests.labels(kind="forward", result=result).inc()
            logger.warning("--auth-url did not answer (%s)", type(error).__name__)
            return 0.0, UNAVAILABLE
        finally:
            self._metrics.auth_upstream_duration.labels(kind="forward").observe(
                time.perf_counter() - started
            )
        until = self._clock() + lifetime_of(cache_control, self._cache_seconds)
        if 200 <= status < 300:
            self._metrics.auth_upstream_requests.labels(kind="forward", result="ok").inc()
            return until, Grant(subject=subject or None)
        if status in (401, 403):
            self._metrics.auth_upstream_requests.labels(kind="forward", result="denied").inc()
            refusal = Refusal(status=status, reason="", result="denied", headers=relayed, body=body)
            return until, refusal
        self._metrics.auth_upstream_requests.labels(kind="forward", result="error").inc()
        logger.warning("--auth-url answered %d: refusing (fail closed)", status)
        return 0.0, UNAVAILABLE
