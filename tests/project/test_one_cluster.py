"""One set of roles, launched two ways (issue 42): what engine code only one launch reaches stays small.

Follows the shardstore imports (module level and inside functions, relative ones resolved) from the
module that defines ``class Cluster`` (the embedded launcher) and from the one that defines
``run_node`` (a node process), and counts the lines of the engine modules only one of them reaches.
The client role (``engine/client.py``: what ``shardstore.connect`` gives a user of node processes,
and what ``Cluster`` is over the in-process transport) counts as shared; node processes serve it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "engine"
#: shared by both launches although a node process does not import it (see the module docstring)
SHARED = {ENGINE / "client.py"}
LIMIT = 300


def _file_of(module: str) -> Path | None:
    parts = module.split(".")
    if parts[0] != "shardstore":
        return None
    for base in (ROOT, ROOT / "src" / "shardstore"):
        for n in range(len(parts) - 1, 0, -1):
            p = base.joinpath(*parts[1:n + 1])
            if p.with_suffix(".py").is_file():
                return p.with_suffix(".py")
            if (p / "__init__.py").is_file():
                return p / "__init__.py"
    return None


def _module_of(path: Path) -> list[str]:
    rel = path.relative_to(ROOT / "src") if path.is_relative_to(ROOT / "src") else Path("shardstore") / path.relative_to(ROOT)
    parts = list(rel.with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    package = _module_of(path) if path.name == "__init__.py" else _module_of(path)[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else (node.module or "")
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def reached(start: Path) -> set[Path]:
    """Every project file ``start`` reaches through its imports (itself included)."""
    seen: set[Path] = set()
    todo = [start]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo.extend(f for f in map(_file_of, _imports(path)) if f is not None)
    return seen


def _defining(text: str) -> Path:
    return next(p for p in sorted(ENGINE.rglob("*.py")) if text in p.read_text(encoding="utf-8"))


def _lines(paths: set[Path]) -> int:
    return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in paths)


def test_the_engine_code_only_one_launch_reaches_is_small() -> None:
    embedded_entry, node_entry = _defining("\nclass Cluster("), _defining("\ndef run_node(")
    embedded = {p for p in reached(embedded_entry) if p.is_relative_to(ENGINE)} - SHARED
    node = {p for p in reached(node_entry) if p.is_relative_to(ENGINE)}
    only_embedded, only_node = embedded - node, node - embedded - {node_entry}
    assert embedded_entry in only_embedded
    assert _lines(only_embedded) <= LIMIT, sorted(str(p.relative_to(ROOT)) for p in only_embedded)
    assert _lines(only_node) <= LIMIT, sorted(str(p.relative_to(ROOT)) for p in only_node)


def test_both_launches_reach_the_same_roles() -> None:
    roles = {ENGINE / "node" / "process.py", ENGINE / "node" / "data_role.py", ENGINE / "manager" / "role.py",
             ENGINE / "coordinator" / "role.py"}
    assert roles <= reached(_defining("\nclass Cluster(")) and roles <= reached(_defining("\ndef run_node("))
