"""Giving freed memory back to the operating system.

Bodies of origin answers pass through the edge as many 64 KiB chunks (cache fills, relays of
large answers). CPython frees them, but glibc keeps the pages of a fragmented heap: 100 reads of
40 MB messages once left an edge at 1.5 GB RSS while it held 40 MB. Fills now grow one buffer
(one mapping, returned whole); what fragmentation is left is returned here: while transfers pass,
the edge asks glibc to return free pages (``malloc_trim``, which also releases free pages inside
the heap) at most once per ``INTERVAL_SECONDS``, and once more ``TRAILING_SECONDS`` after the
last of them, when their buffers are gone too. Elsewhere than glibc this is a no-op.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable

MiB = 1024 * 1024
# Trim when this much passed through since the last trim ...
TRIM_AFTER_BYTES = 1 * MiB
# ... at most this often ...
INTERVAL_SECONDS = 1.0
# ... and once more this long after the last transfer.
TRAILING_SECONDS = 3.0


def _glibc_trim() -> Callable[[], object] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


class Trimmer:
    def __init__(self, trim: Callable[[], object] | None = None) -> None:
        self._trim = trim if trim is not None else _glibc_trim()
        self._passed = 0
        self._quiet_ticks = 0
        self._task: asyncio.Task[None] | None = None
        self.trims = 0

    def passed(self, size: int) -> None:
        """``size`` bytes of transient buffers passed through (and are being released)."""
        self._passed += size
        if self._trim is None or self._passed < TRIM_AFTER_BYTES:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no running loop: nothing to schedule
        task = self._task
        if task is None or task.done() or task.get_loop() is not loop:
            self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        try:
            while True:
                await asyncio.sleep(INTERVAL_SECONDS)
                if self._passed >= TRIM_AFTER_BYTES:
                    self._passed, self._quiet_ticks = 0, 0
                    await self._do_trim()
                    continue
                self._quiet_ticks += 1
                if self._quiet_ticks * INTERVAL_SECONDS >= TRAILING_SECONDS:
                    await self._do_trim()
                    return
        finally:
            if self._task is asyncio.current_task():
                self._task = None

    async def _do_trim(self) -> None:
        if self._trim is not None:
            # Off the event loop: walking a large heap takes milliseconds.
            await asyncio.get_running_loop().run_in_executor(None, self._trim)
            self.trims += 1


# One per process: the heap is the process's.
TRIMMER = Trimmer()
