"""The one door for origin answers: what an answer the origin gave (to a catch-up fill, on a
live tail, or to a request the edge relays or makes without storing its answer: a read, a HEAD,
a DELETE, ``offset=now``, a lifetime probe) means for the stream instance the edge knows, as a
decision and the actions that carry it out. Writes are judged by ``judge_write``.

Rules this module owns (DESIGN.md "a stream's identity"; PROTOCOL-NOTES "Cacheability"):

* An answer fetched under an instance that is no longer current changes nothing (``STALE``): it
  is its client's only, and a live tail that follows a forgotten instance stops.
* A 404 or 410 to any request says the stream (in that scope) is gone (``GONE``: ``says_gone``);
  about an instance already forgotten it says nothing of the current one.
* Only a 200 in identity encoding with a well-formed ``Stream-Next-Offset`` to a fill can become
  a segment; any other answer is evidence about its own request (``RELAY``). An answer the edge
  never stores (``Arrival.evidence``) is judged for its status only.
* ``Cache-Control: no-store``/``private`` is relayed verbatim and makes the edge relay the stream
  for ``BYPASS_SECONDS`` (RFC 9111 §5.2.2: not a shared cache's to keep).
* A stream keeps its content type for life, offsets never go back, and a closure never moves:
  an answer that contradicts the instance is another stream at the path (``NEW_INSTANCE``),
  whose old instance is forgotten everywhere. The tail judgement is ``judge_tail``'s.
* A fill's word on the tail is observed as of when its request left (``Arrival.touched_at``),
  not when its answer arrived: the freshness window counts from the earliest moment it can
  be true of.
* A catch-up answer read past the tail (its next offset before the read's) is the client's to
  see, never stored; a live batch's word on the tail is authoritative while its upstream runs.
* Otherwise the segment is stored under the instance it was fetched for and shared
  (``STORE``), with the closure when the answer ends a closed stream.

``decide`` is pure: values in, an ``Intake`` out. ``edge.instances.door.Door.take_in`` carries out
its actions, in order, after deciding; nothing else stores what the origin said.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from edge.log.segment import (
    Segment,
    answer_segment,
    is_json,
    is_json_array,
)
from edge.log.stream_log import (
    StreamInstance,
    TailFact,
    TailJudgement,
    TailVerdict,
    judge_tail,
    names_another_instance,
    says_gone,
)
from edge.protocol.headers import HOP_BY_HOP, cors_headers, first_value, flag
from edge.protocol.reads import is_offset_token

# A stream whose origin answers said no-store/private is relayed this long before trying again.
BYPASS_SECONDS = 60.0

# Headers that describe one answer, not the stream: never replayed from the template.
PER_ANSWER = frozenset(
    {
        "content-type",
        "content-length",
        "content-encoding",
        "date",
        "etag",
        "cache-control",
        # A CDN's lifetime and purge keys are the edge's to give for its own answers.
        "cdn-cache-control",
        "surrogate-control",
        "surrogate-key",
        "cache-tag",
        "xkey",
        "vary",
        "via",
        "age",
        "expires",
        "last-modified",
        "location",
        "cache-status",
        "stream-next-offset",
        "stream-up-to-date",
        "stream-closed",
        "stream-cursor",
        "stream-ttl",
        "stream-expires-at",
        "set-cookie",
    }
)


class Decision(enum.Enum):
    STORE = "store"  # a forward segment of the current instance: kept and shared
    RELAY = "relay"  # true for its own request only: relayed, nothing kept
    STALE = "stale"  # fetched under an instance already forgotten: nothing of it is kept
    NEW_INSTANCE = "new instance"  # impossible for the instance known: forget it everywhere
    GONE = "gone"  # a 404 or 410: the stream is gone in this scope
    MALFORMED = "malformed"  # a live batch with an offset that is not one: the tail stops


@dataclass(frozen=True, kw_only=True, slots=True)
class Arrival:
    """One origin answer, as values. ``start`` is where it was asked from (a fill's offset, a
    live batch's first offset); ``end`` its ``Stream-Next-Offset``. ``started`` and
    ``received`` are the edge's tickets when the request left and when the answer came;
    ``asked_at`` the edge's clock when a fill's request left (None: a live batch)."""

    live: bool
    start: str
    status: int
    end: str | None
    body: bytes
    headers: tuple[tuple[str, str], ...]
    content_type: str | None
    up_to_date: bool
    closed: bool
    started: int
    received: int
    now: float
    asked_at: float | None = None

    @property
    def touched_at(self) -> float:
        """When the origin renewed the stream's sliding TTL for this answer, at the earliest:
        a read renews it when the origin takes it up (PROTOCOL.md 5.1), after its request left
        and before its answer started, which may be long before its body ends. A live batch's
        is its arrival (the origin renews it as it reads the batch it sends)."""
        return self.now if self.asked_at is None else self.asked_at

    # Evidence only: an answer the edge relays or asked for itself and never stores (a relayed
    # read, HEAD or DELETE; ``offset=now``; a lifetime probe; a live upstream's refusal).
    evidence_only: bool = False

    @classmethod
    def evidence(
        cls,
        status: int,
        headers: tuple[tuple[str, str], ...],
        *,
        live: bool,
        started: int,
        received: int,
        now: float,
    ) -> Arrival:
        return cls(
            live=live, start="", status=status, end=None, body=b"", headers=headers,
            content_type=first_value(headers, "content-type"), up_to_date=False, closed=False,
            started=started, received=received, now=now, evidence_only=True,
        )  # fmt: skip

    @classmethod
    def of_fill(
        cls,
        start: str,
        status: int,
        headers: tuple[tuple[str, str], ...],
        body: bytes,
        *,
        started: int,
        received: int,
        now: float,
        asked_at: float | None = None,
    ) -> Arrival:
        return cls(
            live=False, start=start, status=status,
            end=first_value(headers, "stream-next-offset"), body=body, headers=headers,
            content_type=first_value(headers, "content-type"),
            up_to_date=flag(headers, "stream-up-to-date"), closed=flag(headers, "stream-closed"),
            started=started, received=received, now=now, asked_at=asked_at,
        )  # fmt: skip


# --- actions, carried out in order by ``Door.take_in`` (edge.instances) ---


@dataclass(frozen=True, slots=True)
class Forget:
    """Forget the stream's instance everywhere (a purge)."""

    why: str


@dataclass(frozen=True, slots=True)
class ForgetScope:
    """A 404: the stream is gone for this scope (for the public scope, the instance)."""


@dataclass(frozen=True, slots=True)
class Bypass:
    until: float


@dataclass(frozen=True, slots=True)
class Describe:
    """The stream's content type and the headers every answer of it carries."""

    content_type: str | None
    template: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Touched:
    now: float


@dataclass(frozen=True, slots=True)
class LearnLifetime:
    headers: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class BelieveTail:
    judgement: TailJudgement


@dataclass(frozen=True, slots=True)
class Reached:
    offset: str
    received: int


@dataclass(frozen=True, slots=True)
class Keep:
    """Store the segment (if any) under the instance and share it; ``closed_at``: the answer
    ends a closed stream there; ``open_tail``: it said the stream open with its tail there."""

    segment: Segment | None
    closed_at: str | None
    open_tail: bool = False


@dataclass(frozen=True, slots=True)
class ProbeLifetime:
    """Ask the origin once whether the stream expires, if no answer has said it yet."""


Action = (
    Forget | ForgetScope | Bypass | Describe | Touched | LearnLifetime | BelieveTail | Reached
    | Keep | ProbeLifetime
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Intake:
    decision: Decision
    actions: tuple[Action, ...] = ()
    segment: Segment | None = None  # the segment to keep, for STORE

    @property
    def forgets(self) -> bool:
        return any(isinstance(action, Forget) for action in self.actions)


def header_template(headers: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The headers of one origin answer that hold for every answer of the stream: not those
    of the answer itself, nor its CORS headers, which are its request's (``OriginCors``)."""
    cors = {name.lower() for name, _ in cors_headers(headers)}
    return tuple(
        (n, v)
        for n, v in headers
        if n.lower() not in PER_ANSWER and n.lower() not in HOP_BY_HOP and n.lower() not in cors
    )


def forbids_storing(headers: Sequence[tuple[str, str]]) -> bool:
    """RFC 9111 §5.2.2: ``no-store`` and ``private`` answers are not a shared cache's to keep."""
    directives = ",".join(v for n, v in headers if n.lower() == "cache-control").lower()
    names = {part.split("=")[0].strip() for part in directives.split(",")}
    return bool(names & {"no-store", "private"})


def decide(
    arrival: Arrival, instance: StreamInstance, tail: TailFact | None, *, current: bool
) -> Intake:
    """What ``arrival`` means for ``instance`` (the one it was fetched under; ``current``:
    still the one the edge knows) whose log believes ``tail``."""
    if says_gone(arrival.status):
        if current:
            return Intake(Decision.GONE, (ForgetScope(),))
        # About an instance already gone, it says nothing about the current one: a fill's is
        # its client's answer; a live upstream following a forgotten instance stops.
        return Intake(Decision.STALE if arrival.live else Decision.RELAY)
    if arrival.evidence_only:
        return Intake(Decision.RELAY)
    return _decide_live(arrival, instance, tail, current=current) if arrival.live else (
        _decide_fill(arrival, instance, tail, current=current)
    )  # fmt: skip


def _decide_fill(
    arrival: Arrival, instance: StreamInstance, tail: TailFact | None, *, current: bool
) -> Intake:
    headers = arrival.headers
    encoding = (first_value(headers, "content-encoding") or "identity").lower()
    end = arrival.end
    if arrival.status != 200 or encoding != "identity" or not is_offset_token(end):
        return Intake(Decision.RELAY)  # other refusals: about this request only
    assert end is not None
    if forbids_storing(headers):
        return Intake(Decision.RELAY, (Bypass(until=arrival.now + BYPASS_SECONDS),))
    if not current:
        return Intake(Decision.STALE)
    json = is_json(arrival.content_type)
    if json and not is_json_array(arrival.body):
        return Intake(Decision.RELAY)
    # A fill's answer always names its stream's type: one with none names another than a known
    # one (stricter than a write's answer, where none names nothing).
    if names_another_instance(instance, arrival.content_type or ""):
        return Intake(Decision.NEW_INSTANCE, (Forget("changed content type at the origin"),))
    actions: list[Action] = [
        Describe(arrival.content_type, header_template(headers)),
        Touched(arrival.touched_at),
        LearnLifetime(headers),
    ]
    offset = arrival.start
    if arrival.up_to_date or end < offset:
        # Observed as of when the request left (``touched_at``): the origin said where its tail
        # was at some moment after that, so the freshness window counts from there and no
        # at-tail answer given from it is older than ``--tail-freshness`` (a slow fill, or a
        # refresh-ahead answered late in its window, takes nothing off the bound).
        judgement = judge_tail(
            instance, tail, end, closed=arrival.closed and arrival.up_to_date,
            now=arrival.touched_at,
            started=arrival.started, received=arrival.received,
        )  # fmt: skip
        if judgement.verdict is TailVerdict.NEW_INSTANCE:
            # Told to a request that started after the edge knew better: another instance.
            return Intake(
                Decision.NEW_INSTANCE, (Forget("tail went back or reopened at the origin"),)
            )
        actions.append(BelieveTail(judgement))
    if end < offset:
        return Intake(Decision.RELAY, tuple(actions))  # past the tail: the client's to see
    final = arrival.up_to_date and arrival.closed
    segment = answer_segment(offset, end, arrival.body, json=json)
    actions += [
        Reached(end, arrival.received),
        Keep(segment, end if final else None, arrival.up_to_date and not arrival.closed),
        ProbeLifetime(),
    ]
    return Intake(Decision.STORE, tuple(actions), segment)


def _decide_live(
    arrival: Arrival, instance: StreamInstance, tail: TailFact | None, *, current: bool
) -> Intake:
    if not current:
        return Intake(Decision.STALE)
    end = arrival.end
    if end is None or not is_offset_token(end):
        return Intake(Decision.MALFORMED)
    start = arrival.start
    touched = Touched(arrival.touched_at)
    if end < start:
        # The upstream follows from an offset the stream reached; behind it is another stream
        # (deleted and recreated, or an origin that lost its tail).
        return Intake(Decision.NEW_INSTANCE, (touched, Forget(f"went back from {start} to {end}")))
    actions: list[Action] = [touched]
    if arrival.up_to_date or arrival.closed:
        judgement = judge_tail(
            instance, tail, end, closed=arrival.closed, now=arrival.now,
            started=arrival.started, received=arrival.received, authoritative=True,
        )  # fmt: skip
        if judgement.verdict is TailVerdict.NEW_INSTANCE:
            return Intake(Decision.NEW_INSTANCE, (touched, Forget("tail contradicts the stream")))
        actions.append(BelieveTail(judgement))
    segment = answer_segment(start, end, arrival.body, json=is_json(arrival.content_type))
    keep = Keep(segment, end if arrival.closed else None, arrival.up_to_date and not arrival.closed)
    actions += [Reached(end, arrival.received), keep]
    return Intake(Decision.STORE, tuple(actions), segment)


__all__ = [
    "Action",
    "Arrival",
    "Decision",
    "Intake",
    "decide",
    "forbids_storing",
    "header_template",
]
