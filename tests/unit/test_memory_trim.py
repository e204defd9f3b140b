"""The trimmer returns freed memory after transfers, off the event loop, and survives its loop."""

from __future__ import annotations

import asyncio

from edge import memory
from edge.memory import Trimmer


def test_small_trickles_never_trim_and_large_transfers_do() -> None:
    calls: list[int] = []
    trimmer = Trimmer(trim=lambda: calls.append(1))

    async def scenario() -> None:
        trimmer.passed(1000)  # below the threshold: nothing scheduled
        await asyncio.sleep(0)
        assert trimmer._task is None
        trimmer.passed(memory.TRIM_AFTER_BYTES)
        assert trimmer._task is not None
        await asyncio.wait_for(trimmer._task, timeout=10)

    original = (memory.INTERVAL_SECONDS, memory.TRAILING_SECONDS)
    memory.INTERVAL_SECONDS, memory.TRAILING_SECONDS = 0.01, 0.03
    try:
        asyncio.run(scenario())
    finally:
        memory.INTERVAL_SECONDS, memory.TRAILING_SECONDS = original
    # once for the transfer, once more after it went quiet
    assert len(calls) == 2
    assert trimmer.trims == 2


def test_a_task_left_on_a_closed_loop_does_not_stop_trimming() -> None:
    calls: list[int] = []
    trimmer = Trimmer(trim=lambda: calls.append(1))
    dead = asyncio.new_event_loop()

    async def start() -> None:
        trimmer.passed(memory.TRIM_AFTER_BYTES)

    dead.run_until_complete(start())
    left = trimmer._task
    assert left is not None
    left.cancel()  # the loop goes away with it (as a test's private loop does)
    dead.run_until_complete(asyncio.sleep(0))
    dead.close()

    async def again() -> None:
        trimmer.passed(memory.TRIM_AFTER_BYTES)
        assert trimmer._task is not None
        assert trimmer._task.get_loop() is asyncio.get_running_loop()
        trimmer._task.cancel()

    asyncio.run(again())
