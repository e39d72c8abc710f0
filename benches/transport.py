"""Transport round trips over loopback: in-process ``Transport`` against ``FlightTransport`` (``shardstore.net``).

``python -m benches.transport [--reps N]`` prints the p50 (and p90) round trip of a small
control action (``{"op": "ping", "term": 3, "seq": 17}``) and of a 1,000-row record batch
(two columns: an ``_id`` string and an int64 ``seq``), the handler echoing the request:

- ``inproc``: :class:`shardstore.transport.Transport` (the handler runs in the caller's thread);
- ``inproc+codec``: the same, plus the wire codec both ways (encode request, decode, encode
  response, decode): what a "local short-cut" of the network transport would cost;
- ``flight``: :class:`shardstore.net.flight.FlightTransport` to a node served on 127.0.0.1
  (``do_action``); ``flight-exchange`` forces ``do_exchange`` for comparison;
- ``raw do_action``: a bare ``pyarrow.flight`` echo of the same frame (the floor).

Also a 2 MB table (``do_action`` against ``do_exchange``), which sets ``EXCHANGE_OVER``, and the wire codec
alone (``encode`` only: ``wire-encode``) of a shard request's size: 65,536 flights rows with every column.
Not registered in the benches CLI; :func:`run` has the runner's signature for when it is.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from shardstore.net import wire
from shardstore.net.flight import FlightTransport
from shardstore.transport import Transport

SMALL = {"op": "ping", "term": 3, "seq": 17}


def _batch(rows: int) -> pa.RecordBatch:
    return pa.record_batch({"_id": pa.array([f"doc-{i:08d}" for i in range(rows)]),
                            "seq": pa.array(range(rows), pa.int64())})


def _flights_rows(rows: int) -> pa.Table:
    """The first ``rows`` flights rows (every column) with the ``_source`` the engine writes from them."""
    from shardstore.datasets import flights
    from shardstore.segments.source_json import sources_from_table

    table = flights(rows)
    return table.append_column("_source", sources_from_table(table)[1])


def _percentiles(fn: Callable[[], Any], reps: int, warmup: int = 20) -> tuple[float, float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return statistics.median(times) * 1e3, times[int(len(times) * 0.9)] * 1e3


def _echo(action: str, request: Any) -> Any:
    return request


class _RawEcho(flight.FlightServerBase):
    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> list[flight.Result]:
        return [flight.Result(action.body)]


def measure(reps: int = 1000) -> Iterator[tuple[str, str, float, float]]:
    """Yield ``(payload, transport, p50_ms, p90_ms)`` for each payload and transport."""
    payloads = {"small control": SMALL, "1,000-row batch": _batch(1000)}
    inproc = Transport()
    inproc.register("a", _echo)
    server = FlightTransport()
    server.register("a", _echo)
    client = FlightTransport(peers={"a": server.address})
    forced = FlightTransport(peers={"a": server.address}, exchange_actions=("*",))
    raw_server = _RawEcho("grpc://127.0.0.1:0")
    raw = flight.connect(f"grpc://127.0.0.1:{raw_server.port}")
    try:
        for label, payload in payloads.items():
            frame = wire.encode(payload, meta={"sender": "b", "target": "a"})

            def codec(p: Any = payload) -> Any:
                request = wire.decode_value(wire.encode(p, meta={"sender": "b", "target": "a"}))
                return wire.decode_value(wire.encode(inproc.send("b", "a", "echo", request)))

            cases: dict[str, Callable[[], Any]] = {
                "inproc": lambda p=payload: inproc.send("b", "a", "echo", p),
                "inproc+codec": codec,
                "flight": lambda p=payload: client.send("b", "a", "echo", p),
                "flight-exchange": lambda p=payload: forced.send("b", "a", "echo", p),
                "raw do_action": lambda f=frame: list(raw.do_action(flight.Action("echo", f))),
            }
            for name, fn in cases.items():
                yield (label, name, *_percentiles(fn, reps))
        big = pa.Table.from_batches([_batch(100_000)])
        for name, t in (("flight", FlightTransport(peers={"a": server.address}, exchange_over=1 << 62)),
                        ("flight-exchange", forced)):
            yield (f"{big.nbytes / 1e6:.1f} MB table", name, *_percentiles(lambda t=t: t.send("b", "a", "e", big),
                                                                           max(reps // 50, 10), warmup=2))
        request = _flights_rows(65_536)
        yield (f"{request.num_rows:,} flights rows", "wire-encode",
               *_percentiles(lambda: wire.encode({"ops": request}), max(reps // 20, 10), warmup=3))
    finally:
        for t in (client, forced, server):
            t.close()
        raw.close()
        raw_server.shutdown()


def run(ctx: Any) -> Iterator[Any]:
    """The runner's entry point (``ctx``: ``benches.runner.Context``): one figure per p50."""
    for payload, name, p50, _ in measure(200 if ctx.quick else 1000):
        ctx.progress(f"{payload} {name}: p50 {p50:.3f} ms")
        yield ctx.figure("round_trip_p50", p50, "ms", payload=payload, transport=name)


def main(argv: list[str] | None = None) -> None:
    """Print the round-trip p50/p90 table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--reps", type=int, default=1000)
    args = parser.parse_args(argv)
    print(f"{'payload':<22} {'transport':<16} {'p50 ms':>8} {'p90 ms':>8}")
    for payload, name, p50, p90 in measure(args.reps):
        print(f"{payload:<22} {name:<16} {p50:>8.3f} {p90:>8.3f}", flush=True)


if __name__ == "__main__":
    main()
