"""``route_of``: the one decision, for aiohttp's handler and the connection's own relay, of
what becomes of a classified request."""

from __future__ import annotations

import pytest

from edge.protocol.reads import classify
from edge.web.own_relay import RELAYED_HEAD, Relayed, Route, Serve, route_of

STREAM = "/v1/stream/x"
ROUTES: dict[str, tuple[str, str, bool, Route]] = {
    "catch-up": ("GET", "offset=-1", False, Serve.CATCHUP),
    "now": ("GET", "offset=now", False, Relayed("edge; fwd=bypass", bypass=True)),
    "unknown parameter": ("GET", "offset=-1&x=1", False, Relayed("edge; fwd=bypass", bypass=True)),
    "long-poll": ("GET", "offset=-1&live=long-poll", False, Serve.LIVE),
    "sse": ("GET", "offset=-1&live=sse", False, Serve.LIVE),
    "long-poll, CORS unknown": (
        "GET",
        "offset=-1&live=long-poll",
        True,
        Relayed("edge; fwd=bypass; detail=cors"),
    ),
    "sse, CORS unknown": (
        "GET",
        "offset=-1&live=sse",
        True,
        Relayed("edge; fwd=bypass; detail=cors"),
    ),
    "head": ("HEAD", "", False, Serve.HEAD),
    "head with a parameter": ("HEAD", "x=1", False, RELAYED_HEAD),
    "write": ("POST", "", False, Relayed("edge; fwd=method")),
}


@pytest.mark.parametrize("name", ROUTES)
def test_every_classified_request_has_one_route(name: str) -> None:
    method, query, cors_unknown, route = ROUTES[name]
    classified = classify(method, STREAM, query, ())
    assert route_of(classified, cors_unknown=cors_unknown) == route
