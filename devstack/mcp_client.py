"""The official MCP SDK's client, calling ``devstack/mcp_upstream.py``'s ``count`` tool through a
fleet, and recording what it heard and which replica answered each request (HAProxy's
``X-Edge-Replica``, which ``devstack.cluster`` sets). ``make demo ARGS=--resume`` and the
fleet's tests (``tests/integration/test_resume_fleet.py``) call with it.

Rules this module owns:

* A ``CallLog`` records, never decides: the demo and the tests judge what it holds.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import mcp.types as types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.message import ClientMessageMetadata


def count_call(n: int, delay: float, tag: str = "") -> types.CallToolRequest:
    """``count``: ``n`` progress notifications ``delay`` seconds apart, each and the result
    naming ``tag`` if one is given."""
    arguments: dict[str, Any] = {"n": n, "delay": delay, "tag": tag}
    return types.CallToolRequest(
        params=types.CallToolRequestParams(name="count", arguments=arguments)
    )


@dataclass
class CallLog:
    """What one SDK session heard (progress, with its messages, and the edge's ids, the
        resumption tokens) and which replica answered each of its HTTP requests, in order:
        ``(what, replica)``, ``what`` the JSON-RPC method of a POST or ``"resume"`` for a GET with
        ``Last-Event-ID``; the answer's stream (``Edge-Resume-Stream``), once an answer names it.
    ``on_progress`` is told of each progress notification as it comes."""

    progress: list[tuple[float, str | None]] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    answered: list[tuple[str, str | None]] = field(default_factory=list)
    stream: str | None = None
    on_progress: Callable[[float], Awaitable[None]] | None = None

    async def message(self, message: object) -> None:
        if isinstance(message, types.ProgressNotification):
            self.progress.append((message.params.progress, message.params.message))
            if self.on_progress is not None:
                await self.on_progress(message.params.progress)

    async def asked(self, progress: float, total: float | None, message: str | None) -> None:
        """The SDK asks the server for progress only for a request with a progress callback;
        what arrives is heard by ``message`` (a resumed call's carry the first call's token)."""

    async def token(self, token: str) -> None:
        self.tokens.append(token)

    async def response(self, response: httpx2.Response) -> None:
        request = response.request
        if request.method == "POST":
            what = str(json.loads(request.content).get("method"))
        else:
            what = "resume" if "last-event-id" in request.headers else request.method
        self.answered.append((what, response.headers.get("X-Edge-Replica")))
        self.stream = response.headers.get("Edge-Resume-Stream", self.stream)

    def replica_of(self, what: str) -> str:
        """The replica that answered the session's ``what`` (one, or this fails)."""
        (replica,) = {replica for done, replica in self.answered if done == what}
        assert replica is not None, self.answered
        return replica

    def steps(self) -> list[float]:
        return [step for step, _ in self.progress]


async def call(
    url: str, request: types.CallToolRequest, log: CallLog, *, resume_from: str | None = None
) -> types.CallToolResult:
    """One SDK session through ``url``: initialize, then the call, or with ``resume_from`` (a
    resumption token) its resumption, a GET with ``Last-Event-ID``."""
    async with (
        create_mcp_http_client() as http,
        streamable_http_client(url, http_client=http) as (read, write, *_),
        ClientSession(read, write, message_handler=log.message) as session,
    ):
        http.event_hooks = {"request": [], "response": [log.response]}
        await session.initialize()
        return await session.send_request(
            request,
            types.CallToolResult,
            metadata=ClientMessageMetadata(
                resumption_token=resume_from, on_resumption_token_update=log.token
            ),
            progress_callback=log.asked,
        )


def text_of(result: types.CallToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, types.TextContent)
    return block.text
