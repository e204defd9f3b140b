"""Pass-through: relay one client request to the origin and its answer back, as it streams.

Rules this module owns:

* Bodies stream in both directions chunk by chunk; nothing is read whole into memory, and each
  chunk is written to the client as soon as it arrives (SSE and long-poll need that).
* The client sees the origin's status and headers verbatim (hop-by-hop aside, ``Via`` appended);
  aiohttp's own defaults (``Content-Type``, ``Server``) are not added where the origin sent none.
* Errors before the origin answered become a short plain-text 502/504. An error after the answer
  started aborts the client connection: a truncated body must never look complete.
* A client that goes away cancels the handler (the server runs with handler cancellation), and the
  upstream request is closed with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp
from aiohttp import hdrs, web

from edge.metrics import Metrics
from edge.origin import OriginClient, OriginError
from edge.protocol.headers import downstream_response_headers, upstream_request_headers
from edge.protocol.reads import RequestKind

log = logging.getLogger(__name__)

LIVE_KINDS = frozenset({RequestKind.LONG_POLL, RequestKind.SSE})

# (method, path, origin status, request headers, origin response headers) for every answer.
Observer = Callable[[str, str, int, Sequence[tuple[str, str]], Sequence[tuple[str, str]]], None]


def stream_path(request: web.Request) -> str:
    """The path as the client sent it (still percent-encoded): the stream's key, and what a
    cache fill sends upstream, so both name exactly the resource the client named."""
    return request.raw_path.partition("?")[0]


class RelayedResponse(web.StreamResponse):
    """A StreamResponse that keeps the origin's header set instead of aiohttp's defaults."""

    def __init__(self, *, status: int, reason: str | None, omit_defaults: frozenset[str]) -> None:
        super().__init__(status=status, reason=reason)
        self._omit_defaults = omit_defaults

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()
        # aiohttp fills in Content-Type and Server when absent; the origin's answer had neither.
        for name in self._omit_defaults:
            self.headers.popall(name, None)


@dataclass(frozen=True, kw_only=True, slots=True)
class Relay:
    origin: OriginClient
    metrics: Metrics
    observe: Observer | None = None

    async def forward(
        self, request: web.Request, kind: RequestKind, *, cache_status: str
    ) -> web.StreamResponse:
        client_headers = list(request.headers.items())
        headers = upstream_request_headers(
            client_headers,
            client_address=request.remote,
            scheme=request.scheme,
            host=request.host,
            http_version=f"{request.version.major}.{request.version.minor}",
        )
        body = request.content if request.body_exists else None
        try:
            upstream = await self.origin.open(
                request.method, request.raw_path, headers, body, live=kind in LIVE_KINDS
            )
        except OriginError as error:
            self.metrics.origin_errors.labels(reason=error.reason).inc()
            log.warning("origin error for %s %s: %s", request.method, request.raw_path, error)
            return origin_error_response(error)
        self.metrics.origin_requests.labels(kind=kind.value, code=str(upstream.status)).inc()
        if self.observe is not None:
            self.observe(
                request.method,
                stream_path(request),
                upstream.status,
                client_headers,
                list(upstream.headers.items()),
            )
        try:
            return await self._relay(request, upstream, cache_status)
        finally:
            # Closing (not releasing) drops the connection if the body was not read to the end,
            # which is what cancels the origin's work when the client has gone.
            if upstream.content.at_eof():
                upstream.release()
            else:
                upstream.close()

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse, cache_status: str
    ) -> web.StreamResponse:
        relayed = downstream_response_headers(
            list(upstream.headers.items()),
            origin_base=self.origin.base_url,
            public_base=f"{request.scheme}://{request.host}",
        )
        present = {name.lower() for name, _ in relayed}
        omit = frozenset(
            name for name in (hdrs.CONTENT_TYPE, hdrs.SERVER) if name.lower() not in present
        )
        response = RelayedResponse(
            status=upstream.status, reason=upstream.reason, omit_defaults=omit
        )
        for name, value in relayed:
            response.headers.add(name, value)
        response.headers.add("Cache-Status", cache_status)
        await response.prepare(request)
        try:
            async for chunk in OriginClient.body_chunks(upstream):
                self.metrics.origin_bytes.inc(len(chunk))
                await response.write(chunk)
                self.metrics.served_bytes.inc(len(chunk))
        except OriginError as error:
            self.metrics.origin_errors.labels(reason=error.reason).inc()
            log.warning("origin failed mid-body for %s: %s", request.raw_path, error)
            if request.transport is not None:
                request.transport.abort()
            return response
        await response.write_eof()
        return response


def origin_error_response(error: OriginError) -> web.Response:
    return web.Response(status=error.status, text=f"{error}\n")
