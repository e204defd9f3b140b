"""What the deployment tests report at the end of the run (the image's build time and size)."""

from __future__ import annotations

import pytest

REPORT = pytest.StashKey[list[str]]()


def report(config: pytest.Config, line: str) -> None:
    config.stash.setdefault(REPORT, []).append(line)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    lines = config.stash.get(REPORT, [])
    if lines:
        terminalreporter.section("container image")
        for line in lines:
            terminalreporter.write_line(line)
