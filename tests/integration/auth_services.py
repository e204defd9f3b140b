"""Small real HTTP services the authorization tests start: a JWKS endpoint and a forward-auth
service. Each runs an aiohttp server on loopback in a thread of its own (its own event loop),
so it keeps answering whatever the test's loop is doing, and counts what it was asked."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ThreadedServer:
    """One aiohttp route table on 127.0.0.1, port chosen by the kernel."""

    def __init__(self, routes: list[web.RouteDef]) -> None:
        self._routes = routes
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    def start(self) -> ThreadedServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        app = web.Application()
        app.add_routes(self._routes)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, backlog=4096)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        """Stop listening (connections are refused from now on); ``start`` again reuses the port."""
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._runner = None

    def restart(self) -> None:
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class JwksEndpoint:
    """Serves ``document`` at /jwks.json and counts the fetches."""

    document: bytes
    hits: int = 0
    server: ThreadedServer | None = None

    async def _serve(self, _: web.Request) -> web.Response:
        self.hits += 1
        return web.Response(body=self.document, content_type="application/json")

    def start(self) -> JwksEndpoint:
        self.server = ThreadedServer([web.get("/jwks.json", self._serve)]).start()
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url + "/jwks.json"


@dataclass
class AuthService:
    """A forward-auth service: session cookies name who may read which stream prefix.

    It decides, as Traefik's ForwardAuth services do, by the ``X-Forwarded-Uri`` and
    ``X-Forwarded-Method`` it is given: a path prefix and a method, nothing else of the request.
    ``mode``: ``ok`` answers from ``sessions``; ``slow`` waits ``delay`` first; ``broken``
    answers 500. Every question is recorded (cookie, method, URI)."""

    sessions: dict[str, str] = field(default_factory=dict)  # session id -> stream prefix
    writers: set[str] = field(default_factory=set)  # may PUT, POST and DELETE
    appenders: set[str] = field(default_factory=set)  # may POST only
    # session id -> the user a 2xx names in ``X-Auth-Request-User`` (as oauth2-proxy does)
    users: dict[str, str] = field(default_factory=dict)
    mode: str = "ok"
    delay: float = 5.0
    max_age: int | None = 30
    asked: list[tuple[str | None, str, str]] = field(default_factory=list)
    # What each question said of the request besides: its X-Forwarded-Host and -For.
    forwarded: list[tuple[str | None, str | None]] = field(default_factory=list)
    server: ThreadedServer | None = None

    async def _check(self, request: web.Request) -> web.StreamResponse:
        cookie = request.cookies.get("session")
        method = request.headers.get("X-Forwarded-Method", "")
        uri = request.headers.get("X-Forwarded-Uri", "")
        self.asked.append((cookie, method, uri))
        headers_in = request.headers
        self.forwarded.append(
            (headers_in.get("X-Forwarded-Host"), headers_in.get("X-Forwarded-For"))
        )
        if self.mode == "slow":
            await asyncio.sleep(self.delay)
        if self.mode == "broken":
            return web.Response(status=500, text="auth database down")
        headers = {"Cache-Control": f"max-age={self.max_age}"} if self.max_age else {}
        prefix = self.sessions.get(cookie or "")
        if prefix is None:
            return web.Response(
                status=401,
                text="please log in",
                headers={**headers, "WWW-Authenticate": 'Cookie realm="site"'},
            )
        if method in ("GET", "HEAD"):
            allowed = True
        elif method == "POST":
            allowed = cookie in self.writers or cookie in self.appenders
        else:
            allowed = cookie in self.writers
        if not uri.startswith(prefix) or not allowed:
            return web.Response(status=403, text="not your stream", headers=headers)
        user = self.users.get(cookie or "")
        if user is not None:
            headers["X-Auth-Request-User"] = user
        return web.Response(status=204, headers=headers)

    def start(self) -> AuthService:
        self.server = ThreadedServer([web.get("/check", self._check)]).start()
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url + "/check"
