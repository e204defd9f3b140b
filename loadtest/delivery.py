"""Delivery accounting for ``loadtest.audience``: which answer brought each append to a viewer,
how long after its send, and whether the viewer got every byte once, in order. No I/O.

Rules this module owns:
* An append is known by its send time and the stream position just past its last byte
  (``Append.end``: bytes from the viewers' starting offset), found in the stream's final content
  as the origin holds it (``appends_in``): appends sent before the previous one was answered
  may land in another order, and the stream's order is the one viewers must see. Every
  append's bytes are distinct (they carry a sequence number), so each is found once or missing.
  A viewer's answer with bytes is known by its receipt time and the viewer's byte count once it
  was in (``Receipt.total``).
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


class AppendMissing(ValueError):
    """An append the origin answered is not in the stream's final content."""


def appends_in(content: bytes, sent: Sequence[tuple[float, bytes]]) -> list[Append]:
    """The appends ``sent`` (send time, bytes), by where they ended up in ``content``, in stream
    order."""
    appends = []
    for sent_at, data in sent:
        at = content.find(data)
        if at == -1:
            raise AppendMissing(f"{data[:20]!r}... is not in the stream")
        appends.append(Append(sent_at=sent_at, end=at + len(data)))
    return sorted(appends, key=lambda a: a.end)


def deliveries(appends: Sequence[Append], receipts: Sequence[Receipt]) -> list[float]:
    """Each append's delivery time to one viewer (seconds; ``math.inf``: never delivered);
    ``appends`` in stream order, ``receipts`` as the viewer got them."""
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
