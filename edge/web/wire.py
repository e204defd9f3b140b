"""An edge answer as HTTP/1.1 bytes, for direct writes (long-polls released together), and the
response a handler returns once its answer is written.

Rules this module owns:

* ``client_headers`` is the one place an ``Answer`` gets the headers every client sees
  (``Cache-Status``, ``Via``, the CORS headers the origin gives this request's ``Origin``, and
  last an at-tail answer's ``Age``):
  ``to_response`` and ``encode`` both use it, so a written answer and a returned one cannot
  drift apart.
* ``encode`` writes exactly what aiohttp writes for ``EdgeResponse(answer)`` to a GET (the test
  ``tests/unit/test_wire.py`` compares the two byte for byte on a real aiohttp server, so an
  aiohttp upgrade that changes its framing fails there): after the answer's headers,
  ``Content-Length`` (none on 204/304 and 1xx), a default ``Content-Type`` for a body without
  one, ``Date``, no ``Server``, and ``Connection`` as the request's version and keep-alive ask.
  Header values with control characters are refused (``ValueError``), as aiohttp refuses them.
* ``encode_served`` is the same for an answer whose headers the catch-up front finished (the
  connection's own catch-up answers, ``edge.web.fast_catchup``).
* ``AlreadyWrittenResponse`` completes a request whose answer is on the wire already, through
  aiohttp's public response interface (``prepare``, ``write_eof``, ``keep_alive``): it writes
  nothing, and keeps the connection open exactly when the written bytes said so.
"""

from __future__ import annotations

import time

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from multidict import CIMultiDict

from edge.answer import Answer
from edge.live.polls import AlreadyWritten, Framing
from edge.protocol.headers import VIA_PSEUDONYM, default_cache_control
from edge.protocol.http1 import bodiless, date_line, serialise, trailer
from edge.web.proxy import OriginCors, make_private, without_cors

VIA = f"1.1 {VIA_PSEUDONYM}"


def client_headers(
    answer: Answer, cors: OriginCors, origin: str | None, *, reader_only: bool = False
) -> CIMultiDict[str]:
    """The headers of ``answer`` to a request whose ``Origin`` was ``origin``.
    ``reader_only``: an authorized reader's answer from the shared scope, made ``private``
    (``edge.web.proxy.reader_only``). CORS headers are the request's own: whatever an
    origin answer the edge built this from said to its own request is dropped. They go first,
    where the origin puts them (it sets them before routing)."""
    headers = CIMultiDict(cors.grant(origin))
    headers.extend(without_cors(answer.headers))
    # A relayed refusal (404, 410) or answer without one: a cache downstream must not keep it.
    control = default_cache_control(answer.headers, method="GET", private=reader_only)
    if control is not None:
        headers.add("Cache-Control", control)
    headers.add("Cache-Status", answer.cache_status)
    headers.add("Via", VIA)
    if reader_only:
        make_private(headers)
    cors.mark_vary(headers)
    if answer.age_seconds is not None:
        # Last, where the hit path splices in each hit's own (``edge.web.fastpath``).
        headers.add("Age", str(answer.age_seconds))
    return headers


def encode(answer: Answer, framing: Framing, *, cors: OriginCors) -> bytes:
    """The whole HTTP response to a GET answered with ``answer``."""
    headers = client_headers(answer, cors, framing.origin, reader_only=framing.reader_only)
    body = b"" if bodiless(answer.status) else answer.body
    head = serialise(answer.status, list(headers.items()), len(body), version=framing.version)
    return b"".join(
        (head, date_line(int(time.time())), trailer(framing.version, framing.keep_alive), body)
    )


def encode_served(answer: Answer, headers: CIMultiDict[str], *, keep_alive: bool) -> bytes:
    """The whole HTTP/1.1 response to a GET answered with ``answer`` and its finished
    ``headers`` (``client_headers``'), as aiohttp writes ``EdgeResponse(answer, headers)``."""
    body = b"" if bodiless(answer.status) else answer.body
    head = serialise(answer.status, list(headers.items()), len(body))
    return b"".join((head, date_line(int(time.time())), trailer((1, 1), keep_alive), body))


class AlreadyWrittenResponse(web.StreamResponse):
    """The response of a request whose answer was written to its socket directly."""

    def __init__(self, written: AlreadyWritten) -> None:
        super().__init__(status=written.status)
        self._written_keep_alive = written.keep_alive

    @property
    def keep_alive(self) -> bool:
        return self._written_keep_alive

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        return None  # the status line, headers and body are on the wire already

    async def write_eof(self, data: bytes = b"") -> None:
        assert not data
