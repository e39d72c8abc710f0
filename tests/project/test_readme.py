"""Every code block of README.md and of the user docs beside it (docs/*.md) is run, so they cannot
drift from the code (issue 18).

Each Python block runs on its own, in a namespace of its own, as a user pasting that one block would,
in one process of the *installed wheel's* venv (session fixture ``venv``, tests/installed.py), with an
environment like a user's shell: no ``PYSPARK_*`` settings and no venv on ``PATH`` (so ``python3``
there is some other interpreter).  That is where ``shardstore.spark.register`` once failed with
``DATA_SOURCE_ALREADY_EXISTS`` while the editable dev install passed.  Then they all run a second time,
each in a new namespace of the same process: an example must work on every run (issue 32: the engine
example raised ``ClusterStateSuperseded`` and the API one ``IndexAlreadyExists`` the second time).
Nothing is rewritten: the examples make fresh directories with ``tempfile``, under this test's own
directory (``TMPDIR``).

- A ``print(...)`` line whose comment is a Python literal (``print(cluster.count("x"))  # 2``)
  must print that value.
- A block that imports what an extra brings (``pyspark``, ``shardstore.spark``, ``deltalake``...)
  names its install line in a comment (``# pip install '.[spark]'``); every ``pip install`` line, in
  a comment or an ``sh`` block, names only extras pyproject.toml declares, and the installed wheel
  provides them with their requirements installed.
- After the blocks, the same process checks the Spark example (the block that defines ``spark``
  and ``changes``) against the engine: each of ``format("shardstore")`` (the bridge),
  ``format("shardstore-arrow")`` and the changes feed sees the engine's count, and a second
  ``register`` is a no-op that still reports the bridge.

The ``sh`` blocks: every ``shardstore ...`` line runs through the wheel's console script (a
cloud URL gets the emulator's endpoint and test credentials appended as ``-o`` options);
``make demo`` runs for real (its data directory moved here); ``make test`` is this very suite,
so the test checks that ``.ci/run`` runs exactly it.  The ``toml`` block must parse and name
the registry's entry-point group.

A newcomer reads the README's first screen first (issue 45): its first 60 lines hold the two set-up
commands and a runnable example, and the README names no issue number and no commit hash.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardstore.blobstores.registry import GROUP
from tests.installed import PYPROJECT, REPO, bare_venv, clean_env, run

pytestmark = pytest.mark.slow

README = REPO / "README.md"
_FENCE = re.compile(r"^```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
#: No example may write to a fixed path here: a second run would meet the first one's files.
EXAMPLE_TMP = "/tmp/"
KNOWN = {"python", "sh", "toml"}
_PRINT_EXPECTED = re.compile(r"^\s*print\(.*\)\s+#\s*(?P<expected>.+?)\s*$")
#: the README's first screen: what a newcomer reads before scrolling
FIRST_SCREEN = 60
SETUP_COMMANDS = ("make demo", "make test")
ISSUE_NUMBER = re.compile(r"\bissues?\s+#?\d+", re.I)
#: 7 to 40 hex digits, at least one a digit and one a letter (so neither 1000000 nor a word like "defaced")
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", re.I)
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
#: a ``pip install`` target: this checkout (``.``) or the distribution by name, with extras
_PIP_TARGET = re.compile(r"(?:\.|shardstore)(?:\[(?P<extras>[\w,-]*)\])?")
_PIP_COMMENT = re.compile(r"^\s*#\s*(?P<line>pip install\s.*)$")


def documents() -> list[Path]:
    """The documents whose blocks run: README.md and the user docs in docs/ (not the design notes)."""
    return [README, *sorted((REPO / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Block:
    """One fenced code block of a document."""

    doc: str  # its path from the repository root
    lang: str
    body: str
    line: int  # of its first code line

    @property
    def label(self) -> str:
        return f"{self.doc}:{self.line}"


def doc_blocks(path: Path) -> list[Block]:
    """One document's fenced code blocks, in order."""
    text = path.read_text()
    doc = path.relative_to(REPO).as_posix()
    return [Block(doc, m["lang"], m["body"], text.count("\n", 0, m.start("body")) + 1) for m in _FENCE.finditer(text)]


def readme_blocks() -> list[Block]:
    """README.md's fenced code blocks, in order."""
    return doc_blocks(README)


def all_blocks() -> list[Block]:
    """Every document's blocks, README.md first."""
    return [b for path in documents() for b in doc_blocks(path)]


def expected_prints(body: str) -> dict[int, object]:
    """Line number (1-based, within the block) -> the literal its ``print`` must show."""
    out: dict[int, object] = {}
    for n, line in enumerate(body.splitlines(), 1):
        m = _PRINT_EXPECTED.match(line)
        if m:
            try:
                out[n] = ast.literal_eval(m["expected"])
            except (ValueError, SyntaxError):
                continue  # a comment in words, not a value
    return out


def user_env(**extra: str) -> dict[str, str]:
    """A user's shell: no PYSPARK_* settings, no virtualenv (nor the repo's .venv) on PATH."""
    env = {k: v for k, v in clean_env().items() if not k.startswith("PYSPARK_")}
    keep = [p for p in env.get("PATH", "").split(os.pathsep)
            if p and not Path(p).resolve().is_relative_to(Path(sys.prefix).resolve())]
    env["PATH"] = os.pathsep.join(keep)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # this machine's notes: Spark binds to loopback
    env.update(extra)
    return env


def test_every_block_has_a_runner():
    blocks = all_blocks()
    assert len(blocks) >= 8, f"the documents parsed into {len(blocks)} blocks only"
    assert {b.lang for b in blocks} <= KNOWN, [(b.label, b.lang) for b in blocks if b.lang not in KNOWN]
    for b in blocks:
        if b.lang == "sh":
            for line in _commands(b):
                assert line.split()[0] in ("make", "shardstore", "pip"), f"{b.label}: no runner for {line!r}"
    assert sum(len(expected_prints(b.body)) for b in blocks if b.lang == "python") >= 3


def test_expected_prints_are_read_from_comments():
    body = 'x = 1\nprint(x)   # 1\nprint(x)  # one, in words\nprint([{"a": 1}])  # [{"a": 1}]\n'
    assert expected_prints(body) == {2: 1, 4: [{"a": 1}]}


# --------------------------------------------------------------------------- the first screen, no issue numbers


def test_readme_first_screen_has_the_set_up_commands_and_an_example():
    screen = [b for b in readme_blocks() if b.line + b.body.count("\n") <= FIRST_SCREEN]
    commands = [c for b in screen if b.lang == "sh" for c in _commands(b)]
    for command in SETUP_COMMANDS:
        assert command in commands, f"README.md's first {FIRST_SCREEN} lines do not give `{command}`"
    examples = [b for b in screen if b.lang == "python"]
    assert examples, f"README.md's first {FIRST_SCREEN} lines hold no Python example"
    assert any(expected_prints(b.body) for b in examples), "the first example shows no printed value"


@pytest.mark.parametrize("path", documents(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_issue_numbers_or_commit_hashes(path: Path):
    text = path.read_text()
    where = path.relative_to(REPO).as_posix()
    for pattern, what in ((ISSUE_NUMBER, "an issue number"), (COMMIT_HASH, "a commit hash")):
        found = [(text.count("\n", 0, m.start()) + 1, m[0]) for m in pattern.finditer(text)]
        assert not found, f"{where} names {what}: " + ", ".join(f"line {n}: {s!r}" for n, s in found)


def test_issue_and_hash_patterns():
    assert ISSUE_NUMBER.search("fixed (issue 18)") and ISSUE_NUMBER.search("Issues #31")
    assert not ISSUE_NUMBER.search("an issue with 3 nodes")
    assert COMMIT_HASH.search("on 83d01f3 (stop 30)") and COMMIT_HASH.search("a" * 39 + "1")
    assert not COMMIT_HASH.search("336776 rows, 1000000 ops, a defaced blob, 83d01f")


# --------------------------------------------------------------------------- install lines and extras


def pip_extras(line: str) -> set[str]:
    """The extras a ``pip install`` line names; it installs this checkout or ``shardstore``, nothing else."""
    argv = shlex.split(line)
    assert argv[:2] == ["pip", "install"] and len(argv) > 2, line
    extras: set[str] = set()
    for target in argv[2:]:
        m = _PIP_TARGET.fullmatch(target)
        assert m, f"{line!r}: installs {target!r}, not shardstore"
        extras |= {e.strip() for e in (m["extras"] or "").split(",") if e.strip()}
    return extras


def install_lines(block: Block) -> list[str]:
    """The block's ``pip install`` lines: commands of an sh block, comments of a Python block."""
    if block.lang == "sh":
        return [c for c in _commands(block) if c.split()[0] == "pip"]
    if block.lang == "python":
        out = []
        for raw in block.body.splitlines():
            m = _PIP_COMMENT.match(raw)
            if m:
                out.append(re.sub(r"\s+#.*$", "", m["line"]).strip())
        return out
    return []


def _requirement_name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", requirement)[0].lower().replace("-", "_")


def extras_for_module(module: str) -> set[str]:
    """The extras that bring ``module`` (a dotted import name); none for the base install."""
    if module == "shardstore.spark" or module.startswith(("shardstore.spark.", "pyspark_shardstore")):
        return {"spark"}
    top = module.split(".")[0].lower()
    return {extra for extra, reqs in EXTRAS.items() if top in {_requirement_name(r) for r in reqs}}


def imported_modules(body: str) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(body)):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def test_install_lines_name_declared_extras():
    lines = [(b, line) for b in all_blocks() for line in install_lines(b)]
    assert lines, "no block gives an install line"
    for b, line in lines:
        unknown = pip_extras(line) - set(EXTRAS)
        assert not unknown, f"{b.label}: {line!r} names extras pyproject.toml does not declare: {unknown}"
    with pytest.raises(AssertionError):
        pip_extras("pip install pyspark")
    assert pip_extras("pip install '.[spark,bench]'") == {"spark", "bench"}
    assert pip_extras("pip install shardstore") == set()


def test_each_block_names_the_extra_it_needs():
    needing = 0
    for b in all_blocks():
        if b.lang != "python":
            continue
        named = set().union(*(pip_extras(line) for line in install_lines(b)))
        for module in sorted(imported_modules(b.body)):
            need = extras_for_module(module)
            if need:
                needing += 1
                assert need & named, (f"{b.label}: imports {module}, which needs pip install '.[{sorted(need)[0]}]'; "
                                      f"give that line as a comment in the block")
    assert needing, "no example needs an extra: the Spark example should"
    assert extras_for_module("pyspark.sql") == {"spark"} and extras_for_module("shardstore.spark") == {"spark"}
    assert extras_for_module("deltalake") == {"bench"} and not extras_for_module("shardstore.engine")


# --------------------------------------------------------------------------- python blocks

_RUNNER = r'''
import builtins, importlib.metadata as md, json, re, sys
spec = json.load(open(sys.argv[1]))
labels = {block["label"] for block in spec["blocks"]}
printed = {}


def _print(*args, sep=" ", end="\n", file=None, flush=False):
    frame = sys._getframe(1)
    name = frame.f_code.co_filename
    if file is None and name in labels:
        printed.setdefault(name, {}).setdefault(frame.f_lineno, []).append(sep.join(map(str, args)))
    builtins.print(*args, sep=sep, end=end, file=file, flush=flush)


spark_space = None
for run in (1, 2):  # every example works again, as it is
    for block in spec["blocks"]:
        space = {"__name__": "__readme__", "print": _print}  # each block on its own
        exec(compile(block["source"], block["label"], "exec"), space)
        if "spark" in space and "changes" in space:
            spark_space = space

# the install lines' extras: the installed wheel declares each one, and its requirements are installed
requires = md.distribution("shardstore").requires or []
extras = {}
for extra in spec["extras"]:
    names = [re.match(r"[A-Za-z0-9._-]+", r)[0] for r in requires
             if re.search(r"extra\s*==\s*['\"]" + re.escape(extra) + r"['\"]", r)]
    missing = []
    for name in names:
        try:
            md.distribution(name)
        except md.PackageNotFoundError:
            missing.append(name)
    extras[extra] = {"provided": extra in (md.metadata("shardstore").get_all("Provides-Extra") or []),
                     "requirements": names, "missing": missing}

# the Spark example against the engine
import shardstore.spark
from shardstore.engine import Cluster
spark, url = spark_space["spark"], spark_space["url"]
restored = Cluster.restore(store=url, data_dir=spec["check_dir"], nodes=1)
engine_count = restored.count("flights")
restored.close()
counts = {fmt: spark.read.format(fmt).option("store", url).option("index", "flights").load().count()
          for fmt in ("shardstore", "shardstore-arrow")}
result = {
    "printed": printed,
    "extras": extras,
    "engine_count": engine_count,
    "counts": counts,
    "changes": spark_space["changes"].count(),
    "bridge": spark_space["bridge"],
    "register_again": shardstore.spark.register(spark),
    "shardstore_file": shardstore.__file__,
}
spark.stop()
builtins.print(json.dumps(result))
'''


def test_python_blocks_run_in_the_installed_wheel(venv, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    blocks = [b for b in all_blocks() if b.lang == "python"]
    assert not any(EXAMPLE_TMP in b.body for b in blocks), "an example writes to a fixed /tmp/ path: use tempfile"
    spec = {
        "blocks": [{"label": b.label, "source": b.body} for b in blocks],
        "extras": sorted(set().union(*(pip_extras(line) for b in all_blocks() for line in install_lines(b)))),
        "check_dir": str(tmp_path / "check-nodes"),
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "runner.py").write_text(_RUNNER)
    proc = subprocess.run([str(venv["python"]), "-I", str(tmp_path / "runner.py"), str(tmp_path / "spec.json")],
                          cwd=work, env=user_env(TMPDIR=str(work)), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"the documents' blocks failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])

    assert Path(res["shardstore_file"]).resolve().is_relative_to(Path(venv["site"]).resolve())
    checked = 0
    for b in blocks:
        for n, want in expected_prints(b.body).items():
            got = res["printed"].get(b.label, {}).get(str(n))
            where = f"{b.doc}:{b.line + n - 1}"
            assert got, f"{where}: printed nothing"
            assert len(got) == 2, f"{where}: printed {len(got)} times in two runs"
            assert [ast.literal_eval(g) for g in got] == [want] * len(got), f"{where}: {got}"
            checked += 1
    assert checked >= 3
    assert "spark" in res["extras"], res["extras"]
    for extra, found in res["extras"].items():
        assert found["provided"] and found["requirements"] and not found["missing"], (extra, found)
    assert res["bridge"] is True and res["register_again"] is True
    assert res["engine_count"] == 2
    assert res["counts"] == {"shardstore": 2, "shardstore-arrow": 2}
    assert res["changes"] >= 2  # every op since seq# 0, the sink's append of the same ids included


# --------------------------------------------------------------------------- sh and toml blocks


def _commands(block: Block) -> list[str]:
    """The block's command lines, trailing comments cut."""
    out = []
    for raw in block.body.splitlines():
        line = re.sub(r"\s+#.*$", "", raw).strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def _sh_lines(first_word: str) -> list[tuple[Block, str]]:
    return [(b, c) for b in all_blocks() if b.lang == "sh" for c in _commands(b) if c.split()[0] == first_word]


def test_cli_lines_run_through_the_installed_console_script(venv, s3_emulator, oci_emulator, tmp_path):
    lines = _sh_lines("shardstore")
    assert len(lines) >= 4
    emulators = {"s3": s3_emulator, "oci": oci_emulator}
    for block, line in lines:
        argv = shlex.split(line)
        argv[0] = str(venv["bin"] / "shardstore")
        for arg in list(argv):
            scheme, sep, rest = arg.partition("://")
            if not sep:
                continue
            assert scheme in emulators, f"{block.label}: no emulator for {arg}"
            emu = emulators[scheme]
            emu.make_bucket(rest.split("/")[0])
            for key, value in emu.store_options().items():
                if f"{key}=" not in line:  # the document's own options stay as written
                    argv += ["-o", f"{key}={value}"]
        out = run(argv, cwd=tmp_path, timeout=180)
        assert out.strip(), f"{block.label}: {line!r} printed nothing"
        if argv[1:2] == ["--version"]:
            assert out.startswith("shardstore ")


def test_make_lines_are_the_makefile_and_ci(tmp_path):
    lines = [c for _b, c in _sh_lines("make")]
    assert lines == ["make demo", "make test"], lines
    # make test is this suite; CI runs exactly it
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert "make test" in ci
    # make demo runs for real: the main job on the local-filesystem store. In a venv of its own (this one's
    # packages borrowed): its `make install` puts an editable install there, never over the package this suite
    # runs against (that reinstall, mid-run, once took the files from under every later test)
    (tmp_path / "demo-venv").mkdir()
    venv = bare_venv(tmp_path / "demo-venv")
    proc = subprocess.run(["make", "demo", f"VENV={venv['root']}", f"DEMO_DIR={tmp_path / 'demo'}"], cwd=REPO,
                          env=clean_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"make demo failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert "OK" in proc.stdout and "MISMATCH" not in proc.stdout, proc.stdout[-4000:]


def test_toml_block_declares_a_plugin_in_the_registry_group():
    (block,) = [b for b in all_blocks() if b.lang == "toml"]
    doc = tomllib.loads(block.body)
    targets = doc["project"]["entry-points"][GROUP]
    assert targets, "the README's plugin example declares no entry point"
    for scheme, target in targets.items():
        assert re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme), scheme
        assert re.fullmatch(r"[\w.]+:\w+", target), target
