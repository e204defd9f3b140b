"""Stand-ins for the receivers of the edge's CDN purges (``--cdn-purge``): Fastly's and
Cloudflare's purge APIs, a webhook, and a Varnish that takes ``PURGE`` by xkey.

Each is a real aiohttp server on loopback in a thread of its own (``ThreadedServer``), that
checks every request is exactly the one its receiver documents and answers as that receiver
does: the documented success body; 401/403 with the API's error body for a wrong token; 400
for a malformed request (recorded in ``rejected``, which a test expects empty); and, when a
test scripts them (``fail_next``), errors and rate limits (429 with ``Retry-After``).

What the real APIs take (the documentation followed):

* Fastly, "Purge multiple surrogate key tags" (``POST /service/{service_id}/purge``, API token
  in ``Fastly-Key``, keys space-separated in a ``Surrogate-Key`` header, up to 256; optional
  ``Fastly-Soft-Purge``; answers a JSON map of each key to its purge id).
* Cloudflare, "Purge Cached Content" by tag (``POST /client/v4/zones/{zone_id}/purge_cache``,
  ``Authorization: Bearer``, JSON ``{"tags": [...]}``; the per-call tag limit; answers
  ``{"success": true, "errors": [], "messages": [], "result": {"id": ...}}``; errors carry
  ``"success": false`` and an ``errors`` list).
* The Varnish purge of the CDN contract (``PURGE`` with ``xkey-purge``; 200 with the count).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from edge.instances.forgetting import REASONS
from edge.protocol.purge_keys import KEY_LENGTH, PREFIX
from tests.integration.auth_services import ThreadedServer

FASTLY_KEYS_PER_CALL = 256  # the documented limits, restated here: the stand-ins enforce them
CLOUDFLARE_TAGS_PER_CALL = 30


@dataclass(frozen=True)
class Received:
    """One purge the stand-in acknowledged."""

    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    keys: tuple[str, ...]
    at: float  # time.monotonic()
    stream: str | None = None  # a webhook's
    reason: str | None = None  # a webhook's


@dataclass(frozen=True)
class Scripted:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class Refused(Exception):
    def __init__(self, response: web.Response, why: str) -> None:
        super().__init__(why)
        self.response = response


def _key_ok(key: str) -> bool:
    return key.startswith(PREFIX) and 0 < len(key) <= KEY_LENGTH


class StandIn:
    """What every stand-in shares: a route, the checks, the record, the scripted answers."""

    def __init__(self, method: str, path: str) -> None:
        self._lock = threading.Lock()
        self.received: list[Received] = []
        self.rejected: list[str] = []
        self._script: list[Scripted] = []
        self.answers: list[int] = []  # every status answered, scripted ones included
        # Every request as it arrived: (time.monotonic(), headers lower-cased, body).
        self.seen: list[tuple[float, dict[str, str], bytes]] = []
        self.server = ThreadedServer([web.route(method, path, self._handle)])

    def start(self) -> StandIn:
        self.server.start()
        return self

    def close(self) -> None:
        self.server.close()

    @property
    def url(self) -> str:
        return self.server.url

    def fail_next(self, *answers: Scripted) -> None:
        """Answer the next requests with these (then as the real receiver does)."""
        with self._lock:
            self._script.extend(answers)

    def calls_for(self, key: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if key in r.keys]

    def all_keys(self) -> list[str]:
        with self._lock:
            return [k for r in self.received for k in r.keys]

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {name.lower(): value for name, value in request.headers.items()}
        with self._lock:
            self.seen.append((time.monotonic(), headers, body))
            scripted = self._script.pop(0) if self._script else None
        if scripted is not None:
            self.answers.append(scripted.status)
            return web.Response(
                status=scripted.status, headers=scripted.headers, body=scripted.body
            )
        try:
            received, response = self.check(request, headers, body)
        except Refused as refused:
            with self._lock:
                self.rejected.append(str(refused))
            self.answers.append(refused.response.status)
            return refused.response
        with self._lock:
            self.received.append(received)
        self.answers.append(response.status)
        return response

    def check(
        self, request: web.Request, headers: dict[str, str], body: bytes
    ) -> tuple[Received, web.Response]:
        raise NotImplementedError


class FastlyStandIn(StandIn):
    def __init__(self, service_id: str, token: str) -> None:
        super().__init__("POST", "/service/{service_id}/purge")
        self.service_id, self.token = service_id, token

    def check(
        self, request: web.Request, headers: dict[str, str], body: bytes
    ) -> tuple[Received, web.Response]:
        if headers.get("fastly-key") != self.token:
            raise Refused(
                web.json_response(
                    {"msg": "Provided credentials are missing or invalid"}, status=401
                ),
                "wrong or missing Fastly-Key",
            )
        if request.match_info["service_id"] != self.service_id:
            raise Refused(web.json_response({"msg": "Record not found"}, status=404), "service")
        keys = tuple(headers.get("surrogate-key", "").split(" "))
        if not all(_key_ok(k) for k in keys) or not 0 < len(keys) <= FASTLY_KEYS_PER_CALL:
            raise Refused(web.json_response({"msg": "Bad request"}, status=400), "keys")
        if body:
            raise Refused(web.json_response({"msg": "Bad request"}, status=400), "a body")
        if "fastly-soft-purge" in headers:
            # Accepted by Fastly; the edge's purges must be hard (see edge.cdn.api).
            raise Refused(web.json_response({"msg": "unexpected"}, status=400), "soft purge")
        ids = {key: f"108-{int(time.time())}-{secrets.randbelow(10**6)}" for key in keys}
        received = Received(
            method=request.method, path=request.path, headers=headers, body=body, keys=keys,
            at=time.monotonic(),
        )  # fmt: skip
        return received, web.json_response(ids)


def cloudflare_error(status: int, code: int, message: str) -> web.Response:
    return web.json_response(
        {"success": False, "errors": [{"code": code, "message": message}], "messages": [],
         "result": None},
        status=status,
    )  # fmt: skip


class CloudflareStandIn(StandIn):
    def __init__(self, zone_id: str, token: str) -> None:
        super().__init__("POST", "/client/v4/zones/{zone_id}/purge_cache")
        self.zone_id, self.token = zone_id, token

    def check(
        self, request: web.Request, headers: dict[str, str], body: bytes
    ) -> tuple[Received, web.Response]:
        if headers.get("authorization") != f"Bearer {self.token}":
            raise Refused(cloudflare_error(403, 10000, "Authentication error"), "token")
        if request.match_info["zone_id"] != self.zone_id:
            raise Refused(cloudflare_error(400, 7003, "Could not route"), "zone")
        if headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise Refused(cloudflare_error(400, 6003, "Invalid request headers"), "type")
        try:
            payload = json.loads(body)
        except ValueError:
            raise Refused(cloudflare_error(400, 6007, "Malformed JSON"), "json") from None
        tags = payload.get("tags") if isinstance(payload, dict) else None
        if (
            set(payload) != {"tags"}
            or not isinstance(tags, list)
            or not 0 < len(tags) <= CLOUDFLARE_TAGS_PER_CALL
            or not all(isinstance(t, str) and _key_ok(t) for t in tags)
        ):
            raise Refused(cloudflare_error(400, 1012, "Request must contain tags"), "tags")
        received = Received(
            method=request.method, path=request.path, headers=headers, body=body,
            keys=tuple(tags), at=time.monotonic(),
        )  # fmt: skip
        result = {"id": secrets.token_hex(16)}
        answer = {"success": True, "errors": [], "messages": [], "result": result}
        return received, web.json_response(answer)


def cloudflare_rate_limited(retry_after: int = 1) -> Scripted:
    error = {"code": 971, "message": "Please wait and consider throttling your request speed"}
    body = {"success": False, "errors": [error], "messages": [], "result": None}
    return Scripted(
        status=429,
        headers={"Retry-After": str(retry_after), "Content-Type": "application/json"},
        body=json.dumps(body).encode(),
    )


class WebhookStandIn(StandIn):
    def __init__(self, path: str = "/cdn-purge") -> None:
        super().__init__("POST", path)

    def check(
        self, request: web.Request, headers: dict[str, str], body: bytes
    ) -> tuple[Received, web.Response]:
        if headers.get("content-type") != "application/json":
            raise Refused(web.Response(status=415), "content type")
        try:
            payload = json.loads(body)
        except ValueError:
            raise Refused(web.Response(status=400), "json") from None
        if not isinstance(payload, dict) or set(payload) != {"keys", "stream", "reason"}:
            raise Refused(web.Response(status=400), f"shape {payload!r}")
        keys, stream, reason = payload["keys"], payload["stream"], payload["reason"]
        if not (
            isinstance(keys, list)
            and keys
            and all(isinstance(k, str) and _key_ok(k) for k in keys)
            and isinstance(stream, str)
            and reason in REASONS
        ):
            raise Refused(web.Response(status=400), f"values {payload!r}")
        received = Received(
            method=request.method, path=request.path, headers=headers, body=body,
            keys=tuple(keys), at=time.monotonic(), stream=stream, reason=reason,
        )  # fmt: skip
        return received, web.Response(status=204)


class VarnishStandIn(StandIn):
    """The purge side of the contract's VCL: ``PURGE`` with ``xkey-purge``, 200 with a count."""

    def __init__(self) -> None:
        super().__init__("PURGE", "/{tail:.*}")

    def check(
        self, request: web.Request, headers: dict[str, str], body: bytes
    ) -> tuple[Received, web.Response]:
        keys = tuple(headers.get("xkey-purge", "").split(" "))
        if body or not all(_key_ok(k) for k in keys):
            raise Refused(web.Response(status=400), "keys or body")
        received = Received(
            method=request.method, path=request.path, headers=headers, body=body, keys=keys,
            at=time.monotonic(),
        )  # fmt: skip
        return received, web.Response(text=f"Purged {len(keys)} objects\n")


async def eventually(predicate: Callable[[], bool], within: float = 10.0) -> bool:
    """Wait (without blocking the loop) until ``predicate`` holds; whether it did."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return predicate()
