"""What a request on a resume route asks for, decided from its method and headers alone.

Rules this module owns:

* A request that declares an MCP revision from 2026-07-28 on (``MCP-Protocol-Version``) is
  relayed as it is (``Relay``): that revision removed resumability, and a closed response stream
  is the client's cancellation, so nothing is kept and a client that leaves cancels upstream.
* A ``GET`` with a ``Last-Event-ID`` is a resume (``Resume``) when the id is one of the edge's,
  and refused (``NotFound``) otherwise: the upstream never sees a ``Last-Event-ID``, and an id
  the edge did not mint (an upstream's own, a guess) finds nothing, exactly as an expired one.
* A ``POST`` is relayed with its SSE answer kept (``Keep``), and so is a ``GET`` without an id
  that declares nothing of MCP: a browser's ``EventSource`` (it can send no header of its own)
  opening an SSE endpoint, whose reconnection then resumes it on any replica. A ``GET`` that
  declares MCP (``MCP-Protocol-Version`` or ``Mcp-Session-Id``) is MCP's standalone stream, with
  no end of its own (the SDK's server holds it open for as long as its client does): it is
  relayed as it is, so it ends with its client (docs/resume.md says why).
* A CORS preflight (``OPTIONS`` with ``Access-Control-Request-Method``) is the edge's to answer
  (``Preflight``): the answers of a resume route are the edge's own. Every other method is
  relayed as it is (``DELETE`` ends an MCP session).
* What goes upstream: the client's headers by the relay's hop-by-hop rules, its
  ``Authorization`` included, without ``Last-Event-ID`` (always) and, when the answer may be
  kept, without ``Accept-Encoding`` (the edge reads the events).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edge.resume.ids import ResumePoint, parse_id

# The first MCP revision without resumability (a closed stream cancels the request).
NO_RESUME_REVISION = "2026-07-28"
LAST_EVENT_ID = "last-event-id"
MCP_PROTOCOL_VERSION = "mcp-protocol-version"
MCP_SESSION_ID = "mcp-session-id"
PREFLIGHT_METHOD = "access-control-request-method"


@dataclass(frozen=True, slots=True)
class Relay:
    """Relayed as it is; nothing kept."""


@dataclass(frozen=True, slots=True)
class Keep:
    """Relayed; an SSE answer is kept in a stream and served from it."""


@dataclass(frozen=True, slots=True)
class Resume:
    point: ResumePoint


@dataclass(frozen=True, slots=True)
class NotFound:
    """A ``Last-Event-ID`` that is not one of the edge's ids."""


@dataclass(frozen=True, slots=True)
class Preflight:
    """A browser asking whether it may send its request: the edge answers with its CORS."""


Asked = Relay | Keep | Resume | NotFound | Preflight


def _header(headers: Sequence[tuple[str, str]], name: str) -> str | None:
    return next((value for key, value in headers if key.lower() == name), None)


def declares_no_resume(headers: Sequence[tuple[str, str]]) -> bool:
    version = _header(headers, MCP_PROTOCOL_VERSION)
    # Revisions are ISO dates, so they order as strings.
    return version is not None and version.strip() >= NO_RESUME_REVISION


def asked_of(method: str, headers: Sequence[tuple[str, str]]) -> Asked:
    if declares_no_resume(headers):
        return Relay()
    method = method.upper()
    if method == "OPTIONS" and _header(headers, PREFLIGHT_METHOD) is not None:
        return Preflight()
    last_event_id = _header(headers, LAST_EVENT_ID)
    if method == "GET" and last_event_id is not None:
        point = parse_id(last_event_id)
        return NotFound() if point is None else Resume(point)
    if method == "POST":
        return Keep()
    if method == "GET" and not declares_mcp(headers):
        return Keep()
    return Relay()


def declares_mcp(headers: Sequence[tuple[str, str]]) -> bool:
    """An MCP client's request: MCP's standalone ``GET`` stream, not a browser's."""
    return any(
        _header(headers, name) is not None for name in (MCP_PROTOCOL_VERSION, MCP_SESSION_ID)
    )


def upstream_headers(relayed: Sequence[tuple[str, str]], *, keep: bool) -> list[tuple[str, str]]:
    """``relayed`` (the relay's hop-by-hop rules already applied) as sent upstream."""
    dropped = {LAST_EVENT_ID, "content-length"} | ({"accept-encoding"} if keep else set())
    return [(name, value) for name, value in relayed if name.lower() not in dropped]
