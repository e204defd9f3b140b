"""A shared agent run: one JSON Durable Stream of typed messages (``docs/session.md``).

Rules this module owns:

* A message is one compact JSON object, ``{"type", "from", "seq", ...}``: ``from`` is the
  writer's ``Producer-Id`` and ``seq`` its ``Producer-Seq`` for that append, so ``from:seq``
  names a message uniquely and a retried append is the same bytes under the same headers.
* Bytes on the wire are ``json.dumps(..., ensure_ascii=False, separators=(",", ":"))``, which is
  also what the page's ``JSON.stringify`` produces: a transcript re-serialised anywhere is
  byte-for-byte the origin's.
* Who holds the session and whether it was stopped is a fold over the transcript in stream order
  (``fold``), computed the same way by every agent and page (``watch_page/watch.js``), so
  everyone who read the same prefix agrees. The last ``take_over`` wins; only the holder's
  ``release`` frees it; the first ``stop`` is final.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

JSON = "application/json"

# Message types. Agents write prompt/token/tool_call/tool_result/review/status; pages write
# control and human.
PROMPT = "prompt"
TOKEN = "token"
TOOL_CALL = "tool_call"
TOOL_RESULT = "tool_result"
REVIEW = "review"
STATUS = "status"
CONTROL = "control"
HUMAN = "human"
TYPES = frozenset({PROMPT, TOKEN, TOOL_CALL, TOOL_RESULT, REVIEW, STATUS, CONTROL, HUMAN})

# Control actions and agent states.
STOP = "stop"
TAKE_OVER = "take_over"
RELEASE = "release"
STARTED, YIELDED, RESUMED, STOPPED, DONE, SIGNED_OFF = (
    "started",
    "yielded",
    "resumed",
    "stopped",
    "done",
    "signed_off",
)

Message = dict[str, Any]


def encode(message: Mapping[str, Any]) -> bytes:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()


def encode_transcript(messages: Iterable[Mapping[str, Any]]) -> bytes:
    """What the origin answers for a JSON stream holding ``messages``: one array."""
    return b"[" + b",".join(encode(m) for m in messages) + b"]"


# The first names the watch page shows for pages (``watch.js`` ``NAMES``, same order).
PAGE_NAMES = (
    "Alex", "Sam", "Robin", "Kim", "Jo", "Charlie", "Max", "Noa", "Eli", "Ari", "Lou", "Dani",
    "Mika", "Ren", "Sky", "Jules", "Nico", "Tess", "Ida", "Omar", "Lena", "Ravi", "Yuki", "Zoe",
    "Finn", "Maya", "Theo", "Ines", "Hugo", "Lia", "Otto", "Vera",
)  # fmt: skip
PAGE_ID = re.compile(r"^page-[0-9a-f]+$")


def shown_names(messages: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """What the watch page calls each writer (``watch.js`` ``nameOf``): a page's producer id is
    a first name picked by its 32-bit FNV-1a hash; a second id with a taken name gets the id's
    last four characters, in order of first appearance; agents keep their id, capitalised."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for message in messages:
        sender = str(message.get("from"))
        if sender in names:
            continue
        if PAGE_ID.match(sender):
            digest = 2166136261
            for char in sender:
                digest = ((digest ^ ord(char)) * 16777619) & 0xFFFFFFFF
            shown = PAGE_NAMES[digest % len(PAGE_NAMES)]
        else:
            shown = sender[:1].upper() + sender[1:]
        if shown in taken:
            shown = f"{shown} {sender[-4:]}"
        names[sender] = shown
        taken.add(shown)
    return names


def name(message: Mapping[str, Any]) -> str:
    return f"{message.get('from')}:{message.get('seq')}"


@dataclass(frozen=True, kw_only=True, slots=True)
class SessionState:
    holder: str | None = None  # producer id of the page holding the session
    held_by: str | None = None  # name of the take_over control that gave it
    released_by: str | None = None  # name of the release control that last freed it
    stopped_by: str | None = None  # name of the first stop control
    finished: frozenset[str] = frozenset()  # writers that wrote done/stopped/signed_off

    @property
    def held(self) -> bool:
        return self.holder is not None


def fold(messages: Iterable[Mapping[str, Any]]) -> SessionState:
    holder = held_by = released_by = stopped_by = None
    finished: set[str] = set()
    for message in messages:
        kind, sender = message.get("type"), message.get("from")
        if kind == CONTROL:
            action = message.get("action")
            if action == STOP and stopped_by is None:
                stopped_by = name(message)
            elif action == TAKE_OVER and stopped_by is None:
                holder, held_by = str(sender), name(message)
            elif action == RELEASE and holder is not None and sender == holder:
                holder, released_by = None, name(message)
        elif kind == STATUS and message.get("state") in (DONE, STOPPED, SIGNED_OFF):
            finished.add(str(sender))
    return SessionState(
        holder=holder,
        held_by=held_by,
        released_by=released_by,
        stopped_by=stopped_by,
        finished=frozenset(finished),
    )
