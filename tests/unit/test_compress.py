"""Compress once: a representation is made once, kept in the budget, and made off the loop
when it is large."""

from __future__ import annotations

import asyncio
import gzip
import random

from edge.log.stream_log import LogKey
from edge.store.local import OFF_LOOP_BYTES, Compressor, LocalTier

KEY = LogKey(stream="/v1/stream/z", scope="public")


async def test_each_representation_is_compressed_once_and_reused() -> None:
    local = LocalTier(1 << 30)
    compressor = Compressor(local)
    body = b"token " * 1000
    first = await compressor.gzip(KEY, local.instance_for(KEY.stream), ("-1", "e1", "digest"), body)
    again = await compressor.gzip(KEY, local.instance_for(KEY.stream), ("-1", "e1", "digest"), body)
    assert gzip.decompress(first) == body
    assert again == first
    assert compressor.made == 1
    assert local.usage()["derived"][1] == 1
    # Concurrent askers of another representation share one compression.
    others = await asyncio.gather(
        *(
            compressor.gzip(KEY, local.instance_for(KEY.stream), ("-1", "e2", "other"), body + b"!")
            for _ in range(20)
        )
    )
    assert len(set(others)) == 1
    assert compressor.made == 2
    # Forgotten with the stream, and made again afterwards.
    local.forget(KEY.stream)
    await compressor.gzip(KEY, local.instance_for(KEY.stream), ("-1", "e1", "digest"), body)
    assert compressor.made == 3


async def test_a_large_body_is_compressed_off_the_event_loop() -> None:
    local = LocalTier(1 << 30)
    compressor = Compressor(local)
    rng = random.Random(7)
    body = bytes(rng.getrandbits(8) for _ in range(OFF_LOOP_BYTES)) * 8
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    running = asyncio.create_task(ticker())
    compressed = await compressor.gzip(KEY, local.instance_for(KEY.stream), ("big",), body)
    ticks_during = ticks
    done = True
    await running
    assert gzip.decompress(compressed) == body
    # On the loop, the ticker would get two or three turns; off it, one per loop iteration.
    assert ticks_during > 20


async def test_a_body_compressed_while_its_stream_was_forgotten_is_not_kept_for_the_new_one() -> (
    None
):
    local = LocalTier(1 << 30)
    compressor = Compressor(local)
    old = local.instance_for(KEY.stream)
    rng = random.Random(3)
    body = bytes(rng.getrandbits(8) for _ in range(OFF_LOOP_BYTES)) * 2  # made in a thread
    making = asyncio.create_task(compressor.gzip(KEY, old, ("-1", "e1", "digest"), body))
    await asyncio.sleep(0)
    local.forget(KEY.stream)  # deleted and recreated while the thread works
    new = local.instance_for(KEY.stream)
    assert gzip.decompress(await making) == body  # its own reader still gets it
    assert local.derived(KEY, ("gzip", ("-1", "e1", "digest"))) is None
    assert local.usage()["derived"][1] == 0
    assert local.current(new)
