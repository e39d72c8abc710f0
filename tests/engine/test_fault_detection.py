"""The pure decision of fault detection: when consecutive failed checks make a peer failed (issue 29)."""

from __future__ import annotations

import itertools

import pytest

from shardstore.engine.node.fault_detection import OK, REFUSED, TIMEOUT, FailureCounter, FaultDetectionSettings


def _model(outcomes: tuple[str, ...], retries: int) -> list[bool]:
    """The rule written out plainly: failed at a refusal, or at the retries-th timeout in a row; then reset."""
    out, run = [], 0
    for o in outcomes:
        if o == OK:
            run = 0
            out.append(False)
        elif o == REFUSED or run + 1 >= retries:
            run = 0
            out.append(True)
        else:
            run += 1
            out.append(False)
    return out


@pytest.mark.parametrize("retries", [1, 2, 3, 4])
def test_every_sequence_of_up_to_seven_outcomes(retries: int) -> None:
    for n in range(8):
        for outcomes in itertools.product((OK, TIMEOUT, REFUSED), repeat=n):
            counter = FailureCounter(retries)
            assert [counter.record("p", o) for o in outcomes] == _model(outcomes, retries), outcomes


def test_peers_are_counted_apart_and_forget_resets() -> None:
    counter = FailureCounter(3)
    assert not counter.record("a", TIMEOUT) and not counter.record("a", TIMEOUT)
    assert not counter.record("b", TIMEOUT)
    assert counter.failures("a") == 2 and counter.failures("b") == 1
    counter.forget("a")
    assert counter.failures("a") == 0
    assert not counter.record("a", TIMEOUT)
    assert not counter.record("b", TIMEOUT) and counter.record("b", TIMEOUT)
    with pytest.raises(ValueError, match="unknown check outcome"):
        counter.record("a", "maybe")


def test_settings_refuse_nonsense_and_give_the_worst_case() -> None:
    assert FaultDetectionSettings().worst_case_seconds == 3 * (0.5 + 1.0)
    for bad in ({"interval": 0}, {"timeout": -1}, {"retries": 0}, {"retries": 1.5}):
        with pytest.raises(ValueError):
            FaultDetectionSettings(**bad)
