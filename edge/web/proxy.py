"""Pass-through: relay one client request to the origin and its answer back, as it streams.

Rules this module owns:

* Bodies stream in both directions chunk by chunk; nothing is read whole into memory, and each
  chunk is written to the client as soon as it arrives (SSE and long-poll need that).
* The client sees the origin's status and headers verbatim (hop-by-hop aside, ``Via`` appended,
  a read's lifetime below);
  aiohttp's own defaults (``Content-Type``, ``Server``) are not added where the origin sent none.
* Errors before the origin answered become a short plain-text 502/504 that names nothing
  internal (the details go to the log). An error after the answer started aborts the client
  connection: a truncated body must never look complete.
* A client that goes away cancels the handler (the server runs with handler cancellation), and the
  upstream request is closed with it; one found gone while writing is ``ClientGone``.
* What goes upstream is ``Target.upstream``: the client's path and query as sent, even when the
  client used an absolute-form target (whose authority is never used). The stream a request is
  about, for the cache and for invalidation, is ``Target.stream``, the origin's normalised path.
* What is sent upstream (``Relay.open``: the headers, the observer, the counters) and the headers
  a relayed answer gets (``Relay.relayed_head``) are decided once, for both writers: aiohttp's
  (``forward``) and the connection's own (``edge.web.own_relay``).
* Every answer the edge makes itself (``edge_answer``) carries the CORS headers the origin gives
  a request with the same ``Origin`` (``OriginCors``), as the origin's own answers would.
* A relayed answer to a read keeps no lifetime of its own: it is ``no-store`` (``private,
  no-store`` with credentials) in every tier, whatever the origin said (a 404, a HEAD, a read
  with an unknown parameter, ``offset=now``, one too large to keep), except an event stream
  that says how it may be cached (``edge.protocol.headers.relayed_read_cache_control``).
* A request to the origin's control API (``RequestKind.CONTROL``) is relayed verbatim: its
  answer is about subscriptions, not about the stream its path may look like, so the observer
  (what relayed answers teach the cache: a DELETE or creating PUT forgets a stream, a 404 ends
  one) never hears it, and its own ``Cache-Control`` is kept (the JWKS's ``public,
  max-age=300``, PROTOCOL.md 6.5); a read answered with none gets ``no-store``, as above, so a
  CDN does not keep subscription state by default (PROTOCOL-NOTES 11).
* A read the cache relays instead of answering (``validators=False``) carries no validator
  either way: the origin's tags do not tell stream instances apart (a stream deleted and
  recreated reuses its offsets, hence its tags), so the origin's ``ETag`` is not handed out (the
  edge hands out no tag it cannot honour, as with a fill's relayed answer) and the client's
  ``If-None-Match`` is not sent up (the origin would answer 304 to a deleted stream's tag).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import aiohttp
from aiohttp import hdrs, web
from cachetools import LRUCache
from multidict import CIMultiDict

from edge.auth.gate import RequestAdmission
from edge.memory import TRIMMER
from edge.metrics import Metrics
from edge.origin import OriginClient, OriginError
from edge.protocol.headers import (
    CDN_LIFETIMES,
    cors_headers,
    downstream_response_headers,
    relayed_read_cache_control,
    upstream_request_headers,
    with_cache_control,
)
from edge.protocol.paths import Target, parse_target
from edge.protocol.reads import RequestKind

logger = logging.getLogger(__name__)

LIVE_KINDS = frozenset({RequestKind.LONG_POLL, RequestKind.SSE})
VALIDATORS = frozenset({"etag", "if-none-match"})


def without_validators(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """``headers`` with no ``ETag`` or ``If-None-Match`` (see the module rules)."""
    return [(name, value) for name, value in headers if name.lower() not in VALIDATORS]


# (method, path, origin status, request headers, origin response headers, the ticket taken
# when the request started) for every answer.
Observer = Callable[
    [str, str, int, Sequence[tuple[str, str]], Sequence[tuple[str, str]], int], Awaitable[None]
]


TARGET = web.RequestKey("target", Target)
# What the authorization gate allowed (edge.web.gatekeeper); absent with --auth none.
ADMISSION = web.RequestKey("admission", RequestAdmission)


def reader_only(request: web.Request) -> bool:
    """Whether this request's answer is its reader's alone: an authorized read's answer was
    served from the shared scope, but a cache downstream (a CDN, a browser's shared cache) must
    not give it to anyone else (``make_private``)."""
    admitted = request.get(ADMISSION)
    return admitted is not None and admitted.shared


def credentialed(request: web.Request) -> bool:
    """Does the request carry anything that names a reader (its answer is that reader's)?"""
    return reader_only(request) or any(
        name in request.headers for name in (hdrs.AUTHORIZATION, hdrs.COOKIE)
    )


def make_private(headers: CIMultiDict[str]) -> None:
    """Only the reader's own cache may keep the answer: ``private``, and no lifetime a CDN
    would take over ``Cache-Control`` (RFC 9213: a CDN honouring ``CDN-Cache-Control`` ignores
    ``Cache-Control``, and would share it)."""
    for name in CDN_LIFETIMES:
        headers.popall(name, None)
    value = headers.get(hdrs.CACHE_CONTROL)
    if value is None:
        return
    directives = [part.strip() for part in value.split(",") if part.strip()]
    lowered = {part.lower() for part in directives}
    if "no-store" in lowered or "private" in lowered:
        return
    kept = [part for part in directives if part.lower() != "public"]
    headers[hdrs.CACHE_CONTROL] = ", ".join(["private", *kept])


class ClientGone(Exception):
    """The client left while its answer was being written; nothing more can reach it."""


def request_target(request: web.Request) -> Target:
    """The request's target, parsed once (``BadTarget`` for one the edge refuses)."""
    target = request.get(TARGET)
    if target is None:
        target = parse_target(request.raw_path, request.method)
        request[TARGET] = target
    return target


def stream_path(request: web.Request) -> str:
    """The stream the request is about: the origin's normalised path, so every alias of a path
    (``/s/./x``, ``/s/a/../x``, ``/s/%2e/x``) is one stream for the cache, as for the origin."""
    return request_target(request).stream


def request_origin(request: web.Request) -> str | None:
    """The request's ``Origin``: whose CORS headers its answer carries (``OriginCors``)."""
    return request.headers.get(hdrs.ORIGIN)


def client_host(request: web.Request) -> str | None:
    """The host the client asked for, from ``Host``: never an absolute-form target's authority,
    which a client can set to anything and which must not steer ``Forwarded`` or ``Location``."""
    return request.headers.get(hdrs.HOST)


class OriginCors:
    """What the origin's CORS policy says for a request's ``Origin``, learned from its answers.

    CORS headers (``access-control-*``, ``x-content-type-options``,
    ``cross-origin-resource-policy``) are per request: an origin may grant one ``Origin`` and not
    another. So the edge keeps, per request ``Origin`` (None: a request without one), the CORS
    headers of the origin's latest answer to such a request that had any, in a bounded LRU,
    and whether the origin's policy **varies** by ``Origin``: once any answer said so
    (``Vary: Origin`` or ``*``, or an ``Access-Control-Allow-Origin`` other than ``*``).

    * While it does not vary, one policy holds for every request: the latest answer's.
    * Once it varies, a request gets only what the origin said for its own ``Origin``; for an
      ``Origin`` the edge has no word on, ``for_request`` is None: reads are then relayed (the
      origin's answer teaches the edge), and answers the edge makes itself carry no grant.
    * An answer without CORS headers (an injected fault, a proxy in between) teaches nothing.
    * Records are replaced only when they change: stored answers compare them by identity.
    """

    MAX_ORIGINS = 1024

    def __init__(self) -> None:
        self._static: tuple[tuple[str, str], ...] = ()
        self._by_origin: LRUCache[str | None, tuple[tuple[str, str], ...]] = LRUCache(
            maxsize=self.MAX_ORIGINS
        )
        self.varies = False

    def remember(self, request_origin: str | None, headers: Iterable[tuple[str, str]]) -> None:
        """The origin answered a request whose ``Origin`` was ``request_origin`` with
        ``headers``."""
        answer = list(headers)
        found = cors_headers(answer)
        if not found:
            return
        if not self.varies and varies_by_origin(answer):
            self.varies = True
        known = self._by_origin.get(request_origin)
        if known != found:
            self._by_origin[request_origin] = found
        if found != self._static:
            self._static = found

    def for_request(self, origin: str | None) -> tuple[tuple[str, str], ...] | None:
        """The CORS headers the origin gives a request with this ``Origin``; None: unknown."""
        if not self.varies:
            return self._static
        if origin is None:
            # No Origin: no browser reads it across origins; the edge's own fills send none.
            return self._by_origin.get(None, ())
        return self._by_origin.get(origin)

    def unknown_for(self, origin: str | None) -> bool:
        """Would an answer built here have to guess this request's CORS headers?"""
        return self.for_request(origin) is None

    def grant(self, origin: str | None) -> tuple[tuple[str, str], ...]:
        """The CORS headers of an answer to a request from ``origin`` (none where unknown)."""
        return self.for_request(origin) or ()

    def mark_vary(self, headers: CIMultiDict[str]) -> None:
        """``Vary: Origin`` on an answer, when the policy varies by it and it is not named yet."""
        mark_vary(headers, self.varies)

    def add_missing(self, headers: CIMultiDict[str], origin: str | None) -> None:
        """Add the CORS headers for ``origin`` that ``headers`` does not already have, and
        ``Vary: Origin`` when the policy varies by it."""
        present = {name.lower() for name in headers}
        for name, value in self.grant(origin):
            if name.lower() not in present:
                headers.add(name, value)
        self.mark_vary(headers)


def mark_vary(headers: CIMultiDict[str], varies: bool) -> None:
    """``Vary: Origin`` on an answer, when a policy that ``varies`` by it applies and the answer
    does not name it yet."""
    if varies and not _vary_names_origin(headers.items()):
        headers.add(hdrs.VARY, "Origin")


def _vary_names_origin(headers: Iterable[tuple[str, str]]) -> bool:
    return any(
        token.strip().lower() in ("origin", "*")
        for name, value in headers
        if name.lower() == "vary"
        for token in value.split(",")
    )


def varies_by_origin(headers: Sequence[tuple[str, str]]) -> bool:
    """Does this answer show CORS that depends on the request's ``Origin``?"""
    return _vary_names_origin(headers) or any(
        name.lower() == "access-control-allow-origin" and value.strip() != "*"
        for name, value in headers
    )


def without_cors(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """``headers`` without CORS headers: those are the request's (``OriginCors``)."""
    cors = {name.lower() for name, _ in cors_headers(list(headers))}
    return [(n, v) for n, v in headers if n.lower() not in cors]


async def answer_http10_as_http11(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """An HTTP/1.0 request is answered as an HTTP/1.1 server answers it (RFC 9110 §2.5: the
    highest version the server conforms to): an ``HTTP/1.1`` status line, the connection
    closed after it (``Connection: close``: RFC 9112 §9.3 leaves HTTP/1.0 keep-alive to the
    server), a body of unknown length written to the close (aiohttp framed it so for the
    request's version, just before). The connection's own answers follow the same rule
    (``edge.protocol.http1.RequestHead.http10``). aiohttp's ``on_response_prepare`` signal,
    between its framing and its status line: the status line is written with
    ``request.version``, read from the request's reify cache (aiohttp 3.x;
    ``tests/integration/test_own_heads.py`` pins it)."""
    if request.version >= aiohttp.HttpVersion11:
        return
    response.force_close()
    response.headers[hdrs.CONNECTION] = "close"
    # ``BaseRequest.version`` is reified: its cached value is what the status line reads.
    request._cache["version"] = aiohttp.HttpVersion11


class EdgeResponse(web.Response):
    """An answer the edge made itself; like relayed ones, it carries no aiohttp ``Server``."""

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()
        self.headers.popall("Server", None)


class EdgeStreamResponse(web.StreamResponse):
    """A streamed answer the edge made itself (SSE): no aiohttp ``Server`` either."""

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()
        self.headers.popall("Server", None)


def edge_answer(
    status: int,
    text: str,
    cors: OriginCors,
    headers: Sequence[tuple[str, str]] = (),
    *,
    origin: str | None,
) -> EdgeResponse:
    """A short plain-text answer of the edge's own, with the CORS headers the origin gives a
    request from ``origin`` (the request's ``Origin`` header)."""
    response = EdgeResponse(status=status, text=text + "\n", headers=CIMultiDict(headers))
    cors.add_missing(response.headers, origin)
    return response


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
class RelayAsk:
    """What a relayed request is, as values: the same for aiohttp's handler (``ask_of``) and
    the connection's own relay (``edge.web.own_relay``)."""

    method: str
    target: Target
    headers: Sequence[tuple[str, str]]  # the client's, every one (an admitted read's already
    # carrying the edge's credential)
    client_address: str | None
    scheme: str
    host: str | None  # from ``Host`` (``client_host``)
    version: tuple[int, int]
    credentialed: bool  # it names a reader (``credentialed``)
    reader_only: bool  # an authorized reader's copy of a shared answer (``reader_only``)


def ask_of(request: web.Request) -> RelayAsk:
    """``request`` as the relay sees it."""
    client_headers = list(request.headers.items())
    admitted = request.get(ADMISSION)
    if admitted is not None:
        # An authorized read goes with the edge's credential, a write with the client's.
        client_headers = admitted.relay_headers(client_headers)
    return RelayAsk(
        method=request.method, target=request_target(request), headers=client_headers,
        client_address=request.remote, scheme=request.scheme, host=client_host(request),
        version=(request.version.major, request.version.minor),
        credentialed=credentialed(request), reader_only=reader_only(request),
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class Relay:
    origin: OriginClient
    metrics: Metrics
    cors: OriginCors
    observe: Observer | None = None
    # Orders origin exchanges (``Tickets.ticket``): what the edge knew before a request started
    # is what its answer can contradict.
    ticket: Callable[[], int] = lambda: 0

    async def forward(
        self,
        request: web.Request,
        kind: RequestKind,
        *,
        cache_status: str,
        validators: bool = True,
    ) -> web.StreamResponse:
        """Relay ``request`` and its answer; ``validators=False`` for a read the cache relays
        instead of answering (see the module rules)."""
        ask = ask_of(request)
        body = request.content if request.body_exists else None
        try:
            upstream = await self.open(ask, kind, validators=validators, body=body)
        except OriginError as error:
            return origin_error_response(error, self.cors, request_origin(request))
        try:
            return await self._relay(request, ask, upstream, kind, cache_status, validators)
        finally:
            self.close(upstream)

    async def open(
        self,
        ask: RelayAsk,
        kind: RequestKind,
        *,
        validators: bool,
        body: aiohttp.StreamReader | None = None,
    ) -> aiohttp.ClientResponse:
        """Send ``ask`` to the origin and tell the observer what its answer says; an
        ``OriginError`` (counted and logged) when the origin did not answer. The caller
        ``close``s the answer."""
        headers = upstream_request_headers(
            ask.headers if validators else without_validators(ask.headers),
            client_address=ask.client_address,
            scheme=ask.scheme,
            host=ask.host,
            http_version=f"{ask.version[0]}.{ask.version[1]}",
        )
        started = self.ticket()
        target = ask.target
        try:
            upstream = await self.origin.open(
                ask.method, target.upstream, headers, body, live=kind in LIVE_KINDS
            )
        except OriginError as error:
            self.metrics.origin_errors.labels(reason=error.reason).inc()
            logger.warning("origin error for %s %r: %s", ask.method, target.upstream, error)
            raise
        self.metrics.origin_requests.labels(kind=kind.value, code=str(upstream.status)).inc()
        if self.observe is not None and kind is not RequestKind.CONTROL:
            await self.observe(
                ask.method,
                target.stream,
                upstream.status,
                ask.headers,
                list(upstream.headers.items()),
                started,
            )
        return upstream

    @staticmethod
    def close(upstream: aiohttp.ClientResponse) -> None:
        """Closing (not releasing) drops the connection if the body was not read to the end,
        which is what cancels the origin's work when the client has gone."""
        if upstream.content.at_eof():
            upstream.release()
        else:
            upstream.close()

    def relayed_head(
        self,
        ask: RelayAsk,
        upstream: aiohttp.ClientResponse,
        kind: RequestKind,
        cache_status: str,
        *,
        validators: bool,
    ) -> CIMultiDict[str]:
        """The headers of the origin's answer to ``ask`` as relayed (see the module rules),
        for whichever writer writes it: aiohttp's (``forward``) or the connection's own."""
        answered = list(upstream.headers.items())
        relayed = downstream_response_headers(
            answered if validators else without_validators(answered),
            origin_base=self.origin.base_url,
            # Without a Host, a Location is rebased to a path: relative to what the client used.
            public_base=f"{ask.scheme}://{ask.host}" if ask.host else "",
        )
        control = relayed_read_cache_control(
            relayed, method=ask.method, private=ask.credentialed,
            event_stream=kind is RequestKind.SSE, control=kind is RequestKind.CONTROL,
        )  # fmt: skip
        if control is not None:
            relayed = with_cache_control(relayed, control)
        headers: CIMultiDict[str] = CIMultiDict(relayed)
        if ask.reader_only:
            # An authorized read's answer is its reader's alone (``reader_only``).
            make_private(headers)
        headers.add("Cache-Status", cache_status)
        return headers

    async def _relay(
        self,
        request: web.Request,
        ask: RelayAsk,
        upstream: aiohttp.ClientResponse,
        kind: RequestKind,
        cache_status: str,
        validators: bool,
    ) -> web.StreamResponse:
        headers = self.relayed_head(ask, upstream, kind, cache_status, validators=validators)
        # aiohttp fills in Content-Type and Server when absent; the origin's answer had neither.
        omit = frozenset(name for name in (hdrs.CONTENT_TYPE, hdrs.SERVER) if name not in headers)
        response = RelayedResponse(
            status=upstream.status, reason=upstream.reason, omit_defaults=omit
        )
        response.headers.extend(headers)
        try:
            await response.prepare(request)
            async for chunk in OriginClient.body_chunks(upstream):
                self.metrics.origin_bytes.inc(len(chunk))
                await response.write(chunk)
                self.metrics.served_bytes.inc(len(chunk))
                TRIMMER.passed(len(chunk))
            await response.write_eof()
        except ConnectionResetError as gone:
            raise ClientGone from gone
        except OriginError as error:
            self.metrics.origin_errors.labels(reason=error.reason).inc()
            logger.warning("origin failed mid-body for %r: %s", ask.target.upstream, error)
            if request.transport is not None:
                request.transport.abort()
        return response


def origin_error_response(error: OriginError, cors: OriginCors, origin: str | None) -> EdgeResponse:
    """The client's view of an origin failure: a fixed text; the details are for the log. True
    of this moment only: no cache downstream keeps it (a CDN would otherwise keep a 502 or 504
    that has no Cache-Control by its own defaults)."""
    no_store = [("Cache-Control", "no-store")]
    return edge_answer(error.status, error.public_text, cors, no_store, origin=origin)
