"""The ``--auth jwt|forward`` gate before the reads a connection serves itself: the same
decision, by the gate's own code, with the same answers to a refusal, as the full path's
(``edge.web.gatekeeper``).

Rules this module owns:

* A head the connection parsed is decided once, before any read of its own: by
  ``Gate.decide_now`` when the gate needs no wait (remembered per method, target as sent and
  credential headers, exactly as the hit path asks it, so both share one memo); otherwise
  (``UNDECIDED``: forward mode's auth service, a key set to fetch) by ``Gate.admit`` in a task
  of the connection's, with the ``Client`` the full path gives: its ``Host`` re-read from the
  raw head (``header_value``; the parser keeps only what the gate reads on every request) and
  the peer's address as aiohttp reports it (``request.remote``).
* A target the edge refuses (``BadTarget``) is the full path's 400, decided by nobody here.
* A refusal is the full path's answer byte for byte (``refusal_response``, serialised as
  aiohttp writes an ``EdgeResponse``; to a HEAD, without its body), counted as the full path
  counts it: ``edge_requests_total`` by the kind of the request as sent and
  ``edge_auth_decisions_total``. A refusal whose headers only aiohttp writes (``ValueError``)
  is the full path's (nothing of it was written).
* An admission decided now is counted allowed when the connection serves the read
  (``served``); one ``Gate.admit`` made is counted by it. The admission goes with the read
  to whatever finishes it on the connection, its own relay included (``edge.web.own_relay``),
  so it is decided once; only a read the connection hands to aiohttp after all (one its own
  paths and relay do not serve) is decided and counted there again.
* Counting is plain integers here, folded into the Prometheus counters at scrape time.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable

from edge.auth.gate import Client, Gate, RequestAdmission
from edge.auth.policy import Refusal
from edge.metrics import Metrics
from edge.protocol.http1 import RequestHead, date_line, header_value, serialise, trailer
from edge.protocol.paths import MEMO_ENTRIES, BadTarget, Target, parse_target
from edge.protocol.reads import RequestKind, classify
from edge.web.gatekeeper import refusal_response
from edge.web.proxy import OriginCors


class Undecided:
    """Only a wait decides it (``Gate.admit``)."""


UNDECIDED = Undecided()


class BadHead:
    """A target the edge refuses: the full path answers 400."""


BAD_HEAD = BadHead()

Decision = RequestAdmission | Refusal | Undecided | BadHead


def peer_address(transport: asyncio.BaseTransport) -> str | None:
    """The client's address as aiohttp's ``request.remote`` gives it."""
    peername = transport.get_extra_info("peername")
    if peername is None:
        return None
    if isinstance(peername, (list, tuple)):
        return str(peername[0])
    return str(peername)


def target_of(head: RequestHead) -> Target:
    """The head's target as the full path parses it (``BadTarget`` for one it refuses)."""
    return _target(head.path, head.query)


@functools.lru_cache(maxsize=MEMO_ENTRIES)
def _target(path: str, query: str) -> Target:
    # Remembered: an audience sends the same targets again and again (a refusal is not kept).
    return parse_target(path + ("?" + query if query else ""), "GET")


class OwnGate:
    def __init__(
        self,
        gate: Gate,
        cors: OriginCors,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._gate = gate
        self._cors = cors
        self._clock = clock
        # Plain counters, folded into the Prometheus ones at scrape time.
        self.allowed = 0
        self.refused: dict[tuple[RequestKind, int, str], int] = {}  # (kind, status, result)
        self._folded_allowed = 0
        self._folded_refused: dict[tuple[RequestKind, int, str], int] = {}

    def decide_now(self, head: RequestHead) -> Decision:
        """The gate's decision on ``head`` when it needs no wait (see the module rules)."""
        try:
            target = target_of(head)
        except BadTarget:
            return BAD_HEAD
        decided = self._gate.decide_now(self._client(head, target), remember=True)
        return UNDECIDED if decided is None else decided

    async def admit(
        self, head: RequestHead, raw: bytes, transport: asyncio.BaseTransport
    ) -> RequestAdmission | Refusal:
        """The decision only a wait makes, asked as the full path asks it (and counted by the
        gate). ``raw``: the head's bytes, for what the full path's ``Client`` carries besides
        the credentials."""
        client = self._client(
            head, target_of(head), host=header_value(raw, b"host"),
            address=peer_address(transport),
        )  # fmt: skip
        return await self._gate.admit(client)

    def _client(
        self, head: RequestHead, target: Target, *, host: str | None = None,
        address: str | None = None,
    ) -> Client:  # fmt: skip
        return Client(
            method="HEAD" if head.head else "GET", target=target, headers=head.credentials,
            host=host, scheme="http", address=address,
        )  # fmt: skip

    def served(self) -> None:
        """An admission decided now served a read of the connection's."""
        self.allowed += 1

    def refusal(self, refusal: Refusal, head: RequestHead, *, counted: bool) -> bytes | None:
        """The full path's answer to ``head`` refused by the gate, counted as it counts it
        (``counted``: the gate counted its decision already); None: the full path's to write."""
        response = refusal_response(refusal, self._cors, head.origin)
        body = response.body
        assert isinstance(body, bytes)
        try:
            start = serialise(response.status, list(response.headers.items()), len(body))
        except ValueError:
            return None
        target = target_of(head)
        method = "HEAD" if head.head else "GET"
        kind = classify(method, target.stream, target.query, ()).kind
        key = (kind, refusal.status, "" if counted else refusal.result)
        self.refused[key] = self.refused.get(key, 0) + 1
        now = int(self._clock())
        # A HEAD's answer is the GET's head, its Content-Length included, without the body.
        ending = b"" if head.head else body
        return b"".join((start, date_line(now), trailer((1, 1), head.keep_alive), ending))

    def fold_into(self, metrics: Metrics) -> None:
        """Add what was counted since the last scrape to the Prometheus counters."""
        mode = self._gate.mode
        if self.allowed > self._folded_allowed:
            allowed = metrics.auth_decisions.labels(mode=mode, result="allowed")
            allowed.inc(self.allowed - self._folded_allowed)
            self._folded_allowed = self.allowed
        for key, count in list(self.refused.items()):
            last = self._folded_refused.get(key, 0)
            if count > last:
                kind, status, result = key
                metrics.request_count(kind, status).inc(count - last)
                if result:
                    metrics.auth_decisions.labels(mode=mode, result=result).inc(count - last)
                self._folded_refused[key] = count
