"""One writer per connection: only the stream listener's connection protocol writes to a client
socket (the fan-out, heartbeats, refusals and every answer of its own go through it), and the
full path's viewer writes through its one sink. Checked on the source: a new direct write to a
transport elsewhere fails here, before it can interleave bytes with the connection's own."""

from __future__ import annotations

import ast
from pathlib import Path

import edge

PACKAGE = Path(edge.__file__).parent
# (module, class) allowed to call a transport's write/writelines/write_eof.
WRITERS = {
    ("web/connection_protocol.py", "_Connection"),
    ("web/live_reads.py", "TransportSink"),
}
WRITES = {"write", "writelines"}


def direct_writes() -> list[tuple[str, str | None, int, str]]:
    """Every ``<something transport>.write(...)`` in the package: module, class, line, text."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text(), filename=str(path))
        for cls, node in _calls(tree):
            func = node.func
            if not (isinstance(func, ast.Attribute) and func.attr in WRITES):
                continue
            target = ast.unparse(func.value)
            if "transport" in target.lower():
                found.append((module, cls, node.lineno, ast.unparse(node)))
    return found


def _calls(tree: ast.AST) -> list[tuple[str | None, ast.Call]]:
    out: list[tuple[str | None, ast.Call]] = []

    def walk(node: ast.AST, cls: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, child.name)
            else:
                if isinstance(child, ast.Call):
                    out.append((cls, child))
                walk(child, cls)

    walk(tree, None)
    return out


def test_only_the_connection_writes_to_a_client_socket() -> None:
    strays = [w for w in direct_writes() if (w[0], w[1]) not in WRITERS]
    assert strays == [], "direct transport writes outside the connection: " + repr(strays)


def test_the_check_sees_the_connections_own_writes() -> None:
    # The scan must find what it polices: the connection's writes are direct writes.
    assert any(w[0] == "web/connection_protocol.py" for w in direct_writes())
