"""Attacks on a catch-up herd that the connection answers after the tail moved
(``FastCatchup._answer`` asks the fast path again before building): heads of every kind of
reader meet in one pass of the edge's loop (the edge is stopped while they are sent), each
followed on its connection by another request, and every answer must be the one the full path
(``--fast-path off``) gives that same request, byte for byte but for ``Date`` and ``Age``'s
value: no reader is given another representation's, scope's, ``Origin``'s or conditional's
answer, a reader that asked to close is closed after its answer, and what it pipelined after
the herd head is answered after it, in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin
from tests.auth_support import hs_key, jwks, token
from tests.integration.own_reads_support import (
    CORS_ORIGIN,
    Raw,
    append,
    edge_pair,
    exchange,
    fast_path_answers,
    host_port,
    make_stream,
    read_answers,
    request,
    sent_while_stopped,
    sse,
)

ARGS = ("--workers", "1")
PER_VARIANT = 6
# Each kind of reader of a herd: its bytes, the methods answered, whether it then closes.
Kinds = dict[str, tuple[bytes, list[str], bool]]


@pytest.fixture(scope="module")
def edges(origin: Origin, logs_dir: Path) -> Iterator[tuple[Edge, Edge]]:
    with edge_pair(origin, logs_dir, "herd-attacks", *ARGS) as pair:
        yield pair


def variants(path: str, etag: str, stale_etag: str) -> dict[str, tuple[bytes, list[str], bool]]:
    """Each kind of reader: its bytes (the herd head, then a pipelined request unless it
    closes), the methods answered, and whether the connection must end after its answer."""
    target = f"{path}?offset=-1"
    follow = request(path, method="HEAD")
    return {
        "plain": (request(target) + follow, ["GET", "HEAD"], False),
        "gzip": (request(target, "Accept-Encoding: gzip") + follow, ["GET", "HEAD"], False),
        "identity": (
            request(target, "Accept-Encoding: gzip;q=0, identity") + follow,
            ["GET", "HEAD"],
            False,
        ),
        "current-etag": (
            request(target, f"If-None-Match: {etag}") + follow,
            ["GET", "HEAD"],
            False,
        ),
        "stale-etag": (
            request(target, f"If-None-Match: {stale_etag}") + follow,
            ["GET", "HEAD"],
            False,
        ),
        "gzip-current-etag": (
            request(target, "Accept-Encoding: gzip", f"If-None-Match: {etag}") + follow,
            ["GET", "HEAD"],
            False,
        ),
        "cors": (request(target, CORS_ORIGIN) + follow, ["GET", "HEAD"], False),
        "credential": (
            request(target, "Authorization: Bearer herd-1") + follow,
            ["GET", "HEAD"],
            False,
        ),
        "other-credential": (
            request(target, "Authorization: Bearer herd-2") + follow,
            ["GET", "HEAD"],
            False,
        ),
        # Closes after its answer (nothing pipelined after it: aiohttp, the full path, answers
        # a request followed by bytes after its ``Connection: close`` with a 400).
        "close": (request(target, "Connection: close"), ["GET"], True),
        "http1.0": (f"GET {target} HTTP/1.0\r\nHost: edge.test\r\n\r\n".encode(), ["GET"], True),
        "gzip-close": (
            request(target, "Accept-Encoding: gzip", "Connection: close"),
            ["GET"],
            True,
        ),
    }


async def answered_then_closed(
    reader: asyncio.StreamReader, methods: list[str], closes: bool
) -> list[tuple[bytes, list[tuple[bytes, bytes]], bytes]]:
    answers = await read_answers(reader, methods)
    if closes:
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the edge closed it
    return [comparable(a) for a in answers]


def comparable(answer: Raw) -> tuple[bytes, list[tuple[bytes, bytes]], bytes]:
    """``Raw.comparable``, and ``Cache-Status`` but for how the edge got it (a herd's readers
    that joined the first one's fill say ``collapsed``, as on the full path)."""
    status, headers, body = answer.comparable()
    return status, [(n, v.split(b";")[0] if n == b"Cache-Status" else v) for n, v in headers], body


async def etag_of(edge: Edge, probe: bytes) -> str:
    """The ETag of ``probe``'s answer (the stream's bytes from the start) at ``edge``."""
    answer = (await exchange(edge.url, probe, ["GET"]))[0]
    etag = answer.header(b"ETag")
    assert etag is not None
    return etag.decode()


async def herd_after_the_tail_moved(
    http: aiohttp.ClientSession,
    edges: tuple[Edge, Edge],
    url: str,
    kinds_of: Callable[[str, str], Kinds],
    probe: bytes,
    viewer_head: bytes,
    rounds: int,
) -> None:
    """``rounds`` herds of every kind (``kinds_of(current_etag, stale_etag)``), each just after
    an append moved the tail: each answer is the full path's to the same request. ``probe``
    reads the stream's ETag from the start; ``viewer_head`` opens the SSE viewer that keeps
    the fast edge's tail running."""
    fast, full = edges
    stale = await etag_of(full, probe)
    for round_ in range(rounds):
        # An SSE viewer keeps the fast edge's tail of the stream running: an append reaches its
        # log without a fill, and the stored at-tail answers no longer hold.
        viewer = asyncio.ensure_future(exchange(fast.url, viewer_head, ["GET"]))
        current = await etag_of(full, probe)
        # Every kind read once, so that each has an answer stored that the append outdates
        # (on both edges: each then knows the same of each scope's log).
        for payload, methods, _ in kinds_of(current, stale).values():
            for edge in edges:
                await exchange(edge.url, payload, methods)
        await asyncio.sleep(0.3)
        await append(http, url, b"b%d" % round_)
        # Past the full edge's --tail-freshness (1 s): its answers are of the moved tail too.
        await asyncio.sleep(1.2)
        stale, current = current, await etag_of(full, probe)
        kinds = kinds_of(current, stale)
        herd = [(name, kind) for name, kind in kinds.items() for _ in range(PER_VARIANT)]
        opened = [await asyncio.open_connection(*host_port(fast.url)) for _ in herd]
        built = fast_path_answers(fast)
        sends = [
            (writer, payload)
            for (_, (payload, _, _)), (_, writer) in zip(herd, opened, strict=True)
        ]
        await sent_while_stopped(fast, sends)
        got = await asyncio.wait_for(
            asyncio.gather(
                *(
                    answered_then_closed(reader, methods, closes)
                    for (_, (_, methods, closes)), (reader, _) in zip(herd, opened, strict=True)
                )
            ),
            30,
        )
        for _, writer in opened:
            writer.close()
        viewer.cancel()
        hits = fast_path_answers(fast) - built
        # The full path's answer to each kind, asked now (the same tail, the same interval).
        expected = {
            name: [comparable(a) for a in await exchange(full.url, payload, methods)]
            for name, (payload, methods, _) in kinds.items()
        }
        for (name, _), answers in zip(herd, got, strict=True):
            assert answers == expected[name], (round_, name)
        # Most of the herd were hits of an answer stored by the first of its kind (without
        # asking the fast path again, 12 of 72 were).
        assert hits >= len(herd) / 2, (round_, hits)


@pytest.mark.parametrize("size", [3, 100 * 1024], ids=["small", "two-parts"])
async def test_a_mixed_herd_after_the_tail_moved_gets_the_full_paths_answers(
    http: aiohttp.ClientSession,
    origin: Origin,
    edges: tuple[Edge, Edge],
    stream_path: str,
    size: int,
) -> None:
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"x" * size, close=False)

    def kinds_of(etag: str, stale: str) -> Kinds:
        return variants(stream_path, etag, stale)

    probe = request(f"{stream_path}?offset=-1")
    viewer = sse(stream_path, "-1")
    await herd_after_the_tail_moved(http, edges, url, kinds_of, probe, viewer, rounds=2)


HS = hs_key("hs-herd")


@pytest.fixture(scope="module")
def jwt_edges(
    origin: Origin, logs_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Edge, Edge]]:
    keys = tmp_path_factory.mktemp("jwks-herd") / "jwks.json"
    keys.write_bytes(jwks(HS))
    args = ("--auth", "jwt", "--jwt-jwks", str(keys), *ARGS)
    args += ("--origin-header", "Authorization: Bearer edge-secret")
    with edge_pair(origin, logs_dir, "herd-jwt", *args) as pair:
        yield pair


async def test_a_gated_herd_of_different_credentials_gets_each_its_own_answer(
    http: aiohttp.ClientSession,
    origin: Origin,
    jwt_edges: tuple[Edge, Edge],
    stream_path: str,
) -> None:
    """Tokens of different readers and grants (a stream, a prefix; header or query), and
    representations, in one herd: each is answered as the full path answers it."""
    url = origin.url + stream_path
    await make_stream(http, url, "text/plain", b"x" * 20_000, close=False)
    readers = {
        "alice": f"Authorization: Bearer {token(HS, stream_path, sub='alice')}",
        "bob": f"Authorization: Bearer {token(HS, stream_path, sub='bob')}",
        "prefix": f"Authorization: Bearer {token(HS, '/v1/stream/', sub='carol')}",
    }
    query = token(HS, stream_path, sub="dave")

    def kinds_of(etag: str, stale: str) -> Kinds:
        target = f"{stream_path}?offset=-1"
        kinds: Kinds = {}
        for name, credential in readers.items():
            kinds[name] = (request(target, credential), ["GET"], False)
            kinds[name + "-gzip"] = (
                request(target, credential, "Accept-Encoding: gzip"),
                ["GET"],
                False,
            )
            kinds[name + "-etag"] = (
                request(target, credential, f"If-None-Match: {etag}"),
                ["GET"],
                False,
            )
            kinds[name + "-close"] = (
                request(target, credential, "Connection: close"),
                ["GET"],
                True,
            )
        kinds["query"] = (request(f"{target}&token={query}"), ["GET"], False)
        kinds["none"] = (request(target), ["GET"], False)  # refused, whoever else is let in
        return kinds

    probe = request(f"{stream_path}?offset=-1", readers["alice"])
    viewer = sse(stream_path, "-1", readers["alice"])
    await herd_after_the_tail_moved(http, jwt_edges, url, kinds_of, probe, viewer, rounds=2)
