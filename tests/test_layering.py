"""Import rules between the packages (issue 17): the edges already cut stay cut.

Parses every module's imports (``ast``, module level and inside functions) and fails on an
edge the layering forbids.  The full rule set of the issue (engine and cluster_state apart,
spark alone importing pyspark) comes as the remaining edges are cut; these rules hold today:

* ``shardstore.core`` imports none of the packages above it;
* ``segments`` and ``translog`` do not import each other (``OpType`` and the no-operations
  seq# moved to ``shardstore.core``: ``segments/directory.py`` imported ``translog``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"core": ROOT / "shardstore" / "core", "segments": ROOT / "segments", "translog": ROOT / "translog"}
FORBIDDEN = {
    "core": ("shardstore.translog", "shardstore.segments", "shardstore.cluster_state", "shardstore.engine",
             "shardstore.spark", "shardstore.blobstores", "shardstore.plugins"),
    "segments": ("shardstore.translog",),
    "translog": ("shardstore.segments",),
}


def imports_of(path: Path) -> set[str]:
    """Every module name ``path`` imports (absolute imports; relative ones stay inside their package)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_module_imports_across_a_forbidden_edge(layer: str) -> None:
    bad = [f"{path.relative_to(ROOT)} imports {name}"
           for path in sorted(FOLDERS[layer].rglob("*.py"))
           for name in sorted(imports_of(path))
           if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[layer])]
    assert not bad, "\n".join(bad)


def test_the_parser_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from shardstore.translog.operations import OpType\n", encoding="utf-8")
    assert "shardstore.translog.operations" in imports_of(module)
