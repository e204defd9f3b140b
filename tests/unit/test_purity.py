"""The protocol core stays pure: no networking or event loop underneath it (STYLE.md habit 1)."""

import ast
from pathlib import Path

import pytest

import edge.answer
import edge.cdn.api
import edge.cdn.book
import edge.live.answers
import edge.live.board
import edge.live.upstream_mode
import edge.log
import edge.log.policy
import edge.protocol
import edge.protocol.paths
import edge.resume
import edge.store.shared_codec
import edge.summary
import edge.web.backlog
import edge.web.connection_table

FORBIDDEN = ("aiohttp", "redis", "asyncio", "prometheus_client", "socket", "uvloop")
# The protocol and the cache core (segments, logs, the read policy, the one intake).
PURE_PACKAGES = [Path(edge.protocol.__file__).parent, Path(edge.log.__file__).parent]
PURE_PACKAGES.append(Path(edge.resume.__file__).parent)  # resume routes' core (edge.resume)
AUTH = Path(edge.protocol.__file__).parent.parent / "auth"
# Pure modules that live beside their adapters.
PURE_MODULES = [AUTH / "credentials.py", AUTH / "policy.py", AUTH / "keys.py"]
PURE_MODULES += [
    Path(edge.answer.__file__),
    Path(edge.live.board.__file__),
    Path(edge.live.answers.__file__),
    Path(edge.live.upstream_mode.__file__),
    Path(edge.web.connection_table.__file__),
    Path(edge.web.backlog.__file__),
    Path(edge.cdn.api.__file__),
    Path(edge.cdn.book.__file__),
    Path(edge.summary.__file__),
    Path(edge.store.shared_codec.__file__),
]


def imported_modules(source: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
    return modules


@pytest.mark.parametrize(
    "module",
    [*(p for pkg in PURE_PACKAGES for p in sorted(pkg.rglob("*.py"))), *PURE_MODULES],
    ids=str,
)
def test_pure_module_imports_no_io(module: Path) -> None:
    bad = {m for m in imported_modules(module) if m.split(".")[0] in FORBIDDEN}
    assert not bad, f"{module} imports {bad}"


# Each pure layer imports only from itself and the layers below it: protocol/ is the floor (the
# wire's rules), log/ builds on it (plus the constants of edge.config).
LAYERS = {
    Path(edge.protocol.__file__).parent: ("edge.protocol",),
    Path(edge.log.__file__).parent: ("edge.log", "edge.protocol", "edge.config"),
}


def climbs(module: Path, allowed: tuple[str, ...]) -> set[str]:
    """The edge modules ``module`` imports from outside ``allowed`` (and above it)."""
    return {
        m
        for m in imported_modules(module)
        if m.split(".")[0] == "edge" and not any(m == a or m.startswith(a + ".") for a in allowed)
    }


def test_a_layer_that_imports_upwards_is_caught() -> None:
    assert climbs(Path(edge.protocol.paths.__file__), ("edge.protocol",)) == set()
    assert climbs(Path(edge.log.policy.__file__), ("edge.protocol",)) >= {"edge.log.freshness"}


@pytest.mark.parametrize(
    ("module", "allowed"),
    [(p, allowed) for pkg, allowed in LAYERS.items() for p in sorted(pkg.rglob("*.py"))],
    ids=str,
)
def test_pure_layers_import_nothing_above_them(module: Path, allowed: tuple[str, ...]) -> None:
    bad = climbs(module, allowed)
    assert not bad, f"{module} imports {bad} from above its layer"
