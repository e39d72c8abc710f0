"""In-process transport (delivery, partitions, drops, delays, hooks, counters) and engine errors."""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any

import pytest

import shardstore.engine.errors as engine_errors
from shardstore.engine.errors import (
    EngineError,
    IndexAlreadyExists,
    IndexNotFound,
    InvalidRequest,
    NodeDisconnected,
    NodeNotFound,
    ShardUnavailable,
    StalePrimary,
    VersionConflict,
)
from shardstore.errors import ConflictError, CorruptError, InvalidError, NotFoundError, UnavailableError
from shardstore.transport import InvalidTransportRequest, Transport

KINDS = (ConflictError, CorruptError, InvalidError, NotFoundError, UnavailableError)


class Node:
    """A handler that records what it handled."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.handled: list[tuple[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, action: str, request: Any) -> Any:
        with self.lock:
            self.handled.append((action, request))
        if action == "fail":
            raise request
        return {"node": self.name, "action": action, "echo": request}


@pytest.fixture
def net() -> tuple[Transport, dict[str, Node]]:
    t = Transport(seed=42)
    nodes = {n: Node(n) for n in ("n1", "n2", "n3")}
    for name, node in nodes.items():
        t.register(name, node)
    return t, nodes


# -- errors -------------------------------------------------------------------------------------


def _engine_errors() -> list[type]:
    return [c for _, c in inspect.getmembers(engine_errors, inspect.isclass)
            if issubclass(c, EngineError) and c is not EngineError]


@pytest.mark.parametrize("cls", _engine_errors(), ids=lambda c: c.__name__)
def test_every_engine_error_has_exactly_one_kind(cls: type) -> None:
    kinds = [k for k in KINDS if issubclass(cls, k)]
    assert len(kinds) == 1, f"{cls.__name__} has kinds {kinds}"
    assert cls.retryable == (kinds[0] is UnavailableError)


def test_engine_error_kinds_and_messages() -> None:
    vc = VersionConflict("doc-1", 5, 1, 7, 2, index="books", shard=0)
    assert isinstance(vc, ConflictError) and not vc.retryable
    assert (vc.doc_id, vc.expected_seq_no, vc.expected_primary_term, vc.actual_seq_no, vc.actual_primary_term) == (
        "doc-1", 5, 1, 7, 2)
    assert "[books][0]" in str(vc) and "seq_no [5]" in str(vc) and "seq_no [7]" in str(vc)
    assert "not applied" in str(vc)
    assert "does not exist" in str(VersionConflict("d", 0, 1, None, None))
    sp = StalePrimary("[books][0]: term 3 superseded by 4", term=3, current_term=4)
    assert "NOT acknowledged" in str(sp) and sp.current_term == 4 and isinstance(sp, ConflictError)
    assert str(StalePrimary("x; not acknowledged")).count("acknowledged") == 1
    assert isinstance(IndexNotFound("books"), NotFoundError) and "[books]" in str(IndexNotFound("books"))
    assert isinstance(IndexAlreadyExists("books"), ConflictError)
    assert isinstance(NodeNotFound("n9"), LookupError)
    su = ShardUnavailable("books", 2, "no active primary")
    assert su.retryable and "[books][2]" in str(su) and "not applied" in str(su)
    assert isinstance(InvalidRequest("bad"), ValueError)
    assert "nothing was applied" in str(NodeDisconnected("a", "b", "x", "down", delivered=False))
    assert "may have been applied" in str(NodeDisconnected("a", "b", "x", "lost", delivered=True))
    assert "may have been applied" in str(NodeDisconnected("a", "b", "x", "slow", delivered=None))


# -- delivery -----------------------------------------------------------------------------------


def test_send_calls_the_target_handler_and_returns_its_response(net) -> None:
    t, nodes = net
    assert t.send("n1", "n2", "index", {"id": "a"}) == {"node": "n2", "action": "index", "echo": {"id": "a"}}
    assert nodes["n2"].handled == [("index", {"id": "a"})]
    assert nodes["n1"].handled == [] and t.nodes() == {"n1", "n2", "n3"}
    assert t.send("n1", "n1", "local", 1)["node"] == "n1"  # a node may send to itself


def test_a_handler_error_propagates_unchanged(net) -> None:
    t, _ = net
    err = VersionConflict("a", 1, 1, 2, 1)
    with pytest.raises(VersionConflict) as info:
        t.send("n1", "n2", "fail", err)
    assert info.value is err
    with pytest.raises(KeyError):
        t.send("n1", "n2", "fail", KeyError("k"))


def test_unknown_and_unregistered_targets_disconnect(net) -> None:
    t, nodes = net
    with pytest.raises(NodeDisconnected, match="'n9' is not registered") as info:
        t.send("n1", "n9", "index", 1)
    assert info.value.delivered is False and info.value.retryable
    t.unregister("n2")
    with pytest.raises(NodeDisconnected) as info:
        t.send("n1", "n2", "index", 1)
    assert info.value.delivered is False and nodes["n2"].handled == []
    with pytest.raises(NodeNotFound):
        t.unregister("n2")
    t.register("n2", nodes["n2"])  # a restart
    assert t.send("n1", "n2", "index", 1)["node"] == "n2"


def test_register_validates(net) -> None:
    t, nodes = net
    with pytest.raises(InvalidTransportRequest, match="registered already"):
        t.register("n1", nodes["n1"])
    with pytest.raises(InvalidTransportRequest):
        t.register("", nodes["n1"])
    with pytest.raises(InvalidTransportRequest):
        t.register("n4", "not callable")  # type: ignore[arg-type]


# -- partitions ---------------------------------------------------------------------------------


def test_partition_blocks_both_directions_until_healed(net) -> None:
    t, nodes = net
    t.partition({"n1"}, {"n2", "n3"})
    for a, b in (("n1", "n2"), ("n2", "n1"), ("n1", "n3"), ("n3", "n1")):
        with pytest.raises(NodeDisconnected, match="partitioned") as info:
            t.send(a, b, "ping", None)
        assert info.value.delivered is False
    assert t.send("n2", "n3", "ping", None)["node"] == "n3"  # same side
    assert t.send("n1", "n1", "ping", None)["node"] == "n1"
    assert not t.connected("n1", "n2") and t.connected("n2", "n3")
    assert [a for a, _ in nodes["n2"].handled] == []
    t.heal()
    assert t.send("n1", "n2", "ping", None)["node"] == "n2"
    with pytest.raises(InvalidTransportRequest, match="disjoint"):
        t.partition({"n1"}, {"n1", "n2"})


def test_isolate_cuts_a_node_from_everyone_even_new_nodes(net) -> None:
    t, _ = net
    t.isolate("n3")
    t.register("n4", Node("n4"))
    for other in ("n1", "n2", "n4"):
        with pytest.raises(NodeDisconnected):
            t.send("n3", other, "ping", None)
        with pytest.raises(NodeDisconnected):
            t.send(other, "n3", "ping", None)
    assert t.send("n1", "n4", "ping", None)["node"] == "n4"
    t.heal()
    assert t.send("n3", "n4", "ping", None)["node"] == "n4"


# -- drops --------------------------------------------------------------------------------------


def test_a_dropped_request_never_reaches_the_handler(net) -> None:
    t, nodes = net
    rule = t.drop("replicate*", target="n2", times=2, after=1)
    t.send("n1", "n2", "replicate/index", 0)  # skipped by after=1
    for i in (1, 2):
        with pytest.raises(NodeDisconnected, match="request dropped") as info:
            t.send("n1", "n2", "replicate/index", i)
        assert info.value.delivered is False
    t.send("n1", "n2", "replicate/index", 3)  # times=2 exhausted
    t.send("n1", "n3", "replicate/index", 4)  # other target
    t.send("n1", "n2", "index", 5)  # other action
    assert [r for _, r in nodes["n2"].handled] == [0, 3, 5]
    assert rule.fired == 2 and rule.exhausted
    assert t.count("replicate*", "dropped_requests") == 2


def test_a_dropped_response_means_the_handler_ran(net) -> None:
    t, nodes = net
    t.drop("index", sender="n1", direction="response", times=1)
    with pytest.raises(NodeDisconnected, match="response dropped") as info:
        t.send("n1", "n2", "index", "x")
    assert info.value.delivered is True
    assert "may have been applied" in str(info.value)
    assert nodes["n2"].handled == [("index", "x")]  # it WAS applied: the ambiguous case
    assert t.send("n1", "n2", "index", "y")["echo"] == "y"
    assert t.stats()["index"].dropped_responses == 1


def test_a_dropped_error_response_is_lost_too(net) -> None:
    t, _ = net
    t.drop("fail", direction="response")
    with pytest.raises(NodeDisconnected) as info:
        t.send("n1", "n2", "fail", VersionConflict("a", 1, 1, 2, 1))
    assert info.value.delivered is True and isinstance(info.value.__cause__, VersionConflict)


def test_sender_filter_and_rule_removal(net) -> None:
    t, _ = net
    rule = t.drop(sender={"n1", "n3"})
    with pytest.raises(NodeDisconnected):
        t.send("n1", "n2", "a", None)
    with pytest.raises(NodeDisconnected):
        t.send("n3", "n2", "b", None)
    t.send("n2", "n1", "c", None)
    rule.remove()
    rule.remove()  # idempotent
    t.send("n1", "n2", "a", None)
    t.drop()
    t.partition({"n1"}, {"n2"})
    t.clear_faults()
    assert t.rules() == [] and t.connected("n1", "n2")
    t.send("n1", "n2", "a", None)
    with pytest.raises(InvalidTransportRequest, match="direction"):
        t.drop(direction="sideways")
    with pytest.raises(InvalidTransportRequest, match="probability"):
        t.drop(probability=1.5)


def _pattern(seed: int, p: float = 0.3, n: int = 200) -> list[bool]:
    t = Transport(seed=seed)
    t.register("b", lambda action, request: request)
    t.drop("*", probability=p)
    out = []
    for i in range(n):
        try:
            t.send("a", "b", "x", i)
            out.append(True)
        except NodeDisconnected:
            out.append(False)
    return out


def test_probabilistic_drops_are_deterministic_given_a_seed() -> None:
    first = _pattern(7)
    assert first == _pattern(7)
    assert first != _pattern(8)
    assert 0.2 < first.count(False) / len(first) < 0.4


# -- delays and timeouts ------------------------------------------------------------------------


def test_a_delayed_request_arrives_late(net) -> None:
    t, nodes = net
    t.delay(0.05, "slow", times=1)
    start = time.monotonic()
    t.send("n1", "n2", "slow", None)
    assert time.monotonic() - start >= 0.05
    start = time.monotonic()
    t.send("n1", "n2", "slow", None)
    assert time.monotonic() - start < 0.05
    assert len(nodes["n2"].handled) == 2


def test_a_request_delayed_past_the_timeout_is_not_delivered(net) -> None:
    t, nodes = net
    t.delay(5.0, "index")
    start = time.monotonic()
    with pytest.raises(NodeDisconnected, match="timed out") as info:
        t.send("n1", "n2", "index", None, timeout=0.05)
    assert time.monotonic() - start < 2.0
    assert info.value.delivered is False and nodes["n2"].handled == []
    assert t.stats()["index"].timed_out == 1


def test_a_response_delayed_past_the_timeout_was_applied(net) -> None:
    t, nodes = net
    t.delay(5.0, "index", direction="response")
    with pytest.raises(NodeDisconnected, match="response timed out") as info:
        t.send("n1", "n2", "index", "v", timeout=0.05)
    assert info.value.delivered is True and nodes["n2"].handled == [("index", "v")]


def test_a_message_held_by_a_delay_goes_on_once_the_delay_is_removed(net) -> None:
    """A healed link or a resumed node (issue 42): what the delay held is delivered at once, not at its end."""
    t, nodes = net
    rule = t.delay(60.0, "index", target="n2")
    threading.Timer(0.1, rule.remove).start()
    start = time.monotonic()
    t.send("n1", "n2", "index", "v", timeout=30.0)
    assert time.monotonic() - start < 5.0
    assert nodes["n2"].handled == [("index", "v")] and rule.removed.is_set()


def test_a_slow_handler_exceeding_the_timeout_loses_its_response() -> None:
    t = Transport(default_timeout=0.02)
    t.register("b", lambda action, request: time.sleep(0.05))
    with pytest.raises(NodeDisconnected, match="no response within") as info:
        t.send("a", "b", "x", None)
    assert info.value.delivered is True
    assert t.send("a", "b", "x", None, timeout=1.0) is None


# -- hooks --------------------------------------------------------------------------------------


def test_a_hook_runs_before_delivery(net) -> None:
    t, nodes = net
    calls = []

    def hook(sender: str, target: str, action: str, request: Any) -> None:
        calls.append((sender, target, action, request, len(nodes["n2"].handled)))

    t.on("replicate/*", hook, times=1)
    t.send("n1", "n2", "replicate/index", "r")
    t.send("n1", "n2", "replicate/index", "s")
    assert calls == [("n1", "n2", "replicate/index", "r", 0)]


def test_a_hook_can_kill_the_target_mid_operation(net) -> None:
    t, nodes = net
    t.on("replicate/*", lambda s, target, a, r: t.unregister(target), target="n3")
    assert t.send("n1", "n2", "replicate/index", 1)["node"] == "n2"
    with pytest.raises(NodeDisconnected, match="not registered") as info:
        t.send("n1", "n3", "replicate/index", 1)
    assert info.value.delivered is False and nodes["n3"].handled == []
    assert "n3" not in t.nodes()


def test_a_hook_error_aborts_the_send(net) -> None:
    t, nodes = net

    def boom(*args: Any) -> None:
        raise RuntimeError("injected")

    t.on("*", boom, sender="n1")
    with pytest.raises(RuntimeError, match="injected"):
        t.send("n1", "n2", "x", None)
    assert nodes["n2"].handled == []


def test_a_target_dying_or_partitioned_while_handling_loses_the_response() -> None:
    t = Transport()
    state = {}

    def dying(action: str, request: Any) -> str:
        state["ran"] = True
        if action == "die":
            t.unregister("b")
        else:
            t.partition({"a"}, {"b"})
        return "ok"

    t.register("b", dying)
    with pytest.raises(NodeDisconnected, match="partitioned before it responded") as info:
        t.send("a", "b", "split", None)
    assert info.value.delivered is True and state["ran"]
    t.heal()
    with pytest.raises(NodeDisconnected, match="before it responded") as info:
        t.send("a", "b", "die", None)
    assert info.value.delivered is True


def test_a_restart_during_handling_loses_the_response() -> None:
    t = Transport()

    def restarting(action: str, request: Any) -> str:
        t.unregister("b")
        t.register("b", lambda a, r: "new")
        return "old"

    t.register("b", restarting)
    with pytest.raises(NodeDisconnected, match="restarted") as info:
        t.send("a", "b", "x", None)
    assert info.value.delivered is True
    assert t.send("a", "b", "x", None) == "new"


# -- counters and threads -----------------------------------------------------------------------


def test_counters_per_action(net) -> None:
    t, _ = net
    t.send("n1", "n2", "index", 1)
    t.send("n1", "n3", "index", 2)
    with pytest.raises(VersionConflict):
        t.send("n1", "n2", "fail", VersionConflict("a", 1, 1, 2, 1))
    with pytest.raises(NodeDisconnected):
        t.send("n1", "n9", "search", None)
    stats = t.stats()
    assert (stats["index"].sent, stats["index"].delivered, stats["index"].responded) == (2, 2, 2)
    assert (stats["fail"].errors, stats["fail"].responded) == (1, 1)
    assert (stats["search"].sent, stats["search"].delivered, stats["search"].disconnected) == (1, 0, 1)
    assert t.count() == 4 and t.count("ind*", "delivered") == 2
    stats["index"].sent = 99  # a snapshot
    assert t.stats()["index"].sent == 2
    with pytest.raises(InvalidTransportRequest, match="no counter"):
        t.count("*", "bogus")
    t.reset_stats()
    assert t.stats() == {}


def test_concurrent_sends_count_exactly(net) -> None:
    t, nodes = net
    t.drop("bulk", times=50)
    t.drop("bulk", times=25, direction="response")
    threads, per_thread = 8, 200
    outcomes: list[str] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        for i in range(per_thread):
            try:
                t.send("n1", "n2" if i % 2 else "n3", "bulk", (k, i))
                res = "ok"
            except NodeDisconnected as exc:
                res = "applied?" if exc.delivered else "lost"
            with lock:
                outcomes.append(res)

    workers = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    total = threads * per_thread
    assert outcomes.count("lost") == 50 and outcomes.count("applied?") == 25
    st = t.stats()["bulk"]
    assert st.sent == total and st.delivered == total - 50 and st.responded == total - 75
    assert st.dropped_requests == 50 and st.dropped_responses == 25 and st.disconnected == 75
    assert len(nodes["n2"].handled) + len(nodes["n3"].handled) == total - 50
