"""A big bulk part of new documents written once (issue 44; docs/design/segments.md, "A big part of new documents
is written once").

On the row path a primary encodes a part's rows twice: a typed translog frame (zstd of the Arrow columns), then,
on the refresh beside the writes, a Parquet segment.  On two cores the two encodings compete for the same CPU.
A part that qualifies is encoded a single time instead, as a stamped segment file (segments/stamp.py: ``_id``
and the typed fields, the metadata columns virtual), which the primary

1. places in its directory as a segment (``ShardDirectory.adopt`` with ``new``: no lookup, nothing re-applied),
   searchable at once, and uploads ahead of the commit;
2. logs as the part's translog frame (a Parquet frame, translog/parquet_frames.py), which every reader decodes
   to the same index operations a typed frame of them holds.

Replicas, replays, restores and peer recoveries see operations, as before: nothing else changes.

Which parts (pure: :func:`qualifies`, :func:`all_new`): at least :data:`WRITE_ONCE_MIN_ROWS` index operations
with typed fields of flat scalar types (:func:`encodable`), no JSON source, no reason, no expectation; and, once
the version lookup ran, every id new to the shard and no id twice (each row's version is then 1 and its seq# the
part's first plus its row: exactly what a stamp says).

The encoding starts before the version lookup, on a worker (:class:`WriteOnce`), so the two run side by side; it
starts only while the copy's last qualifying part was all new, so a stream of updates does not encode every part
for nothing (a guess that misses costs one encoding, thrown away, and the part takes the row path).
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from shardstore.core.ops import FIELDS_COLUMN, fields_of
from shardstore.segments.id_index import SortedKeys
from shardstore.segments.segment_writer import encode_stamped

__all__ = ["ENV_MIN_ROWS", "PIECE_ROWS", "WRITE_ONCE_MIN_ROWS", "Attempt", "WriteOnce", "Written", "all_new", "encodable",
           "min_rows_setting", "piece_cuts", "qualifies"]

log = logging.getLogger(__name__)

#: A part of fewer rows takes the row path: its two encodings are cheap, and many small segments cost merges.
#: The ``SHARDSTORE_WRITE_ONCE_MIN_ROWS`` environment variable overrides it for the copies opened after it is set
#: (0: no part is written once; the fault simulator sets 1 for half its seeds, so small bulks take this path).
WRITE_ONCE_MIN_ROWS = 16_384
ENV_MIN_ROWS = "SHARDSTORE_WRITE_ONCE_MIN_ROWS"


def min_rows_setting() -> int | None:
    """The fewest rows of a part written once (None: none is): :data:`ENV_MIN_ROWS` if set, else
    :data:`WRITE_ONCE_MIN_ROWS`; ValueError naming the variable when it is not a whole number >= 0."""
    raw = os.environ.get(ENV_MIN_ROWS)
    if raw is None or raw.strip() == "":
        return WRITE_ONCE_MIN_ROWS
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"{ENV_MIN_ROWS}={raw!r}: expected a whole number of rows >= 0 (0: never)")
    return n or None


def encodable(fields: pa.DataType) -> bool:
    """Whether a ``fields`` struct of this type round-trips exactly through a stamped segment file: flat scalar
    children only (integers, floats, booleans, strings, timestamps, dates)."""
    if not pa.types.is_struct(fields) or fields.num_fields == 0:
        return False
    for i in range(fields.num_fields):
        t = fields.field(i).type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
                or pa.types.is_timestamp(t) or pa.types.is_date32(t)):
            return False
    return True


def qualifies(ops: pa.RecordBatch, *, all_index: bool, expect: object | None,
              min_rows: int = WRITE_ONCE_MIN_ROWS) -> bool:
    """Whether a part may be written once, as far as its operations tell before the version lookup."""
    n = ops.num_rows
    if n < min_rows or not all_index or expect is not None or FIELDS_COLUMN not in ops.schema.names:
        return False
    fields = ops.column(FIELDS_COLUMN)
    return (fields.null_count == 0 and encodable(fields.type) and ops.column("source").null_count == n
            and ops.column("reason").null_count == n)


def all_new(new_ids: np.ndarray, keys: SortedKeys | None) -> bool:
    """Whether the version lookup found every id of the part new to the shard, and no id twice (``keys``: the
    sorted fingerprints the lookup returns only for distinct ids)."""
    return keys is not None and len(keys.fp) == len(new_ids) and bool(np.all(new_ids))


#: A part of at least twice this many rows is cut into one piece per core, encoded side by side: each piece its
#: own file, segment and frame (as the refresh beside the writes cuts a big buffer: segments/directory.py).
PIECE_ROWS = 40_000


def piece_cuts(rows: int, cores: int | None = None, piece_rows: int | None = None) -> list[int]:
    """Where a part of ``rows`` rows is cut into pieces: ascending offsets from 0 to ``rows``, one piece per core
    (at most; default the machine's) once there are twice ``piece_rows`` (default :data:`PIECE_ROWS`), else one."""
    pieces = max(1, min(cores or os.cpu_count() or 1, rows // (piece_rows or PIECE_ROWS)))
    return [rows * i // pieces for i in range(pieces + 1)]


@dataclass
class Attempt:
    """A qualifying part: its pieces' encodings, started before the lookup (None when the copy did not guess all
    new), and where the pieces start and end (:func:`piece_cuts`)."""

    encoding: list[Future[pa.Buffer]] | None
    cuts: list[int]


@dataclass(frozen=True)
class Written:
    """A part written once: each piece's file bytes, where the pieces start and end, the ids' sorted fingerprints."""

    files: list[pa.Buffer]
    cuts: list[int]
    keys: SortedKeys


class WriteOnce:
    """One primary copy's written-once encodings (called under the copy's lock, one part at a time)."""

    def __init__(self, min_rows: int | None = WRITE_ONCE_MIN_ROWS) -> None:
        """``min_rows``: the fewest rows a part written once has (None: no part is; :func:`min_rows_setting`)."""
        self.min_rows = min_rows
        self.guess_new = True  # the last qualifying part was all new (or none came yet)
        self.written = 0  # parts written once
        self.missed = 0  # encodings thrown away: the part was not all new

    def start(self, ops: pa.RecordBatch, *, all_index: bool, expect: object | None) -> Attempt | None:
        """The attempt of a qualifying part, its encoding under way when the last one was all new; None otherwise."""
        if self.min_rows is None or not qualifies(ops, all_index=all_index, expect=expect, min_rows=self.min_rows):
            return None
        cuts = piece_cuts(ops.num_rows)
        if not self.guess_new:
            return Attempt(None, cuts)
        fields = fields_of(ops)
        assert fields is not None  # qualifies() saw the column
        ids = ops.column("id")
        return Attempt([_pool().submit(encode_stamped, ids.slice(lo, hi - lo), fields.slice(lo, hi - lo))
                        for lo, hi in zip(cuts, cuts[1:])], cuts)

    def finish(self, attempt: Attempt | None, ids: pa.Array, new_ids: np.ndarray,
               keys: SortedKeys | None) -> Written | None:
        """The part written once (its pieces' files, its ids' sorted fingerprints), else None (the row path takes it).
        ``keys``: the lookup's, when it sorted them (a big part); a small part's are made here."""
        if attempt is None:
            return None
        if keys is None and len(ids) and bool(np.all(new_ids)):  # a small part: its lookup sorted nothing
            made = SortedKeys.of(ids)
            keys = made if made.distinct else None
        new = all_new(new_ids, keys)
        self.guess_new = new
        if attempt.encoding is None:
            return None
        if not new:
            for f in attempt.encoding:
                f.cancel()  # one already running finishes on its worker and is dropped
            self.missed += 1
            return None
        try:
            files = [f.result() for f in attempt.encoding]
        except Exception as exc:  # noqa: BLE001 - the row path logs and applies these rows instead
            log.warning("a part of %d rows could not be encoded as segment files (%s: %s); it takes the row path",
                        len(new_ids), type(exc).__name__, exc)
            return None
        self.written += 1
        assert keys is not None  # all_new() saw them
        return Written(files, attempt.cuts, keys)


_POOL: ThreadPoolExecutor | None = None
_POOL_PID = 0
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The process's encoding workers (the Parquet encoding releases the GIL), made on first use in each process."""
    global _POOL, _POOL_PID
    with _POOL_LOCK:
        if _POOL is None or _POOL_PID != os.getpid():
            _POOL, _POOL_PID = ThreadPoolExecutor(max_workers=2, thread_name_prefix="write-once"), os.getpid()
        return _POOL
