"""Correctness is a property (issue 8): the catch-up cache against a model of the origin.

A Hypothesis state machine drives one ``CatchupCache`` in front of ``FakeOrigin`` (an in-process
``OriginClient`` answering from ``OriginModel``, a pure model of the reference origin) through
random interleavings of creates, appends, closes, deletes and recreates (through the edge, so the
cache is told, and directly at the origin, so it is not), forks and deletes of their sources
(soft deletes: 410 to everything), origin restarts (every stream lost), purges, clock advances,
catch-up reads at
every kind of offset (absent, ``-1``, before the start, every position any instance ever issued,
between positions, past the tail, malformed), ``If-None-Match`` with tags handed out earlier, and
reads racing a write, delete or recreate while their origin fill is in flight.

Every answer is graded against the model's history (``Grader``):

1. A 200 equals, byte for byte (body, ``Content-Type``, ``Stream-Next-Offset``,
   ``Stream-Up-To-Date``, ``Stream-Closed``), what the origin would have answered to the same read
   at some moment of the last ``tail_freshness_seconds``. An answer that can never change (it ends
   a closed stream, or it is capped: no ``Stream-Up-To-Date``) may be older. A capped answer is a
   prefix of the origin's messages that ends where a read of ``Stream-Next-Offset`` resumes
   exactly (nothing lost, nothing repeated).
2. Only versions the edge may still serve count: none before the last time the edge was *told*
   the stream changed identity (a DELETE or a creating PUT through the edge, a purge, an origin
   404 in that scope), and none before the last write through the edge (read-after-write).
3. No answer repeats a message; no answer carries a message of an instance from before that.
4. A 304 is given only for a tag the client got earlier for that path, and only if the bytes the
   client holds for it (body, ``Stream-Next-Offset``, ``Stream-Closed``) are a correct answer now
   (rule 1; ``Stream-Up-To-Date`` is a fact about time, not part of what a tag vouches for). A tag
   the edge hands out again must mean the same bytes, unless only an *untold* recreation separates
   the two (the origin's own tags collide then): after the edge is told, old tags must not match.
5. A 404 only if the stream was absent at some moment of the freshness window, a 410 only if it
   was soft-deleted then; a 400 only for an offset the origin refuses.
6. A 404 or 410 the edge relays, to a read or a write, tells the edge the stream is gone in that
   scope (rule 2), as a DELETE through it does (issue 27).

Untold recreation (delete and create directly at the origin after the edge already holds bytes of
the old instance) cannot be detected in general: the new instance reuses the old offsets, and a
delta fetched from the old chain's end is indistinguishable from an append. While such a stream
is in that state for a scope ("relaxed" grading), only rules 3 and 5 and the tag rules are checked;
it ends as soon as the edge is told.

With ``--workers 2`` (``TwoWorkersMachine``) the edge is two ``EdgeUnderTest`` workers, each
what one process holds (its own cache, fast path, CORS book and origin client, all over the one
model), each read and each write through the edge going to a worker Hypothesis chooses. What a
worker tells its siblings is decided and applied by the production code
(``edge.workers.siblings``: ``Siblings.observe`` for its relay, ``Siblings.forgot`` for the
forgettings it decides, ``Siblings.apply`` for what a sibling told); only the hop between
processes, through the supervisor, is an in-process call (``InProcessSupervisor``), and a purge
goes to every worker as the supervisor sends it. The grading is the same, for the edge as one:
siblings are told before the answer, so what one worker was told every worker was, and
read-after-write is exact whichever worker the next read reaches. Relaxed grading is per worker
(a worker holds only what its own fills brought); the tag rules are the whole edge's (relaxed if
any worker is), as a client's next request may reach any worker.

The edge's API is used only by ``EdgeUnderTest``: adapt that class when the API changes.
``ReferenceEdge`` (a naive cache, correct by construction) runs through the same machines and
must pass: it keeps the oracle honest. The plain tests at the end are the failures the machine
found, written out by hand.

Run: ``.venv/bin/pytest tests/unit/test_properties.py``; more examples:
``EDGE_PROPERTY_EXAMPLES=2000 .venv/bin/pytest tests/unit/test_properties.py``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import gzip
import inspect
import json
import math
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import event as _event
from hypothesis import note as _note
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from edge import catchup as catchup_module
from edge.answer import Bypass
from edge.config import Address, Settings, per_worker
from edge.log.stream_log import LogKey
from edge.metrics import Metrics
from edge.protocol.http1 import RequestHead
from edge.protocol.paths import parse_target
from edge.protocol.purge_keys import purge_keys
from edge.protocol.reads import auth_scope, classify, scope_credentials
from edge.web.fastpath import FastPath
from edge.web.front import CatchupFront, catchup_request
from edge.web.proxy import OriginCors, without_validators
from edge.web.wiring import build_catchup
from edge.workers.siblings import Siblings, Transport, at_supervisors_request, decode_forgot
from tests.model.fake_origin import FakeOrigin, Served
from tests.model.origin_model import (
    JSON_TYPE,
    OFFSET_ZERO,
    TEXT_TYPE,
    Instance,
    OriginModel,
    Version,
    format_offset,
    message_ids,
    parse_offset,
    read_response,
    valid_read_offset,
)

# The whole file takes about 50 s when the edge is correct (2 cores; the two-worker machine
# runs half as many examples, a third of that); shrinking a failure takes one to five minutes
# more. EDGE_PROPERTY_EXAMPLES=5000 for a long hunt.
EXAMPLES = int(os.environ.get("EDGE_PROPERTY_EXAMPLES", "600"))
STEPS = int(os.environ.get("EDGE_PROPERTY_STEPS", "40"))
MiB = 1024 * 1024

PATHS = ("/v1/stream/a", "/v1/stream/b")
# Scope name -> the credentials a reader in it sends (the origin ignores them; the edge does not).
SCOPES: dict[str, tuple[tuple[str, str], ...]] = {
    "public": (),
    "alice": (("Authorization", "Bearer alice"),),
}
GOOD_ORIGIN = "https://good.example"
EVIL_ORIGIN = "https://evil.example"
BEFORE_START = "0" * 17 + "_0"  # string-smaller than OFFSET_ZERO: a read from before the start
PAST_EVERYTHING = "0_0"  # string-greater than every padded offset: always past the tail
FAR_FUTURE = format_offset(0, 99_999)
HUGE = "9999999999999999_9999999999999999"
MALFORMED = ("", "abc", "-2", "1_")
SPECIAL_OFFSETS: tuple[str | None, ...] = (
    None,
    "-1",
    OFFSET_ZERO,
    BEFORE_START,
    PAST_EVERYTHING,
    FAR_FUTURE,
    HUGE,
    *MALFORMED,
)
FIRST_ID = 100  # ids 100..999 all have the same length: a new instance reuses the old offsets


def note(message: str) -> None:
    if currently_in_test_context():
        _note(message)


def event(message: str) -> None:
    if currently_in_test_context():
        _event(message)


# ---------------------------------------------------------------------------------------------
# The adapter: the only code that knows the edge's API.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Seen:
    """An answer as a client sees it (body decoded to identity bytes)."""

    status: int
    body: bytes
    next_offset: str | None
    up_to_date: bool
    closed: bool
    content_type: str | None
    etag: str | None
    relayed: bool = False
    allow_origin: str | None = None  # Access-Control-Allow-Origin
    cache_control: str | None = None
    age: str | None = None
    surrogate_key: str | None = None
    cache_tag: str | None = None

    @property
    def representation(self) -> tuple[bytes, str | None, bool, str | None]:
        """What an ETag vouches for (Stream-Up-To-Date is a fact about time, not about bytes)."""
        return (self.body, self.next_offset, self.closed, self.content_type)

    def describe(self) -> str:
        flags = "".join(
            (" up-to-date" if self.up_to_date else "", " closed" if self.closed else "")
        )
        body = _short(self.body)
        return f"{self.status} next={self.next_offset}{flags} etag={self.etag} body={body}"


def _short(body: bytes, limit: int = 160) -> str:
    return repr(body[:limit]) + (f"... ({len(body)} bytes)" if len(body) > limit else "")


def seen_on_the_wire(response: bytes) -> Seen:
    """What a client reads from a stored, pre-serialised answer."""
    head, _, body = response.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = [tuple(line.split(": ", 1)) for line in lines]
    length = next((int(v) for n, v in headers if n.lower() == "content-length"), 0)
    assert len(body) == length, (len(body), length)
    return seen_from(int(status_line.split()[1]), headers, body)  # type: ignore[arg-type]


def seen_from(status: int, headers: Sequence[tuple[str, str]], body: bytes, **kw: bool) -> Seen:
    def value(name: str) -> str | None:
        return next((v for n, v in headers if n.lower() == name.lower()), None)

    if (value("content-encoding") or "identity").lower() == "gzip":
        body = gzip.decompress(body)
    return Seen(
        status=status,
        body=body,
        next_offset=value("stream-next-offset"),
        up_to_date=(value("stream-up-to-date") or "").lower() == "true",
        closed=(value("stream-closed") or "").lower() == "true",
        content_type=value("content-type"),
        etag=value("etag"),
        allow_origin=value("access-control-allow-origin"),
        cache_control=value("cache-control"),
        age=value("age"),
        surrogate_key=value("surrogate-key"),
        cache_tag=value("cache-tag"),
        **kw,
    )


async def relay(
    origin: FakeOrigin,
    path: str,
    offset: str | None,
    headers: Sequence[tuple[str, str]],
    *,
    validators: bool = True,
) -> tuple[Seen, list[tuple[str, str]], list[tuple[str, str]]]:
    """A read sent to the origin as the client sent it: (answer, request and response headers).
    ``validators=False``: as the edge relays a read its cache does not answer (``Relay.forward``:
    no ``If-None-Match`` up, no ``ETag`` down)."""
    path_qs = path if offset is None else f"{path}?offset={offset}"
    sent = list(headers) if validators else without_validators(headers)
    upstream = await origin.open("GET", path_qs, sent, live=False)
    try:
        body = await upstream.read()
    finally:
        upstream.close()
    response_headers = list(upstream.headers.items())
    relayed = response_headers if validators else without_validators(response_headers)
    return (
        seen_from(upstream.status, relayed, body, relayed=True),
        list(headers),
        response_headers,
    )


class EdgeUnderTest:
    """The edge as the web layer drives it, through the real glue: the request is written as
    bytes and parsed by the fast path's own parser (``HeadParser``), answered by the
    pre-serialised hit path if it can, else classified (``parse_target``, ``classify``,
    ``catchup_request``) and answered by ``CatchupFront``, which finishes the headers
    (``client_headers``: CORS per request) and offers the answer to the fast path. The CORS
    book learns from every origin answer, as ``create_app`` wires it. One instance is one
    process: a worker of ``--workers N`` once ``link``ed to its siblings. The only code that
    knows the edge's API."""

    def __init__(self, settings: Settings, origin: FakeOrigin, clock: Callable[[], float]) -> None:
        self.origin = origin
        self.settings = settings
        self.metrics = Metrics()
        self.parts = build_catchup(settings, origin, self.metrics, shared=None, clock=clock)  # type: ignore[arg-type]
        self.cors = OriginCors()
        origin.listen_to_answers(self.cors.remember)
        self.fast = FastPath(
            settings, self.parts.local, self.cors, ahead=self.parts.ahead, clock=clock
        )
        self.front = CatchupFront(catchup=self.parts.catchup, fast=self.fast, cors=self.cors)
        # What the relay tells of the answers it relays (``Relay.observe``, as create_app wires
        # it; a worker's is its ``Siblings``').
        self.observer: Callable[..., object] = self.parts.lifecycle.observe
        self.siblings: Siblings | None = None
        self.fast_answers = 0
        self.remembered_answers = 0  # of them, answered as heads met before (``hit``)
        # Set while a compression is to be held (a thread still working while a stream changes).
        self.compression_gate: asyncio.Event | None = None
        compressor = self.parts.compressor
        make = compressor._make

        async def held(body: bytes) -> bytes:
            gate = self.compression_gate
            if gate is not None:
                self.compression_started.set()
                await gate.wait()
            return await make(body)

        self.compression_started = asyncio.Event()
        compressor._make = held  # type: ignore[method-assign]

    async def read(
        self,
        path: str,
        offset: str | None,
        *,
        credentials: Sequence[tuple[str, str]],
        if_none_match: str | None,
        accept_encoding: str | None,
        origin: str | None = None,
    ) -> Seen:
        query = "" if offset is None else f"offset={offset}"
        raw_target = path + (f"?{query}" if query else "")
        headers = [("Host", "edge.test"), *credentials]
        if if_none_match is not None:
            headers.append(("If-None-Match", if_none_match))
        if accept_encoding is not None:
            headers.append(("Accept-Encoding", accept_encoding))
        if origin is not None:
            headers.append(("Origin", origin))
        wire = "".join(f"{n}: {v}\r\n" for n, v in headers)
        # As the connection does: a head met before first (``hit``), then the parsed head.
        raw = f"GET {raw_target} HTTP/1.1\r\n{wire}\r\n".encode()
        remembered = self.fast.hit(raw)
        if remembered is not None:
            self.fast_answers += 1
            self.remembered_answers += 1
            return seen_on_the_wire(remembered)
        head = self.fast.parser().parse(raw)
        if isinstance(head, RequestHead):
            stored = self.fast.answer(head, None, raw)
            if stored is not None:
                self.fast_answers += 1
                return seen_on_the_wire(b"".join(stored))
        target = parse_target(raw_target, "GET")
        classified = classify(
            "GET", target.stream, target.query, headers,
            scope_headers=self.settings.scope_headers, scope_cookies=self.settings.scope_cookies,
        )  # fmt: skip
        read = classified.read
        assert read is not None
        assert read.plain
        request = catchup_request(
            target, read, headers, version=(1, 1),
            credentials=scope_credentials(
                headers, scope_headers=self.settings.scope_headers,
                scope_cookies=self.settings.scope_cookies,
            ),
            reader_only=False, cors=self.cors,
        )  # fmt: skip
        outcome = await self.front.answer(request)
        if isinstance(outcome, Bypass):
            # What the web layer does with a read that is not the cache's: relay it, observe it.
            sent = [(n, v) for n, v in headers if n.lower() not in ("host", "accept-encoding")]
            seen, sent, received = await relay(self.origin, path, offset, sent, validators=False)
            observing = self.observed("GET", path, seen.status, sent, received)
            if observing is not None:
                await observing
            return seen
        answer, finished = outcome.answer, outcome.headers
        return seen_from(answer.status, list(finished.items()), answer.body)

    # The cache's observers may be plain functions or coroutines: each returns what the caller
    # must await (or None), and the state machine runs it to completion before going on.

    def observed(
        self,
        method: str,
        path: str,
        status: int,
        request_headers: Sequence[tuple[str, str]],
        response_headers: Sequence[tuple[str, str]],
    ) -> Awaitable[object] | None:
        """A request the edge relayed to the origin (a write, a HEAD) and the origin's answer."""
        # The machine runs one step at a time: nothing arrives between this request's start
        # and its answer, so its ticket is taken here.
        started = self.parts.ticket()
        result = self.observer(
            method, path, status, list(request_headers), list(response_headers), started
        )
        return result if inspect.isawaitable(result) else None

    def deleted_through_edge(self, path: str, status: int = 204) -> Awaitable[object] | None:
        return self.observed("DELETE", path, status, [], [])

    def created_through_edge(
        self,
        path: str,
        status: int = 201,
        request_headers: Sequence[tuple[str, str]] = (),
        response_headers: Sequence[tuple[str, str]] = (),
    ) -> Awaitable[object] | None:
        return self.observed("PUT", path, status, request_headers, response_headers)

    def purge(self, path: str) -> Awaitable[object] | None:
        """A purge from the admin listener; a worker's comes from its supervisor, which sends it
        to every worker (its ``/purge`` runs under ``at_supervisors_request``, then awaits the
        purge's durability, as ``add_admin_routes`` does)."""
        purge: Callable[[str], object] = self.parts.lifecycle.forget
        if self.siblings is None:
            result = purge(path)
            return result if inspect.isawaitable(result) else None
        with at_supervisors_request():
            purge(path)
        return self.parts.lifecycle.forgotten_everywhere(path)

    # --- --workers N: the worker's side of edge.workers.siblings, wired as share_observations ---

    def link(self, supervisor: InProcessSupervisor, index: int) -> None:
        """Make this worker ``index`` of ``supervisor``'s: its relay's observations and its own
        forgettings are told through the supervisor (``Siblings``), which has every sibling
        ``apply`` them."""
        self.siblings = Siblings(
            forgetter=self.parts.forgetter, local=self.parts.local,
            observe=self.parts.lifecycle.observe, tell=supervisor.transport(index),
        )  # fmt: skip
        self.observer = self.siblings.observe
        self.parts.forgetter.tellers.append(self.siblings.forgot)

    async def apply(self, body: bytes) -> None:
        """What the worker's private admin listener does with ``POST /observe``."""
        assert self.siblings is not None
        await self.siblings.apply(body)

    async def close(self) -> None:
        await self.parts.ahead.close()
        await self.parts.lifetimes.close()

    def refreshes(self) -> float:
        """The at-tail refreshes this worker started that have ended (``edge.refresh_ahead``)."""
        return sum(
            sample.value
            for family in self.metrics.refresh_ahead.collect()
            for sample in family.samples
            if sample.name.endswith("_total")
        )


class InProcessSupervisor:
    """The one hop of ``--workers N`` that is not production code: the supervisor's
    ``POST /observed`` (edge.workers.admin), in process. A message one worker's ``Siblings``
    tells is applied by every other worker, each in a context of its own as in its own process,
    before the teller's call returns. What a worker fails to apply is kept in ``errors`` (the
    state machine fails on it: in production it would be a 400 and a sibling left behind)."""

    def __init__(self) -> None:
        self.workers: list[EdgeUnderTest] = []
        self.errors: list[BaseException] = []

    def transport(self, sender: int) -> Transport:
        async def tell(body: bytes) -> None:
            forgot = decode_forgot(json.loads(body)) is not None
            event("siblings told " + ("a forgetting" if forgot else "an observation"))
            others = [w for i, w in enumerate(self.workers) if i != sender]
            applied = await asyncio.gather(
                *(
                    asyncio.create_task(worker.apply(body), context=contextvars.Context())
                    for worker in others
                ),
                return_exceptions=True,
            )
            self.errors.extend(e for e in applied if isinstance(e, BaseException))

        return tell


class ReferenceEdge(EdgeUnderTest):
    """A deliberately naive cache that is correct by construction, to prove the oracle raises no
    false alarms: whole origin answers per (path, scope, offset), an open one reused for the
    freshness window only, a closed one forever; everything of a path forgotten on any write
    through the edge, a purge, or a 404 (that scope); a fill that raced such an event is not
    kept and gets no tag; ETags carry a counter of those events. As a worker, it tells its
    siblings every such event but a purge (the supervisor sends that to every worker)."""

    def __init__(self, settings: Settings, origin: FakeOrigin, clock: Callable[[], float]) -> None:
        self.origin = origin
        self._clock = clock
        self._freshness = settings.tail_freshness_seconds
        self._answers: dict[tuple[str, str, str | None, str | None], tuple[Seen, float]] = {}
        self._generation: dict[str, int] = {}
        self._siblings: list[ReferenceEdge] = []

    async def read(
        self,
        path: str,
        offset: str | None,
        *,
        credentials: Sequence[tuple[str, str]],
        if_none_match: str | None,
        accept_encoding: str | None,
        origin: str | None = None,
    ) -> Seen:
        key = (path, auth_scope(credentials), offset, origin)
        kept = self._answers.get(key)
        if kept is not None and (kept[0].closed or self._clock() - kept[1] < self._freshness):
            seen = kept[0]
        else:
            generation = self._generation.get(path, 0)
            asked = [*credentials, *([("Origin", origin)] if origin is not None else [])]
            seen, _, _ = await relay(self.origin, path, offset, asked)
            if seen.status in (404, 410):
                self._told(path, key[1])
            if seen.status != 200:
                return replace(seen, cache_control="no-store")
            if self._generation.get(path, 0) == generation:
                tag = f'"{generation}:{offset}:{seen.next_offset}{":c" if seen.closed else ""}"'
                keys = purge_keys(path)
                seen = replace(
                    seen, etag=tag, surrogate_key=keys.surrogate_key, cache_tag=keys.cache_tag
                )
                kept = (seen, self._clock())
                self._answers[key] = kept
            else:
                # The fill raced a forget: its bytes may be of either side of it, so it gets no
                # tag (as the edge relays such answers without one) and is not kept.
                seen = replace(seen, etag=None, cache_control="no-store")
                kept = None
        if kept is not None and seen.up_to_date and not seen.closed:
            # Fresh for the window from when it was fetched: Age counts from then.
            age = math.floor(self._clock() - kept[1])
            control = f"max-age={math.floor(self._freshness)}"
            seen = replace(seen, cache_control=control, age=str(age))
        if seen.etag is not None and if_none_match == seen.etag:
            return replace(seen, status=304, body=b"")
        return seen

    def _forget(self, path: str, scope: str | None = None) -> None:
        self._generation[path] = self._generation.get(path, 0) + 1
        for key in [k for k in self._answers if k[0] == path and scope in (None, k[1])]:
            del self._answers[key]

    def _told(self, path: str, scope: str | None = None) -> None:
        for edge in (self, *self._siblings):
            edge._forget(path, scope)

    def link(self, supervisor: InProcessSupervisor, index: int) -> None:
        self._siblings = [
            w
            for i, w in enumerate(supervisor.workers)
            if i != index and isinstance(w, ReferenceEdge)
        ]

    def observed(
        self,
        method: str,
        path: str,
        status: int,
        request_headers: Sequence[tuple[str, str]],
        response_headers: Sequence[tuple[str, str]],
    ) -> None:
        if method in ("PUT", "POST", "DELETE"):
            self._told(path)

    def purge(self, path: str) -> None:
        self._forget(path)

    def refreshes(self) -> float:
        return 0  # it refreshes nothing ahead: an open answer is reused for the window only

    async def close(self) -> None:
        return None


# ---------------------------------------------------------------------------------------------
# The oracle.
# ---------------------------------------------------------------------------------------------


class Violation(AssertionError):
    pass


@dataclass(frozen=True, slots=True)
class Context:
    """What the grader needs to know about one read."""

    path: str
    offset: str | None
    scope: str
    lowest: int  # the oldest version of ``path`` the edge may still serve
    told: int  # the version at which the edge was last told to forget the stream
    relaxed: bool  # for the worker that answers
    now_ms: int
    window_ms: int  # tail_freshness_seconds
    # Relaxed for some worker: a tag vouches for what the whole edge hands out with it.
    anywhere: bool = False


async def _awaited(pending: Awaitable[object]) -> object:
    return await pending


def _query(offset: str | None) -> list[tuple[str, str]]:
    return [] if offset is None else [("offset", offset)]


def answer_of(instance: Instance, seen: Seen, path: str, offset: str | None) -> bool:
    """Is ``seen`` (a 200) what a faithful edge may answer from ``instance`` (one version)?"""
    if seen.content_type != instance.content_type:
        return False
    expected = read_response(path, instance, _query(offset))
    if expected.status != 200:
        return False
    if seen.up_to_date:
        return (
            seen.body == expected.body
            and seen.next_offset == expected.header("stream-next-offset")
            and seen.closed == (expected.header("stream-closed") == "true")
        )
    if seen.closed:
        return False  # Stream-Closed only on an answer that reaches the tail
    # Capped: a prefix of the messages, ending where a read of Stream-Next-Offset resumes exactly.
    messages = instance.read(offset)
    for n in range(len(messages) + 1):
        if instance.format(messages[:n]) == seen.body:
            return seen.next_offset in instance.positions and (
                instance.read(seen.next_offset) == messages[n:]
            )
    return False


class Grader:
    def __init__(self, model: OriginModel) -> None:
        self.model = model
        # message id -> every (path, generation) that holds it (a fork holds its source's)
        self.owner: dict[int, set[tuple[str, int]]] = {}

    def learn_ids(self, path: str) -> None:
        instance = self.model.current(path)
        if instance is not None:
            for message_id in instance.ids:
                self.owner.setdefault(message_id, set()).add((path, instance.generation))

    def _versions(self, ctx: Context) -> list[Version]:
        return self.model.history(ctx.path)[ctx.lowest :]

    def _fresh(self, ctx: Context) -> list[Version]:
        """Versions current at some moment of [now - window, now] (boundary included)."""
        start = ctx.now_ms - ctx.window_ms
        fresh = []
        for version in self._versions(ctx):
            until = self.model.until_ms(ctx.path, version.index)
            if version.since_ms <= ctx.now_ms and (until is None or until >= start):
                fresh.append(version)
        return fresh

    def _fail(self, ctx: Context, seen: Seen, why: str) -> Violation:
        lines = [
            f"{why}",
            f"  read {ctx.path}?offset={ctx.offset} scope={ctx.scope} at t={ctx.now_ms}ms "
            f"(window {ctx.window_ms}ms, versions >= {ctx.lowest}, told at {ctx.told}"
            f"{', relaxed' if ctx.relaxed else ''})",
            f"  edge answered: {seen.describe()}",
        ]
        history = self.model.history(ctx.path)
        if len(history) > 16:
            lines.append(f"  ... {len(history) - 16} older versions")
        for version in history[-16:]:
            until = self.model.until_ms(ctx.path, version.index)
            if version.instance is None:
                model = "404 (no stream)"
            else:
                expected = read_response(ctx.path, version.instance, _query(ctx.offset))
                model = (
                    f"{expected.status} next={expected.header('stream-next-offset')}"
                    f"{' closed' if expected.header('stream-closed') else ''} "
                    f"body={_short(expected.body)} [instance #{version.instance.generation}]"
                )
            end = "" if until is None else str(until)
            lines.append(f"  origin v{version.index} [{version.since_ms}..{end}ms): {model}")
        return Violation("\n".join(lines))

    def check(self, ctx: Context, seen: Seen) -> None:
        if seen.status == 200:
            self._check_200(ctx, seen)
        elif seen.status == 404:
            if not any(v.instance is None for v in self._fresh(ctx)):
                raise self._fail(ctx, seen, "404 for a stream that existed all along")
        elif seen.status == 410:
            if not any(
                v.instance is not None and v.instance.soft_deleted for v in self._fresh(ctx)
            ):
                raise self._fail(ctx, seen, "410 for a stream that was never soft-deleted")
        elif seen.status == 400:
            # The origin looks for the stream first (404), but an edge may refuse a malformed
            # offset without asking.
            if valid_read_offset(ctx.offset):
                raise self._fail(ctx, seen, "400 for an offset the origin accepts")
        else:
            raise self._fail(ctx, seen, f"unexpected status {seen.status}")

    def _check_200(self, ctx: Context, seen: Seen) -> None:
        ids = message_ids(seen.content_type, seen.body)
        if ids is None:
            raise self._fail(ctx, seen, "malformed body for its Content-Type")
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise self._fail(ctx, seen, f"messages {repeated} appear twice in one answer")
        allowed = {
            v.instance.generation
            for v in self.model.history(ctx.path)[ctx.told :]
            if v.instance is not None
        }
        mine = {(ctx.path, g) for g in allowed}
        foreign = [i for i in ids if not self.owner.get(i, set()) & mine]
        if foreign:
            owners = {i: self.owner.get(i) for i in foreign}
            raise self._fail(
                ctx,
                seen,
                f"messages of another stream or older instance: {owners} (allowed {allowed})",
            )
        if seen.closed and not seen.up_to_date:
            raise self._fail(ctx, seen, "Stream-Closed without Stream-Up-To-Date")
        if ctx.relaxed:
            types = {v.instance.content_type for v in self._versions(ctx) if v.instance}
            if seen.content_type not in types:
                raise self._fail(ctx, seen, "Content-Type of no instance the edge may serve")
            return
        mutable = seen.up_to_date and not seen.closed
        pool = self._fresh(ctx) if mutable else self._versions(ctx)
        for version in pool:
            if version.instance is not None and answer_of(
                version.instance, seen, ctx.path, ctx.offset
            ):
                return
        if mutable:
            why = "an at-tail answer the origin never gave within the freshness window"
        else:
            why = "an immutable (closed or capped) answer the origin's current instance never gave"
        raise self._fail(ctx, seen, why)


# ---------------------------------------------------------------------------------------------
# The state machine.
# ---------------------------------------------------------------------------------------------

# 950 and 2300: into the last tenth of a 1 s and a 2.5 s window, where a read at the tail starts
# a refresh-ahead (edge.log.ahead) that runs on while the machine goes on.
ADVANCES_MS = (1, 250, 950, 999, 1000, 1001, 2300, 2500, 3_600_000)
RACING = (
    "append-edge",
    "append-direct",
    "close-edge",
    "delete-edge",
    "delete-direct",
    "recreate-edge",
    "recreate-direct",
    "purge",
)


@dataclass(slots=True)
class Handed:
    """A tag the edge handed out, and what came with it."""

    seen: Seen
    offset: str | None  # of the read it answered
    epoch: int  # how many times the edge had been told the stream changed, then
    relaxed: bool  # for some worker, then


# The worker a request goes to (the one that relays it, for a write), chosen by Hypothesis among
# the machine's workers; with one worker it is always 0 and draws nothing.
WORKER = st.runner().flatmap(lambda machine: st.sampled_from(range(machine.worker_count)))


class CatchupMachine(RuleBasedStateMachine):
    edge_factory: Callable[[Settings, FakeOrigin, Callable[[], float]], EdgeUnderTest] = (
        EdgeUnderTest
    )
    # --workers N: N edges (one process each: its own cache, fast path, CORS book and origin
    # client) over one origin, told of each other's writes and forgettings through an
    # InProcessSupervisor.
    worker_count = 1

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.model = OriginModel()
        self.grader = Grader(self.model)
        self.origins = [
            FakeOrigin(self.model, on_served=functools.partial(self._served, worker))
            for worker in range(self.worker_count)
        ]
        self.origin = self.origins[0]
        self.workers: list[EdgeUnderTest] = []
        self.supervisor: InProcessSupervisor | None = None
        self.window_ms = 1000
        self.next_id = FIRST_ID
        # (path, scope) -> the version at which the edge was last told to forget it, and a count
        self.told: dict[tuple[str, str], int] = {}
        self.epoch: dict[tuple[str, str], int] = {}
        self.written: dict[str, int] = {}  # path -> version of the last write through the edge
        # (worker, path, scope) -> (version, generation) of each 200 the origin gave that
        # worker's fills in that scope
        self.served: dict[tuple[int, str, str], list[tuple[int, int]]] = {}
        # (scope, path, tag) -> what came with the tag when the edge last handed it out
        self.tags: dict[tuple[str, str, str], Handed] = {}
        self.edge_offsets: dict[str, set[str]] = {}
        self.read_offsets: dict[str, list[str | None]] = {}

    @property
    def edge(self) -> EdgeUnderTest | None:
        """The first worker (the only one without --workers)."""
        return self.workers[0] if self.workers else None

    # --- setup ---

    @initialize(
        freshness=st.sampled_from([1.0, 0.0, 2.5, 30.0]),
        max_response_bytes=st.sampled_from([4 * MiB, 12, 40]),
        cache_bytes=st.sampled_from([256 * MiB, 1400]),
        cors_by_origin=st.booleans(),
    )
    def setup(
        self, freshness: float, max_response_bytes: int, cache_bytes: int, cors_by_origin: bool
    ) -> None:
        self.window_ms = round(freshness * 1000)
        # Every gzip-accepting read is compressed (the machine's bodies are small), so
        # compressions can be in flight while streams change.
        self._compress_min = catchup_module.COMPRESS_MIN_BYTES
        catchup_module.COMPRESS_MIN_BYTES = 0
        config = Settings(
            origin="http://origin.invalid",
            listen=Address.parse("127.0.0.1:0"),
            admin_listen=Address.parse("127.0.0.1:0"),
            tail_freshness_seconds=freshness,
            max_response_bytes=max_response_bytes,
            cache_bytes=cache_bytes,
            max_segment_bytes=min(32 * MiB, cache_bytes),
        )
        if self.worker_count > 1:
            # Each worker's share of the bounds, as the supervisor gives it (edge.workers).
            config = replace(per_worker(replace(config, workers=self.worker_count)), workers=1)
        for origin in self.origins:
            origin.cors_by_origin = cors_by_origin
            edge = self.edge_factory(config, origin, lambda: self.model.now_ms / 1000)
            self.workers.append(edge)
        if self.worker_count > 1:
            self.supervisor = InProcessSupervisor()
            self.supervisor.workers = self.workers
            for index, edge in enumerate(self.workers):
                edge.link(self.supervisor, index)

    @initialize(
        content_types=st.tuples(*(st.sampled_from([JSON_TYPE, TEXT_TYPE]) for _ in PATHS)),
        initial=st.sampled_from([0, 1, 2]),
    )
    def streams(self, content_types: tuple[str, ...], initial: int) -> None:
        """Both streams exist at the start (most reads should find something)."""
        for path, content_type in zip(PATHS, content_types, strict=True):
            self.do_create(path, content_type, via_edge=False, initial=initial)

    def teardown(self) -> None:
        catchup_module.COMPRESS_MIN_BYTES = getattr(self, "_compress_min", 1024)
        try:
            if self.workers:
                fast = sum(getattr(edge, "fast_answers", 0) for edge in self.workers)
                event("reads answered by the pre-serialised hit path" if fast else "none stored")
                remembered = sum(getattr(e, "remembered_answers", 0) for e in self.workers)
                event(
                    "heads met before answered as remembered" if remembered else "none remembered"
                )
                refreshed = sum(edge.refreshes() for edge in self.workers)
                event("at-tail answers refreshed ahead" if refreshed else "none refreshed ahead")
            for edge in self.workers:
                self.loop.run_until_complete(edge.close())
        finally:
            self.loop.close()

    @invariant()
    def siblings_applied_everything(self) -> None:
        if self.supervisor is not None and self.supervisor.errors:
            raise self.supervisor.errors[0]

    # --- bookkeeping ---

    def _scope_of(self, headers: Iterable[tuple[str, str]]) -> str:
        credentials = tuple((n, v) for n, v in headers if n.lower() in ("authorization", "cookie"))
        for name, sent in SCOPES.items():
            if {(n.lower(), v) for n, v in sent} == {(n.lower(), v) for n, v in credentials}:
                return name
        return "other"

    def _served(self, worker: int, served: Served) -> None:
        if served.method != "GET":
            return
        scope = self._scope_of(served.headers)
        if served.status == 200 and served.generation is not None:
            key = (worker, served.path, scope)
            self.served.setdefault(key, []).append((served.version, served.generation))
        elif served.status in (404, 410):
            # The edge learns the stream is gone for this scope: it must forget what it held
            # (every worker: the one that learned it tells the others before it answers).
            self._tell(served.path, [scope], served.version)

    def _tell(self, path: str, scopes: Iterable[str], version: int | None = None) -> None:
        at = self.model.version_index(path) if version is None else version
        for scope in scopes:
            key = (path, scope)
            self.told[key] = max(self.told.get(key, 0), at)
            self.epoch[key] = self.epoch.get(key, 0) + 1

    def _wrote(self, path: str) -> None:
        self.written[path] = self.model.version_index(path)

    def _relaxed(self, path: str, scope: str, worker: int) -> bool:
        """Has ``worker`` been fed two instances of ``path`` in ``scope`` since the edge was last
        told? (A worker holds only what its own fills brought; what it is told by siblings
        only makes it forget, or says how far the current instance reached.)"""
        told = self.told.get((path, scope), 0)
        generations = {g for v, g in self.served.get((worker, path, scope), []) if v >= told}
        current = self.model.current(path)
        if current is not None:
            generations.add(current.generation)
        return len(generations) > 1

    def _relaxed_anywhere(self, path: str, scope: str) -> bool:
        return any(self._relaxed(path, scope, w) for w in range(self.worker_count))

    def _context(self, path: str, offset: str | None, scope: str, worker: int) -> Context:
        told = self.told.get((path, scope), 0)
        return Context(
            path=path,
            offset=offset,
            scope=scope,
            lowest=max(told, self.written.get(path, 0)),
            told=told,
            relaxed=self._relaxed(path, scope, worker),
            now_ms=self.model.now_ms,
            window_ms=self.window_ms,
            anywhere=self._relaxed_anywhere(path, scope),
        )

    def _still_relaxed(self, ctx: Context, worker: int) -> Context:
        """``ctx`` for an answer that raced a change: relaxed if it was before or is now."""
        return replace(
            ctx,
            relaxed=ctx.relaxed or self._relaxed(ctx.path, ctx.scope, worker),
            anywhere=ctx.anywhere or self._relaxed_anywhere(ctx.path, ctx.scope),
        )

    def _settle(self, pending: Awaitable[object] | None) -> None:
        if pending is not None:
            self.loop.run_until_complete(_awaited(pending))

    def _take_ids(self, count: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + count))
        self.next_id += count
        return ids

    @staticmethod
    def _body(content_type: str, ids: Sequence[int]) -> bytes:
        if content_type == JSON_TYPE:
            items = [f'{{"i":{i}}}' for i in ids]
            return (items[0] if len(items) == 1 else f"[{','.join(items)}]").encode()
        return b"".join(b"<%d>" % i for i in ids)

    # --- what happens at the origin (through the edge or not) ---

    def _write(
        self,
        method: str,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes,
        *,
        via_edge: bool,
        worker: int = 0,
    ) -> int:
        """``via_edge``: relayed by ``worker``, which observes the origin's answer (and tells
        its siblings) before the client hears it."""
        if body:  # as a client's request says it, and as the edge sees it relayed
            headers = [*headers, ("Content-Length", str(len(body)))]
        response = self.model.handle(method, path, "", headers, body)
        self.grader.learn_ids(path)
        via = f"via edge{self._on(worker)}" if via_edge else "directly"
        note(f"{method} {path} {via} -> {response.status}")
        if via_edge:
            edge = self.workers[worker]
            if method == "DELETE":
                self._settle(edge.deleted_through_edge(path, response.status))
            elif method == "PUT":
                self._settle(
                    edge.created_through_edge(path, response.status, headers, response.headers)
                )
            else:
                self._settle(
                    edge.observed(method, path, response.status, headers, response.headers)
                )
            if 200 <= response.status < 300:
                if response.status == 201 or method == "DELETE":
                    self._tell(path, SCOPES)
                self._wrote(path)
            elif response.status in (404, 410):
                event(f"{method} through the edge answered {response.status}")
                # Gone, said to a write or a DELETE it relayed: the edge forgets the stream as
                # if deleted through it (the machine's writes carry no credentials).
                self._tell(path, SCOPES)
        return response.status

    def _on(self, worker: int) -> str:
        return f" (worker {worker})" if self.worker_count > 1 else ""

    def do_create(
        self,
        path: str,
        content_type: str,
        *,
        via_edge: bool,
        initial: int = 0,
        closed: bool = False,
        worker: int = 0,
    ) -> int:
        headers = [("Content-Type", content_type)]
        if closed:
            headers.append(("Stream-Closed", "true"))
        body = self._body(content_type, self._take_ids(initial)) if initial else b""
        return self._write("PUT", path, headers, body, via_edge=via_edge, worker=worker)

    def do_append(
        self, path: str, count: int, *, via_edge: bool, close: bool = False, worker: int = 0
    ) -> int:
        current = self.model.current(path)
        content_type = current.content_type if current is not None else JSON_TYPE
        headers = [("Content-Type", content_type)]
        if close:
            headers.append(("Stream-Closed", "true"))
        body = self._body(content_type, self._take_ids(count))
        return self._write("POST", path, headers, body, via_edge=via_edge, worker=worker)

    def do_close(self, path: str, *, via_edge: bool, worker: int = 0) -> int:
        headers = [("Stream-Closed", "true")]
        return self._write("POST", path, headers, b"", via_edge=via_edge, worker=worker)

    def do_delete(self, path: str, *, via_edge: bool, worker: int = 0) -> int:
        return self._write("DELETE", path, [], b"", via_edge=via_edge, worker=worker)

    def do_fork(
        self,
        path: str,
        source: str,
        fork_offset: str | None,
        *,
        via_edge: bool,
        typed: bool = False,
        worker: int = 0,
    ) -> int:
        """``PUT path`` with ``Stream-Forked-From: source`` (and ``Stream-Fork-Offset``);
        ``typed``: with the source's Content-Type (else none: the fork takes the source's)."""
        headers = [("Stream-Forked-From", source)]
        if fork_offset is not None:
            headers.append(("Stream-Fork-Offset", fork_offset))
        current = self.model.current(source)
        if typed and current is not None:
            headers.append(("Content-Type", current.content_type))
        status = self._write("PUT", path, headers, b"", via_edge=via_edge, worker=worker)
        self.grader.learn_ids(path)
        event(f"fork {status}")
        return status

    def do_purge(self, path: str) -> None:
        """From the admin listener: the supervisor's ``POST /purge`` goes to every worker."""
        note(f"purge {path}")
        for edge in self.workers:
            self._settle(edge.purge(path))
        self._tell(path, SCOPES)

    def do_advance(self, ms: int) -> None:
        self.model.advance(ms)
        note(f"clock -> {self.model.now_ms}ms")

    # --- reads ---

    def do_read(
        self,
        path: str,
        offset: str | None,
        scope: str = "public",
        if_none_match: str | None = None,
        accept_encoding: str | None = None,
        origin: str | None = None,
        worker: int = 0,
    ) -> Seen:
        ctx = self._context(path, offset, scope, worker)
        seen = self.loop.run_until_complete(
            self._edge_read(path, offset, scope, if_none_match, accept_encoding, origin, worker)
        )
        self._grade(ctx, seen, if_none_match, worker)
        self._grade_cors(seen, origin)
        return seen

    async def _edge_read(
        self,
        path: str,
        offset: str | None,
        scope: str,
        if_none_match: str | None,
        accept_encoding: str | None,
        origin: str | None = None,
        worker: int = 0,
    ) -> Seen:
        return await self.workers[worker].read(
            path,
            offset,
            credentials=SCOPES[scope],
            if_none_match=if_none_match,
            accept_encoding=accept_encoding,
            origin=origin,
        )

    def _grade_cors(self, seen: Seen, origin: str | None) -> None:
        """A grant is the one the origin gives this request's Origin, or none (never another
        requester's)."""
        granted = origin if self.origin.cors_by_origin else "*"
        if seen.allow_origin is not None and seen.allow_origin != granted:
            raise Violation(
                f"Access-Control-Allow-Origin {seen.allow_origin!r} for Origin {origin!r}"
                f" (the origin grants it {granted!r})"
            )

    def do_racing_compression(
        self, path: str, offset: str | None, mutation: str, *, worker: int = 0, writer: int = 0
    ) -> None:
        """A gzip read whose compression is still in flight while ``mutation`` happens."""
        edge = self.workers[worker]
        if not isinstance(edge, EdgeUnderTest) or isinstance(edge, ReferenceEdge):
            return
        ctx = self._context(path, offset, "public", worker)
        edge.compression_gate = asyncio.Event()
        edge.compression_started = asyncio.Event()
        task = self.loop.create_task(
            self._edge_read(path, offset, "public", None, "gzip", worker=worker)
        )
        started = self.loop.create_task(edge.compression_started.wait())
        try:
            self.loop.run_until_complete(
                asyncio.wait([task, started], return_when=asyncio.FIRST_COMPLETED)
            )
            note(f"{mutation} {'while compressing' if started.done() else 'after the read'}")
            self._mutate(path, mutation, writer)
        finally:
            edge.compression_gate.set()
            edge.compression_gate = None
            started.cancel()
            results = self.loop.run_until_complete(
                asyncio.gather(task, started, return_exceptions=True)
            )
        seen = results[0]
        if isinstance(seen, BaseException):
            raise seen
        assert isinstance(seen, Seen)
        self._grade(self._still_relaxed(ctx, worker), seen, None, worker)

    def do_racing_read(
        self,
        path: str,
        offset: str | None,
        mutation: str,
        *,
        scope: str = "public",
        readers: int = 1,
        on: Sequence[int] = (),
        writer: int = 0,
    ) -> list[Seen]:
        """Reads whose origin fill is in flight while ``mutation`` happens: ``readers`` of them,
        the i-th on worker ``on[i]`` (0 past its end); ``writer`` relays the mutation."""
        workers = [on[i] if i < len(on) else 0 for i in range(readers)]
        contexts = [self._context(path, offset, scope, worker) for worker in workers]
        arrivals = [origin.hold() for origin in self.origins]
        tasks = [
            self.loop.create_task(self._edge_read(path, offset, scope, None, None, worker=worker))
            for worker in workers
        ]
        waiters = [self.loop.create_task(arrived.wait()) for arrived in arrivals]
        try:
            self.loop.run_until_complete(
                asyncio.wait([*tasks, *waiters], return_when=asyncio.FIRST_COMPLETED)
            )
            in_flight = any(arrived.is_set() for arrived in arrivals)
            note(f"racing {mutation} ({'in flight' if in_flight else 'after the read'})")
            self._mutate(path, mutation, writer)
        finally:
            for origin in self.origins:
                origin.release()
            for waiter in waiters:
                waiter.cancel()
            results = self.loop.run_until_complete(
                asyncio.gather(*tasks, *waiters, return_exceptions=True)
            )
        answers: list[Seen] = []
        for result in results[:readers]:
            if isinstance(result, BaseException):
                raise result
            assert isinstance(result, Seen)
            answers.append(result)
        for ctx, worker, seen in zip(contexts, workers, answers, strict=True):
            self._grade(self._still_relaxed(ctx, worker), seen, None, worker)
        return answers

    def _mutate(self, path: str, mutation: str, writer: int = 0) -> None:
        current = self.model.current(path)
        content_type = current.content_type if current is not None else JSON_TYPE
        if mutation == "append-edge":
            self.do_append(path, 1, via_edge=True, worker=writer)
        elif mutation == "append-direct":
            self.do_append(path, 1, via_edge=False)
        elif mutation == "close-edge":
            self.do_close(path, via_edge=True, worker=writer)
        elif mutation == "delete-edge":
            self.do_delete(path, via_edge=True, worker=writer)
        elif mutation == "delete-direct":
            self.do_delete(path, via_edge=False)
        elif mutation in ("recreate-edge", "recreate-direct"):
            via_edge = mutation == "recreate-edge"
            self.do_delete(path, via_edge=via_edge, worker=writer)
            self.do_create(path, content_type, via_edge=via_edge, initial=1, worker=writer)
        elif mutation == "purge":
            self.do_purge(path)
        else:
            raise ValueError(mutation)

    def _grade(self, ctx: Context, seen: Seen, if_none_match: str | None, worker: int = 0) -> None:
        self.read_offsets.setdefault(ctx.path, []).append(ctx.offset)
        where = f"[{ctx.scope}]{self._on(worker)}"
        note(f"read {ctx.path}?offset={ctx.offset} {where} -> {seen.describe()}")
        event(f"status {seen.status}{' relaxed' if ctx.relaxed else ''}")
        if seen.status == 304:
            self._grade_keys(ctx, seen)
            self._grade_304(ctx, seen, if_none_match)
            return
        self.grader.check(ctx, seen)
        self._grade_caching(ctx, seen)
        if seen.status != 200:
            return
        if not seen.up_to_date:
            event("capped answer")
        if seen.next_offset is not None:
            self.edge_offsets.setdefault(ctx.path, set()).add(seen.next_offset)
        if seen.etag is None:
            return
        # Tags belong to a URL's resource: what a tag vouches for is kept per (scope, path),
        # whichever worker handed it out (a client's next request may reach any).
        key = (ctx.scope, ctx.path, seen.etag)
        epoch = self.epoch.get((ctx.path, ctx.scope), 0)
        handed = self.tags.get(key)
        if handed is not None and handed.seen.representation != seen.representation:
            across_told = handed.epoch != epoch
            if across_told or not (ctx.anywhere or handed.relaxed):
                why = (
                    "after the edge was told the stream changed"
                    if across_told
                    else "within one instance"
                )
                raise Violation(
                    f"ETag {seen.etag} handed out again for different bytes ({why}):\n"
                    f"  before (offset={handed.offset}): {handed.seen.describe()}\n"
                    f"  now ({ctx.path}?offset={ctx.offset}): {seen.describe()}"
                )
        self.tags[key] = Handed(seen=seen, offset=ctx.offset, epoch=epoch, relaxed=ctx.anywhere)

    def _grade_keys(self, ctx: Context, seen: Seen) -> None:
        """An answer the edge made of a stream (it has a tag) carries the stream's purge keys
        (no shared tier here: the stream's key alone), so a CDN's copy can be purged."""
        if seen.relayed or seen.etag is None:
            return
        keys = purge_keys(ctx.path)
        if (seen.surrogate_key, seen.cache_tag) != (keys.surrogate_key, keys.cache_tag):
            raise Violation(
                f"purge keys {seen.surrogate_key!r} / {seen.cache_tag!r} on an answer of "
                f"{ctx.path} (its keys: {keys.surrogate_key!r})"
            )

    def _grade_caching(self, ctx: Context, seen: Seen) -> None:
        """What a cache downstream is told. An answer that is not the edge's own (a refusal, a
        read it relayed: no tag) is kept by no tier. An at-tail answer, kept by a cache that
        honours ``max-age`` and ``Age`` for as long as they allow (``max-age - Age`` more
        seconds), must still be a true at-tail answer at the last moment it is served: one the
        origin gave within the freshness window plus a second (the rounding of ``Age``) of it,
        so lag does not stack (``edge.log.freshness``)."""
        if seen.relayed:
            return  # the test's own relay, standing in for ``Relay.forward``
        if seen.status != 200 or seen.etag is None:
            if "no-store" not in (seen.cache_control or ""):
                raise Violation(f"{seen.describe()} with Cache-Control {seen.cache_control!r}")
            return
        self._grade_keys(ctx, seen)
        if not (seen.up_to_date and not seen.closed) or ctx.relaxed:
            return
        found = re.search(r"max-age=(\d+)", seen.cache_control or "")
        if found is None or seen.age is None:
            raise Violation(
                f"an at-tail answer with Cache-Control {seen.cache_control!r} and Age "
                f"{seen.age!r}: {seen.describe()}"
            )
        kept_ms = (int(found.group(1)) - int(seen.age)) * 1000
        downstream = replace(ctx, window_ms=min(ctx.window_ms, ctx.window_ms + 1000 - kept_ms))
        if downstream.window_ms < ctx.window_ms:
            event("Age shortens what a cache downstream may keep")
        try:
            self.grader.check(downstream, seen)
        except Violation as stale:
            raise Violation(
                f"kept {kept_ms} ms more downstream (max-age and Age), it is older than the "
                f"freshness window then:\n{stale}"
            ) from None

    def _grade_304(self, ctx: Context, seen: Seen, if_none_match: str | None) -> None:
        if if_none_match is None:
            raise Violation(f"304 without If-None-Match: {seen.describe()}")
        # A weak tag (a CDN decoded the gzip bytes it was given with it for an identity client)
        # vouches for the bytes once decoded: the 304 may carry the tag of another coding.
        weak = if_none_match.startswith("W/")
        sent = if_none_match.removeprefix("W/")
        if seen.etag is not None and not weak and seen.etag.removeprefix("W/") != sent:
            raise Violation(f"304 with ETag {seen.etag}, the client sent {if_none_match}")
        handed = self.tags.get((ctx.scope, ctx.path, sent))
        if handed is None:
            raise Violation(f"304 for {if_none_match}, a tag never given for {ctx.path}")
        other = self.tags.get((ctx.scope, ctx.path, seen.etag or sent))
        if other is not None and other.seen.representation != handed.seen.representation:
            raise Violation(
                f"304 with ETag {seen.etag} for {if_none_match}: they were given with other "
                f"bytes ({other.seen.describe()} / {handed.seen.describe()})"
            )
        # What a tag vouches for is the bytes (body, Stream-Next-Offset, Stream-Closed), not
        # Stream-Up-To-Date, a fact about time: the held bytes must be a correct answer now,
        # saying up-to-date or not. They may come from another worker, which may have been fed
        # another instance (an untold recreation: then the tags of both may collide).
        held = handed.seen
        ctx = replace(ctx, relaxed=ctx.relaxed or ctx.anywhere)
        try:
            try:
                self.grader.check(ctx, held)
            except Violation:
                self.grader.check(ctx, replace(held, up_to_date=not held.up_to_date))
        except Violation as wrong:
            raise Violation(
                f"304 for {if_none_match}, but the answer that came with that tag "
                f"(offset={handed.offset}) is not a correct answer now:\n{wrong}"
            ) from None

    # --- rules ---

    @rule(
        path=st.sampled_from(PATHS),
        content_type=st.sampled_from([JSON_TYPE, TEXT_TYPE]),
        via_edge=st.booleans(),
        initial=st.sampled_from([0, 0, 1, 2]),
        closed=st.sampled_from([False, False, False, True]),
        worker=WORKER,
    )
    def create(
        self,
        path: str,
        content_type: str,
        via_edge: bool,
        initial: int,
        closed: bool,
        worker: int = 0,
    ) -> None:
        self.do_create(
            path, content_type, via_edge=via_edge, initial=initial, closed=closed, worker=worker
        )

    @rule(
        path=st.sampled_from(PATHS),
        count=st.sampled_from([1, 1, 2, 3]),
        via_edge=st.booleans(),
        close=st.sampled_from([False, False, False, False, True]),
        worker=WORKER,
    )
    def append(self, path: str, count: int, via_edge: bool, close: bool, worker: int = 0) -> None:
        self.do_append(path, count, via_edge=via_edge, close=close, worker=worker)

    @rule(path=st.sampled_from(PATHS), via_edge=st.booleans(), worker=WORKER)
    def close_stream(self, path: str, via_edge: bool, worker: int = 0) -> None:
        self.do_close(path, via_edge=via_edge, worker=worker)

    @rule(path=st.sampled_from(PATHS), via_edge=st.booleans(), worker=WORKER)
    def delete(self, path: str, via_edge: bool, worker: int = 0) -> None:
        self.do_delete(path, via_edge=via_edge, worker=worker)

    @rule(
        path=st.sampled_from(PATHS),
        delete_via_edge=st.sampled_from([True, True, False]),
        create_via_edge=st.sampled_from([True, False]),
        content_type=st.sampled_from([JSON_TYPE, TEXT_TYPE]),
        initial=st.sampled_from([0, 1, 2]),
        worker=WORKER,
        creator=WORKER,
    )
    def recreate(
        self,
        path: str,
        delete_via_edge: bool,
        create_via_edge: bool,
        content_type: str,
        initial: int,
        worker: int = 0,
        creator: int = 0,
    ) -> None:
        self.do_delete(path, via_edge=delete_via_edge, worker=worker)
        self.do_create(
            path, content_type, via_edge=create_via_edge, initial=initial, worker=creator
        )

    @rule(
        data=st.data(),
        source=st.sampled_from(PATHS),
        delete_via_edge=st.booleans(),
        fork_via_edge=st.sampled_from([True, True, False]),
        typed=st.booleans(),
        then_delete=st.sampled_from([None, None, True, False]),
        worker=WORKER,
        creator=WORKER,
    )
    def fork(
        self,
        data: st.DataObject,
        source: str,
        delete_via_edge: bool,
        fork_via_edge: bool,
        typed: bool,
        then_delete: bool | None,
        worker: int = 0,
        creator: int = 0,
    ) -> None:
        """The other path becomes a fork of ``source`` (deleted first if it exists), at one of
        the source's boundaries or its tail; then, maybe, the source is deleted (through the
        edge or not): a soft delete, since it has a fork."""
        path = next(p for p in PATHS if p != source)
        if self.model.current(path) is not None:
            self.do_delete(path, via_edge=delete_via_edge, worker=worker)
        current = self.model.current(source)
        boundaries = list(current.positions) if current is not None else []
        fork_offset = data.draw(st.sampled_from([None, *boundaries]), label="fork_offset")
        self.do_fork(path, source, fork_offset, via_edge=fork_via_edge, typed=typed, worker=creator)
        if then_delete is not None:
            self.do_delete(source, via_edge=then_delete, worker=worker)

    @rule()
    def restart_origin(self) -> None:
        """The origin restarts with an in-memory store: every stream is gone, and nothing tells
        the edge (to the grading, every path deleted behind its back at once; noticing it on a
        live tail is the tail's, which this machine does not run)."""
        note("the origin restarts: every stream is lost")
        self.model.restart()

    @rule(path=st.sampled_from(PATHS))
    def purge(self, path: str) -> None:
        self.do_purge(path)

    @rule(ms=st.sampled_from(ADVANCES_MS))
    def advance(self, ms: int) -> None:
        self.do_advance(ms)

    def _draw_offset(self, data: st.DataObject, path: str) -> str | None:
        issued = self.model.issued_offsets(path)
        near = [
            format_offset(seq, position + delta)
            for seq, position in map(parse_offset, issued)
            for delta in (-1, 1)
            if position + delta >= 0
        ]
        kinds = ["again", "issued", "issued", "edge", "near", "special"]
        kind = data.draw(st.sampled_from(kinds))
        pool: Sequence[str | None] = SPECIAL_OFFSETS
        again = self.read_offsets.get(path, [])[-3:]
        if kind == "again" and again:
            pool = again  # clients re-read from where they are: chains grow, answers get capped
        elif kind == "issued" and issued:
            pool = list(issued)
        elif kind == "edge" and self.edge_offsets.get(path):
            pool = sorted(self.edge_offsets[path])
        elif kind == "near" and near:
            pool = list(near)
        return data.draw(st.sampled_from(pool), label="offset")

    @rule(
        data=st.data(),
        path=st.sampled_from(PATHS),
        scope=st.sampled_from(["public", "public", "alice"]),
        conditional=st.booleans(),
        gzip_ok=st.sampled_from([False, False, True]),
        origin=st.sampled_from([None, None, GOOD_ORIGIN, EVIL_ORIGIN]),
        worker=WORKER,
    )
    def read(
        self,
        data: st.DataObject,
        path: str,
        scope: str,
        conditional: bool,
        gzip_ok: bool,
        origin: str | None,
        worker: int = 0,
    ) -> None:
        offset = self._draw_offset(data, path)
        if_none_match = None
        # Tags this URL was given first (what an HTTP cache sends), then the path's other tags.
        tags = sorted(
            (handed.offset != offset, tag)
            for (s, p, tag), handed in self.tags.items()
            if (s, p) == (scope, path)
        )
        if conditional and tags:
            if_none_match = data.draw(st.sampled_from([t for _, t in tags]), label="if_none_match")
            # As a CDN that decoded a gzip answer for an identity client sends it back (W/).
            if data.draw(st.booleans(), label="weakened"):
                if_none_match = "W/" + if_none_match
        gzip = "gzip" if gzip_ok else None
        self.do_read(path, offset, scope, if_none_match, gzip, origin, worker=worker)

    @rule(
        path=st.sampled_from(PATHS),
        via_edge=st.booleans(),
        wait=st.sampled_from([0, 1001]),
        worker=WORKER,
        writer=WORKER,
    )
    def poll(self, path: str, via_edge: bool, wait: int, worker: int = 0, writer: int = 0) -> None:
        """A writer appends, a reader reads again from where it read last: chains of segments
        grow by deltas, and small --max-response-bytes answers get capped."""
        self.do_append(path, 1, via_edge=via_edge, worker=writer)
        if wait:
            self.do_advance(wait)
        offsets = self.read_offsets.get(path) or ["-1"]
        self.do_read(path, offsets[-1], worker=worker)

    @rule(
        data=st.data(),
        path=st.sampled_from(PATHS),
        mutation=st.sampled_from(RACING),
        readers=st.sampled_from([1, 1, 2]),
        worker=WORKER,
        second=WORKER,
        writer=WORKER,
    )
    def racing_read(
        self,
        data: st.DataObject,
        path: str,
        mutation: str,
        readers: int,
        worker: int = 0,
        second: int = 0,
        writer: int = 0,
    ) -> None:
        offset = self._draw_offset(data, path)
        on = (worker, second)
        self.do_racing_read(path, offset, mutation, readers=readers, on=on, writer=writer)

    @rule(
        data=st.data(),
        path=st.sampled_from(PATHS),
        mutation=st.sampled_from(RACING),
        worker=WORKER,
        writer=WORKER,
    )
    def racing_compression(
        self, data: st.DataObject, path: str, mutation: str, worker: int = 0, writer: int = 0
    ) -> None:
        offset = self._draw_offset(data, path)
        self.do_racing_compression(path, offset, mutation, worker=worker, writer=writer)


CatchupMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    # One bug at a time: shrinking several distinct failures at once takes minutes.
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestCatchupProperties = CatchupMachine.TestCase
# Shrinking a failure can take minutes: more than the suite's default timeout.
TestCatchupProperties.pytestmark = [pytest.mark.timeout(900)]


class ReferenceMachine(CatchupMachine):
    """The same machine in front of ``ReferenceEdge``: it must pass (no false alarms)."""

    edge_factory = ReferenceEdge


ReferenceMachine.TestCase.settings = settings(
    CatchupMachine.TestCase.settings, max_examples=max(10, EXAMPLES // 4)
)
TestOracleAcceptsAReferenceCache = ReferenceMachine.TestCase
TestOracleAcceptsAReferenceCache.pytestmark = [pytest.mark.timeout(900)]


class TwoWorkersMachine(CatchupMachine):
    """``--workers 2``: every read and every write through the edge goes to a worker Hypothesis
    chooses; graded as one edge (what one worker was told, every worker was)."""

    worker_count = 2


TwoWorkersMachine.TestCase.settings = settings(
    CatchupMachine.TestCase.settings, max_examples=max(10, EXAMPLES // 2)
)
TestCatchupMachineTwoWorkers = TwoWorkersMachine.TestCase
TestCatchupMachineTwoWorkers.pytestmark = [pytest.mark.timeout(900)]


class ReferenceTwoWorkersMachine(TwoWorkersMachine):
    """Two reference caches as workers (each tells the other what makes it forget): the two-worker
    grading raises no false alarms."""

    edge_factory = ReferenceEdge


ReferenceTwoWorkersMachine.TestCase.settings = settings(
    CatchupMachine.TestCase.settings, max_examples=max(10, EXAMPLES // 8)
)
TestOracleAcceptsTwoReferenceWorkers = ReferenceTwoWorkersMachine.TestCase
TestOracleAcceptsTwoReferenceWorkers.pytestmark = [pytest.mark.timeout(900)]


# ---------------------------------------------------------------------------------------------
# Scenarios the machine found, kept as plain tests (readable, and they fail fast).
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def machine() -> Iterator[CatchupMachine]:
    m = CatchupMachine()
    m.setup(freshness=1.0, max_response_bytes=4 * MiB, cache_bytes=256 * MiB, cors_by_origin=False)
    yield m
    m.teardown()


A, B = PATHS


def _ids(seen: Seen) -> list[int] | None:
    return message_ids(seen.content_type, seen.body)


def test_a_read_past_the_tail_is_not_a_segment(machine: CatchupMachine) -> None:
    """The origin answers a read past its tail with its real, smaller tail; stored as a segment,
    that backward "segment" makes later reads at that offset return what follows the old tail."""
    machine.do_create(A, JSON_TYPE, via_edge=False)
    machine.do_append(A, 1, via_edge=False)
    machine.do_read(A, PAST_EVERYTHING)  # 200 [] and the tail, as the origin says
    machine.do_append(A, 1, via_edge=True)
    machine.do_read(A, PAST_EVERYTHING)  # still nothing: the offset is past every message


def test_a_backward_segment_never_loops(machine: CatchupMachine) -> None:
    """[30 -> 15) from a read past the tail, then [15 -> 30) once the tail reaches 30: a chain
    that follows both repeats the same message until the segment limit."""
    machine.do_create(A, JSON_TYPE, via_edge=False)
    machine.do_append(A, 1, via_edge=False)  # tail _15
    machine.do_read(A, format_offset(0, 30))
    machine.do_append(A, 1, via_edge=True)  # tail _30: same length, same offsets
    machine.do_read(A, format_offset(0, 15))
    machine.do_read(A, format_offset(0, 30))


def test_recreate_through_the_edge_forgets_the_old_instance(machine: CatchupMachine) -> None:
    machine.do_create(A, JSON_TYPE, via_edge=False)
    machine.do_append(A, 1, via_edge=False)
    machine.do_read(A, "-1")  # caches [-1 -> _15) = [{"i":100}]
    machine.do_delete(A, via_edge=False)
    machine.do_create(A, JSON_TYPE, via_edge=True)  # PUT 201 through the edge
    machine.do_append(A, 1, via_edge=False)  # [{"i":101}] at the same offsets
    machine.do_read(A, "-1")


def test_a_closed_stream_recreated_through_the_edge_is_not_served(
    machine: CatchupMachine,
) -> None:
    machine.do_create(A, JSON_TYPE, via_edge=False)
    machine.do_append(A, 1, via_edge=False, close=True)
    machine.do_read(A, "-1")  # closed: served forever
    machine.do_delete(A, via_edge=False)
    machine.do_create(A, JSON_TYPE, via_edge=True)
    machine.do_read(A, "-1")


def test_recreate_with_another_content_type(machine: CatchupMachine) -> None:
    machine.do_create(A, TEXT_TYPE, via_edge=False)
    machine.do_append(A, 1, via_edge=False)
    machine.do_read(A, "-1")
    machine.do_delete(A, via_edge=False)
    machine.do_create(A, JSON_TYPE, via_edge=True)
    machine.do_append(A, 1, via_edge=False)
    machine.do_read(A, "-1")


def test_no_304_for_a_tag_of_a_previous_instance(machine: CatchupMachine) -> None:
    """The edge forgets the old bytes (DELETE through it) and fetches the new ones, but the new
    instance's answer has the old answer's offsets, hence its tag: a client holding the old bytes
    must not be told they are current."""
    machine.do_create(A, JSON_TYPE, via_edge=False)
    machine.do_append(A, 1, via_edge=False)
    old = machine.do_read(A, "-1")
    machine.do_delete(A, via_edge=True)
    machine.do_create(A, JSON_TYPE, via_edge=True)
    machine.do_append(A, 1, via_edge=False)
    machine.do_read(A, "-1", if_none_match=old.etag)


def test_a_fill_in_flight_during_a_recreate_is_not_kept(machine: CatchupMachine) -> None:
    machine.do_create(A, JSON_TYPE, via_edge=False)
    machine.do_append(A, 1, via_edge=False)
    machine.do_racing_read(A, "-1", "recreate-edge")  # the old answer may go to this reader
    current = machine.model.current(A)
    assert current is not None
    # but to nobody after the recreate
    assert _ids(machine.do_read(A, "-1")) == sorted(current.ids)


def test_a_fill_in_flight_during_a_close_does_not_reopen_the_stream(
    machine: CatchupMachine,
) -> None:
    """Read-after-write: the close went through the edge, so the next read must say closed."""
    machine.do_create(A, JSON_TYPE, via_edge=False)
    machine.do_append(A, 1, via_edge=False)
    machine.do_racing_read(A, "-1", "close-edge")
    assert machine.do_read(A, "-1").closed


def test_a_fill_in_flight_during_a_delete_is_not_kept(machine: CatchupMachine) -> None:
    machine.do_create(A, JSON_TYPE, via_edge=False)
    machine.do_append(A, 1, via_edge=False)
    machine.do_racing_read(A, "-1", "delete-edge")
    assert machine.do_read(A, "-1").status == 404


def test_a_new_content_type_is_a_new_instance(machine: CatchupMachine) -> None:
    """Recreated behind the edge's back (undetectable in general), but the delta's Content-Type
    says the stream is another one: a JSON prefix must not be joined to a text delta."""
    machine.do_create(A, JSON_TYPE, via_edge=False)
    machine.do_read(A, "-1")  # [-1 -> _0) = []
    machine.do_delete(A, via_edge=False)
    machine.do_create(A, TEXT_TYPE, via_edge=False)
    machine.do_append(A, 1, via_edge=True)
    machine.do_read(A, "-1")


def test_a_gzip_body_compressed_during_a_recreate_is_never_the_new_streams(
    machine: CatchupMachine,
) -> None:
    """The compression (in a thread for large bodies) outlives a delete and recreate through
    the edge; the stored answer made of it must belong to the instance it was made from."""
    machine.do_create(A, TEXT_TYPE, via_edge=False, initial=3, closed=True)
    for _ in range(4):  # learned, lifetime asked, stored
        machine.do_read(A, "-1", accept_encoding="gzip")
    edge = machine.edge
    assert isinstance(edge, EdgeUnderTest)
    assert edge.fast_answers > 0  # the stored answer is in use
    # A range not yet stored, so the full path compresses it (held) while the stream changes.
    machine.do_racing_compression(A, OFFSET_ZERO, "recreate-edge")
    for _ in range(3):
        machine.do_read(A, OFFSET_ZERO, accept_encoding="gzip")


def test_an_append_of_another_content_type_is_another_instance() -> None:
    """Found by the machine (its falsifying example, step for step): stream b, text, is read in
    small capped answers (12 bytes), deleted and recreated as JSON at the origin, then appended
    to through the edge up to the tail the edge knew; no tail contradicts the old instance, and
    a capped read from -1 never asks the origin. The append's Content-Type does: the origin
    appends only bytes of the stream's own type."""
    state = CatchupMachine()
    state.setup(freshness=1.0, max_response_bytes=12, cache_bytes=268435456, cors_by_origin=False)
    try:
        state.streams(content_types=(JSON_TYPE, JSON_TYPE), initial=0)
        state.recreate(
            content_type=TEXT_TYPE, create_via_edge=True, delete_via_edge=True, initial=1, path=B
        )
        state.poll(path=A, via_edge=False, wait=0)
        state.poll(path=A, via_edge=False, wait=0)
        state.poll(path=B, via_edge=False, wait=0)
        state.poll(path=A, via_edge=False, wait=0)
        state.poll(path=A, via_edge=False, wait=0)
        state.poll(path=B, via_edge=True, wait=0)
        state.recreate(
            content_type=JSON_TYPE, create_via_edge=False, delete_via_edge=False, initial=1, path=B
        )
        state.poll(path=B, via_edge=True, wait=0)  # the old instance's bytes were served here
    finally:
        state.teardown()


def test_a_relayed_read_hands_out_no_tag_of_the_origins() -> None:
    """Found by the two-worker machine (its falsifying example, step for step): the origin's
    CORS varies by Origin, so a read from an Origin a worker has no word on is relayed, and
    the origin's ETag (path and offsets: the same for a recreated stream) went to the client.
    After a DELETE and PUT through the edge, the other worker, whose CORS book had not seen that
    Origin either, relayed the new stream's bytes under the same tag (one edge: two Origins).
    The edge hands out no tag it cannot honour: relayed reads carry no validator."""
    state = TwoWorkersMachine()
    state.setup(
        freshness=1.0, max_response_bytes=4 * MiB, cache_bytes=256 * MiB, cors_by_origin=True
    )
    try:
        state.streams(content_types=(JSON_TYPE, JSON_TYPE), initial=1)
        first = state.do_read(A, None, origin=GOOD_ORIGIN, worker=0)
        assert first.relayed
        assert first.etag is None
        state.recreate(
            content_type=JSON_TYPE, create_via_edge=True, creator=0, delete_via_edge=True,
            initial=1, path=A, worker=0,
        )  # fmt: skip
        state.do_read(A, None, origin=GOOD_ORIGIN, worker=1)
    finally:
        state.teardown()


def test_an_at_tail_answer_says_how_old_its_tail_is_on_both_paths() -> None:
    """Its ``Age`` is how long ago the edge observed the tail, so a cache downstream keeps it
    no longer than the freshness window from then: here the origin moved on (behind the edge)
    just after the edge saw the tail, and 2 s later the edge still serves that tail (within
    --tail-freshness 2.5), from the hit path and from the full path, with ``max-age=2`` and
    ``Age: 2``: kept nowhere any longer. Without ``Age``, a cache would keep it 2 s more."""
    state = CatchupMachine()
    state.setup(
        freshness=2.5, max_response_bytes=4 * MiB, cache_bytes=256 * MiB, cors_by_origin=False
    )
    try:
        state.do_create(A, TEXT_TYPE, via_edge=False, initial=1)
        first = state.do_read(A, "-1")  # a fill: observed now
        assert (first.cache_control, first.age) == ("public, max-age=2", "0")
        state.do_append(A, 1, via_edge=False)  # behind the edge's back
        state.do_advance(1000)
        state.do_advance(1000)
        edge = state.edge
        assert isinstance(edge, EdgeUnderTest)
        before = edge.fast_answers
        stored = state.do_read(A, "-1")
        assert edge.fast_answers == before + 1
        full = state.do_read(A, "-1", accept_encoding="gzip")  # not stored yet: the full path
        assert edge.fast_answers == before + 1
        for seen in (stored, full):
            assert (seen.cache_control, seen.age, seen.body) == ("public, max-age=2", "2", b"<100>")
    finally:
        state.teardown()


def test_a_weak_gzip_tag_revalidates_the_identity_answer_on_both_paths(
    machine: CatchupMachine,
) -> None:
    """A CDN fetched the gzip answer and decoded it for an identity client, weakening its tag
    (``W/"…:gzip"``); the client's revalidation names the same bytes: 304, from the full path
    and then from the hit path, with the identity answer's tag."""
    machine.do_create(A, TEXT_TYPE, via_edge=False, initial=2, closed=True)
    gzipped = machine.do_read(A, "-1", accept_encoding="gzip")
    assert gzipped.etag is not None
    assert gzipped.etag.endswith(':gzip"')
    edge = machine.edge
    assert isinstance(edge, EdgeUnderTest)
    weakened = f"W/{gzipped.etag}"
    full = machine.do_read(A, "-1", if_none_match=weakened)  # identity: nothing stored yet
    assert edge.fast_answers == 0
    for _ in range(4):  # learned its lifetime, stored
        identity = machine.do_read(A, "-1")
    before = edge.fast_answers
    stored = machine.do_read(A, "-1", if_none_match=weakened)
    assert edge.fast_answers == before + 1
    for seen in (full, stored):
        assert seen.status == 304
        assert seen.etag == identity.etag == gzipped.etag.removesuffix(':gzip"') + '"'
    strong = machine.do_read(A, "-1", if_none_match=gzipped.etag)  # the gzip bytes themselves
    assert strong.status == 200


def test_a_stored_answer_is_given_only_under_the_generation_its_keys_name(
    machine: CatchupMachine,
) -> None:
    """The stored bytes carry the instance's purge keys, which name its generation: should the
    generation change while the answer is stored (the shared tier names the instance), the hit
    path stops giving it, and the full path's answer (stored again) names the new one."""
    machine.do_create(A, TEXT_TYPE, via_edge=False, initial=2, closed=True)
    edge = machine.edge
    assert isinstance(edge, EdgeUnderTest)

    async def read() -> Seen:
        return await edge.read(A, "-1", credentials=(), if_none_match=None, accept_encoding=None)

    for _ in range(4):  # learned, lifetime asked, stored
        machine.loop.run_until_complete(read())
    before = edge.fast_answers
    assert machine.loop.run_until_complete(read()).surrogate_key == purge_keys(A).surrogate_key
    assert edge.fast_answers == before + 1
    instance = edge.parts.local.instance(A)
    assert instance is not None
    instance.generation = "g2"
    renamed = machine.loop.run_until_complete(read())
    assert edge.fast_answers == before + 1  # not the stored answer
    keys = purge_keys(A, "g2")
    assert (renamed.surrogate_key, renamed.cache_tag) == (keys.surrogate_key, keys.cache_tag)
    again = machine.loop.run_until_complete(read())
    assert edge.fast_answers == before + 2
    assert again.surrogate_key == keys.surrogate_key


# --- --workers 2 ---


@pytest.fixture
def two_workers() -> Iterator[CatchupMachine]:
    m = TwoWorkersMachine()
    m.setup(freshness=1.0, max_response_bytes=4 * MiB, cache_bytes=256 * MiB, cors_by_origin=False)
    yield m
    m.teardown()


def test_a_404_one_worker_learns_is_told_to_its_sibling(two_workers: CatchupMachine) -> None:
    """A fill's 404 makes the worker that learned it forget the stream, a forgetting it decided:
    its sibling forgets too before the 404 is answered, so it no longer serves the bytes it
    holds of the deleted stream (within the freshness window it would not ask the origin)."""
    two_workers.do_create(A, JSON_TYPE, via_edge=False, initial=1)
    assert _ids(two_workers.do_read(A, "-1", worker=1)) == [100]
    two_workers.do_delete(A, via_edge=False)
    assert two_workers.do_read(A, "-1", worker=0).status == 404
    assert two_workers.do_read(A, "-1", worker=1).status == 404


def test_a_write_through_one_worker_is_read_back_from_the_other(
    two_workers: CatchupMachine,
) -> None:
    """Read-after-write whichever worker the next read reaches: the relaying worker's siblings
    observe the write before its answer goes out."""
    two_workers.do_create(A, JSON_TYPE, via_edge=False, initial=1)
    assert _ids(two_workers.do_read(A, "-1", worker=1)) == [100]
    two_workers.do_append(A, 1, via_edge=True, worker=0)
    assert _ids(two_workers.do_read(A, "-1", worker=1)) == [100, 101]
    two_workers.do_close(A, via_edge=True, worker=0)
    assert two_workers.do_read(A, "-1", worker=1).closed
    two_workers.do_delete(A, via_edge=True, worker=0)
    assert two_workers.do_read(A, "-1", worker=1).status == 404


def test_an_append_that_does_not_move_the_known_tail_is_another_instance() -> None:
    """Found by the two-worker machine (its falsifying example, step for step): stream a is read
    to its tail (30), deleted and recreated at the origin, and written through the edge up to
    the same offset: an append answered with the tail the edge already knew before it started.
    No tail went back, so nothing contradicted the old instance, and the edge closed it there
    and served the old instance's bytes as the closed stream. An append of bytes always moves
    the tail: one that does not went to another instance."""
    state = TwoWorkersMachine()
    state.setup(
        freshness=1.0, max_response_bytes=4 * MiB, cache_bytes=256 * MiB, cors_by_origin=False
    )
    try:
        state.streams(content_types=(JSON_TYPE, JSON_TYPE), initial=1)
        state.append(close=False, count=1, path=B, via_edge=False, worker=0)
        state.poll(path=A, via_edge=False, wait=0, worker=0, writer=0)
        state.do_racing_read(A, "-1", "recreate-direct", readers=1, on=(0, 0), writer=0)
        state.poll(path=B, via_edge=False, wait=0, worker=0, writer=0)
        state.do_racing_read(A, "-1", "append-edge", readers=1, on=(0, 0), writer=0)
        state.close_stream(path=A, via_edge=False, worker=0)
        state.close_stream(path=A, via_edge=True, worker=0)
        state.delete(path=A, via_edge=False, worker=0)
        state.close_stream(path=A, via_edge=False, worker=0)
        state.poll(path=A, via_edge=False, wait=0, worker=0, writer=0)
    finally:
        state.teardown()


# --- a write's answer that names no instance ---


def _recreated_behind_the_edge_at_the_same_tail(state: CatchupMachine, *, closed: bool) -> None:
    """Stream a, empty JSON, is read through worker 0 (which then holds it at its tail, 0_0),
    then deleted and recreated at the origin, empty again, as text: the same tail offset, and
    nothing the edge is told."""
    state.do_create(A, JSON_TYPE, via_edge=False)
    assert state.do_read(A, "-1", worker=0).content_type == JSON_TYPE
    state.do_delete(A, via_edge=False)
    state.do_create(A, TEXT_TYPE, via_edge=False, closed=closed)


def test_a_bodyless_close_is_not_grafted_onto_the_instance_held(machine: CatchupMachine) -> None:
    """A close without a body is answered with the tail offset and ``Stream-Closed`` only:
    nothing in it names the instance it closed. Taken as the closure of the instance the edge
    held (another, of the same tail offset), it served that one's ``[]`` as the closed stream,
    for ever; a close through the edge is a write, so the next read must see the origin's."""
    _recreated_behind_the_edge_at_the_same_tail(machine, closed=False)
    assert machine.do_close(A, via_edge=True) == 204
    seen = machine.do_read(A, "-1")
    assert (seen.content_type, seen.body, seen.closed) == (TEXT_TYPE, b"", True)


def test_a_bodyless_close_told_by_a_sibling_is_not_grafted_onto_the_instance_held(
    two_workers: CatchupMachine,
) -> None:
    """The two-worker machine's falsifying example: the close relayed by worker 1 (which held
    nothing) is replayed on worker 0 as the same answer, naming the path and the offset only;
    worker 0 closed the JSON instance it held and served ``[]`` as the closed text stream."""
    _recreated_behind_the_edge_at_the_same_tail(two_workers, closed=False)
    assert two_workers.do_close(A, via_edge=True, worker=1) == 204
    seen = two_workers.do_read(A, "-1", worker=0)
    assert (seen.content_type, seen.body, seen.closed) == (TEXT_TYPE, b"", True)


def test_a_put_that_finds_a_closed_stream_of_another_type_is_another_instance(
    two_workers: CatchupMachine,
) -> None:
    """A PUT answered 200 (the stream exists as asked: here closed) names the stream's content
    type: one that is not the type of the instance held is another stream at the path, whose
    closure must not be grafted onto the bytes held."""
    _recreated_behind_the_edge_at_the_same_tail(two_workers, closed=True)
    assert two_workers.do_create(A, TEXT_TYPE, via_edge=True, closed=True, worker=1) == 200
    for worker in (0, 1):
        seen = two_workers.do_read(A, "-1", worker=worker)
        assert (seen.content_type, seen.body, seen.closed) == (TEXT_TYPE, b"", True)


# --- issue 27: a 404 or 410 to a write is evidence; forks and soft deletes ---


@pytest.mark.parametrize("workers", [1, 2])
def test_an_append_answered_404_ends_the_closed_stream_held(workers: int) -> None:
    """Found by the machine (its falsifying example): a closed stream, served for ever from what
    the edge holds, deleted at the origin; an append through the edge is answered 404, and the
    edge went on serving the closed stream's bytes."""
    state = TwoWorkersMachine() if workers == 2 else CatchupMachine()
    state.setup(
        freshness=1.0, max_response_bytes=4 * MiB, cache_bytes=256 * MiB, cors_by_origin=False
    )
    try:
        state.do_create(A, JSON_TYPE, via_edge=False, initial=1, closed=True)
        for worker in range(workers):
            assert _ids(state.do_read(A, None, worker=worker)) == [100]
        state.do_delete(A, via_edge=False)
        assert state.do_append(A, 1, via_edge=True, worker=0) == 404
        for worker in range(workers):
            assert state.do_read(A, None, worker=worker).status == 404
    finally:
        state.teardown()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_soft_deleted_source_is_gone_once_a_write_is_answered_410(workers: int) -> None:
    """A fork of a closed stream a, then a deleted at the origin: soft-deleted (it has a fork),
    410 to everything. An append through the edge is answered 410; no worker serves a's bytes
    afterwards, and the fork still reads them, at their offsets, then its own."""
    state = TwoWorkersMachine() if workers == 2 else CatchupMachine()
    state.setup(
        freshness=1.0, max_response_bytes=4 * MiB, cache_bytes=256 * MiB, cors_by_origin=False
    )
    try:
        state.do_create(A, TEXT_TYPE, via_edge=False, initial=1)
        state.do_append(A, 1, via_edge=False, close=True)
        for worker in range(workers):
            assert _ids(state.do_read(A, "-1", worker=worker)) == [100, 101]
        source = state.model.current(A)
        assert source is not None
        middle = source.positions[1]
        assert state.do_fork(B, A, middle, via_edge=True) == 201
        assert _ids(state.do_read(B, "-1", worker=workers - 1)) == [100]
        assert state.do_delete(A, via_edge=False) == 204
        assert state.do_append(A, 1, via_edge=True, worker=0) == 410
        for worker in range(workers):
            assert state.do_read(A, "-1", worker=worker).status == 410
            assert state.do_read(A, middle, worker=worker).status == 410
        assert state.do_create(A, TEXT_TYPE, via_edge=True) == 409
        state.do_append(B, 1, via_edge=True)
        for worker in range(workers):
            assert _ids(state.do_read(B, "-1", worker=worker)) == [100, 103]  # 102: refused
        assert state.do_delete(B, via_edge=True) == 204  # its last fork: a goes for good
        assert state.do_read(A, "-1").status == 404
        assert state.do_create(A, TEXT_TYPE, via_edge=True) == 201
    finally:
        state.teardown()


def test_the_model_forks_soft_deletes_and_restarts_as_the_reference_origin() -> None:
    """What the origin model does with forks (``StreamStore.create``, ``delete``): read through,
    410 to every request on a soft-deleted source, 409 to re-creating it, 404 for a fork of a
    missing source, 400 past its tail; a restart loses everything."""
    model = OriginModel()
    text = [("Content-Type", TEXT_TYPE)]
    assert model.handle("PUT", A, headers=text, body=b"<1>").status == 201
    assert model.handle("POST", A, headers=text, body=b"<2>").status == 204
    source = model.current(A)
    assert source is not None
    first = source.positions[1]
    forked = [("Stream-Forked-From", A), ("Stream-Fork-Offset", first)]
    assert model.handle("PUT", B, headers=forked).status == 201
    # The same fork again is idempotent, if it names its type: without one the origin compares
    # the fork's type with application/octet-stream (StreamStore.create).
    assert model.handle("PUT", B, headers=[*forked, *text]).status == 200
    assert model.handle("PUT", B, headers=forked).status == 409
    assert model.handle("PUT", B, headers=text).status == 409  # not a fork: another config
    assert model.handle("GET", B, "offset=-1").body == b"<1>"
    assert model.handle("POST", B, headers=text, body=b"<3>").status == 204
    assert model.handle("GET", B, "offset=-1").body == b"<1><3>"
    assert model.handle("GET", B, f"offset={first}").body == b"<3>"
    assert model.handle("DELETE", A).status == 204
    for method in ("GET", "HEAD", "POST", "DELETE"):
        assert model.handle(method, A, headers=text, body=b"<4>").status == 410, method
    assert model.handle("POST", A, headers=[("Stream-Closed", "true")]).status == 410
    assert model.handle("PUT", A, headers=text).status == 409
    assert model.handle("PUT", "/v1/stream/c", headers=[("Stream-Forked-From", A)]).status == 409
    assert model.handle("GET", B, "offset=-1").body == b"<1><3>"  # read through the soft delete
    assert model.handle("DELETE", B).status == 204  # the last fork: the source goes with it
    assert model.handle("GET", A, "offset=-1").status == 404
    assert model.handle("PUT", "/v1/stream/c", headers=[("Stream-Forked-From", A)]).status == 404
    assert model.handle("PUT", A, headers=text, body=b"<5>").status == 201
    past = [("Stream-Forked-From", A), ("Stream-Fork-Offset", format_offset(0, 999))]
    assert model.handle("PUT", B, headers=past).status == 400
    model.restart()
    assert model.handle("GET", A, "offset=-1").status == 404


def test_the_lifetime_probe_answered_410_forgets_the_stream(machine: CatchupMachine) -> None:
    """The edge's own HEAD (a stream known only from reads: does it expire?) is evidence too:
    answered 410 (soft-deleted meanwhile), the stream held is forgotten, and the next read asks
    the origin."""
    machine.do_create(A, TEXT_TYPE, via_edge=False, initial=1, closed=True)
    machine.do_fork(B, A, None, via_edge=False)
    edge = machine.edge
    assert isinstance(edge, EdgeUnderTest)
    assert _ids(machine.do_read(A, "-1")) == [100]
    lifetimes = edge.parts.lifetimes
    instance = edge.parts.local.instance(A)
    assert instance is not None
    assert edge.parts.local.holds_data(A)
    machine.do_delete(A, via_edge=False)  # soft: it has a fork

    async def probe() -> None:
        lifetimes.probe_lifetime(LogKey(stream=A, scope="public"), instance, ())
        await asyncio.gather(*lifetimes._background)

    machine.loop.run_until_complete(probe())
    assert not edge.parts.local.holds_data(A)
    assert machine.do_read(A, "-1").status == 410


def _counted(edge: EdgeUnderTest, name: str, **labels: str) -> float:
    """A counter of ``edge``'s metrics, summed over the series with ``labels``."""
    return sum(
        sample.value
        for family in edge.metrics.registry.collect()
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def _origin_reads(edge: EdgeUnderTest) -> float:
    return _counted(edge, "edge_origin_requests_total", kind="catchup")


def test_a_read_late_in_the_window_refreshes_the_tail_before_it_lapses(
    machine: CatchupMachine,
) -> None:
    """Refresh-ahead (edge.refresh_ahead): a hit-path read in the last tenth of the 1 s window
    starts one background refill; the next reader, past the first window, is answered from the
    edge (no origin read of its own) and sees what the origin appended meanwhile. Graded by the
    machine's oracle throughout."""
    machine.do_create(A, TEXT_TYPE, via_edge=False, initial=1)
    edge = machine.edge
    assert isinstance(edge, EdgeUnderTest)
    machine.do_read(A, "-1")  # a fill: the tail observed now, the answer stored
    machine.do_advance(500)
    before = edge.fast_answers
    machine.do_read(A, "-1")  # early in the window: a hit, and nothing more
    assert edge.fast_answers == before + 1
    machine.loop.run_until_complete(asyncio.sleep(0))
    assert edge.refreshes() == 0
    reads = _origin_reads(edge)
    machine.do_append(A, 1, via_edge=False)  # behind the edge's back
    machine.do_advance(450)  # 950 ms: the last tenth
    late = machine.do_read(A, "-1")
    assert edge.fast_answers == before + 2  # still the stored answer, fresh
    assert late.body == b"<100>"
    for _ in range(20):  # the refill runs in the background
        machine.loop.run_until_complete(asyncio.sleep(0))
    assert _counted(edge, "edge_refresh_ahead_total", result="renewed") == 1
    assert _origin_reads(edge) == reads + 1
    machine.do_advance(100)  # 1050 ms: past the first observation's window
    after = machine.do_read(A, "-1")
    assert after.body == b"<100><101>"  # the refill's bytes, given by the edge alone
    assert _origin_reads(edge) == reads + 1


def test_one_refresh_per_log_however_many_late_readers(machine: CatchupMachine) -> None:
    """While a refresh of a log is out, late readers start no other; readers past the window
    join its flight (the fills' single flight) rather than ask the origin again."""
    machine.do_create(A, TEXT_TYPE, via_edge=False, initial=1)
    edge = machine.edge
    assert isinstance(edge, EdgeUnderTest)
    machine.do_read(A, "-1")
    reads = _origin_reads(edge)
    machine.do_advance(950)
    machine.origin.hold()  # the refill's answer waits
    for _ in range(5):
        machine.do_read(A, "-1")
    key = LogKey(stream=A, scope="public")
    assert edge.parts.ahead.running(key)
    machine.do_advance(100)  # past the window: this read joins the refill in flight
    seen = _read_while_held(machine, edge)
    assert seen.status == 200
    assert seen.body == b"<100>"
    _settle(machine)
    assert not edge.parts.ahead.running(key)
    assert _origin_reads(edge) == reads + 1
    assert _counted(edge, "edge_refresh_ahead_total") == 1


def _settle(machine: CatchupMachine) -> None:
    """Let what runs in the background (a refresh) run to its end."""
    for _ in range(20):
        machine.loop.run_until_complete(asyncio.sleep(0))


def _read_while_held(machine: CatchupMachine, edge: EdgeUnderTest) -> Seen:
    """A read of ``A`` from the start begun while the origin holds its answers, which are
    released once the read has gone as far as it can without them."""
    read = machine.loop.create_task(
        edge.read(A, "-1", credentials=(), if_none_match=None, accept_encoding=None)
    )
    for _ in range(5):
        machine.loop.run_until_complete(asyncio.sleep(0))
    machine.origin.release()
    return machine.loop.run_until_complete(read)


def test_a_refresh_that_finds_the_stream_gone_forgets_it(machine: CatchupMachine) -> None:
    """Deleted behind the edge's back: the refresh's 404 goes through the one door, which
    forgets the stream, so the next reader (still inside the first window) is told 404 by the
    origin rather than given the deleted bytes. Graded by the oracle."""
    machine.do_create(A, TEXT_TYPE, via_edge=False, initial=1)
    edge = machine.edge
    assert isinstance(edge, EdgeUnderTest)
    machine.do_read(A, "-1")
    machine.do_delete(A, via_edge=False)
    machine.do_advance(950)
    assert machine.do_read(A, "-1").body == b"<100>"  # fresh still: the edge's to give
    _settle(machine)
    assert _counted(edge, "edge_refresh_ahead_total", result="gone") == 1
    assert machine.do_read(A, "-1").status == 404


def test_a_refresh_never_stores_an_instance_forgotten_while_it_was_out(
    machine: CatchupMachine,
) -> None:
    """Recreated through the edge while the refresh's answer is held: that answer is of the
    instance forgotten, so the door keeps nothing of it (``stale``), and the reader gets the new
    instance's bytes."""
    machine.do_create(A, TEXT_TYPE, via_edge=False, initial=1)
    edge = machine.edge
    assert isinstance(edge, EdgeUnderTest)
    machine.do_read(A, "-1")
    machine.do_advance(950)
    arrived = machine.origin.hold()
    machine.do_read(A, "-1")  # starts the refresh, whose answer the origin holds
    machine.loop.run_until_complete(asyncio.wait_for(arrived.wait(), 5))
    assert edge.parts.ahead.running(LogKey(stream=A, scope="public"))
    # Writes reach the model at once (only reads are held): recreated while the answer waits.
    machine.do_delete(A, via_edge=True)
    machine.do_create(A, JSON_TYPE, via_edge=True, initial=1)
    machine.origin.release()
    _settle(machine)
    assert _counted(edge, "edge_refresh_ahead_total", result="stale") == 1
    assert _counted(edge, "edge_refresh_ahead_total") == 1
    seen = machine.do_read(A, "-1")
    assert seen.content_type == JSON_TYPE


def test_a_read_after_a_write_through_the_edge_does_not_join_a_refill_that_left_before_it(
    machine: CatchupMachine,
) -> None:
    """Issue 29: what a reader takes from another's flight must be what its own request would
    get. A refill that left before a write through the edge answers with the tail as it was;
    the writer's own read after the write (the tail marked stale) asks the origin itself, and
    sees its write (read-after-write), while the refill goes on for nobody."""
    machine.do_create(A, TEXT_TYPE, via_edge=False, initial=1)
    edge = machine.edge
    assert isinstance(edge, EdgeUnderTest)
    machine.do_read(A, "-1")
    reads = _origin_reads(edge)
    machine.do_advance(950)
    arrived = machine.origin.hold()
    machine.do_read(A, "-1")  # starts the refill, whose answer the origin holds
    machine.loop.run_until_complete(asyncio.wait_for(arrived.wait(), 5))
    assert edge.parts.ahead.running(LogKey(stream=A, scope="public"))
    machine.do_append(A, 1, via_edge=True)  # writes reach the model at once
    seen = _read_while_held(machine, edge)
    _settle(machine)
    assert seen.status == 200
    assert seen.body == b"<100><101>"
    assert _origin_reads(edge) == reads + 2  # the refill and the writer's own read
