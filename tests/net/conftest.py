"""Fixtures of the network transport tests: real Flight servers on 127.0.0.1, closed after each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardstore.net.flight import FlightTransport
from tests.net.certs import Pki, make_pki


@pytest.fixture
def transports() -> Iterator[Callable[..., FlightTransport]]:
    """``transports(**kwargs)`` makes a FlightTransport; every one is closed at the end of the test."""
    made: list[FlightTransport] = []

    def make(**kwargs: Any) -> FlightTransport:
        t = FlightTransport(**kwargs)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A throw-away CA with a server certificate for 127.0.0.1 and a client certificate."""
    return make_pki(Path(tmp_path_factory.mktemp("pki")), "cluster")


@pytest.fixture(scope="session")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A second, unrelated CA (for the wrong-CA cases)."""
    return make_pki(Path(tmp_path_factory.mktemp("pki-other")), "other")
