"""What the authorized cells of ``loadtest.hits`` need: signed tokens and their key set for
``--auth jwt``, and a forward-auth service for ``--auth forward``.

Rules this module owns:
* Tokens are HS256, signed with joserfc (the edge's own JOSE library) by one key whose JWKS
  file the edge is given (``--jwt-jwks FILE``); each grants ``read`` on every stream
  (``streams: ["/v1/stream/"]``) for a day, to a subject of its own, so no two are the same
  string. ``forged`` is a well-formed token under the same ``kid``, signed with another key:
  the edge must refuse it.
* The forward-auth service answers ``204`` with ``Cache-Control: max-age=60`` to the one session
  cookie it knows (``SESSION``), ``401`` with the same caching to anything else, as an auth
  service that lets the edge remember its verdicts would. It runs on loopback in a thread of
  its own (its own event loop) and counts the questions it was asked.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from joserfc import jwt
from joserfc.jwk import OctKey

KID = "hits"
STREAMS = "/v1/stream/"
SESSION = "session=hits-reader"  # the Cookie the forward service allows
FORWARD_MAX_AGE = 60


@dataclass(frozen=True, kw_only=True)
class JwtMaterial:
    jwks: Path
    tokens: tuple[str, ...]
    forged: str


def _sign(key: OctKey, subject: str, expires: int) -> str:
    claims = {"sub": subject, "scope": "read", "streams": [STREAMS], "exp": expires}
    return jwt.encode({"alg": "HS256", "kid": KID}, claims, key, algorithms=["HS256"])


def jwt_material(directory: Path, count: int) -> JwtMaterial:
    """``count`` distinct valid tokens and the JWKS file (in ``directory``) that verifies them."""
    key = OctKey.generate_key(256, parameters={"kid": KID})
    other = OctKey.generate_key(256, parameters={"kid": KID})
    expires = int(time.time() + 86_400)
    tokens = tuple(_sign(key, f"reader-{i}", expires) for i in range(count))
    directory.mkdir(parents=True, exist_ok=True)
    jwks = directory / "hits-jwks.json"
    jwks.write_text(json.dumps({"keys": [key.as_dict(private=True)]}))
    return JwtMaterial(jwks=jwks, tokens=tokens, forged=_sign(other, "intruder", expires))


class ForwardService:
    """The forward-auth service: ``GET /check``, by the request's ``Cookie`` alone."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.asked = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/check"

    async def _check(self, request: web.Request) -> web.Response:
        self.asked += 1
        headers = {"Cache-Control": f"max-age={FORWARD_MAX_AGE}"}
        if request.headers.get("Cookie") == SESSION:
            return web.Response(status=204, headers=headers)
        return web.Response(status=401, text="please log in", headers=headers)

    async def _start(self) -> None:
        app = web.Application()
        app.add_routes([web.get("/check", self._check)])
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server)
        self.port = int(server.sockets[0].getsockname()[1])

    def start(self) -> ForwardService:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._runner = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
