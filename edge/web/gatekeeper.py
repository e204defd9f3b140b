"""The web side of ``edge.auth``: ask the gate once per request, keep its answer on the request.

Rules this module owns:

* ``admit`` is the one call at the top of stream request handling, made when there is a gate
  (``--auth jwt|forward``): a refusal response, or the ``RequestAdmission`` (whose target is
  the one without ``token`` parameters), also kept on the request for the live hub and the
  relay.
* A refusal is the edge's own answer: the status, ``WWW-Authenticate`` where it applies, the
  origin's CORS headers (a browser must be able to read it), ``Cache-Control: no-store``, and a
  short reason; or, in forward mode, the auth service's body and headers.
"""

from __future__ import annotations

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


async def admit(
    request: web.Request, gate: Gate, cors: OriginCors
) -> web.StreamResponse | RequestAdmission:
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
    return decision


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
