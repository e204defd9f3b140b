"""The watch page's own little server, run by the demo (the edge stays a proxy).

Rules this module owns:

* It serves only the page (``/run/<stream name>``), its two static files, ``/api/viewers`` and
  ``/run/latest``, a redirect to the newest run's page (``Runs.latest``, set by the demo);
  the page reads and writes the session itself, cross-origin, through the edge.
* The page learns where the edge is from a JSON config embedded in the HTML, never from its own
  URL, so the page and the edge can be on different hosts and ports. Served for other devices
  (``public``, ``make demo ARGS=--public``), the config names the edge's port at the host the
  visitor reached the page by (its ``Host``), so a phone that opened the page by this machine's
  LAN address reads the edge there too; a ``Host`` that is not a host and port is a 400.
* It serves a favicon, so a browser asks for nothing the server does not have.
* ``/api/viewers`` is the edge's ``edge_sse_viewers`` gauge (viewers on that edge, every stream),
  read from its admin listener, which a browser should not reach directly.
* With ``tokens`` (``--auth jwt``), each page embeds a token minted for its own run's stream
  (``tokens(sub, stream path)``, ``devstack.demo_auth``); a run the minter does not host has no
  page (404), so no visitor gets a token for a stream the page does not show.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
from aiohttp import web
from yarl import URL

PAGE_DIR = Path(__file__).resolve().parent / "watch_page"
STREAM_PREFIX = "/v1/stream/"
NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
EDGE_URL = web.AppKey("edge_url", str)
# True: the page's edge is the edge's port at the host the visitor used (see the rules).
EDGE_AT_VISITOR_HOST = web.AppKey("edge_at_visitor_host", bool)
# With --auth jwt: (sub, stream path) -> the page's token for that stream, None if not a run here.
Mint = Callable[[str, str], str | None]
TOKENS = web.AppKey("tokens", Mint)
ADMIN_URL = web.AppKey("admin_url", str)
HTTP = web.AppKey("http", aiohttp.ClientSession)


class Runs:
    """The runs this server shows; ``latest`` names the newest (``/run/latest`` leads there)."""

    def __init__(self) -> None:
        self.latest: str | None = None


RUNS = web.AppKey("runs", Runs)
LATEST = "latest"


def watch_path(stream_name: str) -> str:
    return f"/run/{stream_name}"


async def latest(request: web.Request) -> web.Response:
    newest = request.app[RUNS].latest
    if newest is None:
        raise web.HTTPNotFound(text="no run yet")
    raise web.HTTPFound(watch_path(newest), headers={"Cache-Control": "no-store"})


async def page(request: web.Request) -> web.Response:
    stream = request.match_info["name"]
    if not NAME.match(stream):
        raise web.HTTPNotFound(text="no such run")
    path = STREAM_PREFIX + stream
    config = {
        "edge": edge_for(request),
        "path": path,
        "stream": stream,
        "viewers": "/api/viewers",
    }
    mint = request.app.get(TOKENS)
    if mint is not None:
        token = mint(f"page-{secrets.token_hex(4)}", path)
        if token is None:
            raise web.HTTPNotFound(text="no such run")
        config["token"] = token
    # "</" cannot end the script element from inside a JSON string.
    embedded = json.dumps(config).replace("</", "<\\/")
    html = (PAGE_DIR / "watch.html").read_text().replace("{{CONFIG}}", embedded)
    return web.Response(text=html, content_type="text/html", headers={"Cache-Control": "no-store"})


def edge_for(request: web.Request) -> str:
    """The edge's URL as this visitor's page should use it."""
    edge = request.app[EDGE_URL]
    if not request.app[EDGE_AT_VISITOR_HOST]:
        return edge
    try:
        visitor_host = URL(f"http://{request.host}").host
        if not visitor_host:
            raise ValueError("no host")
        return str(URL.build(scheme="http", host=visitor_host, port=URL(edge).port))
    except ValueError:
        raise web.HTTPBadRequest(text="the Host header names no host") from None


async def favicon(request: web.Request) -> web.FileResponse:
    return web.FileResponse(PAGE_DIR / "favicon.svg", headers={"Content-Type": "image/svg+xml"})


async def viewers(request: web.Request) -> web.Response:
    try:
        timeout = aiohttp.ClientTimeout(total=2)
        async with request.app[HTTP].get(
            f"{request.app[ADMIN_URL]}/metrics", timeout=timeout
        ) as response:
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError):
        return web.json_response({"viewers": None}, status=502)
    for line in text.splitlines():
        if line.startswith("edge_sse_viewers "):
            return web.json_response({"viewers": int(float(line.split()[1]))})
    return web.json_response({"viewers": None}, status=502)


async def _http(app: web.Application) -> AsyncIterator[None]:
    async with aiohttp.ClientSession() as http:
        app[HTTP] = http
        yield


def create_watch_app(
    edge_url: str, admin_url: str, tokens: Mint | None = None, *, public: bool = False
) -> web.Application:
    app = web.Application()
    app[EDGE_URL] = edge_url
    app[EDGE_AT_VISITOR_HOST] = public
    if tokens is not None:
        app[TOKENS] = tokens
    app[ADMIN_URL] = admin_url
    app[RUNS] = Runs()
    app.cleanup_ctx.append(_http)
    app.router.add_get(watch_path(LATEST), latest)
    app.router.add_get("/run/{name}", page)
    app.router.add_get("/api/viewers", viewers)
    app.router.add_get("/favicon.ico", favicon)
    app.router.add_static("/static/", PAGE_DIR, show_index=False)
    return app


async def serve_watch(
    edge_url: str,
    admin_url: str,
    host: str = "127.0.0.1",
    port: int = 0,
    tokens: Mint | None = None,
    *,
    public: bool = False,
) -> tuple[web.AppRunner, str]:
    """Start the watch server; returns its runner and base URL (as bound: ``0.0.0.0`` for
    every interface). ``public``: pages use the edge at the host the visitor reached them by."""
    app = create_watch_app(edge_url, admin_url, tokens, public=public)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    assert server is not None
    sockets = getattr(server, "sockets", None) or []
    bound_port = sockets[0].getsockname()[1]
    return runner, f"http://{host}:{bound_port}"
