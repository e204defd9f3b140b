"""``python -m loadtest.gcwatch OUT serve ...``: ``edge serve ...`` with its cyclic collections
timed, for ``loadtest.join --gc-pauses``.

Rules this module owns:
* Every collection is timed by a ``gc.callbacks`` hook (its generation, the pause from its
  start to its end); nothing else about the edge changes.
* On SIGUSR1 the totals since the last SIGUSR1 are appended to OUT as one JSON line, then reset:
  ``{"objects": n, "0": [collections, total_ms, max_ms], "1": [...], "2": [...]}``, where
  ``objects`` counts what the collector tracks outside the permanent generation.
* Only the process it starts is watched: with ``--workers N`` (N > 1) that is the supervisor,
  and the workers' collections are not seen.
"""

from __future__ import annotations

import gc
import json
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

_totals: dict[int, list[float]] = {0: [0, 0.0, 0.0], 1: [0, 0.0, 0.0], 2: [0, 0.0, 0.0]}
_started = [0.0]


def _timed(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    pause = time.perf_counter() - _started[0]
    total = _totals[info["generation"]]
    total[0] += 1
    total[1] += pause
    total[2] = max(total[2], pause)


def _report(out: Path) -> None:
    line: dict[str, Any] = {"objects": len(gc.get_objects())}
    for generation, (count, pause, longest) in _totals.items():
        line[str(generation)] = [int(count), round(1000 * pause, 2), round(1000 * longest, 2)]
        _totals[generation] = [0, 0.0, 0.0]
    with out.open("a") as sink:
        sink.write(json.dumps(line) + "\n")


def main() -> int:
    out = Path(sys.argv[1])

    def on_signal(signum: int, frame: FrameType | None) -> None:
        _report(out)

    gc.callbacks.append(_timed)
    signal.signal(signal.SIGUSR1, on_signal)
    from edge.cli import main as edge_main

    return edge_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
