"""The handlers of plain catch-up reads and HEADs: parse, ask the catch-up front, answer.

Rules this module owns:

* A catch-up read is answered from the cache (``CatchupFront``); the origin is asked only for
  what the cache lacks. A read the cache does not answer (``Bypass``) is counted as a bypass,
  logged at INFO, and the client's own request is relayed with ``Cache-Status`` naming why
  (``detail=``) and without the origin's validators (its tags do not tell stream instances
  apart).
* Bytes fresh from the origin count in ``--fill-buffer-bytes`` until they are written: an
  answer that holds a share writes itself before the handler returns, and gives the share back
  whatever happens.
* A HEAD the edge knows all of is answered here; a conditional HEAD, or one from an ``Origin``
  whose CORS answer is unknown, is the origin's to judge.
"""

from __future__ import annotations

import logging
from typing import assert_never

from aiohttp import web
from multidict import CIMultiDict

from edge.answer import Answer, Bypass, Result
from edge.origin import OriginError
from edge.protocol.reads import Classified, Read, RequestKind
from edge.web.asked import Asked, origin_failed, to_response
from edge.web.front import CatchupRequest, Served, catchup_request
from edge.web.keys import CORS, FRONT, METRICS, RELAY
from edge.web.own_relay import bypass_relay
from edge.web.proxy import ClientGone, EdgeResponse

logger = logging.getLogger(__name__)


async def relay_bypass(
    request: web.Request, kind: RequestKind, bypass: Bypass
) -> web.StreamResponse:
    """The client's own request, relayed: the cache does not answer it (``bypass.why``)."""
    relayed = bypass_relay(bypass, kind)
    return await request.app[RELAY].forward(
        request, kind, cache_status=relayed.cache_status, validators=relayed.validators
    )


def front_request(request: web.Request, asked: Asked, read: Read, *, head: bool) -> CatchupRequest:
    return catchup_request(
        asked.target,
        read,
        asked.headers,
        version=asked.version,
        credentials=asked.credentials,
        reader_only=asked.reader_only,
        cors=request.app[CORS],
        head=head,
    )


async def serve_catchup(
    request: web.Request, asked: Asked, classified: Classified
) -> web.StreamResponse:
    """A catch-up read from the cache; the origin is asked only for what the cache lacks."""
    read = classified.read
    assert read is not None
    metrics = request.app[METRICS]
    try:
        outcome = await request.app[FRONT].answer(front_request(request, asked, read, head=False))
    except OriginError as error:
        return origin_failed(request, asked, error)
    match outcome:
        case Bypass() as bypass:
            logger.info("relaying without caching: %s", bypass)
            metrics.cache_result(Result.BYPASS.value).inc()
            return await relay_bypass(request, classified.kind, bypass)
        case Served(answer=answer, headers=headers):
            pass
        case _:
            assert_never(outcome)
    return await write_served(request, asked, answer, headers)


async def write_served(
    request: web.Request, asked: Asked, answer: Answer, headers: CIMultiDict[str]
) -> web.StreamResponse:
    """The catch-up front's answer, written (see the module rules on fresh bytes)."""
    request.app[METRICS].cache_result(answer.result.value).inc()
    response = to_response(request, asked, answer, headers)
    if answer.hold is None:
        return response
    # Bytes fresh from the origin count in --fill-buffer-bytes until they are written.
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionResetError as gone:
        raise ClientGone from gone
    finally:
        answer.hold.release()
    return response


async def serve_head(request: web.Request, asked: Asked, read: Read) -> web.StreamResponse | None:
    """A HEAD the edge answers itself, when it knows the whole stream (``CatchupCache.head``);
    None: the origin answers it. A conditional HEAD is the origin's to judge."""
    if "If-None-Match" in request.headers or request.app[CORS].unknown_for(asked.origin):
        return None
    known = await request.app[FRONT].head(front_request(request, asked, read, head=True))
    if known is None:
        return None
    request.app[METRICS].cache_result(known.answer.result.value).inc()
    return EdgeResponse(status=known.answer.status, headers=known.headers)
