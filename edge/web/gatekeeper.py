"""The web side of ``edge.auth``: ask the gate once per request, keep its answer on the request.

Rules this module owns:

* ``admit`` is the one call at the top of stream request handling: a refusal response, or
  None with the request's target replaced by the one without ``token`` parameters and the
  ``RequestAdmission`` kept on the request for the cache, the live hub and the relay.
* A refusal is the edge's own answer: the status, ``WWW-Authenticate`` where it applies, the
  origin's CORS headers (a browser must be able to read it), ``Cache-Control: no-store``, and a
  short reason; or, in forward mode, the auth service's body and headers.
"""

from __future__ import annotations

import time

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from multidict import CIMultiDict

from edge.auth.credentials import strip_token
from edge.auth.gate import Client, Gate, RequestAdmission
from edge.auth.policy import Refusal
from edge.web.proxy import (
    ADMISSION,
    TARGET,
    EdgeResponse,
    OriginCors,
    client_host,
    request_origin,
    request_target,
)

GATE = web.AppKey("gate", Gate)


async def admit(request: web.Request, cors: OriginCors) -> web.StreamResponse | None:
    gate = request.app.get(GATE)
    if gate is None:
        return None
    decision = await gate.admit(
        Client(
            method=request.method,
            target=request_target(request),
            headers=list(request.headers.items()),
            host=client_host(request),
            scheme=request.scheme,
            address=request.remote,
        )
    )
    if isinstance(decision, Refusal):
        return refusal_response(decision, cors, request_origin(request))
    request[TARGET] = decision.target
    request[ADMISSION] = decision
    return None


def refusal_response(refusal: Refusal, cors: OriginCors, origin: str | None) -> web.Response:
    headers: CIMultiDict[str] = CIMultiDict(refusal.headers)
    challenge = refusal.www_authenticate()
    if challenge is not None and "WWW-Authenticate" not in headers:
        headers["WWW-Authenticate"] = challenge
    headers["Cache-Control"] = "no-store"
    if refusal.body is not None:
        response = EdgeResponse(status=refusal.status, body=refusal.body, headers=headers)
    else:
        response = EdgeResponse(status=refusal.status, text=refusal.reason + "\n", headers=headers)
    if refusal.status == 503:
        response.headers["Retry-After"] = "1"
    cors.add_missing(response.headers, origin)
    return response


def admission(request: web.Request) -> RequestAdmission | None:
    return request.get(ADMISSION)


def reader_scope(request: web.Request) -> str | None:
    """The scope an authorized read is served from (its policy's); None: as classified."""
    admitted = request.get(ADMISSION)
    return admitted.scope if admitted is not None else None


def shared_credentials(request: web.Request) -> list[tuple[str, str]] | None:
    """What the edge's own origin requests carry for an authorized read (``--origin-header``)."""
    admitted = request.get(ADMISSION)
    return list(admitted.upstream) if admitted is not None and admitted.shared else None


def seconds_left(request: web.Request) -> float | None:
    """How long a live read may still run on this request's credential."""
    admitted: RequestAdmission | None = request.get(ADMISSION)
    if admitted is None or admitted.expires_at is None:
        return None
    return max(0.0, admitted.expires_at - time.time())


class TokenFreeAccessLog(AbstractAccessLogger):
    """The DEBUG access log, with every ``token`` query parameter cut out of the logged target
    (aiohttp's own ``%r`` would write bearer tokens into the logs)."""

    def log(self, request: BaseRequest, response: web.StreamResponse, time: float) -> None:
        path, sep, query = request.raw_path.partition("?")
        if sep:
            query = strip_token(query)[0]
            path = f"{path}?{query}" if query else path
        self.logger.debug(
            '%s "%s %s" %d %.3fs', request.remote, request.method, path, response.status, time
        )
