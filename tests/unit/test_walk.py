"""The counting of ``loadtest.walk``: modules, transitions and back and forth of a walk."""

from __future__ import annotations

from pathlib import Path

from loadtest.walk import count_walk, module_of


def test_a_walk_down_and_back_counts_each_crossing_once_and_the_way_back_as_back_and_forth() -> (
    None
):
    counts = count_walk(
        [
            (None, "web/app.py"),  # the handler, entered from aiohttp
            ("web/app.py", "web/app.py"),  # within a module: no transition
            ("web/app.py", "catchup.py"),
            ("catchup.py", "streams.py"),
            ("streams.py", "catchup.py"),  # back: catchup→streams came first
            ("catchup.py", "streams.py"),  # and forth: streams→catchup came first
            ("streams.py", "store/local.py"),
            (None, "live/hub.py"),  # a callback from the event loop: an entry
        ]
    )
    assert counts.modules == (
        "web/app.py",
        "catchup.py",
        "streams.py",
        "store/local.py",
        "live/hub.py",
    )
    assert counts.calls == 8
    assert counts.transitions == 5
    assert counts.back_and_forth == 2
    assert counts.repeats == 1  # catchup→streams the second time
    assert counts.entered == {"catchup.py": 2, "streams.py": 2, "store/local.py": 1}
    assert counts.called == {
        "web/app.py": 2,
        "catchup.py": 2,
        "streams.py": 2,
        "store/local.py": 1,
        "live/hub.py": 1,
    }


def test_a_straight_walk_has_no_back_and_forth_however_often_it_goes_down() -> None:
    down = [("a.py", "b.py"), ("b.py", "c.py")] * 3
    counts = count_walk(down)
    assert counts.transitions == 6
    assert counts.back_and_forth == 0
    assert counts.repeats == 4
    assert counts.entered == {"b.py": 3, "c.py": 3}


def test_an_empty_walk_counts_nothing() -> None:
    counts = count_walk([])
    assert (counts.modules, counts.calls, counts.transitions, counts.back_and_forth) == (
        (),
        0,
        0,
        0,
    )


def test_a_module_is_named_by_its_path_under_the_package(tmp_path: Path) -> None:
    root = tmp_path / "edge"
    (root / "instances").mkdir(parents=True)
    assert module_of(str(root / "instances" / "registry.py"), root) == "instances/registry.py"
    assert module_of(str(root / "streams.py"), root) == "streams.py"
    assert module_of(str(tmp_path / "aiohttp" / "web.py"), root) is None
