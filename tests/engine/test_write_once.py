"""Which parts are written once, and the copy's guess (engine/shard/write_once.py): pure rules, every case."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import pyarrow as pa
import pytest

from shardstore.core.ops import with_fields
from shardstore.engine.shard import write_once as wo
from shardstore.segments.id_index import SortedKeys
from shardstore.translog.operations import OpType, unstamped_batch


def part(n: int = 40, *, source: bool = False, reason: bool = False, holed: bool = False,
         fields: pa.Table | None = None) -> pa.RecordBatch:
    ids = [f"d{i}" for i in range(n)]
    base = unstamped_batch([OpType.INDEX] * n, ids, [1] * n, [b"{}" if source and i == 3 else None for i in range(n)])
    if reason:
        base = base.set_column(base.schema.get_field_index("reason"), "reason",
                               pa.array([None] * (n - 1) + ["why"], pa.string()))
    batch = with_fields(base, fields if fields is not None else pa.table({"v": pa.array(range(n), pa.int64())}))
    if holed:
        col = batch.column("fields")
        mask = pa.array([i == 1 for i in range(n)])
        holey = pa.StructArray.from_arrays([col.field(0)], fields=list(col.type), mask=mask)
        batch = batch.set_column(batch.schema.get_field_index("fields"), "fields", holey)
    return batch


@pytest.mark.parametrize("t", [pa.int8(), pa.int64(), pa.uint32(), pa.float32(), pa.float64(), pa.bool_(),
                               pa.string(), pa.timestamp("ms", "UTC"), pa.timestamp("us"), pa.date32()])
def test_flat_scalar_fields_are_encodable(t: pa.DataType) -> None:
    assert wo.encodable(pa.struct([pa.field("a", pa.int64()), pa.field("b", t)]))


@pytest.mark.parametrize("t", [pa.struct([pa.field("b", pa.list_(pa.int64()))]),
                               pa.struct([pa.field("b", pa.struct([pa.field("c", pa.int64())]))]),
                               pa.struct([pa.field("b", pa.dictionary(pa.int32(), pa.string()))]),
                               pa.struct([pa.field("b", pa.binary())]),
                               pa.struct([pa.field("b", pa.large_string())]),
                               pa.struct([]), pa.int64()])
def test_nested_dictionary_binary_or_empty_fields_are_not(t: pa.DataType) -> None:
    assert not wo.encodable(t)


def test_a_big_part_of_index_operations_with_typed_fields_qualifies() -> None:
    assert wo.qualifies(part(), all_index=True, expect=None, min_rows=40)


@pytest.mark.parametrize("change", ["rows", "not_all_index", "expect", "no_fields", "holed", "source", "reason",
                                    "nested"])
def test_each_condition_alone_keeps_a_part_on_the_row_path(change: str) -> None:
    kwargs = {"all_index": True, "expect": None, "min_rows": 40}
    batch = part()
    if change == "rows":
        kwargs["min_rows"] = 41
    elif change == "not_all_index":
        kwargs["all_index"] = False
    elif change == "expect":
        kwargs["expect"] = ("d1", 3, 1)
    elif change == "no_fields":
        batch = batch.drop_columns(["fields"])
    elif change == "holed":
        batch = part(holed=True)
    elif change == "source":
        batch = part(source=True)
    elif change == "reason":
        batch = part(reason=True)
    elif change == "nested":
        batch = part(fields=pa.table({"v": pa.array([[1]] * 40, pa.list_(pa.int64()))}))
    assert not wo.qualifies(batch, **kwargs)


def _keys(n: int) -> SortedKeys:
    return SortedKeys.of(pa.array([f"d{i}" for i in range(n)]))


IDS = pa.array([f"d{i}" for i in range(40)])


@pytest.mark.parametrize("new,keys,want", [
    (np.ones(4, bool), "distinct", True),
    (np.array([True, True, False, True]), "distinct", False),  # an update among them
    (np.ones(4, bool), None, False),  # an id twice (the lookup gives keys only for distinct ids)
    (np.ones(4, bool), "other", False),  # keys of another batch
])
def test_all_new_needs_every_id_new_and_distinct_keys(new: np.ndarray, keys: str | None, want: bool) -> None:
    k = _keys(4) if keys == "distinct" else _keys(5) if keys == "other" else None
    assert wo.all_new(new, k) is want


def test_the_encoding_starts_only_while_the_last_part_was_all_new() -> None:
    once = wo.WriteOnce(min_rows=40)
    batch = part()
    a = once.start(batch, all_index=True, expect=None)
    assert a is not None and a.encoding is not None
    data = once.finish(a, IDS, np.ones(40, bool), _keys(40))
    assert data is not None and data.files[0].size > 0 and data.cuts == [0, 40] and once.written == 1
    b = once.start(batch, all_index=True, expect=None)  # this one turns out to update ids: thrown away
    assert b is not None and b.encoding is not None
    assert once.finish(b, IDS, np.zeros(40, bool), _keys(40)) is None and once.missed == 1 and not once.guess_new
    c = once.start(batch, all_index=True, expect=None)  # no encoding on the guess: the row path, even if all new
    assert c is not None and c.encoding is None
    assert once.finish(c, IDS, np.ones(40, bool), _keys(40)) is None and once.guess_new
    d = once.start(batch, all_index=True, expect=None)
    assert d is not None and d.encoding is not None and once.finish(d, IDS, np.ones(40, bool), _keys(40)) is not None
    assert once.written == 2
    assert once.start(part(39), all_index=True, expect=None) is None
    assert once.finish(None, IDS, np.ones(40, bool), _keys(40)) is None


@pytest.mark.parametrize("ids,new,want", [
    ([f"d{i}" for i in range(40)], [True] * 40, True),  # a small part's keys are made from its ids
    (["d1"] * 2 + [f"d{i}" for i in range(2, 40)], [True] * 40, False),  # an id twice
    ([f"d{i}" for i in range(40)], [True] * 39 + [False], False),  # an update
])
def test_a_small_part_without_the_lookups_keys_is_written_once_only_if_its_ids_are_distinct_and_new(
        ids: list[str], new: list[bool], want: bool) -> None:
    once = wo.WriteOnce(min_rows=1)
    attempt = once.start(part(), all_index=True, expect=None)
    got = once.finish(attempt, pa.array(ids), np.array(new), None)
    assert (got is not None) is want
    if got is not None:
        assert np.array_equal(got.keys.fp, SortedKeys.of(pa.array(ids)).fp)


def test_an_encoding_that_fails_sends_the_part_down_the_row_path() -> None:
    once = wo.WriteOnce(min_rows=1)
    attempt = once.start(part(), all_index=True, expect=None)
    assert attempt is not None and attempt.encoding is not None
    attempt.encoding[0].result()
    failed: Future[pa.Buffer] = Future()  # an encoding that raised (no real input makes pyarrow's writer fail)
    failed.set_exception(pa.ArrowInvalid("cannot encode"))
    attempt.encoding = [failed]
    assert once.finish(attempt, IDS, np.ones(40, bool), _keys(40)) is None and once.written == 0


def test_no_part_is_written_once_without_a_minimum() -> None:
    assert wo.WriteOnce(min_rows=None).start(part(), all_index=True, expect=None) is None


@pytest.mark.parametrize("raw,want", [(None, wo.WRITE_ONCE_MIN_ROWS), ("", wo.WRITE_ONCE_MIN_ROWS), ("0", None),
                                      ("1", 1), (" 250 ", 250)])
def test_the_minimum_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, raw: str | None,
                                                want: int | None) -> None:
    if raw is None:
        monkeypatch.delenv(wo.ENV_MIN_ROWS, raising=False)
    else:
        monkeypatch.setenv(wo.ENV_MIN_ROWS, raw)
    assert wo.min_rows_setting() == want


@pytest.mark.parametrize("raw", ["-1", "lots", "1.5"])
def test_a_bad_minimum_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(wo.ENV_MIN_ROWS, raw)
    with pytest.raises(ValueError, match=f"{wo.ENV_MIN_ROWS}='{raw}'"):
        wo.min_rows_setting()


@pytest.mark.parametrize("rows,cores,want", [
    (79_999, 2, [0, 79_999]),  # under twice a piece: one
    (80_000, 2, [0, 40_000, 80_000]),
    (336_776, 2, [0, 168_388, 336_776]),
    (336_776, 4, [0, 84_194, 168_388, 252_582, 336_776]),
    (100_000, 8, [0, 50_000, 100_000]),  # no piece under PIECE_ROWS
    (1, 2, [0, 1]),
])
def test_a_big_part_is_cut_into_one_piece_per_core(rows: int, cores: int, want: list[int]) -> None:
    assert wo.piece_cuts(rows, cores) == want


def test_each_piece_is_its_own_file_of_its_rows() -> None:
    import pyarrow.parquet as pq

    once = wo.WriteOnce(min_rows=1)
    n = 2 * wo.PIECE_ROWS
    attempt = once.start(part(n), all_index=True, expect=None)
    assert attempt is not None and attempt.cuts == wo.piece_cuts(n)
    ids = pa.array([f"d{i}" for i in range(n)])
    written = once.finish(attempt, ids, np.ones(n, bool), SortedKeys.of(ids))
    assert written is not None and len(written.files) == len(written.cuts) - 1
    back = pa.concat_tables([pq.read_table(pa.BufferReader(f)) for f in written.files])
    assert back.column("_id").to_pylist() == ids.to_pylist() and back.column("v").to_pylist() == list(range(n))
