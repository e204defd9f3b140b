"""How much of the stream listener's backlog one readable pass accepts (edge.web.backlog): drained
to empty, bounded a pass, never past the connection table's room but always one. No sockets: the
kernel's queue is a list of outcomes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edge.web.backlog import (
    ACCEPTS_PER_PASS,
    Accept,
    Next,
    accepts_this_pass,
    after_accept,
)


def one_pass(queue: list[Accept], *, room: int, handing: int = 0) -> tuple[int, Next]:
    """What one readable pass takes of ``queue`` (EMPTY once it runs out): attempts, last step."""
    limit = accepts_this_pass(room=room, handing=handing)
    attempts, step = 0, Next.ACCEPT
    while step is Next.ACCEPT:
        outcome = queue[attempts] if attempts < len(queue) else Accept.EMPTY
        attempts += 1
        step = after_accept(outcome, attempts=attempts, limit=limit)
    return attempts, step


def test_a_pass_takes_everything_queued_up_to_its_bound() -> None:
    assert one_pass([Accept.ACCEPTED] * 5, room=1000) == (6, Next.WAIT)  # the sixth finds EAGAIN
    assert accepts_this_pass(room=10**6) == ACCEPTS_PER_PASS
    attempts, step = one_pass([Accept.ACCEPTED] * 700, room=10**6)
    assert (attempts, step) == (ACCEPTS_PER_PASS, Next.WAIT)  # the rest: the next pass


def test_never_more_than_the_table_has_room_for_and_always_one() -> None:
    assert accepts_this_pass(room=3) == 3
    assert one_pass([Accept.ACCEPTED] * 10, room=3) == (3, Next.WAIT)
    # At the cap (or past it) a newcomer is still taken, one a pass, for the table to refuse.
    assert accepts_this_pass(room=0) == 1
    assert accepts_this_pass(room=-5) == 1
    assert one_pass([Accept.ACCEPTED] * 10, room=0) == (1, Next.WAIT)


def test_connections_still_being_handed_over_take_their_room() -> None:
    """Accepted in an earlier pass, not yet in the table: without them, passes in a row would
    each take the whole room, and the process more descriptors than the cap."""
    assert accepts_this_pass(room=200, handing=128) == 72
    assert accepts_this_pass(room=200, handing=200) == 1
    assert accepts_this_pass(room=10**6, handing=128) == ACCEPTS_PER_PASS


def test_an_abandoned_connection_counts_and_the_pass_goes_on() -> None:
    queue = [Accept.ACCEPTED, Accept.ABORTED, Accept.ACCEPTED]
    assert one_pass(queue, room=100) == (4, Next.WAIT)
    assert one_pass([Accept.ABORTED] * 10, room=2) == (2, Next.WAIT)


def test_out_of_descriptors_rests_the_listener() -> None:
    queue = [Accept.ACCEPTED, Accept.NO_DESCRIPTORS, Accept.ACCEPTED]
    assert one_pass(queue, room=100) == (2, Next.REST)
    assert after_accept(Accept.NO_DESCRIPTORS, attempts=1, limit=1) is Next.REST


@given(
    queue=st.lists(st.sampled_from(list(Accept)), max_size=300),
    room=st.integers(min_value=-10, max_value=500),
    handing=st.integers(min_value=0, max_value=300),
)
def test_every_pass_is_bounded_and_ends_for_a_reason(
    queue: list[Accept], room: int, handing: int
) -> None:
    attempts, step = one_pass(queue, room=room, handing=handing)
    limit = accepts_this_pass(room=room, handing=handing)
    assert 1 <= attempts <= limit <= max(1, min(ACCEPTS_PER_PASS, room - handing))
    taken = queue[:attempts]
    if step is Next.REST:
        assert taken[-1] is Accept.NO_DESCRIPTORS
    elif attempts < limit:  # ended early: the queue was empty
        assert attempts > len(queue) or taken[-1] is Accept.EMPTY
    # Nothing after an empty queue or a lack of descriptors is tried in the same pass.
    stops = (Accept.EMPTY, Accept.NO_DESCRIPTORS)
    assert all(outcome not in stops for outcome in taken[:-1])
