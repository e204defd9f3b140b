"""What the read handlers use of one request, derived once, and the answers they give with it.

Rules this module owns:

* A request's values (its target, ``Origin``, whether its answer is its reader's alone, the
  credentials the cache's origin requests carry) are derived once, after the authorization gate
  decided (the gate takes its token parameters out of the target and may put the edge's own
  credential in the reader's place), into one ``Asked`` handed to every handler.
* The cache's own origin requests carry exactly the credentials the configured
  ``--scope-headers``/``--scope-cookies`` give (``asked_of``); for a read the edge
  authorized, the edge's own ``--origin-header`` instead.
* Every answer the edge builds counts its body in ``edge_served_bytes_total``; an origin
  failure is counted by its reason and logged with the target.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDict

from edge.answer import Answer
from edge.auth.gate import RequestAdmission
from edge.config import Settings
from edge.origin import OriginError
from edge.protocol.paths import Target
from edge.protocol.reads import scope_credentials
from edge.web.keys import CORS, METRICS
from edge.web.proxy import (
    EdgeResponse,
    origin_error_response,
)
from edge.web.wire import client_headers

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class Asked:
    target: Target  # without token parameters
    origin: str | None  # the request's Origin: whose CORS headers its answer carries
    reader_only: bool  # an authorized reader's copy of a shared answer (made private)
    credentials: tuple[tuple[str, str], ...]  # what the cache's origin requests send upstream
    headers: tuple[tuple[str, str], ...]
    version: tuple[int, int]
    expires_at: float | None  # wall clock: a live read on the gate's credential ends by then


def asked_of(
    request: web.Request,
    settings: Settings,
    *,
    target: Target,
    origin: str | None,
    admitted: RequestAdmission | None,
) -> Asked:
    """``request``'s values, once the gate (if any) ``admitted`` it, from what the caller has
    already read of it: its ``target`` (without token parameters) and its ``Origin``.

    Its credentials are what a cache fill or a live tail sends upstream for its scope: the
    configured credential headers, the Cookie cut down to the configured cookies; for a shared
    read the edge authorized, the edge's own ``--origin-header`` instead, and its answer is
    made private (``edge.web.proxy.reader_only``)."""
    shared = admitted is not None and admitted.shared
    if admitted is not None and shared:
        credentials = admitted.upstream
    else:
        credentials = tuple(
            scope_credentials(
                request.headers.items(),
                scope_headers=settings.scope_headers,
                scope_cookies=settings.scope_cookies,
            )
        )
    return Asked(
        target=target,
        origin=origin,
        reader_only=shared,
        credentials=credentials,
        headers=tuple(request.headers.items()),
        version=(request.version.major, request.version.minor),
        expires_at=admitted.expires_at if admitted is not None else None,
    )


def to_response(
    request: web.Request, asked: Asked, answer: Answer, headers: CIMultiDict[str] | None = None
) -> web.Response:
    if headers is None:
        headers = client_headers(
            answer, request.app[CORS], asked.origin, reader_only=asked.reader_only
        )
    request.app[METRICS].served_bytes.inc(len(answer.body))
    return EdgeResponse(status=answer.status, body=answer.body, headers=headers)


def origin_failed(request: web.Request, asked: Asked, error: OriginError) -> web.Response:
    request.app[METRICS].origin_errors.labels(reason=error.reason).inc()
    logger.warning("origin error for %s %r: %s", request.method, asked.target.upstream, error)
    return origin_error_response(error, request.app[CORS], asked.origin)
