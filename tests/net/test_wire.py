"""The wire codec: exact round trips of every value kind, exceptions, corruption, versions, the dataclass registry."""

from __future__ import annotations

import enum
import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest

from shardstore.core.records import crc32c
from shardstore.errors import (
    CorruptError,
    InvalidError,
    LocalDiskError,
    ShardstoreError,
    UnavailableError,
    UnsupportedFormatVersion,
)
from shardstore.net import wire
from shardstore.transport import InvalidTransportRequest, NodeDisconnected


@dataclass(frozen=True)
class Point:
    x: int
    y: float


@dataclass(frozen=True)
class Shipment:
    name: str
    where: Point
    rows: pa.RecordBatch
    tags: tuple[str, ...] = ()


wire.register_dataclass(Point)
wire.register_dataclass(Shipment, name="tests.net.Shipment")


def hand_frame(header: dict[str, Any], segments: list[bytes] = (), *, version: int = 1, flags: int = 0) -> bytes:
    """A frame built from the byte layout documented in ``shardstore.net.wire`` (independent of the encoder)."""
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    out = b"SSWM" + struct.pack("<HHII", version, flags, len(raw), len(segments))
    out += b"".join(struct.pack("<Q", len(s)) for s in segments) + raw
    out += b"\0" * (-len(out) % 8)
    for s in segments:
        out += s + b"\0" * (-len(s) % 8)
    return out + struct.pack("<I", crc32c(out))


def same(a: Any, b: Any) -> bool:
    """Equal, with the same types all the way down (nan equals nan; -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) and same(k, kb) for k, kb in zip(a, b))
    if isinstance(a, (pa.RecordBatch, pa.Table)):
        return a.equals(b) and a.schema.equals(b.schema, check_metadata=True)
    if isinstance(a, Shipment):
        return same(a.name, b.name) and same(a.where, b.where) and same(a.rows, b.rows) and same(a.tags, b.tags)
    return a == b


BATCH = pa.record_batch({"id": pa.array(range(1000)), "s": pa.array([f"doc-{i}" for i in range(1000)])})
TABLE = pa.Table.from_batches([BATCH.slice(0, 10), BATCH.slice(10, 5)]).replace_schema_metadata({"k": "v", "n": "1"})

VALUES = {
    "none": None, "true": True, "false": False, "zero": 0, "neg": -7, "huge": 2**100, "float": 1.5,
    "negzero": -0.0, "nan": math.nan, "inf": math.inf, "-inf": -math.inf, "empty-str": "", "unicode": "ünï\u2603\0",
    "list": [1, [2, "x"], []], "tuple": (1, (2,), ()), "empty-tuple": (), "dict": {"a": 1, "b": {"c": None}},
    "dollar-keys": {"$tuple": [1], "$": 2}, "int-keys": {1: "a", (1, 2): "b", None: 3, "s": 4},
    "set": {1, 2, 3}, "frozenset": frozenset({"a"}), "bytes": b"\x00\xff" * 1000, "empty-bytes": b"",
    "batch": BATCH, "empty-batch": BATCH.slice(0, 0), "table": TABLE, "empty-table": TABLE.slice(0, 0),
    "dataclass": Point(1, 2.5),
    "nested": {"ops": [Shipment("s", Point(0, -0.0), BATCH.slice(3, 7), ("a", "b")), (b"raw", TABLE)]},
}


@pytest.mark.parametrize("name", sorted(VALUES))
def test_every_kind_round_trips_exactly(name: str) -> None:
    value = VALUES[name]
    message = wire.decode(wire.encode(value, meta={"sender": "a", "target": "b", "n": 3}))
    assert message.error is None
    assert message.meta == {"sender": "a", "target": "b", "n": 3}
    assert same(message.value, value), (message.value, value)


def test_table_chunks_and_schema_metadata_survive() -> None:
    out = wire.decode_value(wire.encode(TABLE))
    assert [len(b) for b in out.to_batches()] == [10, 5]
    assert out.schema.metadata == {b"k": b"v", b"n": b"1"}


def test_the_documented_layout_is_what_the_encoder_writes() -> None:
    value = {"op": "ping", "t": (1, 2), "b": b"xyz"}
    header = {"meta": {"sender": "a"}, "value": {"op": "ping", "t": {"$tuple": [1, 2]}, "b": {"$bytes": 0}}}
    assert wire.encode(value, meta={"sender": "a"}) == hand_frame(header, [b"xyz"])
    assert wire.decode_value(hand_frame(header, [b"xyz"])) == value


def test_arrow_segments_are_ipc_streams_read_without_copy() -> None:
    frame = wire.encode(BATCH)
    # the batch's segment is a plain Arrow IPC stream, 8-byte aligned within the frame
    (hlen,) = struct.unpack_from("<I", frame, 8)
    (slen,) = struct.unpack_from("<Q", frame, 16)
    start = 24 + hlen + (-(24 + hlen) % 8)
    assert pa.ipc.open_stream(frame[start:start + slen]).read_all().equals(pa.Table.from_batches([BATCH]))
    buf = pa.py_buffer(frame)
    out = wire.decode_value(buf)
    assert out.column(0).buffers()[1].address >= buf.address  # points into the frame: no copy
    assert out.column(0).buffers()[1].address < buf.address + buf.size


class Color(enum.IntEnum):
    RED = 1


@dataclass(frozen=True)
class NotRegistered:
    x: int


@dataclass
class Mutable:
    x: int


@pytest.mark.parametrize("value", [object(), Color.RED, bytearray(b"x"), NotRegistered(1), pa.array([1]), {1.5j}])
def test_unsupported_values_are_refused_naming_the_path(value: Any) -> None:
    with pytest.raises(wire.WireUnencodable) as err:
        wire.encode({"k": [value]})
    assert "value['k'][0]" in str(err.value)
    assert isinstance(err.value, InvalidError)


def test_a_cycle_is_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(wire.WireUnencodable, match="deeper"):
        wire.encode(loop)


def test_registration_needs_a_frozen_dataclass_and_a_free_name() -> None:
    with pytest.raises(wire.WireUnencodable, match="not frozen"):
        wire.register_dataclass(Mutable)
    with pytest.raises(wire.WireUnencodable, match="not a dataclass"):
        wire.register_dataclass(dict)
    with pytest.raises(wire.WireUnencodable, match="registered already"):
        wire.register_dataclass(NotRegistered, name="tests.net.Shipment")
    assert wire.register_dataclass(Point) is Point  # idempotent
    assert wire.registered_dataclasses()["tests.net.Shipment"] is Shipment


def test_an_unregistered_dataclass_name_is_refused_never_imported() -> None:
    for name in ("tests.net.test_wire.NotRegistered", "os.system", "subprocess.Popen"):
        frame = hand_frame({"meta": {}, "value": {"$dc": [name, {"x": 1}]}})
        with pytest.raises(wire.WireUnknownType) as err:
            wire.decode(frame)
        assert err.value.name == name


# -- exceptions ----------------------------------------------------------------------------------


def roundtrip_error(exc: BaseException) -> BaseException:
    message = wire.decode(wire.encode_error(exc, meta={"target": "b"}))
    assert message.value is None and message.meta == {"target": "b"}
    assert message.error is not None
    with pytest.raises(type(message.error)):
        message.result()
    return message.error


@pytest.mark.parametrize("delivered", [True, False, None])
def test_node_disconnected_keeps_class_attributes_and_retryable(delivered: bool | None) -> None:
    exc = NodeDisconnected("a", "b", "shard.replicate", "response dropped", delivered=delivered)
    out = roundtrip_error(exc)
    assert type(out) is NodeDisconnected
    assert (out.sender, out.target, out.action, out.reason, out.delivered) == ("a", "b", "shard.replicate",
                                                                               "response dropped", delivered)
    assert str(out) == str(exc) and out.retryable is True and isinstance(out, UnavailableError)
    assert any("remote traceback" in note for note in out.__notes__)


def test_an_error_with_a_custom_init_is_recreated_without_calling_it() -> None:
    exc = LocalDiskError("/data/n1/translog", "fsync", OSError(28, "No space left on device"))
    out = roundtrip_error(exc)
    assert type(out) is LocalDiskError
    assert (out.path, out.op, str(out)) == ("/data/n1/translog", "fsync", str(exc))
    assert out.retryable is True
    out = roundtrip_error(UnsupportedFormatVersion("segment", 9, 2))
    assert type(out) is UnsupportedFormatVersion and (out.found, out.supported) == (9, 2)
    out = roundtrip_error(InvalidTransportRequest("bad rule"))
    assert type(out) is InvalidTransportRequest and out.reason == "bad rule" and isinstance(out, ValueError)


def test_attributes_that_cannot_travel_are_left_out_and_instance_retryable_survives() -> None:
    exc = InvalidTransportRequest("x")
    exc.handle = object()  # type: ignore[attr-defined]
    exc.payload = {"rows": BATCH}  # type: ignore[attr-defined]
    exc.retryable = True
    out = roundtrip_error(exc)
    assert type(out) is InvalidTransportRequest and not hasattr(out, "handle")
    assert out.payload["rows"].equals(BATCH) and out.retryable is True


class ForeignError(ShardstoreError):
    """A ShardstoreError subclass outside a shardstore module (not re-created)."""

    retryable = True


@pytest.mark.parametrize(("exc", "remote_type", "retryable"), [
    (ValueError("plain"), "builtins.ValueError", False),
    (ForeignError("elsewhere"), "tests.net.test_wire.ForeignError", True),
    (KeyError("k"), "builtins.KeyError", False),
])
def test_other_exceptions_become_remote_error(exc: BaseException, remote_type: str, retryable: bool) -> None:
    out = roundtrip_error(exc)
    assert type(out) is wire.RemoteError and isinstance(out, ShardstoreError)
    assert out.remote_type == remote_type and out.retryable is retryable
    assert str(exc) in str(out)


@pytest.mark.parametrize(("module", "qualname"), [
    ("subprocess", "Popen"), ("os", "system"), ("shardstore.net.wire", "register_dataclass"),
    ("shardstore.no_such_module", "X"), ("shardstore.errors", "Nope"), ("shardstore.net.wire", "f.<locals>.E"),
    ("builtins", "ValueError"),
])
def test_a_forged_error_type_is_never_resolved_outside_the_allowlist(module: str, qualname: str) -> None:
    header = {"meta": {}, "error": {"module": module, "qualname": qualname, "message": "m", "args": ["m"],
                                    "attrs": {}, "retryable": False, "traceback": ""}}
    out = wire.decode(hand_frame(header, flags=1)).error
    assert type(out) is wire.RemoteError and out.remote_type == f"{module}.{qualname}"


# -- corruption and versions ----------------------------------------------------------------------------


FRAME = wire.encode({"ops": [1, 2], "rows": BATCH, "raw": b"abc"}, meta={"sender": "a"})


@pytest.mark.parametrize("offset", [0, 3, 4, 5, 6, 8, 12, 16, 30, len(FRAME) // 2, len(FRAME) - 5, len(FRAME) - 1])
def test_a_flipped_byte_anywhere_is_wire_corrupted(offset: int) -> None:
    bad = bytearray(FRAME)
    bad[offset] ^= 0x40
    with pytest.raises(wire.WireCorrupted) as err:
        wire.decode(bytes(bad))
    assert isinstance(err.value, CorruptError)


@pytest.mark.parametrize("cut", [0, 3, 10, 19, len(FRAME) - 1])
def test_a_truncated_frame_is_wire_corrupted(cut: int) -> None:
    with pytest.raises(wire.WireCorrupted):
        wire.decode(FRAME[:cut])


def test_a_frame_from_a_newer_version_raises_a_typed_error() -> None:
    future = hand_frame({"meta": {}, "anything": "new"}, version=2, flags=0x8000)
    with pytest.raises(wire.WireVersionUnsupported) as err:
        wire.decode(future)
    assert isinstance(err.value, UnsupportedFormatVersion)
    assert (err.value.found, err.value.supported) == (2, wire.WIRE_VERSION)
    assert wire.peek_version(future) == 2 and wire.peek_version(b"nope") is None


@pytest.mark.parametrize(("header", "segments", "flags"), [
    ({"meta": {}, "value": 1}, [], 0x2),  # unknown flag
    ({"meta": {}, "value": 1}, [], 0x1),  # error flag without an error
    ({"meta": {}, "value": {"$bytes": 3}}, [b"x"], 0),  # segment index out of range
    ({"meta": {}, "value": {"$batch": 0}}, [b"not arrow"], 0),
    ({"meta": {}, "value": {"$what": 0}}, [], 0),
    ({"meta": {}, "value": {"$x": 1, "y": 2}}, [], 0),
    ({"meta": {}, "value": {"$float": "zero"}}, [], 0),
    ({"meta": [], "value": 1}, [], 0),
    ({"meta": {}}, [], 0),
])
def test_a_well_framed_but_malformed_header_is_wire_corrupted(header: dict, segments: list[bytes], flags: int) -> None:
    with pytest.raises(wire.WireCorrupted):
        wire.decode(hand_frame(header, segments, flags=flags))


def test_meta_takes_scalars_only() -> None:
    with pytest.raises(wire.WireUnencodable):
        wire.encode(1, meta={"x": [1]})
