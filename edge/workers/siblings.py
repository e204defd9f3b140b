"""What one worker learns from a relayed answer, told to its siblings before the client hears.

Rules this module owns:

* In one process a write through the edge invalidates at once, so read-after-write is exact;
  with workers, the next read may reach another worker, whose tail knowledge is still fresh
  for up to ``--tail-freshness``. So every answer that changes what the edge may serve (a
  write: ``PUT``, ``POST``, ``DELETE``, whatever its status; a ``404`` or ``410`` to any
  request: ``says_gone``) is observed
  by every worker before it is relayed: the worker that relayed it tells the supervisor
  (``POST /observed`` on the supervisor's private loopback listener), which replays it to every
  other reachable worker (``POST /observe`` on theirs) and answers once they all did.
* Each sibling replays it with the same observer the relaying worker ran
  (``StreamLifecycle.observe``), so the effect is exactly the single-process one (forgetting,
  tail invalidation, purges).
* A sibling that does not answer in time (``SIBLING_SECONDS``) delays the answer no further:
  the write happened at the origin and cannot be taken back; that sibling is then as far behind
  as another replica would be (``--tail-freshness``). It is logged.
* Forgetting a worker decides inside its own work (a fill's 404, a content type that is not the
  stream's, a tail the core finds impossible, a live tail's 404: ``Forgetter.tellers``) is told
  the same way, as a ``forgot`` message, and each sibling forgets the same (``stream_gone`` for
  that scope, which for the public scope forgets the instance). The answer that revealed it
  waits for the telling (``Forgetter.settled``), bounded as above. A forgetting of what is only in
  doubt (the origin went away: ``edge.log.trust``) says so (``followers_stay``): each sibling
  forgets what it holds and keeps its live followers, as its decider did.
* Nothing is told twice, and nothing loops: what a worker does at its supervisor's request (on
  its private admin listener: a replayed observation or forgetting, a purge the supervisor sends
  to every worker) the supervisor already tells every worker, so it is not told again, nor
  downstream (``edge.instances.forgetting.TELLS_DOWNSTREAM``: the worker that decided purges the
  CDN; of a purge the supervisor sends to every worker, the one worker it names with
  ``TELLS_DOWNSTREAM_PARAM`` does). A message says whether its sender ``held`` anything of the
  stream: a 404 seen by a worker that never served the stream is purged downstream by each
  sibling that held something of it (``Downstream.DECIDER_HELD_NOTHING``), since the kernel
  spreads a stream's readers over the workers; a
  forgetting caused by observing a relayed answer whose replay forgets the same
  (``replay_forgets``) is not told beside it. Forgetting is idempotent in effect: a sibling
  told twice only drops what it learned in between, which it fetches again.
* ``Siblings`` is all of this but the hop between processes (a ``Transport``: here HTTP over
  loopback through the supervisor), so it runs the same with any carrier (the property machine's
  two in-process workers: tests/unit/test_properties.py).
* The calls carry the supervisor's private token; the request headers travel (the credential
  scope of a 404 depends on them) only over loopback, between processes of this edge.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from edge.instances.forgetting import TELLS_DOWNSTREAM, Downstream, Forgetter, Forgetting
from edge.log.stream_log import LogKey, says_gone
from edge.store.local import LocalTier
from edge.web.keys import RELAY
from edge.web.proxy import Observer
from edge.web.wiring import WIRED
from edge.workers.admin import TELLS_DOWNSTREAM_PARAM

logger = logging.getLogger(__name__)

SIBLING_SECONDS = 3.0  # above a purge's wait for Redis (2 s)
WRITES = frozenset({"PUT", "POST", "DELETE"})


# Set while this worker does what its supervisor asked: the supervisor tells every worker itself.
_AT_SUPERVISORS_REQUEST: ContextVar[bool] = ContextVar("at_supervisors_request", default=False)
# The stream of a relayed answer being observed here whose replay on siblings forgets it too.
_REPLAY_FORGETS: ContextVar[str | None] = ContextVar("replay_forgets", default=None)


def worth_telling(method: str, status: int) -> bool:
    return method.upper() in WRITES or says_gone(status)


def replay_forgets(method: str, status: int) -> bool:
    """Does replaying this observation forget the stream on a sibling, as it did here?
    (``Writes.observe``: a DELETE that succeeded, a creating PUT, a 404 or 410 to any request;
    one to a credentialed request forgets that scope on the sibling as here.)"""
    method = method.upper()
    return (
        (method == "DELETE" and status < 400)
        or (method == "PUT" and status == 201)
        or says_gone(status)
    )


def should_tell(key: LogKey, *, at_supervisors_request: bool, replayed: str | None) -> bool:
    return not at_supervisors_request and replayed != key.stream


def encode(
    method: str,
    stream: str,
    status: int,
    request_headers: Sequence[tuple[str, str]],
    response_headers: Sequence[tuple[str, str]],
    *,
    held: bool,
) -> bytes:
    return json.dumps(
        {
            "method": method,
            "stream": stream,
            "status": status,
            "request_headers": list(request_headers),
            "response_headers": list(response_headers),
            "held": held,
        }
    ).encode()


def encode_forgot(key: LogKey, *, held: bool, followers_stay: bool = False) -> bytes:
    message: dict[str, object] = {
        "kind": "forgot", "stream": key.stream, "scope": key.scope, "held": held,
    }  # fmt: skip
    if followers_stay:
        message["followers_stay"] = True
    return json.dumps(message).encode()


@contextmanager
def _downstream_of(data: object) -> Iterator[None]:
    """Replaying what a sibling that held nothing of the stream told: this worker purges the
    CDN itself if it held something (see the module rules)."""
    held = not isinstance(data, dict) or data.get("held", True) is not False
    if held:
        yield
        return
    told = TELLS_DOWNSTREAM.set(Downstream.DECIDER_HELD_NOTHING)
    try:
        yield
    finally:
        TELLS_DOWNSTREAM.reset(told)


def decode_forgot(data: object) -> LogKey | None:
    """The forgetting a ``forgot`` message names; None when the message is not one."""
    if not isinstance(data, dict) or data.get("kind") != "forgot":
        return None
    stream, scope = data.get("stream"), data.get("scope")
    if not isinstance(stream, str) or not isinstance(scope, str):
        raise ValueError("a forgot message names a stream and a scope")
    return LogKey(stream=stream, scope=scope)


async def replay(forgetter: Forgetter, observe: Observer, body: bytes) -> None:
    """Run one observation or forgetting a sibling relayed; ValueError when it is neither."""
    data = json.loads(body)
    forgot = decode_forgot(data)
    if forgot is not None:
        if isinstance(data, dict) and data.get("followers_stay") is True:
            # The sibling saw the origin go away (edge.log.trust) and purged the shared tier and
            # what lies downstream: what is held here is in doubt, its followers stay.
            forgetter.forget_here(forgot.stream, followers_stay=True)
            return
        with _downstream_of(data):
            forgetter.stream_gone(forgot)
        return
    pairs = [
        [(str(name), str(value)) for name, value in data[key]]
        for key in ("request_headers", "response_headers")
    ]
    # Tickets order one process's exchanges only: a sibling's write is taken as having started
    # before anything this worker knew, so it can never contradict what this worker learned
    # (the relaying worker judges that against its own knowledge).
    with _downstream_of(data):
        await observe(
            str(data["method"]), str(data["stream"]), int(data["status"]), pairs[0], pairs[1], 0
        )


# Carries one message (``encode``, ``encode_forgot``) to the supervisor, which has every other
# worker apply it (``Siblings.apply``) before it answers; returns what to await for that, or None
# when this worker cannot tell now (it is not serving yet, or has stopped). It bounds its own
# time and never raises: a sibling that was not told is as far behind as another replica. The
# only part of telling that crosses processes (``share_observations``: HTTP over loopback).
Transport = Callable[[bytes], Awaitable[None] | None]


@contextmanager
def at_supervisors_request(*, tells_downstream: bool = False) -> Iterator[None]:
    """What runs inside is done at the supervisor's request: its forgettings are not told (the
    supervisor tells every worker itself), nor purged downstream unless ``tells_downstream``
    (the supervisor named this worker to, for a purge it sends to every worker)."""
    told = _AT_SUPERVISORS_REQUEST.set(True)
    downstream = TELLS_DOWNSTREAM.set(
        Downstream.DECIDED_HERE if tells_downstream else Downstream.DECIDED_ELSEWHERE
    )
    try:
        yield
    finally:
        TELLS_DOWNSTREAM.reset(downstream)
        _AT_SUPERVISORS_REQUEST.reset(told)


class Siblings:
    """One worker's side of the rules above, whatever carries the messages: what its relay's
    observations and its own forgettings tell (``observe``, ``forgot``), and how it applies what
    a sibling told (``apply``)."""

    def __init__(
        self, *, forgetter: Forgetter, local: LocalTier, observe: Observer, tell: Transport
    ) -> None:
        self._forgetter = forgetter
        self._held = local
        self._observe_here = observe  # this worker's own observer (``StreamLifecycle.observe``)
        self._tell = tell

    async def observe(
        self,
        method: str,
        stream: str,
        status: int,
        request_headers: Sequence[tuple[str, str]],
        response_headers: Sequence[tuple[str, str]],
        started: int,
    ) -> None:
        """The relay's observer: observed here and by every sibling before the answer goes out."""
        telling = None
        if worth_telling(method, status):
            # What this worker forgets on a 404 or 410 it purges downstream only if it held the
            # stream; a write's forgetting it purges regardless.
            held = not says_gone(status) or self._held.holds_data(stream)
            message = encode(method, stream, status, request_headers, response_headers, held=held)
            telling = self._tell(message)
        if telling is None:
            await self._observe_here(
                method, stream, status, request_headers, response_headers, started
            )
        else:
            covered = _REPLAY_FORGETS.set(stream if replay_forgets(method, status) else None)
            try:
                await asyncio.gather(
                    self._observe_here(
                        method, stream, status, request_headers, response_headers, started
                    ),
                    telling,
                )
            finally:
                _REPLAY_FORGETS.reset(covered)
        # What observing it made this worker forget beyond that (a write below the tail it knew).
        await self._forgetter.settled(stream)

    def forgot(self, forgetting: Forgetting) -> asyncio.Future[None] | None:
        """A ``Forgetter.tellers`` teller: a forgetting this worker decided, told to siblings."""
        key = forgetting.key
        if not should_tell(
            key,
            at_supervisors_request=_AT_SUPERVISORS_REQUEST.get(),
            replayed=_REPLAY_FORGETS.get(),
        ):
            return None
        message = encode_forgot(
            key, held=forgetting.held_here, followers_stay=forgetting.followers_stay
        )
        telling = self._tell(message)
        return None if telling is None else asyncio.ensure_future(telling)

    async def apply(self, body: bytes) -> None:
        """What a sibling told, at the supervisor's request; ValueError (or KeyError, TypeError)
        when it is no message."""
        with at_supervisors_request():
            await replay(self._forgetter, self._observe_here, body)


def share_observations(
    stream_app: web.Application,
    admin_app: web.Application,
    *,
    supervisor: str,
    token: str,
    index: int,
) -> None:
    """Wire a worker: its relay tells the supervisor, its admin listener replays siblings'."""
    wired = stream_app[WIRED]
    relay = stream_app[RELAY]
    local = relay.observe
    assert local is not None
    session: list[aiohttp.ClientSession] = []
    authorization = {"Authorization": f"Bearer {token}"}
    observed = f"{supervisor}/observed?worker={index}"

    def tell(body: bytes) -> Awaitable[None] | None:
        return _tell(session[0], observed, body, authorization) if session else None

    siblings = Siblings(forgetter=wired.forgetter, local=wired.local, observe=local, tell=tell)

    @web.middleware
    async def supervisors_request(request: web.Request, handler: Handler) -> web.StreamResponse:
        named = request.path == "/purge" and TELLS_DOWNSTREAM_PARAM in request.query
        with at_supervisors_request(tells_downstream=named):
            return await handler(request)

    async def lifetime(_: web.Application) -> AsyncIterator[None]:
        session.append(aiohttp.ClientSession())
        yield
        await session.pop().close()

    async def replayed(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != authorization["Authorization"]:
            return web.Response(status=401)
        try:
            await siblings.apply(await request.read())
        except (ValueError, KeyError, TypeError):
            return web.Response(status=400, text="not an observation\n")
        return web.Response(status=204)

    stream_app[RELAY] = wired.own_relay.relay = replace(relay, observe=siblings.observe)
    stream_app.cleanup_ctx.append(lifetime)
    wired.forgetter.tellers.append(siblings.forgot)
    admin_app.middlewares.append(supervisors_request)
    admin_app.router.add_post("/observe", replayed)


async def _tell(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> None:
    try:
        async with (
            asyncio.timeout(SIBLING_SECONDS + 1),
            session.post(url, data=body, headers=headers) as response,
        ):
            await response.read()
            if response.status != 204:
                logger.warning(
                    "siblings were not all told of a change (supervisor: %d)", response.status
                )
    except (aiohttp.ClientError, TimeoutError, OSError) as error:
        logger.warning("siblings were not told of a change: %s", type(error).__name__)
