"""Shared fixtures: real emulators (started lazily, once per session) and store factories.

Backends, by test id: ``memory``, ``file``, ``s3``, ``oci``, ``gcs``, ``azure``.  The
four cloud ones run against real emulator processes (moto, fake-gcs-server, Azurite;
see ``shardstore.testing.emulators``), started the first time a test needs them and
stopped at the end of the session.  An emulator that cannot start makes the tests
that need it ERROR with the reason and the emulator's log; nothing is skipped.

Fixtures:

- ``s3_emulator``, ``oci_emulator``, ``gcs_emulator``, ``azure_emulator`` (session),
  and ``emulator_for(kind)`` to get one by name; each has the bucket
  :data:`SESSION_BUCKET` made.
- ``backend``: the backend id of the current test (session-scoped parameter over
  :data:`BACKENDS`; narrow it with ``@pytest.mark.parametrize("backend", CLOUD,
  indirect=True)``).
- ``store_factory``: a :class:`StoreFactory` for ``backend``; ``store_factory()``
  opens ``open_store(url, **options)`` at a fresh unique root.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardstore.blobstores import BlobStore, open_backend, open_store

# Imported first: it sets GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false before gcsfs loads.
from shardstore.testing.emulators import Emulator, start_emulator
from shardstore.testing.fault_proxy import FaultProxy, emu_via_proxy_options

BACKENDS = ("memory", "file", "s3", "oci", "gcs", "azure")
CLOUD = ("s3", "oci", "gcs", "azure")
SESSION_BUCKET = "shardstore-tests"


def _emulator_fixture(kind: str) -> Any:
    @pytest.fixture(scope="session", name=f"{kind}_emulator")
    def fixture() -> Iterator[Emulator]:
        emu = start_emulator(kind)  # EmulatorError -> the tests using it ERROR (never skip)
        try:
            emu.make_bucket(SESSION_BUCKET)
            yield emu
        finally:
            emu.stop()

    fixture.__doc__ = f"A running {kind} emulator (session), bucket {SESSION_BUCKET!r} made."
    return fixture


s3_emulator = _emulator_fixture("s3")
oci_emulator = _emulator_fixture("oci")
gcs_emulator = _emulator_fixture("gcs")
azure_emulator = _emulator_fixture("azure")


@pytest.fixture(scope="session")
def emulator_for(request: pytest.FixtureRequest) -> Callable[[str], Emulator]:
    """``emulator_for("s3")``: the session's emulator of that kind, started on first use."""

    def get(kind: str) -> Emulator:
        return request.getfixturevalue(f"{kind}_emulator")

    return get


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The backend id this test runs on."""
    return str(request.param)


class StoreFactory:
    """Opens stores of one backend at fresh roots; closes them (and proxies) at teardown.

    ``factory()`` -> ``open_store`` (retrying) at a new unique root;
    ``factory(prefix=p)`` -> at root ``p`` (relative to the backend's test area);
    ``factory(raw=True)`` -> ``open_backend`` (no retrying wrapper);
    ``factory(via=proxy)`` -> through a :class:`FaultProxy` (cloud backends);
    other keyword arguments are store options, added to the emulator's.
    """

    def __init__(self, backend: str, base_dir: Path, emulator: Emulator | None) -> None:
        self.backend = backend
        self.emulator = emulator
        self.base_dir = base_dir
        self.memory_space = f"m-{uuid.uuid4().hex[:12]}"
        self.bucket = SESSION_BUCKET
        self.last_prefix: str | None = None
        self._stores: list[BlobStore] = []
        self._proxies: list[FaultProxy] = []

    @property
    def is_cloud(self) -> bool:
        return self.emulator is not None

    def new_prefix(self) -> str:
        return f"t-{uuid.uuid4().hex[:12]}"

    def url(self, prefix: str) -> str:
        if self.backend == "memory":
            return f"memory://{self.memory_space}/{prefix}"
        if self.backend == "file":
            return f"file://{self.base_dir / prefix}"
        assert self.emulator is not None
        return self.emulator.store_url(self.bucket, prefix)

    def options(self, via: FaultProxy | None = None, **extra: Any) -> dict[str, Any]:
        if self.emulator is None:
            if via is not None:
                raise ValueError(f"no proxy for the {self.backend} backend")
            return dict(extra)
        base = emu_via_proxy_options(self.emulator, via) if via is not None else self.emulator.store_options()
        return {**base, **extra}

    def __call__(
        self, prefix: str | None = None, *, raw: bool = False, via: FaultProxy | None = None, **extra: Any
    ) -> BlobStore:
        prefix = prefix or self.new_prefix()
        self.last_prefix = prefix
        opener = open_backend if raw else open_store
        store = opener(self.url(prefix), **self.options(via, **extra))
        self._stores.append(store)
        return store

    def proxy(self) -> FaultProxy:
        """A started FaultProxy in front of this backend's emulator (stopped at teardown)."""
        if self.emulator is None:
            raise ValueError(f"the {self.backend} backend has no HTTP service to proxy")
        proxy = FaultProxy(self.emulator.endpoint, self.emulator.kind).start()
        self._proxies.append(proxy)
        return proxy

    def close(self) -> None:
        for store in self._stores:
            try:
                store.close()
            except Exception:
                pass
        for proxy in self._proxies:
            proxy.stop()
        if self.backend == "memory":
            from shardstore.plugins.memory import MemoryStore

            MemoryStore.drop(self.memory_space)


def make_factory(backend: str, request: pytest.FixtureRequest, base_dir: Path) -> StoreFactory:
    emu = request.getfixturevalue(f"{backend}_emulator") if backend in CLOUD else None
    return StoreFactory(backend, base_dir, emu)


@pytest.fixture
def store_factory(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """A StoreFactory for the current backend (see the class)."""
    factory = make_factory(backend, request, tmp_path / "stores")
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the whole run (local[2], UI off, bound to 127.0.0.1), shardstore and its bridge registered."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from shardstore.spark import configure, register

    builder = (SparkSession.builder.master("local[2]").appName("shardstore-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "4"))
    # as a user would: filter pushdown on and the JVM bridge jar loaded (format("shardstore") reads natively)
    session = configure(builder).getOrCreate()
    assert register(session), "the shardstore bridge jar did not load"
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """shardstore's wheel, built once per run from a copy of the repository (tests/installed.py)."""
    from tests.installed import build_wheel

    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> dict[str, Path]:
    """A fresh venv with the wheel installed as a user's ``pip install`` would (tests/installed.py)."""
    from tests.installed import make_venv

    return make_venv(tmp_path_factory.mktemp("venv"), wheel)
