"""Fixtures shared by the engine tests: real node processes, and embedded nodes running the same roles."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shardstore.engine import Cluster
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


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Cluster]:
    """Three embedded nodes (the production roles over the in-process transport) on a file store, closed at the end."""
    c = Cluster(store=f"file://{tmp_path / 'store'}", data_dir=str(tmp_path / "nodes"), nodes=3, recovery_delay=0.05)
    try:
        yield c
    finally:
        c.close()
