"""Every code block of README.md is run, so the README cannot drift from the code (issue 18).

The Python blocks run in order in one namespace, as a user pasting them into one session
would, in one process of the *installed wheel's* venv (session fixture ``venv``,
tests/installed.py), with an environment like a user's shell: no ``PYSPARK_*`` settings and
no venv on ``PATH`` (so ``python3`` there is some other interpreter).  That is where
``shardstore.spark.register`` once failed with ``DATA_SOURCE_ALREADY_EXISTS`` while the
editable dev install passed.  Then they all run a second time, in a new namespace of the
same process: an example must work on every run (issue 32: the engine example raised
``ClusterStateSuperseded`` and the API one ``IndexAlreadyExists`` the second time).  Nothing
is rewritten: the examples make fresh directories with ``tempfile``, under this test's own
directory (``TMPDIR``).

- A ``print(...)`` line whose comment is a Python literal (``print(cluster.count("x"))  # 2``)
  must print that value.
- After the blocks, the same process checks the Spark example against the engine: each of
  ``format("shardstore")`` (the bridge), ``format("shardstore-arrow")`` and the changes feed
  sees the engine's count, and a second ``register`` is a no-op that still reports the bridge.

The ``sh`` blocks: every ``shardstore ...`` line runs through the wheel's console script (a
cloud URL gets the emulator's endpoint and test credentials appended as ``-o`` options);
``make demo`` runs for real (its data directory moved here); ``make test`` is this very suite,
so the test checks that ``.ci/run`` runs exactly it.  The ``toml`` block must parse and name
the registry's entry-point group.
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
from tests.installed import REPO, bare_venv, clean_env, run

pytestmark = pytest.mark.slow

README = REPO / "README.md"
_FENCE = re.compile(r"^```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
#: No example may write to a fixed path here: a second run would meet the first one's files.
EXAMPLE_TMP = "/tmp/"
KNOWN = {"python", "sh", "toml"}
_PRINT_EXPECTED = re.compile(r"^\s*print\(.*\)\s+#\s*(?P<expected>.+?)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of README.md."""

    lang: str
    body: str
    line: int  # of its first code line


def readme_blocks() -> list[Block]:
    """README.md's fenced code blocks, in order."""
    text = README.read_text()
    return [Block(m["lang"], m["body"], text.count("\n", 0, m.start("body")) + 1) for m in _FENCE.finditer(text)]


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
    blocks = readme_blocks()
    assert len(blocks) >= 8, f"README.md parsed into {len(blocks)} blocks only"
    assert {b.lang for b in blocks} <= KNOWN, [(b.lang, b.line) for b in blocks if b.lang not in KNOWN]
    for b in blocks:
        if b.lang == "sh":
            for line in _commands(b):
                assert line.split()[0] in ("make", "shardstore"), f"README.md:{b.line}: no runner for {line!r}"
    assert sum(len(expected_prints(b.body)) for b in blocks if b.lang == "python") >= 3


def test_expected_prints_are_read_from_comments():
    body = 'x = 1\nprint(x)   # 1\nprint(x)  # one, in words\nprint([{"a": 1}])  # [{"a": 1}]\n'
    assert expected_prints(body) == {2: 1, 4: [{"a": 1}]}


# --------------------------------------------------------------------------- python blocks

_RUNNER = r'''
import builtins, json, sys
spec = json.load(open(sys.argv[1]))
printed = {}


def _print(*args, sep=" ", end="\n", file=None, flush=False):
    frame = sys._getframe(1)
    name = frame.f_code.co_filename
    if file is None and name.startswith("README.md:"):
        printed.setdefault(name, {}).setdefault(frame.f_lineno, []).append(sep.join(map(str, args)))
    builtins.print(*args, sep=sep, end=end, file=file, flush=flush)


for run in (1, 2):  # every example works again, as it is
    space = {"__name__": "__readme__", "print": _print}
    for block in spec["blocks"]:
        exec(compile(block["source"], f"README.md:{block['line']}", "exec"), space)

# the Spark example against the engine
import shardstore.spark
from shardstore.engine import Cluster
spark_space = space
spark, url = spark_space["spark"], spark_space["url"]
restored = Cluster.restore(store=url, data_dir=spec["check_dir"], nodes=1)
engine_count = restored.count("flights")
restored.close()
counts = {fmt: spark.read.format(fmt).option("store", url).option("index", "flights").load().count()
          for fmt in ("shardstore", "shardstore-arrow")}
result = {
    "printed": printed,
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
    blocks = [b for b in readme_blocks() if b.lang == "python"]
    assert not any(EXAMPLE_TMP in b.body for b in blocks), "an example writes to a fixed /tmp/ path: use tempfile"
    spec = {
        "blocks": [{"line": b.line, "source": b.body} for b in blocks],
        "check_dir": str(tmp_path / "check-nodes"),
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "runner.py").write_text(_RUNNER)
    proc = subprocess.run([str(venv["python"]), "-I", str(tmp_path / "runner.py"), str(tmp_path / "spec.json")],
                          cwd=work, env=user_env(TMPDIR=str(work)), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"README blocks failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])

    assert Path(res["shardstore_file"]).resolve().is_relative_to(Path(venv["site"]).resolve())
    checked = 0
    for b in blocks:
        for n, want in expected_prints(b.body).items():
            got = res["printed"].get(f"README.md:{b.line}", {}).get(str(n))
            assert got, f"README.md:{b.line + n - 1}: printed nothing"
            assert len(got) == 2, f"README.md:{b.line + n - 1}: printed {len(got)} times in two runs"
            assert [ast.literal_eval(g) for g in got] == [want] * len(got), f"README.md:{b.line + n - 1}: {got}"
            checked += 1
    assert checked >= 3
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
    return [(b, c) for b in readme_blocks() if b.lang == "sh" for c in _commands(b) if c.split()[0] == first_word]


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
            assert scheme in emulators, f"README.md:{block.line}: no emulator for {arg}"
            emu = emulators[scheme]
            emu.make_bucket(rest.split("/")[0])
            for key, value in emu.store_options().items():
                if f"{key}=" not in line:  # the README's own options stay as written
                    argv += ["-o", f"{key}={value}"]
        out = run(argv, cwd=tmp_path, timeout=180)
        assert out.strip(), f"README.md:{block.line}: {line!r} printed nothing"
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
    (block,) = [b for b in readme_blocks() if b.lang == "toml"]
    doc = tomllib.loads(block.body)
    targets = doc["project"]["entry-points"][GROUP]
    assert targets, "the README's plugin example declares no entry point"
    for scheme, target in targets.items():
        assert re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme), scheme
        assert re.fullmatch(r"[\w.]+:\w+", target), target
