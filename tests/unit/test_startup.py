"""What a serving process does to its heap once it is set up (``edge.startup.settle_heap``)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import gc
from edge.startup import GC_OLD_THRESHOLD, settle_heap
before = gc.get_threshold()
settle_heap()
after = gc.get_threshold()
assert after == (before[0], before[1], GC_OLD_THRESHOLD), (before, after)
assert gc.get_freeze_count() > 1000, gc.get_freeze_count()
cycle = []
cycle.append(cycle)
del cycle
assert gc.collect() >= 1  # garbage made after start-up is still collected
"""


def test_settling_freezes_start_up_and_raises_only_the_old_threshold() -> None:
    # In a process of its own: freezing is for the whole interpreter.
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
