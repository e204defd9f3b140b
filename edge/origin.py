"""The one HTTP client the edge uses to reach the origin.

Exceptions (every aiohttp error is translated here, at the boundary)::

    BodyTooLarge           a body past the caller's limit (not an error of the origin's)
    OriginError            status hint and fixed text for the client, reason label for metrics
    ├── OriginUnreachable  502  could not connect           "origin unreachable"
    ├── OriginTimeout      504  no response headers in time, or a body stalled
    │                                                       "origin timed out"
    └── OriginBroken       502  connection reset or malformed answer
                                                            "origin connection failed"

An error's message (``str(error)``) carries the details (addresses, parser messages) and is for
the log only; a client is told ``public_text``, which names nothing internal.

Rules this module owns:

* The client adds nothing the edge's caller did not ask for: no ``Accept``, ``Accept-Encoding``,
  ``User-Agent`` or ``Content-Type`` defaults, and bodies are relayed as received (no
  decompression), so the origin's bytes and ``Content-Encoding`` pass through untouched.
* Live answers have no idle read timeout: an SSE origin may stay silent for minutes. Every answer
  must start (headers) within ``upstream_headers_timeout_seconds``, which is longer than any
  origin's long-poll.
* Pooled connections are dropped before the origin's own keep-alive timeout (Node: 5 s), so a
  request never lands on a socket the origin is closing.
* **A write is sent once.** aiohttp sends a request of an idempotent method (PUT and DELETE
  among them) again, on a new connection, when the first broke before an answer; but the origin
  may have applied the first, and answers the second otherwise (a DELETE 404, a creating PUT
  200), which the edge would relay, and act on, as the answer to the one the client sent. A
  broken write is ``OriginBroken`` (502), as a client of the origin alone sees a broken
  connection: the outcome unknown, never a wrong one. Reads (``READ_METHODS``) may be asked again.
* Every origin connection (relays, cache fills, live tails, long-poll groups) comes from the one
  pool, so its cap bounds the descriptors they hold; a request past it waits for a connection
  (within ``upstream_headers_timeout_seconds``).
* Every origin answer (relayed, a cache fill, a live tail) is shown to the answer listeners as it
  arrives, so the edge knows the origin's current headers (its CORS policy) without each caller
  reporting them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from edge.config import Settings
from edge.log.trust import Ending

# Below Node's default server keep-alive timeout (5 s).
POOL_IDLE_SECONDS = 4.0
# Methods aiohttp may send again on a fresh connection when the first one broke: a read asks
# again what it asked. Every other method goes once (see the module rules).
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
BODY_CHUNK_BYTES = 64 * 1024


class BodyTooLarge(Exception):
    """An origin body past the caller's limit: relay it rather than hold it."""


class OriginError(Exception):
    status = 502
    reason = "protocol"
    public_text = "origin connection failed"
    # What the failure says of the origin itself (``edge.log.trust.origin_went_away``).
    ending = Ending.BROKEN


class OriginUnreachable(OriginError):
    status = 502
    reason = "connect"
    public_text = "origin unreachable"
    ending = Ending.REFUSED


class OriginTimeout(OriginError):
    status = 504
    reason = "timeout"
    public_text = "origin timed out"
    ending = Ending.TIMED_OUT


class OriginMalformed(OriginError):
    """An answer whose head cannot be passed on (a control character in a header): the
    origin is there and answered, so nothing is forgotten of it."""

    status = 502
    reason = "protocol"
    public_text = "origin answer cannot be relayed"
    ending = Ending.ANSWERED


class OriginBroken(OriginError):
    status = 502
    reason = "reset"
    public_text = "origin connection failed"


# Called with the request's Origin header (None: it had none) and the headers of every origin
# answer, as its status line and headers arrive.
AnswerListener = Callable[[str | None, Sequence[tuple[str, str]]], None]


def translate(error: BaseException) -> OriginError:
    """The edge's view of an aiohttp or socket error."""
    if isinstance(error, OriginError):
        return error
    if isinstance(error, aiohttp.ClientConnectorError):
        return OriginUnreachable(f"origin unreachable: {error.os_error or error}")
    if isinstance(error, TimeoutError):
        return OriginTimeout("origin did not answer in time")
    if isinstance(error, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError):
        return OriginBroken(f"origin connection lost: {error}")
    broken = OriginBroken(f"origin sent a malformed answer: {error}")
    broken.reason = "protocol"
    return broken


class OriginClient:
    def __init__(self, settings: Settings, *, pool_limit: int | None = None) -> None:
        """``pool_limit``: origin connections at most (0: unlimited); by default
        ``--upstream-max-connections``. A serving edge passes its descriptor budget's share
        (``edge.web.descriptors``), what that flag's 0 means there."""
        self._settings = settings
        self._base = settings.origin_base  # computed by the settings; asked once, not per request
        self._pool_limit = settings.upstream_max_connections if pool_limit is None else pool_limit
        self._session: aiohttp.ClientSession | None = None
        self._writes: aiohttp.ClientSession | None = None
        self._listeners: list[AnswerListener] = []

    def listen_to_answers(self, listener: AnswerListener) -> None:
        """Show ``listener`` the headers of every origin answer from now on."""
        self._listeners.append(listener)

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self._pool_limit,
            keepalive_timeout=POOL_IDLE_SECONDS,
            enable_cleanup_closed=False,
        )
        self._session = self._new_session(connector, owner=True)
        # Writes go through one pool but a session of their own that never sends a request
        # twice (see the module rules).
        self._writes = self._new_session(connector, owner=False)
        self._writes._retry_connection = False  # as aiohttp's own test client turns it off

    def _new_session(
        self, connector: aiohttp.TCPConnector, *, owner: bool
    ) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=connector,
            connector_owner=owner,
            auto_decompress=False,
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
            timeout=aiohttp.ClientTimeout(
                total=None,
                sock_connect=self._settings.upstream_connect_timeout_seconds,
            ),
            # Paths and queries are relayed exactly as the client sent them.
            requote_redirect_url=False,
        )

    async def close(self) -> None:
        if self._writes is not None:
            await self._writes.close()
            self._writes = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def base_url(self) -> str:
        return self._base

    def url_for(self, path_qs: str) -> str:
        return self._base + path_qs

    async def open(
        self,
        method: str,
        path_qs: str,
        headers: Sequence[tuple[str, str]],
        body: AsyncIterable[bytes] | aiohttp.StreamReader | None = None,
        *,
        live: bool,
        idle_timeout: float | None = None,
    ) -> aiohttp.ClientResponse:
        """Send a request and return once the origin's status and headers have arrived.

        ``idle_timeout`` bounds the silence between body chunks of a live answer (the edge's own
        upstream tails set it; relayed live answers have none). The caller owns the response:
        read it with ``body_chunks`` and ``close`` it.
        """
        session = self._session if method.upper() in READ_METHODS else self._writes
        if session is None:
            raise RuntimeError("OriginClient.start() was not awaited")
        read_timeout = idle_timeout if live else self._settings.upstream_read_timeout_seconds
        try:
            async with asyncio.timeout(self._settings.upstream_headers_timeout_seconds):
                response = await session.request(
                    method,
                    URL(self.url_for(path_qs), encoded=True),
                    headers=CIMultiDict(headers),
                    data=body,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(
                        total=None,
                        sock_connect=self._settings.upstream_connect_timeout_seconds,
                        sock_read=read_timeout,
                    ),
                )
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise translate(error) from error
        if self._listeners:
            answered = list(response.headers.items())
            asked_by = next((v for n, v in headers if n.lower() == "origin"), None)
            try:
                for listener in self._listeners:
                    listener(asked_by, answered)
            except BaseException:
                response.close()
                raise
        return response

    @staticmethod
    async def read_body(response: aiohttp.ClientResponse, limit: int) -> bytes:
        """The whole body, which the caller is about to keep; at most ``limit`` bytes."""
        chunks: list[bytes] = []
        size = 0
        async for chunk in OriginClient.body_chunks(response):
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(f"{response.url.path}: over {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    @staticmethod
    async def body_chunks(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        """The response body as it arrives, chunk by chunk (never buffered whole)."""
        try:
            async for chunk in response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise translate(error) from error
