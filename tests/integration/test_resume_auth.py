"""Resume routes behind ``--auth``, with real processes: the reference origin, the agent
backend of ``mcp_upstream.py`` (its ``/raw`` answers), two edges with ``--auth jwt`` (a JWKS
file) and one with ``--auth forward`` (a real auth service).

The gate judges a route's requests as it judges a stream's (the token must cover the route's
path; a POST needs ``write``). A kept answer is bound to the principal the gate names (a JWT's
``sub``): the same principal with a fresh token resumes it on any replica, another principal
gets the 404 an unknown id gets. A credential that names no principal (``forward`` here) binds
by the credential, as without ``--auth``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devstack.processes import Edge, Origin, start_edge
from edge.protocol.sse import SseDecoder
from tests.auth_support import claims_for, hs_key, jwks, sign
from tests.integration.auth_services import AuthService
from tests.integration.resume_support import (
    Backend,
    id_after,
    messages,
    read_resume,
    read_until_cut,
    sse_events,
    start_backend,
    steps_and_end,
    two_edges,
)

pytestmark = pytest.mark.timeout(120)

HS = hs_key("hs-resume")


@dataclass
class Stand:
    backend: Backend
    a: Edge
    b: Edge
    forward: Edge
    named: Edge  # forward, with --auth-subject-header
    service: AuthService


@pytest.fixture(scope="module")
def stand(origin: Origin, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stand]:
    logs = tmp_path_factory.mktemp("resume-auth")
    keys = logs / "jwks.json"
    keys.write_bytes(jwks(HS))
    backend = start_backend(logs, name="resume-auth-upstream")
    route = backend.raw_route()
    jwt = ("--auth", "jwt", "--jwt-jwks", str(keys), "--jwt-leeway", "1")
    sessions = {"s-alice": "/raw/", "s-bob": "/raw/", "s-alice-phone": "/raw/"}
    users = {"s-alice": "alice", "s-alice-phone": "alice", "s-bob": "bob"}
    service = AuthService(sessions=sessions, users=users).start()
    forward_args = (*route, "--auth", "forward", "--auth-url", service.url)
    forward = start_edge(origin.url, logs, *forward_args, name="resume-forward")
    named = start_edge(
        origin.url, logs, *forward_args, "--auth-subject-header", "X-Auth-Request-User",
        name="resume-forward-named",
    )  # fmt: skip
    with two_edges(origin.url, logs, ("resume-jwt-a", "resume-jwt-b"), *route, *jwt) as (a, b):
        yield Stand(backend=backend, a=a, b=b, forward=forward, named=named, service=service)
    for process in (forward, named):
        process.stop()
    if service.server is not None:
        service.server.close()
    backend.stop()


def bearer(sub: str, *, scope: str = "read", streams: str = "/raw/", **extra: Any) -> str:
    return "Bearer " + sign(HS, claims_for(streams, sub=sub, scope=scope, **extra))


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


async def test_the_gate_judges_a_routes_requests(
    stand: Stand, client: aiohttp.ClientSession
) -> None:
    before = len(stand.backend.seen_lines())
    async with client.get(stand.a.url + "/raw/slow?tag=none") as anonymous:
        assert anonymous.status == 401
        assert "Bearer" in anonymous.headers["WWW-Authenticate"]
    other = {"Authorization": bearer("alice", streams="/elsewhere/")}
    async with client.get(stand.a.url + "/raw/slow?tag=other", headers=other) as elsewhere:
        assert elsewhere.status == 403
    reader = {"Authorization": bearer("alice")}
    async with client.post(stand.a.url + "/raw/slow?tag=post", headers=reader) as read_only:
        assert read_only.status == 403  # a POST is a write
    assert len(stand.backend.seen_lines()) == before  # refusals never reach the backend
    # A preflight carries no credential: the edge answers it.
    asking = {"Origin": "http://page.example", "Access-Control-Request-Method": "GET"}
    async with client.options(stand.a.url + "/raw/slow", headers=asking) as preflight:
        assert preflight.status == 204


async def test_the_same_principal_resumes_with_a_fresh_token_and_no_other_does(
    stand: Stand, client: aiohttp.ClientSession
) -> None:
    writer = {"Authorization": bearer("alice", scope="read write")}
    async with client.post(stand.a.url + "/raw/slow?tag=alice", headers=writer) as answer:
        assert answer.status == 200
        last = await id_after(answer, 5)
    # Another principal, with a token as good as alice's: the 404 of an unknown id.
    for who in (bearer("bob"), bearer("bob", scope="read write")):
        async with client.get(
            stand.b.url + "/raw/slow", headers={"Authorization": who, "Last-Event-ID": last}
        ) as refused:
            assert refused.status == 404
            assert await refused.text() == "no such answer\n"
    # Alice again on the other replica, with a token minted since (another string, another
    # expiry), as a browser's EventSource sends one: in the query.
    fresh = bearer("alice", lifetime=600.0).removeprefix("Bearer ")
    assert f"Bearer {fresh}" != writer["Authorization"]
    rest = await read_resume(client, stand.b.url + f"/raw/slow?token={fresh}", last)
    steps, end = steps_and_end(rest)
    assert steps == list(range(6, 21))
    assert end["id"] == 42
    # The backend was asked once, with alice's credential; no token parameter, no
    # Last-Event-ID ever reached it.
    asked = [
        line
        for line in stand.backend.seen_lines()
        if line.get("method") and "alice" in line["query"]
    ]
    assert len(asked) == 1
    assert asked[0]["authorization"] == writer["Authorization"]
    assert all("token=" not in line.get("query", "") for line in stand.backend.seen_lines())
    assert all(line.get("last_event_id") is None for line in stand.backend.seen_lines())


async def test_a_query_token_goes_upstream_as_a_bearer_header(
    stand: Stand, client: aiohttp.ClientSession
) -> None:
    # A browser's EventSource opens the route with its token in the query.
    token = bearer("carol").removeprefix("Bearer ")
    async with client.get(stand.a.url + f"/raw/slow?tag=carol&token={token}") as answer:
        assert answer.status == 200
        events = await sse_events(answer, SseDecoder())
    assert messages(events)[-1]["id"] == 42
    (asked,) = [line for line in stand.backend.seen_lines() if line.get("query") == "tag=carol"]
    assert asked["authorization"] == f"Bearer {token}"


async def test_a_forward_principal_resumes_from_another_session(
    stand: Stand, client: aiohttp.ClientSession
) -> None:
    # The auth service names the user (--auth-subject-header): alice's laptop begins the answer,
    # her phone (another session cookie) resumes it; bob finds nothing.
    laptop, phone = {"Cookie": "session=s-alice"}, {"Cookie": "session=s-alice-phone"}
    async with client.get(stand.named.url + "/raw/slow?tag=named", headers=laptop) as answer:
        assert answer.status == 200
        last = await id_after(answer, 3)
    bob = {"Cookie": "session=s-bob", "Last-Event-ID": last}
    async with client.get(stand.named.url + "/raw/slow", headers=bob) as refused:
        assert refused.status == 404
    steps, _ = steps_and_end(await read_resume(client, stand.named.url + "/raw/slow", last, phone))
    assert steps == list(range(4, 21))


async def test_without_a_principal_the_credential_binds(
    stand: Stand, client: aiohttp.ClientSession
) -> None:
    # Without --auth-subject-header a forward verdict names no one: the cookie binds.
    alice, bob = {"Cookie": "session=s-alice"}, {"Cookie": "session=s-bob"}
    async with client.get(stand.forward.url + "/raw/slow?tag=fwd", headers=alice) as answer:
        assert answer.status == 200
        last = await id_after(answer, 3)
    async with client.get(
        stand.forward.url + "/raw/slow", headers={**bob, "Last-Event-ID": last}
    ) as refused:
        assert refused.status == 404
    async with client.get(stand.forward.url + "/raw/slow", headers={"Last-Event-ID": last}) as no:
        assert no.status == 401
    rest = await read_resume(client, stand.forward.url + "/raw/slow", last, alice)
    steps, _ = steps_and_end(rest)
    assert steps == list(range(4, 21))
    assert ("s-bob", "GET", "/raw/slow") in stand.service.asked  # the gate asked about bob


async def test_a_reader_whose_token_expires_is_cut_short_and_resumes_with_a_fresh_one(
    stand: Stand, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    go_on = tmp_path / "go-on"  # the upstream holds after its second event until this exists
    short = {"Authorization": bearer("dave", lifetime=3.0)}
    async with client.get(
        stand.a.url + f"/raw/slow?tag=dave&hold={go_on}", headers=short
    ) as answer:
        assert answer.status == 200
        events, cut = await read_until_cut(answer, SseDecoder())
    assert cut  # ended unfinished, as a live read at its token's expiry
    assert len(events) == 2
    last = events[1].id
    assert last is not None
    async with client.get(
        stand.b.url + "/raw/slow", headers={**short, "Last-Event-ID": last}
    ) as stale:
        assert stale.status == 401
    go_on.touch()
    fresh = {"Authorization": bearer("dave")}
    steps, end = steps_and_end(await read_resume(client, stand.b.url + "/raw/slow", last, fresh))
    assert steps == list(range(3, 21))
    assert end["id"] == 42
