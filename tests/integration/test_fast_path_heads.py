"""Heads the hit path and the full path could read differently, against the real origin and two
real edges (``--fast-path on`` and ``off``): a head the full path refuses is refused on the hit
path too, and a credential's bytes name the scope the full path names, never another reader's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from devstack.processes import Edge, Origin
from tests.integration.test_fast_path import (
    edge_pair,
    exchange,
    fast_answers,
    make_stream,
    stored_hit,
)

ONE = ("--workers", "1")  # what one process stored is read on fresh connections


@pytest.fixture(scope="module")
def edges(origin: Origin, logs_dir: Path) -> Iterator[tuple[Edge, Edge]]:
    with edge_pair(origin, logs_dir, "heads", *ONE) as pair:
        yield pair


def head_of(target: str, *lines: bytes) -> bytes:
    return b"\r\n".join([f"GET {target} HTTP/1.1".encode(), b"Host: edge.test", *lines, b"", b""])


async def owners_answer_is_stored(edge: Edge, owner: bytes) -> None:
    """Read until the answer is immutable and a local hit (then it is stored), once more."""
    for _ in range(50):
        seen = (await exchange(edge.url, owner, ["GET"]))[0]
        control = seen.header(b"Cache-Control") or b""
        if control.endswith(b"immutable") and seen.header(b"Cache-Status") == b"edge; hit":
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the owner's answer was never stored")


async def test_a_credentials_bytes_never_name_another_readers_scope(
    http: aiohttp.ClientSession, origin: Origin, edges: tuple[Edge, Edge], stream_path: str
) -> None:
    """The UTF-8 bytes of ``s=Ã©`` are one reader's cookie; the UTF-8 bytes of ``s=é``
    another's. Read as Latin-1, the second would name the first one's scope, and the hit path
    would give it the first reader's stored answer without the origin ever seeing that cookie."""
    fast, full = edges
    await make_stream(http, origin.url + stream_path, "text/plain", b"for one reader", close=True)
    target = f"{stream_path}?offset=-1"
    owner = head_of(target, b"Cookie: s=\xc3\x83\xc2\xa9")
    other = head_of(target, b"Cookie: s=\xc3\xa9")
    for edge in (fast, full):
        await owners_answer_is_stored(edge, owner)
    before = fast_answers(fast)
    want = (await exchange(full.url, other, ["GET"]))[0]
    got = (await exchange(fast.url, other, ["GET"]))[0]
    assert fast_answers(fast) == before, "another cookie was answered from the owner's scope"
    assert got.header(b"Cache-Status") == want.header(b"Cache-Status")
    assert got.header(b"Cache-Status") != b"edge; hit"


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param([b"X-Pad: " + b"a" * 9000], id="a-field-past-8190-bytes"),
        pytest.param([b"X%d: b" % i for i in range(128)], id="129-fields"),
        pytest.param([b"Sec-WebSocket-Key1: x"], id="Sec-WebSocket-Key1"),
    ],
)
async def test_a_head_the_full_path_refuses_is_refused_on_the_hit_path(
    http: aiohttp.ClientSession,
    origin: Origin,
    edges: tuple[Edge, Edge],
    stream_path: str,
    extra: list[bytes],
) -> None:
    fast, full = edges
    await make_stream(http, origin.url + stream_path, "text/plain", b"stored", close=True)
    target = f"{stream_path}?offset=-1"
    await stored_hit(fast, target)
    before = fast_answers(fast)
    payload = head_of(target, *extra)
    want = (await exchange(full.url, payload, ["GET"]))[0]
    got = (await exchange(fast.url, payload, ["GET"]))[0]
    assert want.status_line == b"HTTP/1.0 400 Bad Request"
    assert got.comparable() == want.comparable()
    assert fast_answers(fast) == before
