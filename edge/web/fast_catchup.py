"""Catch-up reads the stored hits do not answer, served by the stream listener's own connection
protocol: the same catch-up front as the full path, without aiohttp.

Rules this module owns:

* A plain catch-up ``GET`` (not a HEAD) is the connection's when its target is one the full
  path would cache (``parse_target`` accepts it and
  ``classify`` makes it a plain catch-up read at an offset other than ``now``). The answer is
  ``CatchupFront.answer``'s, the full path's own glue, with the request values the full path
  reads from the same head (``catchup_request``), written as aiohttp writes ``EdgeResponse``
  (``edge.web.wire.encode_served``). With ``--auth jwt|forward`` only once the gate allowed it
  (``edge.web.own_gate``), with that admission's values as the full path takes them
  (``edge.web.asked.asked_of``): its target without ``token`` parameters, the policy's scope,
  the edge's own credential upstream, an answer ``private`` to its reader.
* What the cache does not answer (``Bypass``), an origin failure, and an answer whose headers
  carry the origin's ``Date`` are handed on (``HandOn``), nothing having been written: the
  connection's own relay (``edge.web.own_relay``) relays or writes them as the full path does,
  and counts them (with ``--auth``, with the admission the gate gave the read).
* Bytes fresh from the origin count in ``--fill-buffer-bytes`` until written: the share is
  given back once the transport has taken them (or the client left).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol, assert_never

from edge.answer import Bypass
from edge.auth.gate import RequestAdmission
from edge.config import Settings
from edge.metrics import Metrics
from edge.origin import OriginError
from edge.protocol.http1 import RequestHead
from edge.protocol.paths import BadTarget, parse_target
from edge.protocol.reads import NOW, RequestKind, classify, scope_credentials
from edge.web.fast_polls import HANDED_OFF, Done, Ending, HandedOff, HandOn, written
from edge.web.fast_sse import Streaming
from edge.web.front import CatchupFront, CatchupRequest, Served, catchup_request
from edge.web.proxy import OriginCors
from edge.web.wire import encode_served

logger = logging.getLogger(__name__)


class AnswerConnection(Protocol):
    def send(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


CatchupStep = Streaming | HandedOff


class FastCatchup:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        front: CatchupFront,
        cors: OriginCors,
        *,
        gated: bool,
    ) -> None:
        self.enabled = settings.fast_path
        self._gated = gated
        self._settings = settings
        self._metrics = metrics
        self._front = front
        self._cors = cors

    def serve(
        self,
        head: RequestHead,
        raw: bytes,
        connection: AnswerConnection,
        done: Done,
        admission: RequestAdmission | None = None,
    ) -> CatchupStep:
        """Serve the catch-up ``head`` (``raw``: its bytes, handed to the full path if it must
        answer after all). With ``--auth``, ``admission`` is the gate's yes to it (None: the
        full path's): its target without token parameters, its policy's scope, the edge's own
        credential upstream, an answer for its reader alone."""
        if head.head or "live=" in head.query or (self._gated and admission is None):
            return HANDED_OFF
        if admission is not None:
            target = admission.target
        else:
            target_text = head.path + ("?" + head.query if head.query else "")
            try:
                target = parse_target(target_text, "GET")
            except BadTarget:
                return HANDED_OFF  # the full path's 400
        settings = self._settings
        classified = classify(
            "GET", target.stream, target.query, head.credentials,
            scope_headers=settings.scope_headers, scope_cookies=settings.scope_cookies,
            scope=admission.scope if admission is not None else None,
        )  # fmt: skip
        read = classified.read
        if (
            classified.kind is not RequestKind.CATCHUP
            or read is None
            or not read.plain
            or read.offset == NOW
        ):
            return HANDED_OFF
        sent = [
            (name, value)
            for name, value in (
                ("accept-encoding", head.accept_encoding),
                ("origin", head.origin),
                ("if-none-match", head.if_none_match),
            )
            if value is not None
        ]
        shared = admission is not None and admission.shared
        credentials = (
            admission.upstream
            if admission is not None and shared
            else scope_credentials(
                head.credentials, scope_headers=settings.scope_headers,
                scope_cookies=settings.scope_cookies,
            )
        )  # fmt: skip
        request = catchup_request(
            target, read, sent, version=(1, 1), credentials=credentials, reader_only=shared,
            cors=self._cors,
        )  # fmt: skip
        task = asyncio.get_running_loop().create_task(
            self._answer(request, head, admission, raw, connection, done)
        )
        return Streaming(task)

    async def _answer(
        self,
        request: CatchupRequest,
        head: RequestHead,
        admission: RequestAdmission | None,
        raw: bytes,
        connection: AnswerConnection,
        done: Done,
    ) -> None:
        metrics = self._metrics
        keep_alive = head.keep_alive
        ended: Ending | HandOn = Ending.CUT
        try:
            # Heads that arrived together after the tail moved each began here; the first to
            # run stored the answer, and the rest are hits of it, not answers built again.
            try:
                stored = self._front.fast.answer(head, admission, raw)
            except Exception:
                # As on the connection's own first try: a fault of the fast path costs the
                # client nothing; its answer is built as if nothing were stored.
                logger.exception("the fast path failed; the catch-up answer is built instead")
                stored = None
            if stored is not None:
                for part in stored:
                    connection.send(part)
                ended = written(keep_alive)
                return
            try:
                outcome = await self._front.answer(request)
            except OriginError as error:
                ended = HandOn(raw, error)  # the full path answers the failure as ever
                return
            match outcome:
                case Bypass():
                    ended = HandOn(raw, outcome)  # relayed by the full path, and counted
                    return
                case Served(answer=answer, headers=headers):
                    pass
                case _:
                    assert_never(outcome)
            try:
                data = encode_served(answer, headers, keep_alive=keep_alive)
            except ValueError:
                # Headers aiohttp writes its own way (a relayed answer's Date): it writes
                # this one, and gives its fill share back.
                ended = HandOn(raw, outcome)
                return
            metrics.cache_result(answer.result.value).inc()
            metrics.request_count(RequestKind.CATCHUP, answer.status).inc()
            metrics.served_bytes.inc(len(answer.body))
            try:
                connection.send(data)
                if answer.hold is not None:
                    await connection.drain()
            except ConnectionError:
                metrics.client_gone(RequestKind.CATCHUP).inc()
                return
            finally:
                if answer.hold is not None:
                    answer.hold.release()
            ended = written(keep_alive)
        except Exception:
            logger.exception("a catch-up answer failed; its connection is cut")
            ended = Ending.CUT
        finally:
            done(ended)
