"""Adopted operations: how a file a primary adopted as a segment is written in the translog (pure; issue 43).

A primary that adopts a file of ``n`` rows (``ShardDirectory.adopt``; docs/design/adoption.md,
"Step 2") takes the seq#s ``S .. S+n-1`` and logs one :data:`~shardstore.core.ops.OpType.ADOPTED`
operation per row, so every consumer of the translog (checkpoints, trims, resync, recovery from a
seq#, the restore audit) keeps its rule of one seq# per operation.  An adopted operation has the
row's ``id`` and ``version`` (1, or the version the primary re-applied it with); no ``source``:
the row's fields are in the file.  Together the rows of one file are a *run*:

- contiguous seq#s ``S .. S+n-1`` in row order, one primary term;
- the run's first row (seq# ``S``, the *head*) names the file in its ``reason``; the other rows'
  ``reason`` is null (a file of 200,000 rows logs its name once, not 200,000 times).

A run is applied whole or not at all (under the copy's lock; its seq#s are marked processed at
once), so no checkpoint, trim point or recovery start falls inside one, and every read of the
translog from such a point sees a run from its head.  A run met without its head, cut short, or
whose head does not parse is refused (:class:`~shardstore.translog.errors.InvalidOperation`).

**Head reason layout** (UTF-8 text, fields separated by one space, the key last so it may hold
spaces)::

    adopted/<version> <S> <rows> <size> <crc32c as 8 hex digits> <key>

``version`` is :data:`REASON_VERSION` (1); a newer one raises
:class:`~shardstore.errors.UnsupportedFormatVersion`.  ``size`` and ``crc32c`` are the file's in
the store: a copy that fetches it checks both before it adopts (a mismatch is a lost or damaged
blob, :class:`AdoptedFileLost` names it and the seq#s).  The translog frame that carries the run
is itself checksummed, and generation files that may hold adopted operations are format version
5 (translog/frames.py ``ADOPTED_OPS_VERSION``): an older reader refuses them instead of replaying
an adopted row as nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.core.ops import FIELDS_COLUMN, OpType
from shardstore.errors import CorruptError, UnsupportedFormatVersion
from shardstore.translog.errors import InvalidOperation
from shardstore.translog.operations import SCHEMA

#: The head reason's prefix, and its format version.
REASON_PREFIX = "adopted/"
REASON_VERSION = 1
_ADOPTED = int(OpType.ADOPTED)


class AdoptedFileLost(CorruptError):
    """The file an adopted run names is gone from the store, or not the bytes its run recorded: the rows it held
    (named by seq#) cannot be applied from here."""

    retryable = False

    def __init__(self, key: str, first: int | None, last: int | None, why: str) -> None:  # noqa: D107
        held = f" (seq# {first}-{last})" if first is not None else " (nothing adopted)"
        super().__init__(f"adopted file {key}{held}: {why}")
        self.key, self.first, self.last = key, first, last


@dataclass(frozen=True)
class AdoptedFile:
    """A staged Parquet file to adopt: its key in the store, byte size, CRC32C and row count."""

    key: str
    size: int
    crc32c: int
    rows: int

    def __post_init__(self) -> None:
        if not self.key or self.size < 0 or self.rows < 0 or not 0 <= self.crc32c <= 0xFFFFFFFF:
            raise ValueError(f"not an adoptable file: {self}")


@dataclass(frozen=True)
class AdoptedRun:
    """The operations of one adopted file, read back from a batch: the file, its first seq#, term and rows."""

    file: AdoptedFile
    seq_no_base: int
    primary_term: int
    ops: pa.RecordBatch  # the run's operations (SCHEMA; ``version`` per row)

    @property
    def last(self) -> int:
        """The run's last seq#."""
        return self.seq_no_base + self.file.rows - 1


def encode_reason(file: AdoptedFile, seq_no_base: int) -> str:
    """The head reason of ``file``'s run starting at ``seq_no_base`` (module docstring)."""
    return f"{REASON_PREFIX}{REASON_VERSION} {seq_no_base} {file.rows} {file.size} {file.crc32c:08x} {file.key}"


def decode_reason(reason: str | None, where: str) -> tuple[AdoptedFile, int]:
    """``(file, S)`` of a head reason; InvalidOperation when malformed, UnsupportedFormatVersion when newer."""
    if not reason or not reason.startswith(REASON_PREFIX):
        raise InvalidOperation(None, None, f"{where}: an adopted run's head has no file reason ({reason!r})")
    parts = reason[len(REASON_PREFIX):].split(" ", 5)
    try:
        version = int(parts[0])
    except ValueError:
        raise InvalidOperation(None, None, f"{where}: adopted reason {reason!r} has no version") from None
    if version > REASON_VERSION:
        raise UnsupportedFormatVersion(f"adopted operation reason at {where}", version, REASON_VERSION)
    try:
        if len(parts) != 6 or version < 1:
            raise ValueError(reason)
        base, rows, size, crc = int(parts[1]), int(parts[2]), int(parts[3]), int(parts[4], 16)
        return AdoptedFile(parts[5], size, crc, rows), base
    except ValueError:
        raise InvalidOperation(None, None, f"{where}: malformed adopted reason {reason!r}") from None


def adopted_batch(file: AdoptedFile, seq_no_base: int, primary_term: int, ids: pa.Array | pa.ChunkedArray,
                  versions: np.ndarray) -> pa.RecordBatch:
    """The stamped operations of ``file`` adopted at ``seq_no_base``: one ADOPTED row per file row (ids and
    versions in file order), the head naming the file."""
    n = file.rows
    if len(ids) != n or len(versions) != n:
        raise ValueError(f"{file.key}: {len(ids)} ids and {len(versions)} versions for {n} rows")
    reasons = pa.array([encode_reason(file, seq_no_base)] + [None] * (n - 1), pa.string()) if n else \
        pa.array([], pa.string())
    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    return pa.RecordBatch.from_arrays([
        pa.array(np.arange(seq_no_base, seq_no_base + n, dtype=np.int64)),
        pa.array(np.full(n, primary_term, dtype=np.int64)),
        pa.array(np.full(n, _ADOPTED, dtype=np.int8)),
        ids.cast(pa.string()),
        pa.array(np.asarray(versions, dtype=np.int64)),
        pa.nulls(n, pa.binary()),
        reasons,
    ], schema=SCHEMA)


def run_summary(ops: pa.RecordBatch) -> dict[str, int]:
    """What an adopted run's (seq#, term, version) columns amount to: ``seq_no_base``, ``rows``, ``primary_term`` and
    ``reapplied`` (rows whose version is not 1): ``shard.adopt``'s answer, and what a request ledger keeps of it
    (a few integers, not three columns of every row)."""
    versions = ops.column("version")
    return {"seq_no_base": int(ops.column("seq_no")[0].as_py()), "rows": ops.num_rows,
            "primary_term": int(ops.column("primary_term")[0].as_py()),
            "reapplied": int(pc.sum(pc.not_equal(versions, 1)).as_py() or 0)}


def has_adopted(batch: pa.RecordBatch) -> bool:
    """Whether ``batch`` holds an adopted operation (one byte scan of ``op_type``, no Arrow call)."""
    col = batch.column(2) if batch.schema.names[2] == "op_type" else batch.column("op_type")
    if len(col) == 0:
        return False
    if col.null_count:
        return bool(pc.any(pc.equal(col, _ADOPTED)).as_py())
    values = memoryview(col.buffers()[1])[col.offset:col.offset + len(col)]
    return values.tobytes().count(_ADOPTED) > 0


def run_marks(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``batch``: whether it is an adopted operation, and whether it heads a run (names its file)."""
    adopted = np.asarray(pc.fill_null(pc.equal(batch.column("op_type"), _ADOPTED), False)
                         .to_numpy(zero_copy_only=False), dtype=bool)
    return adopted, adopted & np.asarray(pc.is_valid(batch.column("reason")).to_numpy(zero_copy_only=False), dtype=bool)


def plain_end(adopted: np.ndarray, i: int) -> int:
    """The end of the run of rows that are not adopted operations starting at row ``i``."""
    later = np.flatnonzero(adopted[i:])
    return i + int(later[0]) if later.size else len(adopted)


def split_runs(batch: pa.RecordBatch, where: str) -> list[pa.RecordBatch | AdoptedRun]:
    """``batch`` (seq# order) cut into its plain pieces and its adopted runs, in order; InvalidOperation for a run
    without its head, cut short, with a gap or a second term, or with a source or fields."""
    if not has_adopted(batch):
        return [batch]
    adopted, heads = run_marks(batch)
    reasons = batch.column("reason")
    out: list[pa.RecordBatch | AdoptedRun] = []
    seq = batch.column("seq_no").to_numpy()
    terms = batch.column("primary_term").to_numpy()
    i, n = 0, batch.num_rows
    while i < n:
        if not adopted[i]:
            j = plain_end(adopted, i)
            out.append(batch.slice(i, j - i))
            i = j
            continue
        if not heads[i]:
            raise InvalidOperation(i, batch.column("id")[i].as_py(),
                                   f"{where}: an adopted operation (seq# {int(seq[i])}) without its run's head")
        file, base = decode_reason(reasons[i].as_py(), where)
        end = i + file.rows
        if file.rows < 1 or base != int(seq[i]) or end > n or not adopted[i:end].all() or heads[i + 1:end].any():
            raise InvalidOperation(i, None, f"{where}: the adopted run of {file.key} at seq# {base} is not "
                                            f"{file.rows} whole rows from its head here")
        if end - i > 1 and (np.any(np.diff(seq[i:end]) != 1) or np.any(terms[i:end] != terms[i])):
            raise InvalidOperation(i, None, f"{where}: the adopted run of {file.key} has a seq# gap or two terms")
        run = batch.slice(i, end - i)
        if run.column("source").null_count != run.num_rows or run.column("version").null_count or (
                FIELDS_COLUMN in run.schema.names and run.column(FIELDS_COLUMN).null_count != run.num_rows):
            raise InvalidOperation(i, None, f"{where}: the adopted run of {file.key} carries a source or fields, "
                                            f"or lacks a version")
        out.append(AdoptedRun(file, base, int(terms[i]), run.select(SCHEMA.names) if FIELDS_COLUMN in
                              run.schema.names else run))
        i = end
    return out


__all__ = ["REASON_VERSION", "AdoptedFile", "AdoptedFileLost", "AdoptedRun", "adopted_batch", "decode_reason",
           "encode_reason", "has_adopted", "plain_end", "run_marks", "run_summary", "split_runs"]
