"""The CORS headers of a resume route's answers, from the origin's grant (pure).

Rules this module owns:

* A route's answers are the edge's own: they carry what the origin grants the request's
  ``Origin`` (``edge.web.proxy.OriginCors``), since each answer lives at the origin as a stream.
  Where the origin grants that ``Origin`` nothing (no ``Access-Control-Allow-Origin``), nothing
  is added: the browser refuses, as it would at the origin.
* A grant is widened by what the route itself needs, and only that: its methods
  (``ROUTE_METHODS``), its request headers allowed (``Last-Event-ID`` for an ``EventSource``'s
  reconnection, MCP's headers), its response headers exposed (``Edge-Resume-Stream``,
  ``Mcp-Session-Id``); the origin's own entries are kept, each name once whatever its case.
"""

from __future__ import annotations

from collections.abc import Sequence

# Where a kept answer's stream is named to its client (another device with the same credential
# can follow it there as an ordinary stream).
STREAM_HEADER = "Edge-Resume-Stream"
ROUTE_METHODS = "GET, POST, DELETE, OPTIONS"
ROUTE_REQUEST_HEADERS = ("content-type", "authorization", "last-event-id", "mcp-session-id",
                         "mcp-protocol-version", "accept")  # fmt: skip
ROUTE_EXPOSED = (STREAM_HEADER, "Mcp-Session-Id")
ALLOW_ORIGIN = "access-control-allow-origin"
ALLOW_METHODS = "access-control-allow-methods"
ALLOW_HEADERS = "access-control-allow-headers"
EXPOSE_HEADERS = "access-control-expose-headers"


def route_cors(grant: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The CORS headers of a route's answer to a request the origin grants ``grant``."""
    if not any(name.lower() == ALLOW_ORIGIN for name, _ in grant):
        return []
    widened = {ALLOW_METHODS, ALLOW_HEADERS, EXPOSE_HEADERS}
    granted = {name.lower(): value for name, value in grant}
    return [
        *((name, value) for name, value in grant if name.lower() not in widened),
        ("Access-Control-Allow-Methods", ROUTE_METHODS),
        (
            "Access-Control-Allow-Headers",
            _union(granted.get(ALLOW_HEADERS, ""), ROUTE_REQUEST_HEADERS),
        ),
        ("Access-Control-Expose-Headers", _union(granted.get(EXPOSE_HEADERS, ""), ROUTE_EXPOSED)),
    ]


def _union(listed: str, more: Sequence[str]) -> str:
    """A comma-separated header list with ``more`` added (case-insensitively once each)."""
    names: list[str] = []
    known: set[str] = set()
    for name in (*(piece.strip() for piece in listed.split(",")), *more):
        if name and name.lower() not in known:
            known.add(name.lower())
            names.append(name)
    return ", ".join(names)
