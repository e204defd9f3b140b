"""An in-process stand-in for ``edge.origin.OriginClient``, answering from an ``OriginModel``.

It implements what the catch-up cache uses: ``open(method, path_qs, headers, body, *, live,
idle_timeout)`` returning a response-like object (``status``, ``reason``, ``headers`` as a
``CIMultiDictProxy``, ``content_length``, ``url``, ``content.iter_any()``, ``content.at_eof()``,
``read()``, ``close()``, ``release()``), so ``OriginClient.read_body``/``body_chunks`` work on it
unchanged; plus ``start``/``close``, ``base_url`` and ``url_for``. GET, HEAD, PUT, POST and
DELETE are answered by the model; a live long-poll (an edge's upstream tail) as the reference
origin answers it: at once unless the offset is the tail (``now`` or the current offset) with
nothing past it, a closed tail's 204 at once, else it
waits at the tail until the test says the model changed (``notify_live``: when the upstream
hears of a write is the test's to choose, as the network's is), then looks again. SSE is not
supported.

The answer is decided when the request *arrives* (as the real origin does) and then delivered;
a test can hold deliveries (``hold()``) to change the model while an answer is in flight, the
way a write or a delete races a cache fill in production. Every request is recorded with the
model version it was answered from.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from edge.protocol.cursor import current_interval
from tests.model.origin_model import OriginModel, Response

BASE_URL = "http://origin.invalid"


@dataclass(frozen=True, slots=True)
class Served:
    """One request the fake origin answered."""

    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    status: int
    response_headers: tuple[tuple[str, str], ...]
    version: int  # the model version of ``path`` the answer was computed from
    generation: int | None  # which instance of ``path`` that was (None: none existed)


class FakeContent:
    def __init__(self, body: bytes, chunk_bytes: int) -> None:
        self._chunks = [body[i : i + chunk_bytes] for i in range(0, len(body), chunk_bytes)]
        self._read = 0

    async def iter_any(self) -> AsyncIterator[bytes]:
        while self._read < len(self._chunks):
            chunk = self._chunks[self._read]
            self._read += 1
            await asyncio.sleep(0)
            yield chunk

    async def read(self) -> bytes:
        rest = b"".join(self._chunks[self._read :])
        self._read = len(self._chunks)
        return rest

    def at_eof(self) -> bool:
        return self._read >= len(self._chunks)


class FakeResponse:
    def __init__(self, url: URL, response: Response, chunk_bytes: int) -> None:
        self.status = response.status
        self.reason = {200: "OK", 201: "Created", 204: "No Content", 304: "Not Modified"}.get(
            response.status, "Error"
        )
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict(response.headers))
        self.url = url
        declared = response.header("content-length")
        self.content_length = int(declared) if declared is not None else None
        self.content = FakeContent(response.body, chunk_bytes)
        self.closed = False
        self.released = False

    async def read(self) -> bytes:
        return await self.content.read()

    def close(self) -> None:
        self.closed = True

    def release(self) -> None:
        self.released = True


class FakeOrigin:
    """``OriginClient``'s interface over an ``OriginModel``."""

    def __init__(
        self,
        model: OriginModel,
        *,
        base_url: str = BASE_URL,
        chunk_bytes: int = 7,
        on_served: Callable[[Served], None] | None = None,
    ) -> None:
        self.model = model
        self._base_url = base_url
        self._chunk_bytes = chunk_bytes
        self._on_served = on_served
        self.served: list[Served] = []
        self._gate: asyncio.Event | None = None
        self.arrived: asyncio.Event | None = None
        self._listeners: list[Callable[[str | None, Sequence[tuple[str, str]]], None]] = []
        # An origin whose CORS grants each request's own Origin (with credentials, Vary: Origin)
        # instead of the reference server's "*" for everyone.
        self.cors_by_origin = False
        self._live_waiters: list[asyncio.Future[None]] = []
        self.live_requests = 0

    def listen_to_answers(
        self, listener: Callable[[str | None, Sequence[tuple[str, str]]], None]
    ) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    @property
    def base_url(self) -> str:
        return self._base_url

    def url_for(self, path_qs: str) -> str:
        return self._base_url + path_qs

    # --- racing ---

    def hold(self) -> asyncio.Event:
        """Hold the next answers after they are decided, until ``release()``; returns the event
        set when the first held request has arrived (and been answered by the model)."""
        self._gate = asyncio.Event()
        self.arrived = asyncio.Event()
        return self.arrived

    def release(self) -> None:
        if self._gate is not None:
            self._gate.set()
        self._gate = None

    def notify_live(self) -> None:
        """The model changed: every long-poll waiting at its tail looks again."""
        waiters, self._live_waiters = self._live_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # --- the client interface ---

    async def open(
        self,
        method: str,
        path_qs: str,
        headers: Sequence[tuple[str, str]],
        body: AsyncIterable[bytes] | None = None,
        *,
        live: bool,
        idle_timeout: float | None = None,
    ) -> FakeResponse:
        if live:
            return await self._long_poll(path_qs, headers)
        await asyncio.sleep(0)  # a request is never answered synchronously
        payload = b""
        if body is not None:
            payload = b"".join([chunk async for chunk in body])
        raw_path, _, query = path_qs.partition("?")
        path = raw_path  # the origin keys streams by url.pathname, still percent-encoded
        response = self.model.handle(method, path, query, list(headers), payload)
        asked_by = next((v for n, v in headers if n.lower() == "origin"), None)
        if self.cors_by_origin:
            response = granted_to(response, asked_by)
        for listener in self._listeners:
            listener(asked_by, response.headers)
        current = self.model.current(path)
        served = Served(
            method=method.upper(),
            path=path,
            query=query,
            headers=tuple(headers),
            status=response.status,
            response_headers=response.headers,
            version=self.model.version_index(path),
            generation=current.generation if current is not None else None,
        )
        self.served.append(served)
        if self._on_served is not None:
            self._on_served(served)
        gate = self._gate
        if gate is not None:
            assert self.arrived is not None
            self.arrived.set()
            await gate.wait()
        url = URL(self.url_for(path_qs), encoded=True)
        return FakeResponse(url, response, self._chunk_bytes)

    async def _long_poll(self, path_qs: str, headers: Sequence[tuple[str, str]]) -> FakeResponse:
        path, _, query_string = path_qs.partition("?")
        query = parse_qsl(query_string, keep_blank_values=True)
        if ("live", "long-poll") not in query:
            raise NotImplementedError("the fake origin's live reads are long-polls")
        self.live_requests += 1
        offset = next((v for n, v in query if n == "offset"), None)
        plain = urlencode([(n, v) for n, v in query if n not in ("live", "cursor")])
        url = URL(self.url_for(path_qs), encoded=True)
        while True:
            await asyncio.sleep(0)
            response = self.model.handle("GET", path, plain, list(headers))
            current = self.model.current(path)
            if response.status != 200 or current is None:
                return FakeResponse(url, response, self._chunk_bytes)
            cursor = ("Stream-Cursor", str(current_interval(self.model.now_ms / 1000)))
            caught_up = offset in ("now", current.current_offset)
            if current.read(offset) or not caught_up:  # answered at once, as the origin does
                answer = dataclasses.replace(response, headers=(*response.headers, cursor))
                return FakeResponse(url, answer, self._chunk_bytes)
            if current.closed:
                kept = [(n, v) for n, v in response.headers if n.lower() != "content-length"]
                answer = Response(status=204, headers=(*kept, cursor))
                return FakeResponse(url, answer, self._chunk_bytes)
            waiter = asyncio.get_running_loop().create_future()
            self._live_waiters.append(waiter)
            await waiter


def granted_to(response: Response, origin: str | None) -> Response:
    """``response`` as an origin that grants CORS per requesting Origin would send it."""
    headers = [(n, v) for n, v in response.headers if n.lower() != "access-control-allow-origin"]
    if origin is not None:
        headers += [
            ("access-control-allow-origin", origin),
            ("access-control-allow-credentials", "true"),
        ]
    headers.append(("vary", "Origin"))
    return dataclasses.replace(response, headers=tuple(headers))
