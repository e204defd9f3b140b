"""The shared run's message rules (devstack/session.py), which the page's fold mirrors."""

from __future__ import annotations

import json
from typing import Any

from devstack import session


def msg(kind: str, sender: str, seq: int, **fields: Any) -> session.Message:
    return {"type": kind, "from": sender, "seq": seq, **fields}


def test_encoding_is_compact_utf8_and_a_transcript_is_one_json_array() -> None:
    first = msg("token", "worker", 0, text=' "quoted" ünï\n')
    assert session.encode(first) == (
        '{"type":"token","from":"worker","seq":0,"text":" \\"quoted\\" ünï\\n"}'.encode()
    )
    both = session.encode_transcript([first, msg("status", "worker", 1, state="done")])
    assert json.loads(both)[1] == {"type": "status", "from": "worker", "seq": 1, "state": "done"}
    assert session.encode_transcript([]) == b"[]"


def test_take_over_holds_until_the_holder_releases() -> None:
    messages = [msg("control", "page-a", 0, action="take_over")]
    assert session.fold(messages).holder == "page-a"
    assert session.fold(messages).held_by == "page-a:0"
    messages.append(msg("control", "page-b", 0, action="release"))  # not the holder's
    assert session.fold(messages).holder == "page-a"
    messages.append(msg("control", "page-b", 1, action="take_over"))  # the last one wins
    assert session.fold(messages).holder == "page-b"
    messages.append(msg("control", "page-b", 2, action="release"))
    state = session.fold(messages)
    assert not state.held
    assert state.released_by == "page-b:2"


def test_the_first_stop_is_final_and_nobody_takes_over_after_it() -> None:
    messages = [
        msg("control", "page-a", 0, action="stop"),
        msg("control", "page-b", 0, action="stop"),
        msg("control", "page-c", 0, action="take_over"),
    ]
    state = session.fold(messages)
    assert state.stopped_by == "page-a:0"
    assert state.holder is None


def test_finished_writers_are_those_that_said_done_stopped_or_signed_off() -> None:
    messages = [
        msg("status", "worker", 0, state="started"),
        msg("status", "worker", 1, state="stopped", ref="page-a:0"),
        msg("status", "reviewer", 0, state="signed_off"),
        msg("status", "other", 0, state="yielded"),
    ]
    assert session.fold(messages).finished == {"worker", "reviewer"}
