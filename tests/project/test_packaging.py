"""Packaging: the wheel installs one import package, ``shardstore``, with working plugins.

The repository keeps its code folders (engine/, translog/, segments/, blobstores/,
plugins/, src/shardstore/) at the root and maps them into ``shardstore.*`` with setuptools'
package-dir.  Nothing at the root is named ``shardstore``: a Python started in the
repository imports the installed package, not a partial copy that would shadow it.  These tests build the real wheel, install it into a fresh virtualenv and use
it from outside the repository, install the third-party demo plugin of tests/plugin_pkg
next to it, and check that the editable install of the development venv also works from
elsewhere.

The wheel and the venv are the session fixtures ``wheel`` and ``venv`` (tests/installed.py).
"""

from __future__ import annotations

import json
import re
import shutil
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.installed import (
    IGNORE,
    PACKAGE_DIR,
    PYPROJECT,
    REPO,
    inside,
    make_editable_venv,
    run,
    run_json,
    setuptools_builds_wheels_offline,
)

pytestmark = pytest.mark.slow

PLUGIN_PKG = Path(__file__).resolve().parent.parent / "plugin_pkg"
VERSION = PYPROJECT["project"]["version"]
#: The only top-level modules besides shardstore, on purpose: Spark 4.x registers the
#: ``DefaultSource`` of every installed ``pyspark_*`` module by itself (issue 7).
SPARK_AUTOLOAD = {"pyspark_shardstore", "pyspark_shardstore_changes", "pyspark_shardstore_arrow"}
SUBPACKAGES = {k: v for k, v in PACKAGE_DIR.items() if k not in SPARK_AUTOLOAD}
TOP_LEVEL_FOLDERS = sorted(d for d in SUBPACKAGES.values() if d != "src/shardstore")
SCHEMES = set(PYPROJECT["project"]["entry-points"]["shardstore.blobstores"])
BUILTIN_SCHEMES = {"memory", "file", "s3", "oci", "gs", "az"}
MODULES = ["shardstore", *sorted(SUBPACKAGES)]  # shardstore, shardstore.blobstores, ...


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def built_from(wheel) -> Path:
    """The source snapshot the wheel was built from (the repo may change meanwhile)."""
    return wheel.parent.parent / "src"


@pytest.fixture(scope="module")
def venv_with_plugin(venv) -> dict[str, Path]:
    """The venv above plus the demo plugin of tests/plugin_pkg, installed by pip."""
    src = venv["base"] / "plugin_pkg"
    shutil.copytree(PLUGIN_PKG, src, ignore=IGNORE)
    cmd: list[str | Path] = [venv["python"], "-m", "pip", "install", "--no-deps"]
    if setuptools_builds_wheels_offline():
        cmd += ["--no-build-isolation", "--no-index"]
    # else: pip fetches setuptools for an isolated build (the only download here).
    run([*cmd, src], cwd=venv["base"], timeout=300)
    return venv


# --------------------------------------------------------------------------- the wheel


def test_wheel_holds_only_the_shardstore_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = f"shardstore-{VERSION}.dist-info/"
    allowed = ("shardstore/", dist_info, *(f"{m}/" for m in SPARK_AUTOLOAD))
    stray = [n for n in names if not n.startswith(allowed)]
    assert stray == [], f"files outside shardstore/ in the wheel: {stray}"
    zf = zipfile.ZipFile(wheel)
    assert sorted(zf.read(dist_info + "top_level.txt").decode().split()) == sorted({"shardstore", *SPARK_AUTOLOAD})
    for m in SPARK_AUTOLOAD:  # each only re-exports a DefaultSource from shardstore.spark
        assert "from shardstore.spark." in zf.read(f"{m}/__init__.py").decode()
    eps = zf.read(dist_info + "entry_points.txt").decode()
    assert "shardstore = shardstore.cli:main" in eps
    for scheme in SCHEMES:
        assert re.search(rf"^{scheme} = shardstore\.plugins\.\w+:\w+$", eps, re.M), scheme


def test_wheel_contains_every_source_module(wheel, built_from):
    """Every .py file of the mapped folders is in the wheel, at its mapped place.

    Catches subpackages added under a folder but missing from the explicit
    ``packages`` list in pyproject.toml (setuptools would silently leave them out).
    """
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = []
    for package, folder in PACKAGE_DIR.items():
        for py in sorted((built_from / folder).rglob("*.py")):
            rel = py.relative_to(built_from / folder).as_posix()
            target = package.replace(".", "/") + "/" + rel
            if target not in names:
                missing.append(f"{folder}/{rel} -> {target}")
    assert missing == [], "source files left out of the wheel:\n" + "\n".join(missing)
    # the Spark bridge's Java sources and service file (package data, compiled on first use)
    jvm = sorted(p.relative_to(built_from / "spark").as_posix() for p in (built_from / "spark" / "jvm").rglob("*")
                 if p.is_file())
    assert any(j.endswith("DefaultSource.java") for j in jvm) and any("META-INF/services/" in j for j in jvm)
    left_out = [j for j in jvm if f"shardstore/spark/{j}" not in names]
    assert left_out == [], f"bridge sources left out of the wheel: {left_out}"


# --------------------------------------------------------------------------- installed wheel

_CHECK_INSTALLED = """
import importlib.metadata as md, importlib.util, json, sys, sysconfig
import shardstore, shardstore.blobstores, shardstore.engine, shardstore.translog
import shardstore.segments, shardstore.plugins, shardstore.plugins.local, shardstore.cluster_state, shardstore.spark
from shardstore.blobstores import BlobAlreadyExists, open_store, plugins

root = sys.argv[1]
store = open_store("file://" + root + "/store?fsync=false")
first = store.put("a/b", b"one", if_absent=True)
try:
    store.put("a/b", b"two", if_absent=True)
    conflict = False
except BlobAlreadyExists:
    conflict = True

print(json.dumps({
    "files": {m: sys.modules[m].__file__ for m in sys.argv[2].split(",")},
    "site": sysconfig.get_path("purelib"),
    "version": shardstore.__version__,
    "size": first.size,
    "conflict": conflict,
    "get": store.get("a/b").decode(),
    "eps": {ep.name: [ep.value, str(ep.dist.locate_file(""))]
            for ep in md.entry_points(group="shardstore.blobstores")},
    "dists": [str(d.locate_file("")) for d in md.distributions() if d.metadata["Name"] == "shardstore"],
    "plugins": [[p.scheme, p.target, p.package, p.version] for p in plugins()],
    "top_level": {n: getattr(importlib.util.find_spec(n), "origin", None) for n in sys.argv[3].split(",")},
    "editable_hooks": [repr(f) for f in sys.meta_path if "editable" in repr(f).lower()],
}))
"""


def test_installed_wheel_works_outside_the_repo(venv, tmp_path):
    res = run_json(
        venv["python"], _CHECK_INSTALLED, str(tmp_path), ",".join(MODULES), ",".join(TOP_LEVEL_FOLDERS),
        cwd=tmp_path,
    )
    site = res["site"]
    assert inside(site, venv["root"])
    # Every subpackage is the wheel's copy, in the new venv, not the source tree.
    for mod, path in res["files"].items():
        assert inside(path, site), f"{mod} imported from {path}, not from {site}"
        assert not inside(path, REPO), f"{mod} leaked in from the source tree: {path}"
    assert res["editable_hooks"] == []
    assert res["version"] == VERSION
    # Conditional put/get round trip through the file:// plugin.
    assert (res["size"], res["conflict"], res["get"]) == (3, True, "one")
    # Exactly one shardstore distribution is visible (the dev venv's metadata did not leak).
    assert len(res["dists"]) == 1 and inside(res["dists"][0], site), res["dists"]
    # The built-in schemes come from the installed wheel's metadata.
    assert BUILTIN_SCHEMES <= set(res["eps"])
    for scheme in BUILTIN_SCHEMES:
        target, where = res["eps"][scheme]
        assert target.startswith("shardstore.plugins.")
        assert inside(where, site)
    plugins = {p[0]: p for p in res["plugins"]}
    for scheme in BUILTIN_SCHEMES:
        assert plugins[scheme][2:] == ["shardstore", VERSION]
    # No repo-root folder became a top-level package.
    assert res["top_level"] == {name: None for name in TOP_LEVEL_FOLDERS}


def test_the_installed_package_imports_inside_the_repository_root(venv):
    # `python -c` puts the current directory first on sys.path: in the repository root a folder named
    # shardstore/ (the layout before src/) shadowed the installed package, and shardstore.engine was missing
    out = run([venv["python"], "-c", "import json, shardstore, shardstore.engine, shardstore.cli; "
               "print(json.dumps([shardstore.__file__, shardstore.engine.__file__]))"], cwd=REPO)
    files = json.loads(out.strip().splitlines()[-1])
    assert all(inside(f, venv["site"]) for f in files), files


def test_no_stray_top_level_packages_in_site_packages(venv):
    site = venv["site"]
    for name in TOP_LEVEL_FOLDERS:
        assert not (site / name).exists(), f"top-level {name}/ installed into site-packages"
        assert not (site / f"{name}.py").exists()
    assert (site / "shardstore" / "__init__.py").is_file()
    for folder in TOP_LEVEL_FOLDERS:
        assert (site / "shardstore" / folder / "__init__.py").is_file()
    # RECORD: only the package, its .dist-info and the console script (outside site-packages).
    record = (site / f"shardstore-{VERSION}.dist-info" / "RECORD").read_text()
    tops = {line.split(",")[0].split("/")[0] for line in record.splitlines() if line}
    assert tops - {".."} == {"shardstore", f"shardstore-{VERSION}.dist-info", *SPARK_AUTOLOAD}, tops


# --------------------------------------------------------------------------- third-party plugin

_CHECK_PLUGIN = """
import json, sys
import shardstore_demo_plugin
from shardstore.blobstores import open_store, plugins
from shardstore.plugins.memory import MemoryStore

store = open_store("demo://pkgtest/root")
store.put("k", b"third-party", if_absent=True)
print(json.dumps({
    "module": shardstore_demo_plugin.__file__,
    "subclass": issubclass(shardstore_demo_plugin.DemoStore, MemoryStore),
    "type": type(store.inner).__module__ + ":" + type(store.inner).__name__,
    "get": store.get("k").decode(),
    "plugins": {p.scheme: [p.target, p.package, p.version] for p in plugins()},
}))
"""


def test_third_party_plugin_installs_and_registers(venv_with_plugin, tmp_path):
    v = venv_with_plugin
    meta = tomllib.loads((PLUGIN_PKG / "pyproject.toml").read_text())["project"]
    res = run_json(v["python"], _CHECK_PLUGIN, cwd=tmp_path)
    assert inside(res["module"], v["site"])
    assert res["subclass"] is True
    assert res["type"] == "shardstore_demo_plugin:DemoStore"
    assert res["get"] == "third-party"
    target, package, version = res["plugins"]["demo"]
    assert target == "shardstore_demo_plugin:DemoStore"
    assert _norm(package) == _norm(meta["name"])
    assert version == meta["version"]
    assert BUILTIN_SCHEMES <= set(res["plugins"])


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# --------------------------------------------------------------------------- console script


def test_console_script_version(venv):
    out = run([venv["bin"] / "shardstore", "--version"], cwd=venv["base"])
    assert out.strip() == f"shardstore {VERSION}"
    # The console script's shebang is the venv's interpreter.
    assert (venv["bin"] / "shardstore").read_text().splitlines()[0] == f"#!{venv['python']}"


def test_console_script_lists_plugins_with_packages(venv_with_plugin, tmp_path):
    v = venv_with_plugin
    meta = tomllib.loads((PLUGIN_PKG / "pyproject.toml").read_text())["project"]
    out = run([v["bin"] / "shardstore", "plugins"], cwd=tmp_path)
    lines = [line for line in out.splitlines() if line.strip()]

    def line_for(scheme: str) -> str:
        found = [line for line in lines if re.search(rf"(^|\s){re.escape(scheme)}(\s|:|$)", line)]
        assert len(found) == 1, f"expected one line for {scheme!r} in:\n{out}"
        return found[0]

    demo = line_for("demo")
    assert "shardstore_demo_plugin:DemoStore" in demo
    assert _norm(meta["name"]) in _norm(demo)
    assert meta["version"] in demo
    for scheme, target in PYPROJECT["project"]["entry-points"]["shardstore.blobstores"].items():
        line = line_for(scheme)
        assert target in line and "shardstore" in line and VERSION in line


# --------------------------------------------------------------------------- editable install

_CHECK_EDITABLE = """
import importlib.util, json, sys
import shardstore, shardstore.blobstores, shardstore.plugins.local
import shardstore.engine, shardstore.translog, shardstore.segments, shardstore.plugins, shardstore.cluster_state
import shardstore.spark
from shardstore.blobstores import open_store, schemes

store = open_store("file://" + sys.argv[1] + "/store?fsync=false")
store.put("x", b"editable", if_absent=True)
print(json.dumps({
    "files": {m: sys.modules[m].__file__
              for m in sys.argv[2].split(",") + ["shardstore.plugins.local"]},
    "get": store.get("x").decode(),
    "schemes": schemes(),
    "top_level": {n: getattr(importlib.util.find_spec(n), "origin", None) for n in sys.argv[3].split(",")},
}))
"""


def test_editable_install_imports_from_outside_the_repo(tmp_path):
    # its own editable install of a copy of the tree: the suite itself runs against the installed wheel
    editable = make_editable_venv(tmp_path / "editable")
    res = run_json(
        editable["python"], _CHECK_EDITABLE, str(tmp_path), ",".join(MODULES), ",".join(TOP_LEVEL_FOLDERS),
        cwd=tmp_path,
    )
    tree = editable["tree"]
    expected = {
        pkg: tree / folder / "__init__.py" for pkg, folder in PACKAGE_DIR.items()
    }
    expected["shardstore.plugins.local"] = tree / "plugins" / "local.py"
    for mod, path in res["files"].items():
        assert Path(path).resolve() == expected[mod].resolve(), (mod, path)
    assert res["get"] == "editable"
    assert BUILTIN_SCHEMES <= set(res["schemes"])
    # The editable finder maps only shardstore.*: the repo-root folders are not importable
    # as top-level packages from elsewhere.
    assert res["top_level"] == {name: None for name in TOP_LEVEL_FOLDERS}
