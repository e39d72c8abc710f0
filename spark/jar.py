"""The JVM bridge's jar: ``spark/jvm/*.java`` compiled against the installed PySpark, once.

Spark's Python data-source API cannot hand Spark a plan of its own, so a ``format("shardstore")``
read through it converts every row of every column on its way to the JVM (docs/design/spark.md,
"Figures").  The bridge is a small JVM data source of the same name (``io.shardstore.spark``):
with its jar on ``spark.jars``, Spark resolves ``format("shardstore")`` to it, and it reads through
the fast path (:mod:`shardstore.spark.bridge`).

The jar is built on first use with ``javac`` from the JDK that runs Spark, against the jars of the
installed PySpark, and kept under a name derived from the sources and the PySpark version (a new
PySpark or changed sources build a new jar; a build is atomic, so concurrent builders are safe).
Building takes about 5 s; :func:`jar_path` prints a line when it does.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from shardstore.errors import InvalidError

#: The Java sources and the service file registering ``format("shardstore")``.
SOURCES = Path(__file__).with_name("jvm")
#: Where built jars go unless ``SHARDSTORE_JAR_DIR`` or the caller says otherwise.
DEFAULT_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "shardstore" / "jars"


def _pyspark_jars() -> tuple[str, Path]:
    """(PySpark version, the folder of Spark's jars) of the installed PySpark."""
    try:
        import pyspark
    except ImportError as exc:  # pragma: no cover - the spark extra is missing
        raise InvalidError("the Spark bridge needs PySpark: pip install 'shardstore[spark]'") from exc
    jars = Path(pyspark.__file__).with_name("jars")
    if not jars.is_dir():
        raise InvalidError(f"PySpark at {Path(pyspark.__file__).parent} has no jars folder; "
                           "the bridge compiles against a pip-installed PySpark")
    return pyspark.__version__, jars


def _source_files() -> list[Path]:
    return sorted(p for p in SOURCES.rglob("*") if p.is_file())


def _digest(version: str) -> str:
    """A name for the jar: the sources' bytes and the PySpark version they compile against."""
    h = hashlib.sha256(version.encode())
    for p in _source_files():
        h.update(str(p.relative_to(SOURCES)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _javac() -> str:
    """The javac of JAVA_HOME, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    candidates = [str(Path(home) / "bin" / "javac")] if home else []
    candidates.append(shutil.which("javac") or "")
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    raise InvalidError("building shardstore's Spark bridge needs a JDK (javac, Java 17+): install one or set "
                       "JAVA_HOME; without the bridge use format('shardstore-arrow') or shardstore.spark.read_index")


def jar_path(directory: str | os.PathLike[str] | None = None) -> str:
    """The bridge jar for the installed PySpark, built with javac on first use."""
    version, jars = _pyspark_jars()
    out_dir = Path(directory or os.environ.get("SHARDSTORE_JAR_DIR") or DEFAULT_DIR)
    jar = out_dir / f"shardstore-spark-{version}-{_digest(version)}.jar"
    if jar.is_file():
        return str(jar)
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"shardstore: building the Spark bridge {jar.name} (javac, a few seconds)", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        classes = Path(tmp) / "classes"
        java = [str(p) for p in _source_files() if p.suffix == ".java"]
        cmd = [_javac(), "--release", "17", "-nowarn", "-Xlint:-path", "-d", str(classes),
               "-cp", str(jars / "*"), *java]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise InvalidError(f"javac could not build the Spark bridge against PySpark {version} "
                               f"({jars}):\n{done.stderr.strip()[-4000:]}")
        staged = Path(tmp) / jar.name
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as z:
            for p in sorted(classes.rglob("*.class")):
                z.write(p, p.relative_to(classes).as_posix())
            for p in _source_files():
                if p.suffix != ".java":  # META-INF/services/...
                    z.write(p, p.relative_to(SOURCES).as_posix())
        os.replace(staged, jar)  # atomic: a concurrent builder's jar is byte-for-byte the same kind
    return str(jar)


__all__ = ["DEFAULT_DIR", "SOURCES", "jar_path"]
