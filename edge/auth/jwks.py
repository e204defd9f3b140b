"""Where the key ring comes from: a JWKS file or URL, kept current without blocking the loop.

Rules this module owns:

* The document is read (file, in a worker thread) or fetched (URL, with aiohttp and
  ``--auth-timeout``) at start-up; a failure is logged and the edge starts anyway, refusing
  tokens with 503 (it cannot judge them) until a load succeeds.
* A token naming an unknown ``kid`` triggers one reload, collapsed with any reload in flight,
  and at most one per ``--jwt-jwks-min-refresh``: a flood of made-up kids costs the JWKS
  endpoint one request per interval, and tokens that still name no known key are refused.
* A URL is also reloaded in the background once its ring is older than ``MAX_AGE_SECONDS``, so
  a key removed from the document stops being accepted.
* A reload that fails keeps the ring it had: the keys it knew are still the issuer's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from edge.auth.keys import JwksError, KeyRing
from edge.metrics import Metrics

logger = logging.getLogger(__name__)

MAX_AGE_SECONDS = 300.0
MAX_DOCUMENT_BYTES = 1024 * 1024


class JwksSource:
    def __init__(
        self,
        location: str,
        metrics: Metrics,
        *,
        timeout_seconds: float,
        min_refresh_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._location = location
        self._is_url = location.startswith(("http://", "https://"))
        self._metrics = metrics
        self._timeout = timeout_seconds
        self._min_refresh = min_refresh_seconds
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._reload: asyncio.Task[None] | None = None
        self._attempted_at = float("-inf")
        self._loaded_at = float("-inf")
        self.ring: KeyRing | None = None
        self.loads = 0  # documents fetched or read, successful or not

    async def start(self) -> None:
        if self._is_url:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout)
            )
        await self._load()

    async def close(self) -> None:
        if self._reload is not None:
            self._reload.cancel()
            await asyncio.gather(self._reload, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def ring_now(self, kid: str | None) -> KeyRing | None:
        """The current ring, if it knows ``kid`` (an old one is reloaded in the background);
        None: judging the token needs ``ring_for``."""
        ring = self.ring
        if ring is None or not ring.has(kid):
            return None
        self.reload_if_old()
        return ring

    def reload_if_old(self) -> None:
        """A key set fetched from a URL is fetched again, in the background, once it is old."""
        now = self._clock()
        if self._is_url and now - self._loaded_at > MAX_AGE_SECONDS:
            self._start_reload(now)

    async def ring_for(self, kid: str | None) -> KeyRing | None:
        """The ring to judge a token naming ``kid`` with: the current one when it knows the kid,
        else after one (rate-limited, collapsed) reload."""
        known = self.ring_now(kid)
        if known is not None:
            return known
        ring = self.ring
        now = self._clock()
        reload = self._start_reload(now)
        if reload is None:
            return ring  # reloaded too recently: the kid stays unknown until the next interval
        await asyncio.shield(reload)
        return self.ring

    def _start_reload(self, now: float) -> asyncio.Task[None] | None:
        """The reload in flight, a new one, or None when the last began too recently."""
        if self._reload is None:
            if now - self._attempted_at < self._min_refresh:
                return None
            self._reload = asyncio.ensure_future(self._load())
            self._reload.add_done_callback(self._reloaded)
        return self._reload

    def _reloaded(self, task: asyncio.Task[None]) -> None:
        self._reload = None
        if not task.cancelled():
            task.exception()

    async def _load(self) -> None:
        self._attempted_at = self._clock()
        self.loads += 1
        started = time.perf_counter()
        try:
            document = await (self._fetch() if self._is_url else self._read())
            ring = KeyRing.from_jwks(document)
        except (OSError, aiohttp.ClientError, TimeoutError, JwksError) as error:
            result = "timeout" if isinstance(error, TimeoutError) else "error"
            self._metrics.auth_upstream_requests.labels(kind="jwks", result=result).inc()
            logger.warning(
                "--jwt-jwks: cannot load the key set (%s: %s)", type(error).__name__, error
            )
            return
        finally:
            self._metrics.auth_upstream_duration.labels(kind="jwks").observe(
                time.perf_counter() - started
            )
        self._metrics.auth_upstream_requests.labels(kind="jwks", result="ok").inc()
        self._metrics.auth_keys.set(len(ring))
        self.ring = ring
        self._loaded_at = self._clock()

    async def _read(self) -> bytes:
        return await asyncio.to_thread(Path(self._location).read_bytes)

    async def _fetch(self) -> bytes:
        assert self._session is not None
        async with self._session.get(self._location, allow_redirects=False) as response:
            if response.status != 200:
                raise JwksError(f"answered {response.status}")
            body = await response.content.read(MAX_DOCUMENT_BYTES + 1)
        if len(body) > MAX_DOCUMENT_BYTES:
            raise JwksError("document too large")
        return body
