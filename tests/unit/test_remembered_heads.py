"""The hit path's heads met before (``FastPath.hit``): a raw head whose answer was an immutable
stored hit is answered again from memory, byte for byte what ``answer`` gives for it, counted
as ``answer`` counts, and never once the tier lets its entry go, a newer answer replaces it,
the origin's CORS changes, or its instance stops being what the full path would serve.

The real ``FastPath`` over the real ``LocalTier`` and ``OriginCors``; the clock is a value."""

from __future__ import annotations

from edge.config import Address, Settings
from edge.log.stream_log import LogKey
from edge.protocol.answer_key import AnswerKey, answer_key
from edge.protocol.http1 import RequestHead
from edge.store.local import LocalTier, StoredHit
from edge.web.fastpath import JOIN_BELOW_BYTES, REMEMBERED_BYTES, REMEMBERED_HEADS, FastPath
from edge.web.proxy import OriginCors

STREAM = "/v1/stream/remembered"
TARGET = f"{STREAM}?offset=-1"
BODY = b"x" * 100
CORS = [("Access-Control-Allow-Origin", "*")]
OK = b'HTTP/1.1 200 OK\r\nETag: "t"\r\nContent-Length: 100\r\n'
NOT_MODIFIED = b'HTTP/1.1 304 Not Modified\r\nETag: "t"\r\n'


def raw(*headers: str, target: str = TARGET, method: str = "GET") -> bytes:
    return "\r\n".join(
        [f"{method} {target} HTTP/1.1", "Host: edge.test", *headers, "", ""]
    ).encode()


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.25

    def __call__(self) -> float:
        return self.now


class Stand:
    """A fast path over a tier holding one immutable answer to ``TARGET`` (and its HEAD's)."""

    def __init__(self, cache_bytes: int = 1 << 30) -> None:
        settings = Settings(
            origin="http://origin.invalid",
            listen=Address.parse("127.0.0.1:0"),
            admin_listen=Address.parse("127.0.0.1:0"),
        )
        self.clock = Clock()
        self.local = LocalTier(cache_bytes)
        self.cors = OriginCors()
        self.cors.remember(None, CORS)
        self.fast = FastPath(settings, self.local, self.cors, clock=self.clock)
        self.store(BODY)

    def key(self, *, head: bool = False) -> AnswerKey:
        key = answer_key(STREAM, "offset=-1", "public", None, None, False, head)
        assert key is not None
        return key

    def store(self, body: bytes, *, head: bool = False, **extra: object) -> StoredHit:
        hit = StoredHit(
            instance=self.local.instance_for(STREAM), etag='"t"', ok=OK,
            not_modified=NOT_MODIFIED, body=b"" if head else body,
            cors=self.cors.for_request(None) or (),
            log=self.local.log_for(LogKey(stream=STREAM, scope="public")),
            **extra,  # type: ignore[arg-type]
        )  # fmt: skip
        assert self.local.put_response(self.key(head=head), hit)
        return hit

    def answer(self, head: bytes) -> bytes | None:
        """What the connection writes for ``head`` when it has not met it (and remembers)."""
        parsed = self.fast.parse(head, self.fast.parser())
        assert isinstance(parsed, RequestHead)
        parts = self.fast.answer(parsed, None, head)
        return None if parts is None else b"".join(parts)

    def counts(self) -> tuple[int, int, int, int]:
        fast = self.fast
        return fast.ok, fast.not_modified, fast.heads, fast.served_bytes


def test_a_head_met_before_is_answered_as_answer_answers_it_and_counted_alike() -> None:
    stand = Stand()
    for head, status in (
        (raw(), (1, 0, 0, 100)),
        (raw('If-None-Match: "t"'), (0, 1, 0, 0)),
        (raw(method="HEAD"), (0, 0, 1, 0)),
    ):
        if status[2]:
            stand.store(BODY, head=True)
        assert stand.fast.hit(head) is None  # never met
        first = stand.answer(head)
        assert first is not None
        before = stand.counts()
        assert stand.fast.hit(head) == first
        assert stand.fast.hit(head) == first
        after = stand.counts()
        assert tuple(a - b for a, b in zip(after, before, strict=True)) == tuple(
            2 * n for n in status
        )
        # The next second's answer carries that second's Date, as ``answer``'s would.
        stand.clock.now += 1
        again = stand.fast.hit(head)
        assert again is not None
        assert again != first
        stand.fast._remembered.clear()
        assert stand.answer(head) == again


def test_its_answer_ends_when_the_tier_lets_its_entry_go() -> None:
    stand = Stand()
    head = raw()
    assert stand.answer(head) is not None
    assert stand.fast.hit(head) is not None
    stand.local.forget(STREAM)  # a DELETE, a purge, a 404
    assert stand.fast.hit(head) is None
    assert stand.answer(head) is None


def test_a_newer_answer_under_its_key_replaces_it_at_once() -> None:
    stand = Stand()
    head = raw()
    assert stand.answer(head) is not None
    stand.store(b"y" * 100)
    assert stand.fast.hit(head) is None
    newer = stand.answer(head)
    assert newer is not None
    assert newer.endswith(b"y" * 100)
    assert stand.fast.hit(head) == newer


def test_its_answer_ends_with_the_cors_headers_it_was_built_with() -> None:
    stand = Stand()
    head = raw()
    assert stand.answer(head) is not None
    stand.cors.remember(None, [("Access-Control-Allow-Origin", "https://app.test")])
    assert stand.fast.hit(head) is None
    assert stand.answer(head) is None  # the full path answers, and stores again


def test_its_answer_ends_when_its_instance_says_otherwise() -> None:
    stand = Stand()
    head = raw()
    instance = stand.local.instance_for(STREAM)
    for change in ({"expires_at": 5.0}, {"ttl_seconds": 60.0}, {"bypass_until": 2e6}):
        assert stand.answer(head) is not None
        assert stand.fast.hit(head) is not None
        saved = {name: getattr(instance, name) for name in change}
        for name, value in change.items():
            setattr(instance, name, value)
        assert stand.fast.hit(head) is None, change
        for name, value in saved.items():
            setattr(instance, name, value)


def test_a_close_is_not_remembered_and_the_book_is_bounded_by_heads_and_bytes() -> None:
    stand = Stand()
    close = raw("Connection: close")
    assert stand.answer(close) is not None
    assert stand.fast.hit(close) is None  # its connection ends: the connection's to do
    for n in range(REMEMBERED_HEADS + 5):
        assert stand.answer(raw(f"X-N: {n}")) is not None
    book = stand.fast._remembered
    assert len(book) <= REMEMBERED_HEADS
    held = sum(len(raw) + len(r.data) + len(r.tail) for raw, r in book.items())
    assert stand.fast._remembered_bytes == held <= REMEMBERED_BYTES
    # Bodies near the largest remembered fill the book by bytes before they fill it by heads.
    stand.store(b"z" * JOIN_BELOW_BYTES)
    for n in range(REMEMBERED_BYTES // JOIN_BELOW_BYTES + 5):
        assert stand.answer(raw(f"X-M: {n}")) is not None
    held = sum(len(raw) + len(r.data) + len(r.tail) for raw, r in book.items())
    assert stand.fast._remembered_bytes == held <= REMEMBERED_BYTES
    assert len(book) < REMEMBERED_BYTES // JOIN_BELOW_BYTES
