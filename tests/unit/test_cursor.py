import random

from edge.protocol.cursor import (
    CURSOR_EPOCH,
    answer_class,
    current_interval,
    cursor_class,
    next_cursor,
    response_cursor,
)

NOW = CURSOR_EPOCH + 20 * 1000 + 5  # inside interval 1000


def test_interval_counts_twenty_second_steps_from_the_epoch() -> None:
    assert current_interval(NOW) == 1000
    assert current_interval(NOW + 15) == 1001


def test_no_or_old_cursor_gets_the_current_interval() -> None:
    rng = random.Random(1)
    assert response_cursor(None, now=NOW, rng=rng) == "1000"
    assert response_cursor("999", now=NOW, rng=rng) == "1000"
    assert response_cursor("garbage", now=NOW, rng=rng) == "1000"


def test_a_cursor_not_behind_always_strictly_advances() -> None:
    rng = random.Random(2)
    for client in ("1000", "1005", "5000"):
        for _ in range(200):
            answer = int(response_cursor(client, now=NOW, rng=rng))
            assert int(client) < answer <= int(client) + 180


def test_cursor_classes_decide_the_answer_rule() -> None:
    assert cursor_class(None) is None
    assert cursor_class("") is None
    assert cursor_class("garbage") is None
    assert cursor_class("1005") == 1005
    assert cursor_class("01005") == 1005  # the same value, so the same answer rule
    assert answer_class(None, current=1000) is None
    assert answer_class(999, current=1000) is None  # behind: the current interval, like None
    assert answer_class(1000, current=1000) == 1000
    assert answer_class(5000, current=1000) == 5000
    rng = random.Random(3)
    assert next_cursor(None, current=1000, rng=rng) == "1000"
    assert next_cursor(999, current=1000, rng=rng) == "1000"
    for client in (1000, 1005):
        assert client < int(next_cursor(client, current=1000, rng=rng)) <= client + 180


def test_response_cursor_is_next_cursor_of_the_class() -> None:
    for client in (None, "", "x", "999", "1000", "1005", "+1005"):
        a, b = random.Random(7), random.Random(7)
        expected = next_cursor(cursor_class(client), current=current_interval(NOW), rng=b)
        assert response_cursor(client, now=NOW, rng=a) == expected
