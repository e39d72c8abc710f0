"""The background merge thread (segments/merge_scheduler.py): one run per queued shard, in order, the newest
callable of a shard kept, errors logged without stopping the thread, and the thread's own CPU priority lowered."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from shardstore.segments.merge_scheduler import MergeScheduler


def test_a_shard_queued_twice_runs_once_with_its_newest_callable() -> None:
    scheduler = MergeScheduler(nice=0)
    gate, ran = threading.Event(), []
    scheduler.submit("first", gate.wait)  # holds the thread while the rest is queued
    scheduler.submit("a", lambda: ran.append("a-old"))
    scheduler.submit("b", lambda: ran.append("b"))
    scheduler.submit("a", lambda: ran.append("a-new"))
    gate.set()
    assert scheduler.wait_idle(10)
    assert ran == ["a-new", "b"] and scheduler.ran == 3


def test_a_failing_merge_is_logged_and_the_thread_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    scheduler = MergeScheduler(nice=0)
    ran = []
    with caplog.at_level(logging.WARNING, logger="shardstore.segments.merge_scheduler"):
        scheduler.submit("bad", lambda: 1 / 0)
        scheduler.submit("good", lambda: ran.append(True))
        assert scheduler.wait_idle(10)
    assert ran == [True]
    assert any("the merges of bad failed" in r.getMessage() for r in caplog.records)


def test_the_merge_thread_runs_at_a_lower_priority_than_the_process() -> None:
    scheduler = MergeScheduler(nice=5)
    seen = []
    scheduler.submit("x", lambda: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
    assert scheduler.wait_idle(10)
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert seen == [min(19, mine + 5)]


def test_stop_waits_for_the_merge_in_hand_and_drops_the_queue() -> None:
    scheduler = MergeScheduler(nice=0)
    started, release, ran = threading.Event(), threading.Event(), []
    scheduler.submit("long", lambda: (started.set(), release.wait(5), ran.append("long")))
    scheduler.submit("queued", lambda: ran.append("queued"))
    assert started.wait(5)
    threading.Timer(0.2, release.set).start()
    assert scheduler.stop(timeout=5)
    scheduler.submit("late", lambda: ran.append("late"))
    assert ran == ["long"]
