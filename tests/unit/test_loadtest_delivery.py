"""``loadtest.audience``'s accounting (``loadtest.delivery``): which answer delivered each
append to a viewer and when, and whether a viewer got every byte once, in order."""

from __future__ import annotations

import hashlib
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadtest.delivery import (
    Append,
    AppendMissing,
    Expected,
    Receipt,
    appends_in,
    deliveries,
    is_exact,
    percentile,
)

LINES = [b"0000000 alpha\n", b"0000001 beta\n", b"0000002 gamma\n", b"0000003 delta\n"]


def appends_of(sent_at: list[float], sizes: list[int]) -> list[Append]:
    """Appends that landed in the order they were sent."""
    chunks = [bytes([65 + i]) * size for i, size in enumerate(sizes)]
    return appends_in(b"".join(chunks), list(zip(sent_at, chunks, strict=True)))


def test_appends_end_where_the_stream_has_taken_their_bytes() -> None:
    appends = appends_of([1.0, 1.05, 1.10], [14, 13, 14])
    assert [a.end for a in appends] == [14, 27, 41]
    assert [a.sent_at for a in appends] == [1.0, 1.05, 1.10]


def test_appends_that_landed_out_of_order_are_placed_in_stream_order() -> None:
    content = LINES[0] + LINES[2] + LINES[1]  # the third append overtook the second
    appends = appends_in(content, [(1.0, LINES[0]), (1.05, LINES[1]), (1.10, LINES[2])])
    assert [(a.sent_at, a.end) for a in appends] == [(1.0, 14), (1.10, 28), (1.05, 41)]
    with pytest.raises(AppendMissing):
        appends_in(content, [(1.15, LINES[3])])


def test_each_append_is_delivered_by_the_first_answer_that_reaches_its_end() -> None:
    appends = appends_of([1.0, 1.05, 1.10, 1.15], [len(x) for x in LINES])
    # One answer with the first append, one batching the second and third, one with the fourth.
    receipts = [
        Receipt(at=1.02, total=14),
        Receipt(at=1.30, total=41),
        Receipt(at=1.40, total=55),
    ]
    assert deliveries(appends, receipts) == pytest.approx([0.02, 0.25, 0.20, 0.25])


def test_an_answer_that_stops_inside_an_append_does_not_deliver_it() -> None:
    appends = [Append(sent_at=0.0, end=10), Append(sent_at=0.1, end=20)]
    receipts = [Receipt(at=0.2, total=15), Receipt(at=0.5, total=20)]
    assert deliveries(appends, receipts) == pytest.approx([0.2, 0.4])


def test_an_append_no_answer_reached_is_never_delivered() -> None:
    appends = appends_of([0.0, 0.1], [10, 10])
    assert deliveries(appends, [Receipt(at=0.3, total=10)]) == [pytest.approx(0.3), math.inf]
    assert deliveries(appends, []) == [math.inf, math.inf]


def test_a_viewer_is_exact_only_with_every_byte_once_in_order_and_the_close() -> None:
    expected = Expected.of(LINES)
    assert expected.length == sum(len(x) for x in LINES)

    def exact(chunks: list[bytes], *, ended: bool = True, errors: int = 0) -> bool:
        joined = b"".join(chunks)
        return is_exact(
            length=len(joined),
            sha256=hashlib.sha256(joined).hexdigest(),
            ended=ended,
            errors=errors,
            expected=expected,
        )

    assert exact([LINES[0], LINES[1] + LINES[2], LINES[3]])  # batching is fine
    assert not exact(LINES[:3])  # one missed
    assert not exact([*LINES, LINES[3]])  # one repeated
    assert not exact([LINES[1], LINES[0], LINES[2], LINES[3]])  # out of order
    assert not exact(LINES, ended=False)  # never saw the close
    assert not exact(LINES, errors=1)


def test_percentiles_are_nearest_rank_and_nan_of_nothing() -> None:
    values = [float(x) for x in range(100, 0, -1)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([math.inf, 1.0], 0.99) == math.inf
    assert math.isnan(percentile([], 0.5))


@given(
    sizes=st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=30),
    cuts=st.sets(st.integers(min_value=1, max_value=29)),
)
def test_whatever_the_batching_each_append_arrives_with_the_answer_that_holds_its_end(
    sizes: list[int], cuts: set[int]
) -> None:
    appends = appends_of([float(i) for i in range(len(sizes))], sizes)
    # The server answers in batches of whole appends, ending after the appends in `cuts`.
    ends = sorted({c for c in cuts if c < len(sizes)} | {len(sizes)})
    receipts = [Receipt(at=100.0 + end, total=appends[end - 1].end) for end in ends]
    times = deliveries(appends, receipts)
    for index, time in enumerate(times):
        batch_end = min(e for e in ends if e > index)
        assert time == 100.0 + batch_end - index
