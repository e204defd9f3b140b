"""What one worker learns from a relayed answer, told to its siblings before the client hears.

Rules this module owns:

* In one process a write through the edge invalidates at once, so read-after-write is exact;
  with workers, the next read may reach another worker, whose tail knowledge is still fresh
  for up to ``--tail-freshness``. So every answer that changes what the edge may serve (a
  write: ``PUT``, ``POST``, ``DELETE``, whatever its status; a ``404`` to a read) is observed
  by every worker before it is relayed: the worker that relayed it tells the supervisor
  (``POST /observed`` on the supervisor's private loopback listener), which replays it to every
  other listening worker (``POST /observe`` on theirs) and answers once they all did.
* Each sibling replays it with the same ``CatchupCache.observe`` the relaying worker ran, so the
  effect is exactly the single-process one (forgetting, tail invalidation, purges).
* A sibling that does not answer in time (``SIBLING_SECONDS``) delays the answer no further:
  the write happened at the origin and cannot be taken back; that sibling is then as far behind
  as another replica would be (``--tail-freshness``). It is logged.
* The calls carry the supervisor's private token; the request headers travel (the credential
  scope of a 404 depends on them) only over loopback, between processes of this edge.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import aiohttp
from aiohttp import web

from edge.catchup import CatchupCache
from edge.web.app import CACHE, RELAY

log = logging.getLogger(__name__)

SIBLING_SECONDS = 3.0  # above a purge's wait for Redis (2 s)
WRITES = frozenset({"PUT", "POST", "DELETE"})


def worth_telling(method: str, status: int) -> bool:
    return method.upper() in WRITES or status == 404


def encode(
    method: str,
    stream: str,
    status: int,
    request_headers: Sequence[tuple[str, str]],
    response_headers: Sequence[tuple[str, str]],
) -> bytes:
    return json.dumps(
        {
            "method": method,
            "stream": stream,
            "status": status,
            "request_headers": list(request_headers),
            "response_headers": list(response_headers),
        }
    ).encode()


async def replay(cache: CatchupCache, body: bytes) -> None:
    """Run one observation a sibling relayed; ValueError when it is not one."""
    data = json.loads(body)
    pairs = [
        [(str(name), str(value)) for name, value in data[key]]
        for key in ("request_headers", "response_headers")
    ]
    # Tickets order one process's exchanges only: a sibling's write is taken as having started
    # before anything this worker knew, so it can never contradict what this worker learned
    # (the relaying worker judges that against its own knowledge).
    await cache.observe(
        str(data["method"]), str(data["stream"]), int(data["status"]), pairs[0], pairs[1], 0
    )


def share_observations(
    stream_app: web.Application,
    admin_app: web.Application,
    *,
    supervisor: str,
    token: str,
    index: int,
) -> None:
    """Wire a worker: its relay tells the supervisor, its admin listener replays siblings'."""
    cache = stream_app[CACHE]
    relay = stream_app[RELAY]
    local = relay.observe
    assert local is not None
    session: list[aiohttp.ClientSession] = []
    authorization = {"Authorization": f"Bearer {token}"}

    async def observe(
        method: str,
        stream: str,
        status: int,
        request_headers: Sequence[tuple[str, str]],
        response_headers: Sequence[tuple[str, str]],
        started: int,
    ) -> None:
        if not worth_telling(method, status) or not session:
            await local(method, stream, status, request_headers, response_headers, started)
            return
        body = encode(method, stream, status, request_headers, response_headers)
        await asyncio.gather(
            local(method, stream, status, request_headers, response_headers, started),
            _tell(session[0], f"{supervisor}/observed?worker={index}", body, authorization),
        )

    async def lifetime(_: web.Application) -> AsyncIterator[None]:
        session.append(aiohttp.ClientSession())
        yield
        await session.pop().close()

    async def replayed(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != authorization["Authorization"]:
            return web.Response(status=401)
        try:
            await replay(cache, await request.read())
        except (ValueError, KeyError, TypeError):
            return web.Response(status=400, text="not an observation\n")
        return web.Response(status=204)

    stream_app[RELAY] = replace(relay, observe=observe)
    stream_app.cleanup_ctx.append(lifetime)
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
                log.warning(
                    "siblings were not all told of a write (supervisor: %d)", response.status
                )
    except (aiohttp.ClientError, TimeoutError, OSError) as error:
        log.warning("siblings were not told of a write: %s", type(error).__name__)
