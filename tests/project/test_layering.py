"""Import rules between the packages (issue 17): every edge outside the layering fails.

Parses every module's imports (``ast``: module level, inside functions and under
``TYPE_CHECKING``) and fails on an edge the layering forbids.  The layers, bottom up:

* ``base``: ``shardstore.errors``, ``fileio``, ``progress``, ``transport``, ``datasets`` (top-level modules);
* ``blobstores`` (the store interface and wrappers) <- ``plugins`` (the backends);
* ``core`` (operation types, record format, path strategy, ``ShardAddress``);
* ``translog``, ``segments``, ``cluster_state``: each on core, blobstores and base, none on another;
* ``net`` (the network transport over Arrow Flight, ``src/shardstore/net``): on base and core only;
* ``engine`` on all of the above;
* ``spark``, ``cli``, ``testing`` (and the ``pyspark_shardstore*`` registration shims) on anything;
* ``api``: the package front door, ``src/shardstore/__init__.py`` (``open_store``, ``Cluster``,
  ``open_commit``, imported lazily), on anything except ``testing`` and ``cli``.  Importing
  ``shardstore`` itself or a name from it (``from shardstore import Cluster``) is an edge to
  ``api``: no library layer may do it (it would be a cycle through the front door).

Only ``spark`` (and its registration shims) imports ``pyspark`` or ``py4j``.

Inside a layer too, the modules' imports (at any depth, relative ones resolved) form no cycle
(issue 42): a function-level or ``TYPE_CHECKING`` import does not hide one.  See
``docs/design/layering.md``.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: layer -> the source files of it
FOLDERS: dict[str, list[Path]] = {
    "api": [ROOT / "src" / "shardstore" / "__init__.py"],
    "base": [ROOT / "src" / "shardstore" / f for f in ("errors.py", "fileio.py", "progress.py", "transport.py", "datasets.py")],
    "blobstores": sorted((ROOT / "blobstores").rglob("*.py")),
    "plugins": sorted((ROOT / "plugins").rglob("*.py")),
    "core": sorted((ROOT / "src" / "shardstore" / "core").rglob("*.py")),
    "translog": sorted((ROOT / "translog").rglob("*.py")),
    "segments": sorted((ROOT / "segments").rglob("*.py")),
    "cluster_state": sorted((ROOT / "cluster_state").rglob("*.py")),
    "net": sorted((ROOT / "src" / "shardstore" / "net").rglob("*.py")),
    "engine": sorted((ROOT / "engine").rglob("*.py")),
    "spark": sorted((ROOT / "spark").rglob("*.py")) + sorted(ROOT.glob("pyspark_shardstore*/*.py")),
    "cli": [ROOT / "src" / "shardstore" / "cli.py", ROOT / "src" / "shardstore" / "__main__.py"],
    "testing": sorted((ROOT / "src" / "shardstore" / "testing").rglob("*.py")),
}

#: the project module (or package) prefix of each layer
PREFIXES: dict[str, tuple[str, ...]] = {
    "base": ("shardstore.errors", "shardstore.fileio", "shardstore.progress", "shardstore.transport",
             "shardstore.datasets"),
    "blobstores": ("shardstore.blobstores",),
    "plugins": ("shardstore.plugins",),
    "core": ("shardstore.core",),
    "translog": ("shardstore.translog",),
    "segments": ("shardstore.segments",),
    "cluster_state": ("shardstore.cluster_state",),
    "net": ("shardstore.net",),
    "engine": ("shardstore.engine",),
    "spark": ("shardstore.spark", "pyspark_shardstore", "pyspark_shardstore_changes", "pyspark_shardstore_arrow"),
    "cli": ("shardstore.cli", "shardstore.__main__"),
    "testing": ("shardstore.testing",),
    # last, as a catch-all: whatever no layer above claims is the front door, i.e. ``shardstore``
    # itself or a name imported from it (``from shardstore import Cluster`` -> ``shardstore.Cluster``)
    "api": ("shardstore",),
}

_EVERY = frozenset(PREFIXES)
#: layer -> the layers it may import (itself always)
ALLOWED: dict[str, frozenset[str]] = {
    "base": frozenset({"base"}),
    "blobstores": frozenset({"base"}),
    "plugins": frozenset({"base", "blobstores"}),
    "core": frozenset({"base", "blobstores"}),
    "translog": frozenset({"base", "blobstores", "core"}),
    "segments": frozenset({"base", "blobstores", "core"}),
    "cluster_state": frozenset({"base", "blobstores", "core"}),
    "net": frozenset({"base", "core"}),
    "engine": frozenset({"base", "blobstores", "plugins", "core", "translog", "segments", "cluster_state", "net"}),
    "spark": _EVERY - {"testing", "cli"},
    "cli": _EVERY - {"testing"},
    "testing": _EVERY - {"cli"},
    "api": _EVERY - {"testing", "cli"},
}
SPARK_ONLY = ("pyspark", "py4j")


def imports_of(path: Path) -> set[str]:
    """Every module name ``path`` imports (absolute imports; relative ones stay inside their package)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from shardstore import x`
    return out


def layer_of(module: str) -> str | None:
    """The layer a project module belongs to (None: not a project module, e.g. pyarrow).

    The first layer whose prefix matches wins; ``api`` comes last, so it gets only the bare
    package and the names imported from it.
    """
    for layer, prefixes in PREFIXES.items():
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return layer
    return None


def edge_problems(layer: str, name: str) -> list[str]:
    """Why a module of ``layer`` may not import ``name`` (empty: it may)."""
    target = layer_of(name)
    out = []
    if target is not None and target != layer and target not in ALLOWED[layer]:
        out.append(f"{layer} -> {target}")
    if name.split(".")[0] in SPARK_ONLY and layer != "spark":
        out.append("only spark imports pyspark/py4j")
    return out


def violations(layer: str, paths: list[Path]) -> list[str]:
    """Each import of ``paths`` (files of ``layer``) that the layering forbids, as 'file imports module (why)'."""
    return [f"{path.relative_to(ROOT)} imports {name} ({why})"
            for path in paths for name in sorted(imports_of(path)) for why in edge_problems(layer, name)]


def test_every_source_file_has_a_layer() -> None:
    library = {p for folder in ("blobstores", "plugins", "translog", "segments", "cluster_state", "engine", "spark")
               for p in (ROOT / folder).rglob("*.py")} | set((ROOT / "src" / "shardstore").rglob("*.py"))
    placed = {p for paths in FOLDERS.values() for p in paths}
    assert sorted(str(p.relative_to(ROOT)) for p in library - placed) == []


@pytest.mark.parametrize("layer", sorted(FOLDERS))
def test_no_module_imports_across_a_forbidden_edge(layer: str) -> None:
    assert FOLDERS[layer], f"layer {layer} has no files (moved?)"
    bad = violations(layer, FOLDERS[layer])
    assert not bad, "\n".join(bad)


def test_the_parser_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from shardstore.translog.operations import OpType\n", encoding="utf-8")
    assert "shardstore.translog.operations.OpType" in imports_of(module)


@pytest.mark.parametrize(("layer", "source", "edge"), [
    ("segments", "from shardstore.translog.operations import OpType\n", "segments -> translog"),
    ("cluster_state", "import shardstore.engine.errors\n", "cluster_state -> engine"),
    ("cluster_state", "from shardstore.segments import records\n", "cluster_state -> segments"),
    ("core", "from shardstore import segments\n", "core -> segments"),
    ("engine", "if TYPE_CHECKING:\n    from shardstore.spark.reader import X\n", "engine -> spark"),
    ("blobstores", "from shardstore.plugins.s3 import S3Store\n", "blobstores -> plugins"),
    ("engine", "import pyspark.sql\n", "only spark imports pyspark"),
    ("translog", "from shardstore.cluster_state.model import ClusterState\n", "translog -> cluster_state"),
    ("engine", "from shardstore import Cluster\n", "engine -> api"),
    ("segments", "import shardstore\n", "segments -> api"),
    ("blobstores", "from shardstore.testing import FaultyStore\n", "blobstores -> testing"),
    ("engine", "from shardstore.testing.faulty import FaultyStore\n", "engine -> testing"),
    ("api", "from shardstore.testing import FaultyStore\n", "api -> testing"),
    ("api", "from shardstore.cli import main\n", "api -> cli"),
    ("net", "from shardstore.engine.cluster import Cluster\n", "net -> engine"),
    ("net", "from shardstore.blobstores import open_store\n", "net -> blobstores"),
    ("net", "import shardstore.translog.operations\n", "net -> translog"),
    ("core", "from shardstore.net.flight import FlightTransport\n", "core -> net"),
])
def test_the_rules_catch_the_edges_that_were_cut(tmp_path: Path, layer: str, source: str, edge: str) -> None:
    (tmp_path / "m.py").write_text(source, encoding="utf-8")
    found = [why for name in sorted(imports_of(tmp_path / "m.py")) for why in edge_problems(layer, name)]
    assert any(edge in why for why in found), found


@pytest.mark.parametrize(("module", "layer"), [
    ("shardstore", "api"),
    ("shardstore.Cluster", "api"),
    ("shardstore.__version__", "api"),
    ("shardstore.errors", "base"),
    ("shardstore.errors.ShardstoreError", "base"),
    ("shardstore.engine", "engine"),
    ("shardstore.net.wire", "net"),
    ("shardstore.testing.faulty", "testing"),
    ("shardstore_demo_plugin", None),
    ("pyarrow", None),
])
def test_layer_of_names_the_front_door(module: str, layer: str | None) -> None:
    assert layer_of(module) == layer


def test_the_front_door_may_import_the_library_lazily(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "def __getattr__(name):\n"
        "    from shardstore.engine import Cluster\n"
        "    from shardstore.segments.reader import open_commit\n"
        "    from shardstore.blobstores import open_store\n", encoding="utf-8")
    assert [why for name in sorted(imports_of(tmp_path / "m.py")) for why in edge_problems("api", name)] == []


# -- no import cycle between modules (issue 42) ----------------------------------------------------

#: import package -> its folder, as pyproject.toml's [tool.setuptools] package-dir installs them
PACKAGE_DIRS: dict[str, Path] = {
    name: ROOT / folder
    for name, folder in tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    ["tool"]["setuptools"]["package-dir"].items()
    if name == "shardstore" or name.startswith("shardstore.")
}

#: Edges left out of the cycle check, each with why; each must still exist (test below), so an
#: entry goes once its edge is cut.  Keep this empty: an entry is a known cycle waiting for a fix.


def project_modules(package_dirs: dict[str, Path] | None = None) -> dict[str, Path]:
    """Every module of the ``shardstore`` import package (dotted name -> source file); a package is its ``__init__``."""
    out: dict[str, Path] = {}
    for package, folder in sorted((package_dirs or PACKAGE_DIRS).items()):
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out.setdefault(".".join([package, *parts]), path)
    return out


def module_imports(module: str, path: Path, modules: Iterable[str]) -> set[str]:
    """The project modules ``module`` (at ``path``) imports, at any depth (functions, ``TYPE_CHECKING``).

    ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b`` (``c`` is a
    name defined there); relative imports are resolved; an import of itself is no edge.
    """
    known = set(modules)

    def owner(name: str) -> str | None:  # the longest project module ``name`` is or lies in
        while name not in known and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in known else None

    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(owner(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            out.update(owner(f"{base}.{alias.name}") or owner(base) for alias in node.names)
    out.discard(None)
    out.discard(module)
    return {name for name in out if name is not None}


def import_graph(modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the project modules it imports."""
    modules = project_modules() if modules is None else modules
    return {name: module_imports(name, path, modules) for name, path in modules.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (module, ..., back to the first) per :func:`cyclic_groups` group."""
    return [_cycle_in(graph, group) for group in cyclic_groups(graph)]


def cyclic_groups(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module: each module of one imports every other, indirectly."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for root in sorted(graph):  # Tarjan, iteratively
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next((w for w in edges if w not in index or w in on_stack), None)
            if nxt is not None:
                if nxt in index:
                    low[node] = min(low[node], index[nxt])
                else:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    return groups


def _cycle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest cycle through the group's first module (breadth first, inside the group)."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(group)}")


def test_the_package_folders_are_the_installed_ones() -> None:
    modules = project_modules()
    assert PACKAGE_DIRS["shardstore"] == ROOT / "src" / "shardstore"
    for name in ("shardstore.engine.shard.shard_copy", "shardstore.cluster_state.remote", "shardstore.spark.bridge",
                 "shardstore.segments.segment", "shardstore.translog.remote", "shardstore.blobstores",
                 "shardstore.plugins.s3", "shardstore.core.records", "shardstore.net.flight", "shardstore.testing.faulty"):
        assert name in modules, name
    placed = {p for paths in FOLDERS.values() for p in paths if not p.parent.name.startswith("pyspark_shardstore")}
    assert placed <= set(modules.values())


def test_no_import_cycle_between_modules() -> None:
    graph = import_graph()
    groups = cyclic_groups(graph)
    assert not groups, "import cycles (imports at any depth; move what both sides need below them):\n" + "\n".join(
        f"  {' -> '.join(_cycle_in(graph, group))}  (modules in the cycle: {', '.join(sorted(group))})"
        for group in groups)




def test_the_cycle_check_sees_imports_at_any_depth(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "a.py").write_text("from shardstore.pkg.b import B\n", encoding="utf-8")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from shardstore.pkg.c import C\n", encoding="utf-8")
    (package / "c.py").write_text("def f():\n    from . import a\n", encoding="utf-8")
    (package / "d.py").write_text("import shardstore.pkg.a\n", encoding="utf-8")
    graph = import_graph(project_modules({"shardstore.pkg": package}))
    assert graph["shardstore.pkg.c"] == {"shardstore.pkg.a"}
    assert graph["shardstore.pkg.d"] == {"shardstore.pkg.a"}
    assert import_cycles(graph) == [["shardstore.pkg.a", "shardstore.pkg.b", "shardstore.pkg.c", "shardstore.pkg.a"]]
    (package / "c.py").write_text("def f():\n    from shardstore.pkg import A\n", encoding="utf-8")
    graph = import_graph(project_modules({"shardstore.pkg": package}))
    assert graph["shardstore.pkg.c"] == {"shardstore.pkg"}  # a name of the package: its __init__
    assert import_cycles(graph) == []
