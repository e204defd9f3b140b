"""Delivery accounting for ``loadtest.audience``: which answer brought each append to a viewer,
how long after its send, and whether the viewer got every byte once, in order. No I/O.

Rules this module owns:
* An append is known by its send time and the stream position just past its last byte
  (``Append.end``: bytes from the viewers' starting offset); a viewer's answer with bytes by its
  receipt time and the viewer's byte count once it was in (``Receipt.total``).
* An append is delivered to a viewer by the first answer whose total reaches the append's end:
  its delivery time is that answer's receipt minus the append's send. An append no answer
  reached is never delivered (``math.inf``), and counts as such in the percentiles.
* A viewer is exact when it saw the stream's end and its bytes, in the order received, are the
  stream's: the same length and the same SHA-256 as every append joined in order (so no byte
  missed, repeated or out of place), and no answer of it was an error.
* A percentile is the nearest rank (``ceil(share * n)``-th smallest); of nothing it is NaN.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Append:
    sent_at: float  # time.monotonic() just before the POST went out
    end: int  # stream bytes (from the viewers' start) once this append is in


@dataclass(frozen=True, kw_only=True)
class Receipt:
    at: float  # time.monotonic() when the answer's last byte was parsed
    total: int  # the viewer's bytes received so far, this answer's included


@dataclass(frozen=True, kw_only=True)
class Expected:
    """What every viewer should have received: the stream's bytes, by length and digest."""

    length: int
    sha256: str

    @classmethod
    def of(cls, chunks: Iterable[bytes]) -> Expected:
        digest = hashlib.sha256()
        length = 0
        for chunk in chunks:
            digest.update(chunk)
            length += len(chunk)
        return cls(length=length, sha256=digest.hexdigest())


def appends_of(sent_at: Sequence[float], sizes: Sequence[int]) -> list[Append]:
    """The appends in order, from their send times and byte sizes."""
    ends, total = [], 0
    for size in sizes:
        total += size
        ends.append(total)
    return [Append(sent_at=t, end=end) for t, end in zip(sent_at, ends, strict=True)]


def deliveries(appends: Sequence[Append], receipts: Sequence[Receipt]) -> list[float]:
    """Each append's delivery time to one viewer (seconds; ``math.inf``: never delivered)."""
    times: list[float] = []
    index = 0
    for append in appends:
        while index < len(receipts) and receipts[index].total < append.end:
            index += 1
        times.append(receipts[index].at - append.sent_at if index < len(receipts) else math.inf)
    return times


def is_exact(*, length: int, sha256: str, ended: bool, errors: int, expected: Expected) -> bool:
    return ended and errors == 0 and length == expected.length and sha256 == expected.sha256


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile of ``values`` (sorted here), NaN when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(len(ordered) * share) - 1))]
