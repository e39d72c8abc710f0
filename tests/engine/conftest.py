"""Fixtures shared by the engine tests that run real node processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shardstore.testing.node_processes import ProcessCluster
from shardstore.testing.partitions import LinkedCluster


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[ProcessCluster]:
    """Three ``shardstore node`` processes on 127.0.0.1 over a file store, killed at the end."""
    c = ProcessCluster(str(tmp_path / "nodes"), f"file://{tmp_path / 'store'}?create=true", 3)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def links(tmp_path: Path) -> Iterator[LinkedCluster]:
    """The same, every link between two nodes through its own TCP fault proxy (issue 41)."""
    c = LinkedCluster(str(tmp_path / "nodes"), f"file://{tmp_path / 'store'}?create=true", 3)
    try:
        yield c
    finally:
        c.close()
