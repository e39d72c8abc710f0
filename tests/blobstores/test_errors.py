"""Error kinds and redaction: every blob-store error is actionable and names no secret."""

from __future__ import annotations

import inspect
import traceback

import pytest

import shardstore.blobstores.errors as errors_module
import shardstore.testing.faulty as faulty_module
from shardstore.blobstores import ConfigError, open_store
from shardstore.errors import ConflictError, CorruptError, InvalidError, NotFoundError, UnavailableError

KINDS = (ConflictError, CorruptError, InvalidError, NotFoundError, UnavailableError)


def _blob_errors() -> list[type]:
    found = []
    for module in (errors_module, faulty_module):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, errors_module.BlobStoreError) and cls is not errors_module.BlobStoreError:
                found.append(cls)
    return found


@pytest.mark.parametrize("cls", _blob_errors(), ids=lambda c: c.__name__)
def test_every_blob_error_has_exactly_one_kind(cls: type) -> None:
    kinds = [k for k in KINDS if issubclass(cls, k)]
    assert len(kinds) == 1, f"{cls.__name__} has kinds {kinds}"
    assert cls.retryable == (kinds[0] is UnavailableError)


def test_a_gcs_token_never_shows_when_client_setup_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    # gcsfs checks a raw token's expiry with Google; here that request cannot resolve, and
    # requests' error message quotes the URL, token included.
    monkeypatch.delenv("FETCH_RAW_TOKEN_EXPIRY", raising=False)
    token = "ya29.LEAKCHECK-0123456789-abcdef"
    store = open_store("gs://bkt/p", endpoint_url="http://127.0.0.1:9", token=token, retry_attempts=1)
    with pytest.raises(ConfigError, match="could not set up the gs client") as info:
        store.get("x")
    text = "".join(traceback.format_exception(info.value))
    assert "LEAKCHECK" not in text
    assert "LEAKCHECK" not in repr(store)
