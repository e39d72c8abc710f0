"""Build shardstore's wheel and install it into a fresh venv: what a user's ``pip install`` gives.

Shared by the packaging tests and the README tests (session fixtures ``wheel`` and ``venv`` in
conftest.py), so one wheel and one venv serve the whole run.

The fresh venv gets the already-installed third-party dependencies (pyarrow, fsspec,
s3fs, pyspark, ...) without downloading them: a ``.pth`` file points at a directory of
symlinks to the dev venv's site-packages entries, leaving out shardstore's own editable
install (its ``.dist-info``, its ``__editable__`` finder and every ``.pth`` file).  A path
listed in a ``.pth`` file is only appended to sys.path, its own ``.pth`` files are not run,
so nothing of the source tree can leak in: ``shardstore`` must come from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
from importlib.metadata import version as dist_version
from importlib.util import find_spec
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PACKAGE_DIR: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]

IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")


def copy_build_inputs(dest: Path) -> None:
    """Copy what a wheel build reads: pyproject.toml, its readme/license files, the code.

    An allowlist, so unrelated trees at the root (.venv, node_modules, ...) are not copied.
    """
    dest.mkdir(parents=True)
    files = {"pyproject.toml", "setup.py", "setup.cfg", "MANIFEST.in"}
    readme = PYPROJECT["project"].get("readme")
    if isinstance(readme, str):
        files.add(readme)
    elif isinstance(readme, dict) and "file" in readme:
        files.add(readme["file"])
    files.update(p.name for p in REPO.glob("LICEN[CS]E*"))
    for name in files:
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, dest / name)
    for folder in sorted(set(PACKAGE_DIR.values())):
        shutil.copytree(REPO / folder, dest / folder, ignore=IGNORE)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything that could point Python at the source tree.

    PIP_* settings (index, certificates, find-links) are kept: the isolated builds use them.
    """
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith("PYTHON") and k not in ("VIRTUAL_ENV", "__PYVENV_LAUNCHER__")
    }
    env.update(PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    env.update(extra)
    return env


def run(cmd: list[str | Path], *, cwd: Path, timeout: float = 120, **env: str) -> str:
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=clean_env(**env), capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        pytest.fail(
            f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
            f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"
        )
    return proc.stdout


def run_json(python: Path, script: str, *args: str, cwd: Path) -> dict:
    """Run ``script`` isolated (-I: no cwd, no PYTHON* variables) and parse its last line."""
    out = run([python, "-I", "-c", textwrap.dedent(script), *args], cwd=cwd)
    return json.loads(out.strip().splitlines()[-1])


def inside(path: str | Path, root: str | Path) -> bool:
    return Path(path).resolve().is_relative_to(Path(root).resolve())


def setuptools_builds_wheels_offline() -> bool:
    """True if the dev venv's setuptools can build a wheel with no extra download."""
    try:
        major, minor = (int(x) for x in dist_version("setuptools").split(".")[:2])
    except Exception:
        return False
    return (major, minor) >= (70, 1) or find_spec("wheel") is not None


def build_wheel(base: Path) -> Path:
    """shardstore's wheel, built with ``python -m build`` from a copy of the repository under ``base``.

    A copy, so the build's ``build/`` and ``*.egg-info`` directories never land in the
    working tree (where other test runs may be building at the same time).
    """
    src = base / "src"
    copy_build_inputs(src)
    out = base / "dist"
    run([sys.executable, "-m", "build", "--wheel", "--outdir", out, src], cwd=base, timeout=300)
    (whl,) = out.glob("shardstore-*.whl")
    return whl


def make_venv(base: Path, wheel: Path) -> dict[str, Path]:
    """A fresh venv under ``base`` with ``wheel`` installed (pip --no-index) and the deps borrowed."""
    venv = bare_venv(base)
    run([venv["python"], "-m", "pip", "install", "--no-deps", "--no-index", wheel], cwd=base)
    return venv


def make_editable_venv(base: Path) -> dict[str, Path]:
    """A fresh venv under ``base`` with an editable install of a copy of the repository (``base/tree``), deps
    borrowed: what a developer's ``pip install -e .`` gives, whatever the dev venv itself holds."""
    tree = base / "tree"
    copy_build_inputs(tree)
    venv = bare_venv(base)
    run([venv["python"], "-m", "pip", "install", "-q", "--no-deps", "-e", tree], cwd=base, timeout=300)
    return {**venv, "tree": tree}


def bare_venv(base: Path) -> dict[str, Path]:
    """A fresh venv under ``base`` without shardstore, the dev venv's other packages borrowed (see the module)."""
    root = base / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", root], cwd=base)
    py = root / "bin" / "python"
    site = Path(run([py, "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=base).strip())
    assert inside(site, root)

    # Borrow the dev venv's installed packages (pip included) through symlinks, minus
    # shardstore itself and every .pth file (the __editable__ finder hook among them).
    dev_site = Path(sysconfig.get_path("purelib"))
    deps = base / "borrowed-site-packages"
    deps.mkdir()
    for entry in dev_site.iterdir():
        name = entry.name
        if name.lower().startswith(("shardstore", "__editable__")) or name.endswith(".pth"):
            continue
        (deps / name).symlink_to(entry)
    (site / "_borrowed_deps.pth").write_text(f"{deps}\n")
    return {"root": root, "python": py, "bin": root / "bin", "site": site, "base": base}
