import random

from edge.protocol.cursor import CURSOR_EPOCH, current_interval, response_cursor

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
