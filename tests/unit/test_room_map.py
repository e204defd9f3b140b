"""docs/how-it-works.md's map of the rooms stays true: every module of ``edge/`` is in it once,
and everything it names exists. A newcomer finds any module from the map."""

import re
from pathlib import Path

import edge

EDGE = Path(edge.__file__).parent
DOC = Path(__file__).resolve().parents[2] / "docs" / "how-it-works.md"
NOT_A_ROOM = {"__init__.py", "__main__.py"}  # the package itself and `python -m edge`


def rooms(text: str) -> dict[str, list[str]]:
    """Room name -> the paths (files, or directories ending in ``/``) its row names."""
    section = text.split("## A map of the rooms", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| **")]
    found: dict[str, list[str]] = {}
    for row in rows:
        _, name, modules, _ = row.split("|", 3)
        found[name.strip().strip("*")] = re.findall(r"`([a-z_/]+(?:\.py|/))`", modules)
    return found


def room_of(module: str, named: dict[str, list[str]]) -> list[str]:
    """The rooms that claim ``module`` (a path under edge/): by file, or else by directory."""
    by_file = [room for room, paths in named.items() if module in paths]
    if by_file:
        return by_file
    return [
        room
        for room, paths in named.items()
        if any(path.endswith("/") and module.startswith(path) for path in paths)
    ]


def test_the_parser_reads_a_map() -> None:
    text = "## A map of the rooms\n\n| **A** | `web/x.py`, `live/` | x |\n| **B** | `y.py` | y |\n"
    named = rooms(text)
    assert named == {"A": ["web/x.py", "live/"], "B": ["y.py"]}
    assert room_of("live/hub.py", named) == ["A"]
    assert room_of("web/x.py", named) == ["A"]
    assert room_of("web/z.py", named) == []


def test_every_module_is_in_one_room() -> None:
    named = rooms(DOC.read_text())
    assert len(named) >= 10
    modules = sorted(
        str(path.relative_to(EDGE))
        for path in EDGE.rglob("*.py")
        if not (path.parent == EDGE and path.name in NOT_A_ROOM) and path.name != "__init__.py"
    )
    placed = {module: room_of(module, named) for module in modules}
    assert {m: r for m, r in placed.items() if len(r) != 1} == {}


def test_every_path_the_map_names_exists() -> None:
    named = rooms(DOC.read_text())
    missing = [path for paths in named.values() for path in paths if not (EDGE / path).exists()]
    assert missing == []
