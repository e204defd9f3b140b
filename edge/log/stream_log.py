"""What the edge knows about one stream *instance*, and about it in one credential scope.

A stream is identified by its normalised path (as the origin resolves it) and an instance: a
DELETE and a PUT at the same path make a new stream whose offsets start again and whose bytes
differ. Nothing the edge learned about one instance may be served for another.

Rules this module owns:

* ``StreamInstance`` (one per path) holds what is true of the stream whatever the scope: its
  lifetime, the furthest offset it is known to have reached (``high``), whether it is known
  closed, and whether the origin forbade storing it. ``StreamLog`` (one per path and scope) holds
  the tail fact and the headers the origin sends with that scope's answers.
* **Offsets only move forward within an instance.** Each origin exchange carries a ticket taken
  when its request *started*; facts carry the ticket at which they were *received*. An answer
  whose request started after the edge learned that the stream reached offset H (or was closed
  at C) and that reports a tail before H (or no closure, or another final offset) cannot belong
  to the same instance: ``observe_tail`` says ``NEW_INSTANCE`` and the caller forgets the stream.
  An answer that merely left the origin before a newer fact arrived is older, not wrong: it is
  believed as of its time only (never as a fresh tail).
* The tail fact is *authoritative* while a live upstream follows the stream and keeps speaking,
  otherwise true only as of ``observed_at``. Closure is final within an instance.
* **A fact applies only to the instance it was derived from.** An answer names its instance by
  the content type (a stream keeps its own for life) and by offsets that never go back; what
  it says of the tail (reached, closed) is believed of the instance held only if nothing in it
  contradicts that instance (``judge_write``, ``judge_tail``). A write's answer that names no
  content type (a close without a body: ``Stream-Next-Offset`` and ``Stream-Closed`` only) may
  be another instance's that reached the same offset: its closure is kept as a mark (older
  answers that say open are not believed) but not told as the tail of the bytes held, so the
  next read asks the origin, whose answer names its instance.
* **A 404 or a 410 says the instance is gone** (``says_gone``), whatever request it answered: a
  read, a write, a DELETE, a HEAD, a live read, the edge's own probe. A 410 is a stream deleted
  while it has forks (soft-deleted: 410 to every request on it, PROTOCOL.md 4.2) or one whose
  retention ended; either way "gone", never only "this range". The one judge of what a write
  says (``judge_write``) and the one intake (``edge.log.intake.decide``) both ask it; whose
  scope forgets is ``edge.instances.forgetting.Forgetter.stream_gone``'s rule.
* Expiry: an absolute ``Stream-Expires-At`` ends service at that instant. A sliding ``Stream-TTL``
  is counted from the last time the edge touched the origin for the stream, because reads the
  edge absorbs do not extend it there (PROTOCOL-NOTES "Cacheability").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from edge.log.segment import is_json, media_type, streams_content_type

NEVER = float("-inf")
# A ticket before every exchange: facts with it are older than any answer.
BEFORE_ALL = -1


class TailVerdict(enum.Enum):
    BELIEVED = "believed"  # the tail fact now
    OLDER = "older"  # true once, not now: kept as a stale fact or ignored
    NEW_INSTANCE = "new-instance"  # impossible for the instance the edge knows: forget it


@dataclass(frozen=True, kw_only=True, slots=True)
class LogKey:
    stream: str
    scope: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Mark:
    """An offset the stream is known to have reached, and the ticket when the edge learned it."""

    offset: str
    received: int


@dataclass(kw_only=True, slots=True, eq=False)
class StreamInstance:
    stream: str
    # Opaque token naming this instance in the shared tier; "" until the tier has been asked.
    generation: str = ""
    # When what is held was last confirmed current: the shared tier named ``generation``, or,
    # while it could not say, this replica began holding the stream empty (``edge.log.trust``).
    verified_at: float = NEVER
    high: Mark | None = None
    closed_at: Mark | None = None
    ttl_seconds: float | None = None
    expires_at: float | None = None
    lifetime_known: bool = False
    last_origin_touch: float = NEVER
    # The origin said ``no-store``/``private``: every read is relayed until then.
    bypass_until: float = NEVER
    content_type: str | None = None

    def reached(self, offset: str, received: int) -> None:
        if self.high is None or offset > self.high.offset:
            self.high = Mark(offset=offset, received=received)

    def contradicts(
        self, offset: str, *, closed: bool, started: int, appended: bool = False
    ) -> bool:
        """Would an answer "tail at ``offset``, closed or not", to a request that started at
        ``started``, be impossible for this instance? ``appended``: the request appended bytes
        (a successful append moves the tail past where it was when the append started)."""
        high, closure = self.high, self.closed_at
        if closed and high is not None and offset < high.offset:
            return True  # a closed stream never grows: it cannot have reached ``high``
        if (
            high is not None
            and started > high.received
            and (offset < high.offset or (appended and offset == high.offset))
        ):
            return True
        if closure is not None and started > closure.received:
            return not closed or offset != closure.offset
        return False

    def learn_lifetime(self, ttl_seconds: float | None, expires_at: float | None) -> None:
        self.ttl_seconds, self.expires_at = ttl_seconds, expires_at
        self.lifetime_known = True

    def touched_origin(self, now: float) -> None:
        self.last_origin_touch = now

    def expired(self, now: float) -> bool:
        if self.expires_at is not None and now >= self.expires_at:
            return True
        return self.ttl_seconds is not None and now >= self.last_origin_touch + self.ttl_seconds

    def remaining_seconds(self, now: float) -> float | None:
        """How long the stream is known to live on (None: no known end)."""
        ends = []
        if self.expires_at is not None:
            ends.append(self.expires_at - now)
        if self.ttl_seconds is not None:
            ends.append(self.last_origin_touch + self.ttl_seconds - now)
        return max(0.0, min(ends)) if ends else None

    def bypassed(self, now: float) -> bool:
        return now < self.bypass_until


@dataclass(frozen=True, kw_only=True, slots=True)
class TailFact:
    offset: str
    closed: bool
    authoritative: bool
    # As of when it may be served without asking (NEVER: stale, asked again before use).
    observed_at: float
    # When the origin last said it: kept when a write makes it stale, because "open here at
    # that time" still tells a closure seen earlier apart from this instance's.
    heard_at: float = NEVER


@dataclass(frozen=True, kw_only=True, slots=True)
class TailJudgement:
    """What one origin answer's word on the tail means: the verdict, the fact the log then
    believes (None: unchanged), and the mark the instance reached (and whether it closes there)."""

    verdict: TailVerdict
    fact: TailFact | None = None
    reached: Mark | None = None
    closes: bool = False


def judge_tail(
    instance: StreamInstance,
    tail: TailFact | None,
    offset: str,
    *,
    closed: bool,
    now: float,
    started: int,
    received: int,
    authoritative: bool = False,
) -> TailJudgement:
    """An origin answer says the tail is at ``offset`` (closed or not): believe it, keep it as
    true once, or find it impossible for ``instance`` (another stream at the path). Pure."""
    if instance.contradicts(offset, closed=closed, started=started):
        return TailJudgement(verdict=TailVerdict.NEW_INSTANCE)
    if not closed and (instance.closed_at is not None or (tail is not None and tail.closed)):
        return TailJudgement(verdict=TailVerdict.OLDER)  # left before the closure the edge knows
    high = instance.high
    if high is not None and offset < high.offset and not closed:
        # Older than what the edge already knows the stream reached: true once, not now.
        if tail is None or tail.offset < offset:
            stale = TailFact(offset=offset, closed=False, authoritative=False, observed_at=NEVER)
            return TailJudgement(verdict=TailVerdict.OLDER, fact=stale)
        return TailJudgement(verdict=TailVerdict.OLDER)
    if not authoritative and tail is not None and tail.authoritative and offset < tail.offset:
        return TailJudgement(verdict=TailVerdict.OLDER)
    fact = TailFact(
        offset=offset, closed=closed, authoritative=authoritative, observed_at=now, heard_at=now
    )
    return TailJudgement(
        verdict=TailVerdict.BELIEVED, fact=fact, reached=Mark(offset=offset, received=received),
        closes=closed,
    )  # fmt: skip


def says_gone(status: int) -> bool:
    """Does an origin answer of ``status``, to any request, say the stream instance is gone (in
    the request's scope)? 404: there is no such stream. 410: there was, and it is gone (a
    soft-deleted source of forks answers 410 to ``GET``, ``HEAD``, ``POST`` and ``DELETE``).
    Forgetting on either is always safe; serving the bytes held afterwards is not. Pure."""
    return status in (404, 410)


def names_another_instance(instance: StreamInstance, content_type: str | None) -> bool:
    """Does an origin answer of ``content_type`` (a read's, a HEAD's, a PUT's; or a value a
    replica derived from one) belong to another stream at the path than ``instance``? A stream
    keeps its content type for life, parameters and all, and the origin answers with it as it
    was created; None names none."""
    known = instance.content_type
    return (
        content_type is not None
        and known is not None
        and streams_content_type(content_type) != streams_content_type(known)
    )


def writes_another_type(instance: StreamInstance, content_type: str | None) -> bool:
    """Did the origin take an append whose body is of ``content_type`` for a stream of another
    type than ``instance``? It checks an append's media type only (it takes ``text/plain`` for a
    ``text/plain; charset=utf-8`` stream), so that is all an append says."""
    known = instance.content_type
    return (
        content_type is not None
        and known is not None
        and media_type(content_type) != media_type(known)
    )


def judge_shared(
    instance: StreamInstance,
    tail: TailFact | None,
    at: str,
    *,
    content_type: str | None,
    seen_at: float,
) -> TailVerdict:
    """Another replica shares a value at offset ``at``, where the chain held ends: a segment
    starting there (the stream had gone past ``at``) or a closure there, fetched as an
    instance of ``content_type`` and seen at ``seen_at`` (its clock). The shared tier's
    generation does not change when the stream is recreated behind every replica's back, so
    the value may be another instance's that reached the same offset: of another content type
    it is (``NEW_INSTANCE``: only the origin knows which is current); if the origin said the
    tail was open at ``at`` to this replica since the value was seen, it is not this one's as
    far as the edge can tell (a tail never goes back, a closed stream never reopens; a slow
    answer or clocks apart make it a doubt only), so it is not believed (``OLDER``) and the
    origin is asked. Otherwise ``BELIEVED``. Pure."""
    if names_another_instance(instance, content_type):
        return TailVerdict.NEW_INSTANCE
    if tail is not None and not tail.closed and tail.offset == at and tail.heard_at >= seen_at:
        return TailVerdict.OLDER
    return TailVerdict.BELIEVED


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamWrite:
    """A write through the edge and the origin's answer, as values: its answer's tail
    (``Stream-Next-Offset``; None when it gave none), the ticket when it started, whether it
    appended bytes (which always moves the tail), and the content type it names: the type the
    origin checked it against (an append's body's, a PUT answer's), None for a close without
    a body, which names none. ``answered``: it is the origin's answer's (a PUT's: the stream's
    own, parameters and all), not an append's body's (whose media type alone the origin checks)."""

    floor: str | None
    started: int
    appended: bool
    content_type: str | None
    answered: bool = False
    # The origin's status: a write it refused says nothing of the tail, but a 404 or 410 says
    # the stream is gone (``says_gone``).
    status: int


@dataclass(frozen=True, kw_only=True, slots=True)
class WriteJudgement:
    """What a ``StreamWrite`` means for the instance held: ``another`` says why it went to another
    stream at the path (forget the instance first; None: the same, as far as the edge can
    tell); ``names_instance``: its closure may be told as the tail of the bytes held."""

    another: str | None
    names_instance: bool
    # The origin answered the write 404 or 410: the stream is gone (``says_gone``).
    gone: bool = False


def judge_write(instance: StreamInstance, write: StreamWrite) -> WriteJudgement:
    """The one judge of what a write through the edge says about ``instance``, whatever the
    origin answered. Pure."""
    if says_gone(write.status):
        return WriteJudgement(another=None, names_instance=False, gone=True)
    if not 200 <= write.status < 300:
        return WriteJudgement(another=None, names_instance=False)  # refused: nothing of the tail
    if instance.closed_at is not None:
        # A closed stream takes no appends (the origin answers 409) and closing it again
        # changes nothing: a write that succeeds went to another stream at the path, or did
        # nothing at all. Forgetting is always safe; serving the old instance is not.
        return WriteJudgement(another="written after its closure", names_instance=False)
    another_type = names_another_instance if write.answered else writes_another_type
    if another_type(instance, write.content_type):
        # The origin takes only bytes of the stream's own type, and a PUT's answer names it.
        return WriteJudgement(
            another=f"written as {media_type(write.content_type)}", names_instance=False
        )
    if write.floor is not None and instance.contradicts(
        write.floor, closed=False, started=write.started, appended=write.appended
    ):
        return WriteJudgement(another="written below the tail it had reached", names_instance=False)
    return WriteJudgement(
        another=None,
        names_instance=write.content_type is not None and instance.content_type is not None,
    )


@dataclass(kw_only=True, slots=True, eq=False)
class StreamLog:
    key: LogKey
    instance: StreamInstance = field(default_factory=lambda: StreamInstance(stream=""))
    # Response headers the origin sends on every answer for this stream (CORS, nosniff, ...),
    # replayed on answers the edge makes itself.
    header_template: tuple[tuple[str, str], ...] = ()
    tail: TailFact | None = None
    # Whether the local tier still keeps this log: False once it is forgotten (its stream, its
    # scope) or evicted, and what was stored from it (a pre-serialised answer) ends with it.
    kept: bool = False

    @property
    def content_type(self) -> str | None:
        """The stream's, not the scope's: it lives as long as the instance, whatever the cache
        evicts, so frames and answers never lose it mid-stream."""
        return self.instance.content_type

    @content_type.setter
    def content_type(self, value: str | None) -> None:
        if value is not None:
            self.instance.content_type = value

    @property
    def json(self) -> bool:
        return is_json(self.content_type)

    def observe_tail(
        self,
        offset: str,
        *,
        closed: bool,
        now: float,
        started: int,
        received: int,
        authoritative: bool = False,
    ) -> TailVerdict:
        """An origin answer says the tail is at ``offset`` (closed or not)."""
        judgement = judge_tail(
            self.instance, self.tail, offset, closed=closed, now=now, started=started,
            received=received, authoritative=authoritative,
        )  # fmt: skip
        self.believe(judgement)
        return judgement.verdict

    def believe(self, judgement: TailJudgement) -> None:
        """Take what ``judge_tail`` decided (about this log's instance and tail)."""
        if judgement.fact is not None:
            self.tail = judgement.fact
        reached = judgement.reached
        if reached is not None:
            self.instance.reached(reached.offset, reached.received)
            if judgement.closes and self.instance.closed_at is None:
                self.instance.closed_at = reached

    def heard_open(self, offset: str, heard_at: float) -> None:
        """Another replica heard the origin say the tail was open at ``offset`` at ``heard_at``
        (its clock): nothing to serve (stale), only what tells a shared closure seen before
        that apart from this instance's (``judge_shared``)."""
        tail = self.tail
        if tail is None:
            self.tail = TailFact(
                offset=offset, closed=False, authoritative=False, observed_at=NEVER,
                heard_at=heard_at,
            )  # fmt: skip
        elif not tail.closed and tail.offset == offset and tail.heard_at < heard_at:
            self.tail = replace(tail, heard_at=heard_at)

    def followed_from(self, offset: str) -> None:
        """A live tail goes on from ``offset`` into this log, begun in place of one whose
        knowledge was forgotten (``edge.log.trust``): nothing to serve (stale), only where the
        readers following it wait rather than ask the origin for a gap."""
        if self.tail is None:
            self.tail = TailFact(
                offset=offset, closed=False, authoritative=False, observed_at=NEVER
            )

    def lose_authority(self, now: float) -> None:
        if self.tail is not None and self.tail.authoritative:
            self.tail = replace(self.tail, authoritative=False, observed_at=now)

    def mark_stale(self) -> None:
        if self.tail is not None and not self.tail.closed:
            self.tail = replace(self.tail, observed_at=NEVER, authoritative=False)

    def expired(self, now: float) -> bool:
        return self.instance.expired(now)

    def tail_trusted(
        self, now: float, freshness_seconds: float, authority_seconds: float = float("inf")
    ) -> bool:
        """May an at-tail answer be given from what the edge knows, without asking the origin?
        A live upstream's word holds while it keeps speaking: origins answer a live read at
        least every long-poll timeout (data, or a keep-alive control), so one silent for longer
        than ``authority_seconds`` may be following a stream that is gone (the reference origin
        keeps an SSE answer open, silent, after the stream is deleted)."""
        tail = self.tail
        if tail is None:
            return False
        instance = self.instance
        if (
            instance.ttl_seconds is not None
            and now >= instance.last_origin_touch + instance.ttl_seconds / 2
        ):
            # Touch the origin well before its sliding TTL would end the stream under viewers.
            return False
        age = now - tail.observed_at
        if tail.closed:
            return True
        return age < freshness_seconds or (tail.authoritative and age < authority_seconds)
