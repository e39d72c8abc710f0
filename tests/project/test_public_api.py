"""The public surface of ``shardstore`` (issue 17): a handful of names, cheap to import.

``shardstore`` exports ``open_store``, ``Cluster``, ``open_commit``, the error kinds and
``__version__``; the heavy three are imported on first use (PEP 562), so importing
``shardstore`` or ``shardstore.errors`` loads no engine.  Test tools (``FaultyStore``)
are in ``shardstore.testing``, not in ``shardstore.blobstores``.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import shardstore
import shardstore.blobstores
import shardstore.errors
import shardstore.testing

#: the documented public names of ``shardstore`` (its docstring and the README's Python API)
DOCUMENTED = {
    "open_store",
    "Cluster",
    "open_commit",
    "connect",
    "ShardstoreError",
    "ConflictError",
    "CorruptError",
    "InvalidError",
    "NotFoundError",
    "UnavailableError",
    "LocalDiskError",
    "__version__",
}
LAZY = {"Cluster": "shardstore.engine", "connect": "shardstore.engine", "open_commit": "shardstore.segments", "open_store": "shardstore.blobstores"}
#: what a light import must not load
HEAVY = ("shardstore.engine", "shardstore.segments", "shardstore.translog", "shardstore.cluster_state",
         "shardstore.spark", "shardstore.testing", "pyarrow")


def _fresh(code: str, tmp_path: Path) -> dict:
    """Run ``code`` in a fresh interpreter (outside the repository); it prints one JSON line."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_all_is_exactly_the_documented_names() -> None:
    assert len(shardstore.__all__) == len(set(shardstore.__all__))
    assert set(shardstore.__all__) == DOCUMENTED
    for name in DOCUMENTED - {"__version__"}:
        assert name in shardstore.__doc__, f"{name} is exported but not in the package docstring"


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_each_public_name_resolves(name: str) -> None:
    assert getattr(shardstore, name) is not None
    assert name in dir(shardstore)


def test_the_names_are_the_library_objects() -> None:
    from shardstore.blobstores import open_store
    from shardstore.engine import Cluster
    from shardstore.segments.reader import open_commit

    assert shardstore.open_store is open_store
    assert shardstore.Cluster is Cluster
    assert shardstore.open_commit is open_commit
    from shardstore.engine.client import connect

    assert shardstore.connect is connect
    for kind in ("ShardstoreError", "ConflictError", "CorruptError", "InvalidError", "NotFoundError",
                 "UnavailableError", "LocalDiskError"):
        assert getattr(shardstore, kind) is getattr(shardstore.errors, kind)
    assert isinstance(shardstore.__version__, str) and shardstore.__version__


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'FaultyStore'"):
        _ = shardstore.FaultyStore
    assert not hasattr(shardstore, "no_such_name")


@pytest.mark.parametrize("statement", ["import shardstore.errors", "import shardstore",
                                       "from shardstore import ShardstoreError, __version__"])
def test_light_imports_load_no_engine(statement: str, tmp_path: Path) -> None:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    loaded = set(_fresh(code, tmp_path))
    assert "shardstore.errors" in loaded
    assert [m for m in HEAVY if m in loaded] == []
    assert "shardstore.blobstores" not in loaded


def test_blobstores_import_loads_no_engine_nor_test_tools(tmp_path: Path) -> None:
    loaded = set(_fresh("import json, sys\nimport shardstore.blobstores\nprint(json.dumps(sorted(sys.modules)))",
                        tmp_path))
    assert "shardstore.blobstores" in loaded
    assert [m for m in HEAVY if m in loaded] == []


def test_a_heavy_name_is_imported_on_first_use(tmp_path: Path) -> None:
    code = """import json, sys
import shardstore
before = {m: m in sys.modules for m in %r}
loaded = {}
for name, module in %r.items():
    getattr(shardstore, name)
    loaded[name] = module in sys.modules
from shardstore import *
print(json.dumps({"before": before, "loaded": loaded, "star": sorted(n for n in dir() if n in shardstore.__all__),
                  "cached": all(n in vars(shardstore) for n in shardstore.__all__)}))
""" % (sorted(set(LAZY.values())), LAZY)
    res = _fresh(code, tmp_path)
    assert res["before"] == {m: False for m in set(LAZY.values())}
    assert res["loaded"] == {name: True for name in LAZY}
    assert set(res["star"]) == DOCUMENTED
    assert res["cached"] is True


def test_blobstores_no_longer_exports_the_test_tools() -> None:
    for name in ("FaultyStore", "FaultRule", "SimulatedCrash"):
        assert not hasattr(shardstore.blobstores, name), name
        assert name not in shardstore.blobstores.__all__
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("shardstore.blobstores.faulty")


def test_testing_exports_the_fault_injector() -> None:
    from shardstore.blobstores import TransientError, open_backend
    from shardstore.testing import FaultRule, FaultyStore, SimulatedCrash

    assert set(shardstore.testing.__all__) == {"FaultRule", "FaultyStore", "SimulatedCrash"}
    assert FaultyStore.__module__ == "shardstore.testing.faulty"
    store = FaultyStore(open_backend("memory://public-api-faulty"), [FaultRule(op="put", action="crash_after")])
    with pytest.raises(SimulatedCrash):
        store.put("k", b"v")
    assert store.inner.get("k") == b"v"  # crash_after: the write landed, the reply was "lost"
    assert issubclass(SimulatedCrash, TransientError)
    store.put("k2", b"v2")  # the rule fired once
    assert store.get("k2") == b"v2"
