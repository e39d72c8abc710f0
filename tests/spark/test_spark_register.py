"""``shardstore.spark.register`` is idempotent and ``configure`` picks the workers' interpreter (issue 18).

On the shared session (bridge jar loaded, ``register`` already run by the fixture) a second
``register`` must be a no-op that still reports the bridge, and every format must read.  A
name owned by a JVM data source is shown with Spark's own ``parquet``: registering a Python
source under it is what raised ``DATA_SOURCE_ALREADY_EXISTS`` in a wheel install, where the
bridge jar owned ``shardstore`` before any Python source of that name was known.
The install-level check (a wheel in a fresh venv, a user's environment) is
tests/project/test_readme.py.
"""

from __future__ import annotations

import os
import sys

import pytest
from pyspark.sql.datasource import DataSource

import shardstore.spark
from shardstore.engine import Cluster
from shardstore.spark.registration import Provided, python_source_known, register_source
from shardstore.spark.source import ShardstoreArrowDataSource

N = 300


@pytest.fixture(scope="module")
def idx(tmp_path_factory):
    """A flushed 2-shard index of N docs on a file store: (url, index, the engine's count)."""
    base = tmp_path_factory.mktemp("register")
    url = f"file://{base}/remote"
    cluster = Cluster(store=url, data_dir=str(base / "nodes"), nodes=1)
    try:
        cluster.create_index("docs", shards=2, replicas=0)
        cluster.bulk("docs", [{"_id": str(i), "n": i} for i in range(N)])
        cluster.flush("docs")
        count = cluster.count("docs")
    finally:
        cluster.close()
    return url, "docs", count


def _count(spark, fmt: str, url: str, index: str) -> int:
    return spark.read.format(fmt).option("store", url).option("index", index).load().count()


def test_register_twice_is_a_no_op_that_keeps_every_format(spark, idx):
    url, index, count = idx
    assert count == N
    assert shardstore.spark.register(spark) is True
    assert shardstore.spark.register(spark) is True
    for fmt in ("shardstore", "shardstore-arrow"):
        assert _count(spark, fmt, url, index) == N, fmt
    assert _count(spark, "shardstore-changes", url, index) == N  # one index op per doc


def test_a_known_python_source_is_left_as_it_is(spark):
    assert python_source_known(spark, "shardstore-arrow") is True
    assert register_source(spark, ShardstoreArrowDataSource) is Provided.PYTHON


class _NamedLikeParquet(DataSource):
    """A Python source under the name of a JVM one (Spark's own parquet)."""

    @classmethod
    def name(cls) -> str:
        return "parquet"


def test_a_name_owned_by_a_jvm_source_is_not_registered_again(spark, tmp_path):
    # what plain spark.dataSource.register does with such a name: Spark refuses it
    from pyspark.errors import AnalysisException

    with pytest.raises(AnalysisException, match="DATA_SOURCE_ALREADY_EXISTS"):
        spark.dataSource.register(_NamedLikeParquet)
    assert python_source_known(spark, "parquet") is False
    assert register_source(spark, _NamedLikeParquet) is Provided.JVM
    # the JVM source still answers the name
    spark.range(5).write.parquet(str(tmp_path / "p"))
    assert spark.read.format("parquet").load(str(tmp_path / "p")).count() == 5


def test_a_fresh_name_is_registered(spark):
    class Fresh(DataSource):
        @classmethod
        def name(cls) -> str:
            return "shardstore-register-test"

    assert python_source_known(spark, "shardstore-register-test") is False
    assert register_source(spark, Fresh) is Provided.REGISTERED
    assert python_source_known(spark, "shardstore-register-test") is True
    assert register_source(spark, Fresh) is Provided.PYTHON


class _Builder:
    """Just what ``configure`` reads and writes of a ``SparkSession.Builder``: its options."""

    def __init__(self, master: str | None) -> None:
        self._options = {"spark.master": master} if master else {}

    def config(self, key: str, value: str) -> _Builder:
        self._options[key] = value
        return self


@pytest.mark.parametrize(("master", "preset", "want"), [
    ("local[2]", None, sys.executable),
    (None, None, sys.executable),  # PySpark's default master is local[*]
    ("local[2]", "/opt/chosen/python", "/opt/chosen/python"),  # the user's choice wins
    ("spark://host:7077", None, None),  # remote executors: their interpreter is not ours to pick
])
def test_configure_runs_python_workers_on_this_interpreter(monkeypatch, master, preset, want):
    monkeypatch.delenv("MASTER", raising=False)
    if preset is None:
        monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    else:
        monkeypatch.setenv("PYSPARK_PYTHON", preset)
    builder = shardstore.spark.configure(_Builder(master))
    assert os.environ.get("PYSPARK_PYTHON") == want
    assert builder._options["spark.sql.extensions"].startswith(shardstore.spark.EXTENSIONS)
    assert builder._options["spark.jars"].endswith(".jar")
