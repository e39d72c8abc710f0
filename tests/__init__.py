"""The test suite, one folder per layer (blobstores/, translog/, ..., project/).

Every folder is a package so test modules import as ``tests.<layer>.<module>``: two layers may
then hold test files of the same name.  Shared helpers are imported by that path too
(``from tests.conftest import CLOUD``, ``from tests.installed import run``).
"""
