"""The pre-serialised hit path: immutable shared answers written as stored bytes, in one write.

Rules this module owns:

* An answer is stored (``register``) when the policy's verdict on it (``Derivation.reuse``,
  made when the full path built it) says it is immutable, or it is an at-tail answer of an
  open stream, it is a 200 to a plain HTTP/1.1 catch-up ``GET`` and every byte of it is in the
  local tier. That is the first such answer, a miss included: the stored bytes are what the
  next full-path read would give, a local ``edge; hit``. Each representation is stored once,
  with its 304 beside it. Credentialed scopes are stored under their scope.
* An at-tail answer is given only while the catch-up plan would give it:
  ``edge.log.policy.at_tail_holds`` on its log, at each read (the tail is still where it ends,
  as closed as it was, and trusted). A live tail's next batch moves the tail, so the stored
  answer stops the moment it arrives. A hit late in its tail's window (``edge.log.ahead``) is
  shown to the refresh-ahead (``edge.refresh_ahead``, with the credentials the answer's own
  read sent upstream), which renews the tail in the background; the hit is given as it would be.
* Stored answers are keyed by the request's ``AnswerKey`` (``edge.protocol.answer_key``), the
  one classification both paths make of a head: stream, query as sent, credential scope,
  representation and, where the origin's CORS varies by it, ``Origin``. The fast path can
  only find an answer under the key the full path stored it for.
* The stored bytes are the full path's answer: built from the same ``Answer`` by the same header
  code (``edge.web.wire.client_headers``), serialised as aiohttp would
  (``edge.protocol.http1``). ``Date`` is made per request, and an at-tail answer's ``Age``
  per hit, by the full path's rule (``edge.log.freshness.tail_age_seconds`` of the log's tail),
  where the full path puts it (last of the answer's headers).
* The purge keys in the stored bytes name the stream instance and generation the answer was
  built under (``Derivation.generation``): a stored answer is given only while its instance
  still has that generation, so no hit carries another instance's or generation's keys.
* A stored answer lives only while the log it was built from does (its stream instance and
  credential scope): whatever forgets that log (the stream, or only that scope, as a 404 to a
  credential does) ends the answer, checked at every hit; ``LocalTier.forget_scope`` drops the
  scope's stored answers with it.
* An answer is stored under the stream instance it was derived from (``Derivation.instance``),
  never the one current when it is stored: ``LocalTier.put_response`` refuses it once that
  instance is not current. It is used only while everything the full path would consult still
  says the same: its generation was confirmed by the shared tier within
  ``GENERATION_CHECK_SECONDS`` (with Redis), it still has no known end of life, the origin has not
  since forbidden storing it (``no-store``), and the CORS headers for the request's ``Origin``
  are the ones it was built with. Otherwise the full path answers, re-checks and stores again.
* With ``--auth jwt|forward`` a read is authorized first, by the gate's own code
  (``Gate.decide_now``): a token whose signature the key set in hand has checked (once per token
  string and key set) and whose claims cover the stream now, or a verdict the auth service gave
  and the edge still keeps. Then the answer is looked up under the policy's scope, where the
  full path stored its authorized readers' answer. The connection asks the gate first
  (``edge.web.own_gate``) and hands the admission in (``answer``'s ``admission``), so a head is
  decided once; what the gate cannot decide without waiting, or refuses, the connection
  handles there.
* A read the full path refuses before anything else (``RefusedHead``) is answered with the full
  path's ``edge_answer`` (its CORS headers for the first ``Origin``), counted as
  ``edge_requests_total{kind="other"}`` as the full path counts it (``refusal``).
* A keep-alive head met before whose answer was an immutable stored hit (no tail to check:
  not an at-tail answer, nor a ``HEAD``'s, which reports the tail), without ``--auth``, is
  remembered with that answer (``hit``: the raw head in, the
  bytes out; at most ``REMEMBERED_HEADS`` heads of ``REMEMBERED_HEAD_BYTES`` holding
  ``REMEMBERED_BYTES`` of their own, bodies up to ``JOIN_BELOW_BYTES``), so its next
  hit skips the parse, the key and the lookup; every check ``answer`` makes of the entry is made
  again per hit, and it is given only while the tier keeps it (``StoredHit.kept``: a
  forgetting, an eviction or a newer answer under its key ends it at once) and the origin's
  CORS still varies as it did (the key depended on it). Once a second it is looked up again
  under its key, as ``answer`` does: the tier's LRU hears of it, and its bytes (with that
  second's ``Date``) are made then and reused within the second.
* Counting is plain integers here; ``fold_into`` adds them to the Prometheus counters when
  ``/metrics`` is scraped, so a hit costs no ``labels()`` call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from multidict import CIMultiDict

from edge.answer import Answer
from edge.auth.gate import Client, Gate, RequestAdmission
from edge.catchup import live_authority_seconds
from edge.config import Settings
from edge.instances.generations import GENERATION_CHECK_SECONDS
from edge.log.ahead import due_after, refresh_of
from edge.log.freshness import tail_age_seconds
from edge.log.policy import at_tail_holds, if_none_match_hits
from edge.log.stream_log import LogKey, StreamLog
from edge.metrics import Metrics
from edge.protocol.answer_key import AnswerKey, answer_key, scope_of
from edge.protocol.headers import AUTHORIZATION
from edge.protocol.http1 import (
    CLOSE_TRAILER,
    KEEP_ALIVE_TRAILER,
    LOOP_DETECTED,
    ONE_REQUEST,
    Handoff,
    HeadParser,
    RefusedHead,
    RequestHead,
    date_line,
    serialise,
    serialise_parts,
)
from edge.protocol.paths import BadTarget, normalise_path, parse_target
from edge.protocol.reads import PUBLIC_SCOPE, RequestKind
from edge.refresh_ahead import RefreshAhead
from edge.store.local import LocalTier, StoredHit
from edge.web.proxy import OriginCors, edge_answer

HIT = "edge; hit"

# Small bodies are joined to their head (one buffer, one send); larger ones are not copied.
JOIN_BELOW_BYTES = 16 * 1024
# Heads remembered parsed (``FastPath.parse``): at most this many, each at most this long.
REMEMBERED_HEADS = 1024
REMEMBERED_HEAD_BYTES = 1024
# What heads met before (``hit``) hold of their own besides the tier's entries (the head, the
# second's answer, the body after the trailer): past it, the book starts again.
REMEMBERED_BYTES = 4 * 1024 * 1024
# An at-tail answer's Age is below its freshness window (seconds): these lines are made once.
AGE_LINES = tuple(b"Age: %d\r\n" % seconds for seconds in range(128))


@dataclass(slots=True, eq=False)
class _Remembered:
    """A head met before whose answer is an immutable stored hit (``FastPath.hit``): what each
    of its hits is made of, and the bytes of the current second's."""

    key: AnswerKey
    entry: StoredHit
    origin: str | None  # the head's ``Origin``: its CORS headers are checked per hit
    varies: bool  # ``OriginCors.varies`` when the key was made (the key depends on it)
    head: bytes  # the answer up to its ``Date`` line: the 200's or the 304's
    tail: bytes  # after it: the trailer and (a 200 to a GET) the body
    status: int  # 200 or 304, counted as ``answer`` counts them (a HEAD: 0)
    second: int = -1  # the second ``data`` was made in
    data: bytes = b""


class FastPath:
    def __init__(
        self,
        settings: Settings,
        local: LocalTier,
        cors: OriginCors,
        *,
        gate: Gate | None = None,
        ahead: RefreshAhead | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.enabled = settings.fast_path
        self._ahead = ahead
        # With --auth jwt|forward every read is authorized first (by the gate's own code).
        self._gate = gate
        self._scope_headers = settings.scope_headers
        # The headers the gate reads: the bearer token, and what a forward question shows.
        self._parsed_headers = (
            (*settings.scope_headers, AUTHORIZATION) if gate is not None else settings.scope_headers
        )
        self._scope_cookies = settings.scope_cookies
        self._local = local
        self._cors = cors
        self._clock = clock
        self._verify = settings.redis_url is not None
        self._freshness = settings.tail_freshness_seconds
        self._refresh_after = due_after(self._freshness)
        self._authority = live_authority_seconds(settings)
        self._heads: dict[bytes, RequestHead] = {}
        # Raw heads whose answer is an immutable stored hit (``hit``); never with --auth.
        self._remembered: dict[bytes, _Remembered] = {}
        self._remembered_bytes = 0
        # Resume routes are relayed to their backend by the full path, every method of them.
        self._resume_routes = settings.resume_routes
        self._date_second = -1
        self._date = b""
        # Plain counters, folded into the Prometheus ones at scrape time.
        self.ok = 0
        self.not_modified = 0
        self.served_bytes = 0
        self.heads = 0  # HEADs answered here (edge_requests_total{kind="head"})
        self.admitted = 0  # reads the gate allowed here (edge_auth_decisions_total)
        self.refused: dict[int, int] = {}  # heads refused here, by status (``refusal``)
        self._folded_refused: dict[int, int] = {}
        self._folded = (0, 0, 0)
        self._folded_admitted = 0
        self._folded_heads = 0

    def parser(self) -> HeadParser:
        return HeadParser(self._parsed_headers)

    def parse(self, head: bytes, parser: HeadParser) -> RequestHead | Handoff | RefusedHead:
        """``parser.parse(head)``, remembered for heads met before: a head is parsed the same
        way every time (the parser is at a message boundary before and after each), and an
        audience sends the same head again and again (after each release, every viewer asks
        for the same offset and cursor)."""
        known = self._heads.get(head)
        if known is not None:
            return known
        parsed = parser.parse(head)
        if (
            isinstance(parsed, RequestHead)
            and self._resume_routes
            and self._on_resume_route(parsed)
        ):
            return ONE_REQUEST
        if isinstance(parsed, RequestHead) and len(head) <= REMEMBERED_HEAD_BYTES:
            if len(self._heads) >= REMEMBERED_HEADS:
                self._heads.clear()  # a new audience's heads are met again at once
            self._heads[head] = parsed
        return parsed

    def _on_resume_route(self, head: RequestHead) -> bool:
        """The full path's: a head on a resume route, by the path it routes to (every alias
        of the route's path, as ``dispatch`` matches its normalised target), or one whose path
        the full path refuses (its 400)."""
        try:
            path = normalise_path(head.path)
        except BadTarget:
            return True
        return any(route.holds(path) for route in self._resume_routes)

    def key_of(
        self, head: RequestHead, admission: RequestAdmission | None = None
    ) -> AnswerKey | None:
        """The head's ``AnswerKey``, by the full path's own functions (``admission``: the
        gate's yes to it, when the connection asked the gate first)."""
        if self._gate is not None:
            if admission is not None:
                return self._key_of_admitted(head, admission)
            return self._admitted_key(head, self._gate)
        credentials = head.credentials
        scope = (
            scope_of(
                credentials, scope_headers=self._scope_headers, scope_cookies=self._scope_cookies
            )
            if credentials
            else PUBLIC_SCOPE  # most heads carry none: no call (scope_of agrees)
        )
        # By position: the memoised function's cache key is then one flat tuple (a GET's with
        # six values, the common case; a HEAD has one representation).
        if head.head:
            return answer_key(
                head.path, head.query, scope, None, head.origin, self._cors.varies, True
            )
        return answer_key(
            head.path, head.query, scope, head.accept_encoding, head.origin, self._cors.varies
        )

    def _admitted_key(self, head: RequestHead, gate: Gate) -> AnswerKey | None:
        """The key of an authorized read: where the full path stored its answer to the
        readers of this policy's scope, if the gate allows this head now."""
        raw = head.path + ("?" + head.query if head.query else "")
        try:
            target = parse_target(raw, "GET")
        except BadTarget:
            return None
        client = Client(
            method="HEAD" if head.head else "GET", target=target, headers=head.credentials,
            host=None, scheme="http",
            address=None,
        )  # fmt: skip
        decision = gate.decide_now(client, remember=True)
        if not isinstance(decision, RequestAdmission):
            return None
        return self._key_of_admitted(head, decision)

    def _key_of_admitted(self, head: RequestHead, decision: RequestAdmission) -> AnswerKey | None:
        if decision.scope is None:
            return None
        admitted = decision.target
        return answer_key(
            admitted.upstream.partition("?")[0], admitted.query, decision.scope,
            None if head.head else head.accept_encoding, head.origin, self._cors.varies,
            head.head,
        )  # fmt: skip

    def answer(
        self,
        head: RequestHead,
        admission: RequestAdmission | None = None,
        raw: bytes | None = None,
    ) -> list[bytes] | None:
        """The bytes to write for ``head``, or None: the full path answers it (with
        ``--auth``, ``admission``: the gate's yes the connection already has for it).
        ``raw``: the head as it came, remembered with an immutable answer (``hit``)."""
        key = self.key_of(head, admission)
        if key is None:
            return None
        entry = self._local.response(key)
        if entry is None:
            return None
        now = self._clock()
        if not self._current(entry, now, head.origin):
            return None
        log = entry.log
        if entry.tail_end is not None:
            if not self._tail_holds(log, entry, now):
                return None
            self._late_in_window(log, entry, now)
        second = int(now)
        if second != self._date_second:
            self._date_second, self._date = second, date_line(second)
        trailer = KEEP_ALIVE_TRAILER if head.keep_alive else CLOSE_TRAILER
        if key.head and head.if_none_match is not None:
            return None  # a conditional HEAD is the origin's to judge (as on the full path)
        if self._gate is not None and admission is None:
            self.admitted += 1  # (decided by the connection: counted there)
        remember = (
            raw is not None
            and self._gate is None
            and head.keep_alive
            and entry.tail_end is None
            and not entry.ages
            and len(entry.body) <= JOIN_BELOW_BYTES
        )
        if key.head:
            self.heads += 1
            data = entry.ok + self._date + trailer
            if remember:
                self._remember(raw, key, entry, head, entry.ok, trailer, 0, data)
            return [data]
        if entry.ages:
            return self._aged(entry, log, head, now, trailer)
        if if_none_match_hits(head.if_none_match, entry.etag):
            self.not_modified += 1
            data = entry.not_modified + self._date + trailer
            if remember:
                self._remember(raw, key, entry, head, entry.not_modified, trailer, 304, data)
            return [data]
        self.ok += 1
        body = entry.body
        self.served_bytes += len(body)
        if len(body) <= JOIN_BELOW_BYTES:
            data = b"".join((entry.ok, self._date, trailer, body))  # one send()
            if remember:
                self._remember(raw, key, entry, head, entry.ok, trailer + body, 200, data)
            return [data]
        return [entry.ok + self._date + trailer, body]

    def _current(self, entry: StoredHit, now: float, origin: str | None) -> bool:
        """Does everything the full path would consult still say what ``entry`` was built
        with (the module's rules: generation, lifetime, no-store, CORS, its log)?"""
        instance = entry.instance
        return not (
            (self._verify and now - instance.verified_at >= GENERATION_CHECK_SECONDS)
            or entry.generation != instance.generation  # its purge keys name another
            or instance.expires_at is not None
            or instance.ttl_seconds is not None
            or instance.bypass_until > now
            or entry.cors is not self._cors.for_request(origin)
            # A stored answer lives only while the log it was built from does: whatever
            # forgets that log (its stream, or only its scope: a 404 to a credential) ends it.
            or not entry.log.kept
        )

    def _remember(
        self,
        raw: bytes | None,
        key: AnswerKey,
        entry: StoredHit,
        head: RequestHead,
        answer_head: bytes,
        tail: bytes,
        status: int,
        data: bytes,
    ) -> None:
        assert raw is not None
        if len(raw) > REMEMBERED_HEAD_BYTES:
            return
        self._forget_remembered(raw)
        size = len(raw) + len(data) + len(tail)
        if (
            len(self._remembered) >= REMEMBERED_HEADS
            or self._remembered_bytes + size > REMEMBERED_BYTES
        ):
            # A new audience's heads are met again at once.
            self._remembered.clear()
            self._remembered_bytes = 0
        self._remembered_bytes += size
        self._remembered[raw] = _Remembered(
            key=key, entry=entry, origin=head.origin, varies=self._cors.varies,
            head=answer_head, tail=tail, status=status, second=self._date_second, data=data,
        )  # fmt: skip

    def _forget_remembered(self, raw: bytes) -> None:
        remembered = self._remembered.pop(raw, None)
        if remembered is not None:
            self._remembered_bytes -= len(raw) + len(remembered.data) + len(remembered.tail)

    def hit(self, raw: bytes) -> bytes | None:
        """The answer to ``raw``, a whole head met before (``answer``'s ``raw``), if it is
        still the stored hit it was; None: ``answer`` decides (and remembers it again)."""
        remembered = self._remembered.get(raw)
        if remembered is None:
            return None
        entry = remembered.entry
        now = self._clock()
        if (
            not entry.kept
            or self._cors.varies is not remembered.varies
            or not self._current(entry, now, remembered.origin)
        ):
            self._forget_remembered(raw)
            return None
        second = int(now)
        if second != remembered.second:
            # Once a second, the lookup ``answer`` makes: the LRU hears of the hits.
            if self._local.response(remembered.key) is not entry:
                self._forget_remembered(raw)
                return None
            if second != self._date_second:
                self._date_second, self._date = second, date_line(second)
            remembered.second = second
            remembered.data = remembered.head + self._date + remembered.tail
        status = remembered.status
        if status == 200:
            self.ok += 1
            self.served_bytes += len(entry.body)
        elif status == 304:
            self.not_modified += 1
        else:
            self.heads += 1
        return remembered.data

    def _aged(
        self, entry: StoredHit, log: StreamLog, head: RequestHead, now: float, trailer: bytes
    ) -> list[bytes]:
        """An at-tail answer, with this hit's ``Age``: how long ago its tail was observed
        (``edge.log.freshness.tail_age_seconds``, the full path's own rule)."""
        tail = log.tail
        assert tail is not None  # its tail holds
        seconds = tail_age_seconds(tail, now)
        age = AGE_LINES[seconds] if seconds < len(AGE_LINES) else b"Age: %d\r\n" % seconds
        if if_none_match_hits(head.if_none_match, entry.etag):
            self.not_modified += 1
            parts = (entry.not_modified, age, entry.not_modified_rest, self._date, trailer)
            return [b"".join(parts)]
        self.ok += 1
        body = entry.body
        self.served_bytes += len(body)
        if len(body) <= JOIN_BELOW_BYTES:
            return [b"".join((entry.ok, age, entry.ok_rest, self._date, trailer, body))]
        return [b"".join((entry.ok, age, entry.ok_rest, self._date, trailer)), body]

    def _tail_holds(self, log: StreamLog, entry: StoredHit, now: float) -> bool:
        """An at-tail answer is given while the full path would give it: its log's tail is
        still where it ends, and trusted (the catch-up plan's own rule)."""
        return at_tail_holds(
            log, entry.tail_end or "", entry.tail_closed, now=now,
            freshness_seconds=self._freshness, authority_seconds=self._authority,
        )  # fmt: skip

    def _late_in_window(self, log: StreamLog, entry: StoredHit, now: float) -> None:
        """Show a hit late in its tail's window to the refresh-ahead (most hits are early in
        it and leave at the first comparison)."""
        tail = log.tail
        if self._ahead is None or tail is None or now - tail.observed_at < self._refresh_after:
            return
        refresh = refresh_of(tail, now=now, freshness_seconds=self._freshness)
        self._ahead.served(log, entry.credentials, refresh)

    def register(
        self,
        key: AnswerKey | None,
        answer: Answer,
        response_headers: CIMultiDict[str],
        *,
        version: tuple[int, int],
        origin: str | None,
        credentials: Sequence[tuple[str, str]] = (),
    ) -> bool:
        """Store the full path's ``answer`` (``response_headers``: its finished headers) to a
        request of ``version`` classified as ``key`` from ``origin``, if the policy's verdict
        says it can never change. ``credentials``: what the request's fills sent upstream (an
        at-tail answer's refresh sends them too). True if stored."""
        derivation = answer.derivation
        if not self.enabled or key is None or derivation is None or answer.status != 200:
            return False
        verdict = derivation.reuse
        # Immutable, or at the tail of an open stream (given while that tail holds). A closed
        # stream's final answer is immutable once its lifetime is known; until then its
        # Cache-Control is still to change, so it is not stored.
        at_tail = derivation.up_to_date and not derivation.closed and not verdict.immutable
        # A HEAD reports the tail: it holds while the tail does, closed or not.
        holds_with_tail = key.head or at_tail
        if not (
            version == (1, 1)
            and derivation.kept
            and (verdict.immutable or holds_with_tail)
            and derivation.scope == key.scope
            and derivation.instance.stream == key.stream
        ):
            return False
        tag = response_headers.get("ETag")
        if tag is None or (key.head and answer.body):
            return False
        # What the next full-path read of it would say: a local hit.
        headers = [
            (n, HIT if n.lower() == "cache-status" else v) for n, v in response_headers.items()
        ]
        ages = answer.age_seconds is not None and not key.head
        if ages:
            # ``client_headers`` puts it last; each hit splices in its own there.
            if headers[-1][0].lower() != "age":
                return False
            headers.pop()
        unencoded = [(n, v) for n, v in headers if n.lower() != "content-encoding"]
        try:
            ok, ok_rest = serialise_parts(200, headers, len(answer.body), head=key.head)
            not_modified, not_modified_rest = (
                (b"", b"") if key.head else serialise_parts(304, unencoded, 0)
            )
        except ValueError:
            return False  # a header aiohttp refuses too: the full path answers this one as it can
        if not ages:
            ok, ok_rest = ok + ok_rest, b""
            not_modified, not_modified_rest = not_modified + not_modified_rest, b""
        cors = self._cors.for_request(origin)
        if cors is None:
            return False
        log = self._local.log(LogKey(stream=derivation.instance.stream, scope=derivation.scope))
        if log is None or log.instance is not derivation.instance:
            return False  # forgotten meanwhile: nothing of it is stored
        stored = StoredHit(
            instance=derivation.instance,
            generation=derivation.generation,
            etag=tag,
            ok=ok,
            not_modified=not_modified,
            body=answer.body,
            ages=ages,
            ok_rest=ok_rest,
            not_modified_rest=not_modified_rest,
            cors=cors,
            log=log,
            tail_end=derivation.end if holds_with_tail else None,
            tail_closed=key.head and derivation.closed,
            credentials=tuple(credentials) if holds_with_tail else (),
        )
        return self._local.put_response(key, stored)

    def refusal(self, refused: RefusedHead) -> bytes | None:
        """The full path's answer to a head it refuses before anything else (``edge_answer``,
        as ``handle_stream_request`` gives it), counted as it counts it; None: the full path's
        to write (a header it cannot be written with)."""
        extra = [("Cache-Control", "no-store")] if refused.status == LOOP_DETECTED else []
        response = edge_answer(
            refused.status, refused.text, self._cors, extra, origin=refused.origin
        )
        body = response.body
        assert isinstance(body, bytes)
        try:
            start = serialise(response.status, list(response.headers.items()), len(body))
        except ValueError:
            return None
        self.refused[refused.status] = self.refused.get(refused.status, 0) + 1
        # A HEAD's answer is the GET's head, its Content-Length included, without the body.
        ending = b"" if refused.head else body
        now = int(self._clock())
        ends = KEEP_ALIVE_TRAILER if refused.keep_alive else CLOSE_TRAILER
        return b"".join((start, date_line(now), ends, ending))

    def fold_into(self, metrics: Metrics) -> None:
        """Add what was counted since the last scrape to the Prometheus counters."""
        for status, count in list(self.refused.items()):
            last = self._folded_refused.get(status, 0)
            if count > last:
                metrics.request_count(RequestKind.OTHER, status).inc(count - last)
                self._folded_refused[status] = count
        ok, not_modified, served = self.ok, self.not_modified, self.served_bytes
        last_ok, last_nm, last_served = self._folded
        self._folded = (ok, not_modified, served)
        kind = RequestKind.CATCHUP.value
        if ok > last_ok:
            metrics.requests.labels(kind=kind, code="200").inc(ok - last_ok)
        if not_modified > last_nm:
            metrics.requests.labels(kind=kind, code="304").inc(not_modified - last_nm)
        if ok + not_modified > last_ok + last_nm:
            hits = ok + not_modified - last_ok - last_nm
            metrics.cache_requests.labels(result="hit").inc(hits)
            metrics.fast_path_answers.inc(hits)
        if served > last_served:
            metrics.served_bytes.inc(served - last_served)
        heads, last_heads = self.heads, self._folded_heads
        self._folded_heads = heads
        if heads > last_heads:
            metrics.requests.labels(kind=RequestKind.HEAD.value, code="200").inc(heads - last_heads)
            metrics.cache_requests.labels(result="hit").inc(heads - last_heads)
            metrics.fast_path_answers.inc(heads - last_heads)
        admitted, last_admitted = self.admitted, self._folded_admitted
        self._folded_admitted = admitted
        if self._gate is not None and admitted > last_admitted:
            allowed = metrics.auth_decisions.labels(mode=self._gate.mode, result="allowed")
            allowed.inc(admitted - last_admitted)
