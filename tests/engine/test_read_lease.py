"""The manager's bookkeeping of read leases (engine/node/read_lease.py): pure, every case."""

from __future__ import annotations

import itertools

import pytest

from shardstore.engine.node.read_lease import ReadLeases


def test_a_node_never_granted_a_lease_is_promoted_at_once() -> None:
    assert ReadLeases(3.0).remaining("n1", now=100.0) == 0.0


def test_a_grant_runs_its_seconds_from_the_answer_and_a_later_grant_extends_it() -> None:
    leases = ReadLeases(3.0)
    leases.granted("n1", at=10.0)
    assert leases.remaining("n1", now=10.0) == 3.0
    assert leases.remaining("n1", now=12.5) == 0.5
    assert leases.remaining("n1", now=13.0) == 0.0
    leases.granted("n1", at=12.0)
    assert leases.remaining("n1", now=13.0) == 2.0
    leases.granted("n1", at=11.0)  # an answer that arrives late never shortens it
    assert leases.remaining("n1", now=13.0) == 2.0


def test_a_new_manager_assumes_its_predecessor_granted_every_silent_node_a_lease() -> None:
    leases = ReadLeases(3.0)
    leases.assume(["n1", "n2"], at=50.0)
    assert leases.remaining("n1", now=51.0) == leases.remaining("n2", now=51.0) == 2.0
    assert leases.remaining("n3", now=51.0) == 0.0


def test_a_restarted_node_is_forgotten() -> None:
    leases = ReadLeases(3.0)
    leases.granted("n1", at=0.0)
    leases.forget("n1")
    leases.forget("n1")  # idempotent
    assert leases.remaining("n1", now=0.0) == 0.0


@pytest.mark.parametrize(("grants", "now"), list(itertools.product(
    [(), (0.0,), (0.0, 2.0), (2.0, 0.0), (1.0, 1.0, 4.0)], [0.0, 1.0, 3.0, 5.0, 7.0, 8.0])))
def test_the_lease_ends_exactly_seconds_after_the_latest_grant(grants: tuple[float, ...], now: float) -> None:
    leases = ReadLeases(3.0)
    for at in grants:
        leases.granted("n", at)
    expected = max(0.0, max(grants) + 3.0 - now) if grants else 0.0
    assert leases.remaining("n", now) == expected


def test_a_negative_lease_is_refused() -> None:
    with pytest.raises(ValueError, match="read lease"):
        ReadLeases(-1.0)


def test_a_node_that_missed_the_state_that_took_its_primary_is_granted_nothing() -> None:
    leases = ReadLeases(3.0)
    assert leases.may_grant("n1", (1, 5)) and not leases.may_grant("n1", None)
    leases.took_primary("n1", (1, 9))
    assert not leases.may_grant("n1", (1, 8))  # a link cut one way: it never got version 9
    assert leases.may_grant("n1", (1, 9)) and leases.may_grant("n1", (2, 1))
    assert leases.may_grant("n2", (1, 3))  # lagging a publication that does not concern it costs nothing
    leases.took_primary("n1", (1, 7))  # an older record never lowers the bar
    assert not leases.may_grant("n1", (1, 8))


def test_every_node_must_apply_the_state_a_new_manager_took_over_with() -> None:
    leases = ReadLeases(3.0)
    leases.took_primary("n1", (1, 9))
    leases.took_over((2, 10))
    assert not leases.may_grant("n2", (1, 9)) and leases.may_grant("n2", (2, 10))
    assert leases.may_grant("n1", (2, 10))  # the new floor covers what the old manager recorded


def test_taking_a_primary_bars_grants_until_the_node_applied_the_change_and_says_how_long_to_wait() -> None:
    leases = ReadLeases(3.0)
    assert leases.grant("n1", (1, 4), at=10.0)
    assert leases.take_primary("n1", (1, 5), now=11.0) == 2.0  # publishing version 5 (or later)
    assert not leases.grant("n1", (1, 4), at=11.5)  # a check racing the decision: no grant, no longer lease
    assert leases.remaining("n1", now=11.5) == 1.5
    assert leases.grant("n1", (1, 5), at=12.0)  # it applied the change: it knows the primary is not its own
