"""Resume routes behind the fleet, with real processes: the official MCP SDK's server (stateless,
no event store) and its client, the reference origin, Redis, two edges and HAProxy in front
(``devstack.cluster``: the resume route's path round-robin to any replica, ``backend edges_any``
of the shipped config). Every request goes through HAProxy's port; which replica answered it is
read from ``X-Edge-Replica``, which the cluster's HAProxy sets."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from devstack.cluster import Cluster, start_cluster
from devstack.mcp_client import CallLog, call, count_call, text_of
from edge.resume.ids import parse_id
from tests.integration.resume_support import (
    Backend,
    answers_heard,
    dropped_call,
    kept_at,
    kept_so_far,
    start_backend,
    until_kept,
)

pytestmark = pytest.mark.timeout(120)


@dataclass
class Fleet:
    cluster: Cluster
    backend: Backend

    @property
    def mcp_url(self) -> str:
        return self.cluster.url + "/mcp"

    def tool_runs(self, tag: str) -> int:
        lines = self.backend.seen_lines()
        return sum(1 for line in lines if line.get("tool") == "count" and line["tag"] == tag)

    def served_resumes(self, replica: str) -> float:
        metrics = self.cluster.replica_named(replica).metrics_text()
        found = re.search(r'^edge_resumes_total\{result="served"\} (\S+)$', metrics, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    def other_than(self, replica: str) -> str:
        (other,) = {"edge-1", "edge-2"} - {replica}
        return other


def start_fleet(logs: Path, *edge_args: str) -> Fleet:
    backend = start_backend(logs)
    try:
        cluster = start_cluster(logs / "cluster", edge_args=(*backend.mcp_route(), *edge_args))
    except BaseException:
        backend.stop()
        raise
    return Fleet(cluster=cluster, backend=backend)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    started = start_fleet(tmp_path_factory.mktemp("resume-fleet"))
    yield started
    started.cluster.stop()
    started.backend.stop()


async def dropped_after(fleet: Fleet, tag: str, events: int) -> tuple[CallLog, str]:
    """A call of 8 steps through HAProxy, dropped by its client after ``events`` events (the
    lift: the connection is gone mid-call); what it heard and the replica that relays it."""
    first = await dropped_call(fleet.mcp_url, count_call(8, 0.4, tag), events)
    return first, first.replica_of("tools/call")


async def next_lands_after(fleet: Fleet, replica: str) -> None:
    """Steer the round-robin: probe through HAProxy (a resume of an id the edge never minted,
    answered 404 by the replica and never relayed upstream) until a probe is answered by
    ``replica``; the next request goes to the other one (``balance roundrobin``, two servers)."""
    async with httpx2.AsyncClient() as http:
        for _ in range(4):
            probe = await http.get(fleet.mcp_url, headers={"Last-Event-ID": "no.such.id"})
            assert probe.status_code == 404
            if probe.headers.get("X-Edge-Replica") == replica:
                return
    raise AssertionError(f"no probe reached {replica}")


async def test_a_call_dropped_on_its_replica_resumes_on_the_other_through_haproxy(
    fleet: Fleet,
) -> None:
    """Fails if the resume on the replica that did not relay the call misses, repeats or
    reorders an event (replayed or live) or the result, if the tool runs twice, or if the
    resume is not served by the other replica while the call still runs."""
    first, relaying = await dropped_after(fleet, "dropped", 3)
    point = parse_id(first.tokens[2])
    assert point is not None
    # Two events the client missed are kept (replayed by the resume); three are still to come
    # (heard live), and the call is still running.
    await until_kept(fleet.cluster.origin, point.token, 5)
    other = fleet.other_than(relaying)
    served_before = fleet.served_resumes(other)
    # A session is initialize, notifications/initialized, then the resume (a GET): with the
    # probe on the relaying replica, the initialize goes to the other, and so does the resume.
    await next_lands_after(fleet, relaying)
    second = CallLog()
    result = await call(
        fleet.mcp_url, count_call(8, 0.4, "dropped"), second, resume_from=first.tokens[2]
    )
    assert second.replica_of("resume") == other
    assert fleet.served_resumes(other) == served_before + 1
    assert text_of(result) == "counted 8 for dropped"
    assert first.steps() == [1.0, 2.0, 3.0]
    assert second.steps() == [4.0, 5.0, 6.0, 7.0, 8.0]  # 4, 5 replayed; 6, 7, 8 live
    kept, closed = await kept_so_far(fleet.cluster.origin, point.token)
    assert closed
    assert len(kept) == 9  # 8 progress notifications and the result, each kept once
    assert fleet.tool_runs("dropped") == 1
    lines = fleet.backend.seen_lines()
    assert all(line.get("last_event_id") is None for line in lines if "method" in line)


async def test_a_resume_with_its_replica_drained_at_the_balancer_is_served_whole(
    fleet: Fleet,
) -> None:
    """The replica holding the call (it pumps the answer) is drained at HAProxy (runtime API:
    no new requests reach it) before the client resumes. Fails if any of the resume's
    requests reach the drained replica, or the resume misses or repeats an event or the
    result."""
    first, relaying = await dropped_after(fleet, "drained", 3)
    other = fleet.other_than(relaying)
    answer = fleet.cluster.haproxy_command(f"set server edges_any/{relaying} state drain")
    assert answer.strip() == "", answer
    try:
        second = CallLog()
        result = await call(
            fleet.mcp_url, count_call(8, 0.4, "drained"), second, resume_from=first.tokens[2]
        )
    finally:
        fleet.cluster.haproxy_command(f"set server edges_any/{relaying} state ready")
    assert {replica for _, replica in second.answered} == {other}
    assert [what for what, _ in second.answered][-1] == "resume"
    assert text_of(result) == "counted 8 for drained"
    assert first.steps() + second.steps() == [float(step) for step in range(1, 9)]
    assert fleet.tool_runs("drained") == 1


async def test_sixteen_sessions_through_haproxy_never_hear_each_other(fleet: Fleet) -> None:
    """16 SDK sessions at once through HAProxy, their calls relayed by both replicas, each
    tagged. Fails if a session hears a progress notification or a result of another's call
    (another tag, another answer's ids), misses or repeats one of its own, or if every call
    landed on one replica (the test would then not cover the fleet)."""
    sessions = [CallLog() for _ in range(16)]
    steps = [3 + index % 4 for index in range(16)]
    results = await asyncio.gather(
        *(
            call(fleet.mcp_url, count_call(steps[index], 0.05, f"s{index}"), heard)
            for index, heard in enumerate(sessions)
        )
    )
    for index, (heard, result) in enumerate(zip(sessions, results, strict=True)):
        assert text_of(result) == f"counted {steps[index]} for s{index}"
        assert heard.progress == [
            (float(step), f"step {step} of s{index}") for step in range(1, steps[index] + 1)
        ]
    answers = answers_heard(sessions)
    assert all(len(own) == 1 for own in answers)  # each session heard its own answer only
    assert len(set().union(*answers)) == 16
    relayed_by = {heard.replica_of("tools/call") for heard in sessions}
    assert relayed_by == {"edge-1", "edge-2"}


def leaves(group: BaseExceptionGroup[MCPError]) -> list[MCPError]:
    return [
        leaf
        for inner in group.exceptions
        for leaf in (leaves(inner) if isinstance(inner, BaseExceptionGroup) else [inner])
    ]


@pytest.fixture
def short_lease_fleet(tmp_path: Path) -> Iterator[Fleet]:
    """A fleet of its own (a test kills one of its replicas), with a 2 s lease."""
    started = start_fleet(tmp_path, "--resume-lease", "2")
    yield started
    started.cluster.stop()
    started.backend.stop()


async def test_the_pumping_replica_killed_the_sdk_client_ends_with_the_error_elsewhere(
    short_lease_fleet: Fleet,
) -> None:
    """The replica that relays and pumps a call is SIGKILLed mid-call. The SDK client, on its
    own, reconnects with its last id through HAProxy, which sends it to the survivor: what was
    logged (after that id), then, once the dead pump's lease lapses, the JSON-RPC error, and the
    call ends. Fails if an event is missed or repeated, if the client is left waiting (the
    test's timeout), if the reconnection is not served by the survivor, or if the stream is
    not closed with the error once (the dead pump fenced off)."""
    fleet = short_lease_fleet
    heard = CallLog()
    killed: list[str] = []

    async def kill_after_two(step: float) -> None:
        if step == 2.0:
            relaying = heard.replica_of("tools/call")
            fleet.cluster.replica_named(relaying).process.kill()
            killed.append(relaying)

    heard.on_progress = kill_after_two
    ended: list[MCPError] = []
    try:
        await call(fleet.mcp_url, count_call(40, 0.2, "killed"), heard)
    except* MCPError as errors:  # the SDK's task groups wrap it
        ended.extend(leaves(errors))
    (error,) = ended
    assert error.code == -32000
    (dead,) = killed
    survivor = fleet.other_than(dead)
    steps = heard.steps()
    assert steps == [float(step) for step in range(1, len(steps) + 1)]  # none twice or missing
    assert len(steps) < 40
    assert ("resume", survivor) in heard.answered  # the SDK's own reconnection, on the survivor
    assert all(replica == survivor for what, replica in heard.answered if what == "resume")
    assert heard.stream is not None
    logged, closed = await kept_at(fleet.cluster.origin, heard.stream)
    assert closed
    assert [message for message in logged if "error" in message["data"]] == logged[len(steps) :]
    assert len(logged) == len(steps) + 1  # what was logged, then the error once
    lapsed = fleet.cluster.replica_named(survivor).metrics_text()
    assert 'edge_resume_lapsed_total{result="fenced"} 1.0' in lapsed
    assert fleet.tool_runs("killed") == 1
