"""``call_manager``: a primary's report to the cluster manager follows the manager as it changes (issue 41)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from shardstore.cluster_state.errors import NotMaster
from shardstore.engine.errors import NodeNotReady
from shardstore.engine.node.data_role import call_manager
from shardstore.transport import NodeDisconnected, TransportClosed


def test_an_idempotent_report_leaves_a_cut_off_manager_as_soon_as_another_one_leads() -> None:
    leader = {"name": "n1"}
    asked: list[str] = []
    cut = threading.Event()

    def send(target: str, action: str, request: dict, timeout: float | None = None) -> dict:
        asked.append(target)
        if target == "n1":
            cut.wait(timeout)  # a blackholed manager: no answer until the attempt's timeout
            raise NodeDisconnected("n3", target, action, "no response", delivered=None)
        return {"replicas": [], "by": target}

    def elect() -> None:
        time.sleep(0.3)
        leader["name"] = "n2"

    threading.Thread(target=elect, daemon=True).start()
    with ThreadPoolExecutor(2) as pool:
        started = time.monotonic()
        answer = call_manager(send, lambda: leader["name"], "n3", "cm.fail_replica", {}, 10.0, idempotent=True,
                              attempt_timeout=6.0, pool=pool)
        took = time.monotonic() - started
        cut.set()
    assert answer["by"] == "n2" and asked[:2] == ["n1", "n2"]
    assert took < 3.0, f"the report waited {took:.1f} s on a manager that was replaced after 0.3 s"


def test_a_report_that_may_have_been_applied_is_not_sent_again_unless_idempotent() -> None:
    asked: list[str] = []

    def send(target: str, action: str, request: dict, timeout: float | None = None) -> dict:
        asked.append(target)
        raise NodeDisconnected("n3", target, action, "no response", delivered=None)

    with pytest.raises(NodeDisconnected):
        call_manager(send, lambda: "n1", "n3", "cm.replica_started", {}, 1.0)
    assert asked == ["n1"]


def test_no_manager_for_the_whole_wait_raises_node_not_ready() -> None:
    """Unavailable (retry later), not NotMaster (a conflict saying "submit there", with nowhere to submit)."""
    with pytest.raises(NodeNotReady, match="has not joined a cluster manager") as info:
        call_manager(lambda *a, **k: None, lambda: None, "n3", "cm.fail_replica", {}, 0.3, idempotent=True,
                     attempt_timeout=1.0, pool=None)
    assert info.value.retryable and isinstance(info.value.__cause__, NotMaster)


@pytest.mark.parametrize("idempotent", [False, True])
def test_a_stopped_node_asks_no_manager_again(idempotent: bool) -> None:
    """A killed embedded node's handler, still running in a caller's thread, reports once and stops: its
    own link refuses (TransportClosed) and no retry loop waits out ``wait`` on it (simulator seed 3 waited 10 s)."""
    asked: list[str] = []

    def send(target: str, action: str, request: dict, timeout: float | None = None) -> dict:
        asked.append(target)
        raise TransportClosed("n3", action)

    started = time.monotonic()
    with pytest.raises(TransportClosed):
        call_manager(send, lambda: "n1", "n3", "cm.copy_failed", {}, 10.0, idempotent=idempotent,
                     attempt_timeout=1.0 if idempotent else None,
                     pool=ThreadPoolExecutor(1) if idempotent else None)
    assert asked == ["n1"] and time.monotonic() - started < 1.0
