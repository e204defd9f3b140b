"""What a half-closed connection does (``edge.protocol.half_close``), and the two attributes of
aiohttp's protocol the connection reads to know what aiohttp holds
(``edge.web.connection_protocol._aiohttp_holding``)."""

from __future__ import annotations

import itertools

import pytest
from aiohttp.web_protocol import RequestHandler

from edge.protocol.half_close import AfterHalfClose, Holding, after_half_close

EVERY_HOLDING = [
    Holding(answering=answering, queued=queued, cut_short=cut_short, live=live)
    for answering, queued, cut_short, live in itertools.product((False, True), repeat=4)
]


@pytest.mark.parametrize("holding", EVERY_HOLDING)
def test_a_half_close_never_drops_an_answer_nor_waits_for_nothing(holding: Holding) -> None:
    decision = after_half_close(holding)
    ends_here = holding.cut_short or holding.live
    match decision:
        case AfterHalfClose.CLOSE:
            # Only when nothing is left that could be answered (what was answered before a
            # cut-short request is written already: requests are answered one at a time), or
            # a live reader, which a half-close cannot be told from a client that left.
            assert ends_here or not (holding.answering or holding.queued)
        case AfterHalfClose.AFTER_ANSWER:
            # Closing after the answer in hand would drop any request queued behind it.
            assert holding.answering
            assert not holding.queued
            assert not ends_here
        case AfterHalfClose.WAIT:
            # Something will start or finish and ask again.
            assert holding.queued
            assert not ends_here


def test_a_live_reader_ends_at_the_half_close_whatever_else_is_held() -> None:
    for holding in EVERY_HOLDING:
        if holding.live:
            assert after_half_close(holding) is AfterHalfClose.CLOSE


def test_aiohttp_still_has_the_attributes_the_connection_reads() -> None:
    """``_waiter`` (pending while it waits for a request: its own idle test) and ``_messages``
    (the requests parsed behind the one in hand). A newer aiohttp without them must fail here,
    not in production."""
    assert {"_waiter", "_messages"} <= set(RequestHandler.__slots__)
    source = RequestHandler._process_keepalive.__code__.co_names
    assert "_waiter" in source
