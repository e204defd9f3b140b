"""The full path of a plain catch-up read, from request values to finished answer headers, with
no aiohttp in it: the web handler and the property machine (``tests/unit/test_properties.py``)
both drive this same glue.

Rules this module owns:

* ``catchup_request`` is where the full path classifies a catch-up read for reuse: the
  ``AnswerKey`` comes from ``edge.protocol.answer_key``, the function the fast path calls on
  its own parse of the same head, with the request's ``Accept-Encoding`` and ``Origin``.
* ``CatchupFront.answer`` asks the cache, finishes the headers in the one place
  (``edge.web.wire.client_headers``) and offers the answer to the fast path, which keeps it only
  if the policy's verdict and its derivation allow.
* A read whose CORS headers the edge cannot know (the origin's CORS varies by ``Origin`` and
  this ``Origin`` was never answered) is not the cache's: ``Bypass(CORS)`` sends it to the
  origin, whose answer teaches the edge.
* A read ends ``Served`` (the answer and its finished headers) or ``Bypass`` (why the client's
  own request goes to the origin); ``OriginError`` only when the origin failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from multidict import CIMultiDict

from edge.answer import Answer, Bypass, Why
from edge.catchup import CatchupCache
from edge.protocol.answer_key import AnswerKey, answer_key
from edge.protocol.headers import first_value, joined_value
from edge.protocol.paths import Target
from edge.protocol.reads import Read
from edge.web.fastpath import FastPath
from edge.web.proxy import OriginCors
from edge.web.wire import client_headers


@dataclass(frozen=True, kw_only=True, slots=True)
class Served:
    """The cache's answer to a read, with its finished headers."""

    answer: Answer
    headers: CIMultiDict[str]


@dataclass(frozen=True, kw_only=True, slots=True)
class CatchupRequest:
    read: Read
    key: AnswerKey | None  # None: an alias or non-ASCII target, never stored
    credentials: Sequence[tuple[str, str]]  # what the cache's fills send upstream
    if_none_match: str | None
    accept_encoding: str | None
    origin: str | None
    version: tuple[int, int]
    reader_only: bool  # an authorized reader's copy of a shared answer (made private)


def catchup_request(
    target: Target,
    read: Read,
    headers: Sequence[tuple[str, str]],
    *,
    version: tuple[int, int],
    credentials: Sequence[tuple[str, str]],
    reader_only: bool,
    cors: OriginCors,
    head: bool = False,
) -> CatchupRequest:
    # List-valued: every field line counts (RFC 9110 §5.3), as on the connection's own parse.
    accept_encoding = None if head else joined_value(headers, "accept-encoding")
    origin = first_value(headers, "origin")
    return CatchupRequest(
        read=read,
        key=answer_key(
            target.upstream.partition("?")[0],
            target.query,
            read.scope,
            accept_encoding,
            origin,
            cors.varies,
            head,
        ),
        credentials=credentials,
        if_none_match=joined_value(headers, "if-none-match"),
        accept_encoding=accept_encoding,
        origin=origin,
        version=version,
        reader_only=reader_only,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class CatchupFront:
    catchup: CatchupCache
    fast: FastPath
    cors: OriginCors

    async def answer(self, request: CatchupRequest) -> Served | Bypass:
        """The answer and its finished headers, or why the origin answers instead
        (``OriginError``: the origin failed)."""
        unknown = self._cors_unknown(request.origin)
        if unknown is not None:
            return unknown
        answer = await self.catchup.read(
            request.read,
            credentials=request.credentials,
            if_none_match=request.if_none_match,
            accept_encoding=request.accept_encoding,
        )
        if isinstance(answer, Bypass):
            return answer
        unknown = self._cors_unknown(request.origin)  # the fill itself may have shown it varies
        if unknown is not None:
            if answer.hold is not None:
                answer.hold.release()
            return unknown
        return self._served(request, answer)

    async def head(self, request: CatchupRequest) -> Served | None:
        """The edge's own answer to a HEAD, if it knows the whole stream; else None."""
        answer = await self.catchup.head(request.read)
        if answer is None:
            return None
        return self._served(request, answer)

    def _served(self, request: CatchupRequest, answer: Answer) -> Served:
        headers = client_headers(answer, self.cors, request.origin, reader_only=request.reader_only)
        self.fast.register(
            request.key, answer, headers, version=request.version, origin=request.origin,
            credentials=request.credentials,
        )  # fmt: skip
        return Served(answer=answer, headers=headers)

    def _cors_unknown(self, origin: str | None) -> Bypass | None:
        if self.cors.unknown_for(origin):
            return Bypass(why=Why.CORS, reason=f"no CORS answer known for Origin {origin!r}")
        return None
