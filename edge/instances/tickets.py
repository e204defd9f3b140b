"""The order of origin exchanges on this replica.

Rules this module owns:

* A ticket is taken when a request to the origin starts and when its answer arrives; tickets
  only grow, so an answer that started before another's arrival is known to be older
  (``edge.log.stream_log``'s marks compare them).
"""

from __future__ import annotations

import itertools


class Tickets:
    def __init__(self) -> None:
        self._next = itertools.count()

    def ticket(self) -> int:
        """Orders origin exchanges: taken when a request starts and when its answer arrives."""
        return next(self._next)
