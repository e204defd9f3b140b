"""The long-poll board: groups by what the answer is made of; each waiter's timeout is its own."""

from __future__ import annotations

from edge.live.board import Board, Waiter, by_answer_class


def waiter(
    name: str,
    *,
    key: str = "s",
    source: str = "tail",
    offset: str = "10",
    cursor: int | None = None,
    deadline: float = 30.0,
) -> Waiter[str]:
    return Waiter(
        key=key, source=source, offset=offset, cursor=cursor, deadline=deadline, ticket=name
    )


def names(groups: list[list[Waiter[str]]]) -> list[list[str]]:
    return [[w.ticket for w in members] for members in groups]


def test_waiters_group_by_stream_source_and_offset_in_arrival_order() -> None:
    board: Board[str] = Board()
    for w in (
        waiter("a"),
        waiter("b", cursor=5),
        waiter("c", offset="11"),
        waiter("d", source="old tail"),
        waiter("e", key="other"),
        waiter("f"),
    ):
        board.join(w)
    assert len(board) == 6
    assert names(board.groups("s")) == [["a", "b", "f"], ["c"], ["d"]]
    assert names(board.groups("other")) == [["e"]]
    assert board.groups("nobody") == []
    assert sorted(map(str, board.streams())) == ["other", "s"]


def test_leaving_is_idempotent_and_empties_the_board() -> None:
    board: Board[str] = Board()
    a, b = waiter("a"), waiter("b")
    board.join(a)
    board.join(a)  # joining twice is one membership
    board.join(b)
    assert len(board) == 2
    assert board.leave(a)
    assert not board.leave(a)
    assert names(board.groups("s")) == [["b"]]
    assert board.leave(b)
    assert len(board) == 0
    assert board.streams() == []
    assert board.next_deadline() is None  # left waiters' deadlines do not count


def test_a_waiter_is_due_only_at_its_own_deadline() -> None:
    board: Board[str] = Board()
    early = [waiter(f"early{i}", deadline=30.0 + i / 1000) for i in range(3)]
    late = waiter("late", deadline=31.5)  # arrived 1.5 s later, same group
    for w in (*early, late):
        board.join(w)
    assert board.next_deadline() == 30.0
    assert board.due(29.999) == []
    due = board.due(30.05)
    assert names(due) == [["early0", "early1", "early2"]]
    # due() does not take them off: the adapter does, as it answers them.
    for w in due[0]:
        assert board.leave(w)
    assert board.next_deadline() == 31.5
    assert board.due(31.0) == []
    assert names(board.due(31.5)) == [["late"]]


def test_due_skips_waiters_that_left_and_groups_by_stream_and_offset() -> None:
    board: Board[str] = Board()
    gone = waiter("gone", deadline=1.0)
    board.join(gone)
    board.join(waiter("x1", key="x", deadline=2.0))
    board.join(waiter("y", key="y", deadline=2.0))
    board.join(waiter("x2", key="x", offset="12", deadline=2.0))
    board.leave(gone)
    assert names(board.due(5.0)) == [["x1"], ["y"], ["x2"]]


def test_many_departures_do_not_grow_the_deadline_heap() -> None:
    board: Board[str] = Board()
    for i in range(10_000):
        w = waiter(str(i), deadline=float(i))
        board.join(w)
        board.leave(w)
    assert len(board._deadlines) <= 64 + 1


def test_cursor_classes_follow_the_answer_rule_at_release() -> None:
    members = [
        waiter("none"),
        waiter("behind", cursor=990),
        waiter("current", cursor=1000),
        waiter("ahead", cursor=1500),
        waiter("ahead too", cursor=1500),
        waiter("behind too", cursor=999),
    ]
    classes = by_answer_class(members, current=1000)
    assert {k: [w.ticket for w in v] for k, v in classes.items()} == {
        None: ["none", "behind", "behind too"],
        1000: ["current"],
        1500: ["ahead", "ahead too"],
    }
    # The interval moved on while they waited: the one at 1000 is now behind too.
    later = by_answer_class(members, current=1001)
    assert [w.ticket for w in later[None]] == ["none", "behind", "current", "behind too"]
