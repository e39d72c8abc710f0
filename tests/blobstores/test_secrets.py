"""Credentials stay out of DEBUG logs and out of error chains (issue 15, item 9).

Against the real emulators: with every logger at DEBUG, botocore logs each prepared
request (the Authorization header names the access key id, ``X-Amz-Security-Token`` is
the session token); gcsfs checks a raw token at ``/tokeninfo?access_token=...`` and the
error requests raises quotes that URL.  None of it may reach a log record or any link of
an exception chain, suppressed ``__context__`` included.
"""

from __future__ import annotations

import datetime
import io
import logging
import socket
import threading
import traceback
import types
import uuid
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import parse_qs, quote, quote_plus

import pytest

from shardstore.blobstores import BlobStore, BlobStoreError, ConfigError, open_store
from shardstore.blobstores.errors import AccessDenied, BlobNotFound, RequestRejected, TransientError
from shardstore.blobstores.fsspec_store import FsspecStore
from shardstore.blobstores.options import Option
from shardstore.testing.emulators import AZURITE_ACCOUNT, AZURITE_KEY, Emulator
from tests.conftest import SESSION_BUCKET

KEY = "AKIAEXAMPLESECRETID"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYSECRETKEY"
SESSION_TOKEN = "FwoGZXIvYXdzEXAMPLESESSIONTOKEN/abc+def=="
GCS_TOKEN = "ya29.a0EXAMPLEGCSTOKEN/abc+def="

#: Every logger that could see a request, set to DEBUG (the root too) for the test.
LOGGERS = ("", "botocore", "aiobotocore", "s3fs", "fsspec", "urllib3", "aiohttp", "gcsfs", "google",
           "azure", "adlfs", "shardstore")


def _forms(values: Iterable[str]) -> set[str]:
    """The values as given and URL-encoded (how they show in query strings)."""
    out: set[str] = set()
    for v in values:
        out |= {v, quote(v, safe=""), quote(v, safe="/"), quote_plus(v)}
    return out


def _leaks(text: str, values: Iterable[str]) -> list[str]:
    return sorted(f for f in _forms(values) if f in text)


def _debug_everywhere(caplog: pytest.LogCaptureFixture) -> None:
    for name in LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name or None)


def _formatted(records: Iterable[logging.LogRecord]) -> str:
    """Every record as a handler would write it, traceback included."""
    fmt = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return "\n".join(fmt.format(r) for r in records)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """Every exception linked from ``exc``: causes and contexts, suppressed or not."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        cur = todo.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        todo += [e for e in (cur.__cause__, cur.__context__) if e is not None]


def _s3_store(emu: Emulator) -> BlobStore:
    opts = {**emu.store_options(), "key": KEY, "secret": SECRET, "token": SESSION_TOKEN}
    return open_store(emu.store_url(SESSION_BUCKET, f"secrets-{uuid.uuid4().hex[:8]}"), **opts)


@pytest.mark.parametrize("kind", ["s3", "oci"])
def test_debug_logs_of_s3_calls_name_no_credential(
    kind: str, emulator_for: object, caplog: pytest.LogCaptureFixture
) -> None:
    _debug_everywhere(caplog)
    store = _s3_store(emulator_for(kind))  # type: ignore[operator]
    try:
        assert store.put("a/b", b"payload").size == 7
        assert store.get("a/b") == b"payload"
        assert [i.key for i in store.list("a/")] == ["a/b"]
        store.delete(["a/b"])
    finally:
        store.close()
    names = {r.name for r in caplog.records}
    assert any(n.startswith("botocore.endpoint") for n in names), names  # the SDK did log its requests
    secrets = (KEY, SECRET, SESSION_TOKEN)
    assert _leaks(_formatted(caplog.records), secrets) == []
    assert _leaks(caplog.text, secrets) == []


def test_a_gcs_token_is_nowhere_in_a_setup_error(
    gcs_emulator: Emulator, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gcsfs checks a raw token at https://oauth2.googleapis.com/tokeninfo?access_token=...;
    # a proxy that refuses connections makes that fail the same way with or without a network,
    # and requests' ProxyError quotes the URL, token (URL-encoded) included.
    for name in ("NO_PROXY", "no_proxy", "FETCH_RAW_TOKEN_EXPIRY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    _debug_everywhere(caplog)
    opts = {**gcs_emulator.store_options(), "token": GCS_TOKEN}
    store = open_store(gcs_emulator.store_url(SESSION_BUCKET, "secrets"), **opts, retry_attempts=1)
    with pytest.raises(ConfigError, match="could not set up the gs client") as info:
        store.get("x")
    err = info.value
    assert "ProxyError" in str(err) or "ConnectionError" in str(err)  # still says what went wrong
    chain = list(_chain(err))
    assert chain == [err], [type(e).__name__ for e in chain]  # nothing chained, not even suppressed
    for exc in chain:
        assert _leaks(repr(exc), [GCS_TOKEN]) == []
        assert _leaks(repr(exc.args), [GCS_TOKEN]) == []
    assert _leaks("".join(traceback.format_exception(err, chain=True)), [GCS_TOKEN]) == []
    assert _leaks(_formatted(caplog.records), [GCS_TOKEN]) == []


def _open_with_secret(kind: str, emu: Emulator, monkeypatch: pytest.MonkeyPatch) -> tuple[BlobStore, list[str]]:
    """A store of ``kind`` made with credentials (its client set up by one put), and them."""
    root = f"secrets-{uuid.uuid4().hex[:8]}"
    if kind == "s3":
        store, secrets = _s3_store(emu), [KEY, SECRET, SESSION_TOKEN]
    elif kind == "gcs":
        monkeypatch.setenv("FETCH_RAW_TOKEN_EXPIRY", "false")  # no call to Google: the emulator takes any token
        store = open_store(emu.store_url(SESSION_BUCKET, root), **{**emu.store_options(), "token": GCS_TOKEN})
        secrets = [GCS_TOKEN]
    else:
        store, secrets = open_store(emu.store_url(SESSION_BUCKET, root), **emu.store_options()), [AZURITE_KEY]
    store.put("k", b"v")
    return store, secrets


@pytest.mark.parametrize("kind", ["s3", "gcs", "azure"])
def test_a_store_s_secrets_are_scrubbed_from_any_logger_and_any_handler(
    kind: str, emulator_for: object, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a logger-level filter would miss: child loggers, loggers made later, handlers
    # added after the store was opened (basicConfig), tracebacks of logged exceptions.
    _debug_everywhere(caplog)
    store, secrets = _open_with_secret(kind, emulator_for(kind), monkeypatch)  # type: ignore[operator]
    late = io.StringIO()
    handler = logging.StreamHandler(late)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        secret = secrets[-1]
        logging.getLogger("urllib3.connectionpool").debug(
            '%s://%s:%s "%s %s %s" %s %s', "https", "oauth2.googleapis.com", 443, "GET",
            f"/tokeninfo?access_token={quote(secret, safe='')}", "HTTP/1.1", 400, None)
        fresh = logging.getLogger(f"botocore.made.later.{uuid.uuid4().hex[:6]}")
        fresh.debug("headers: %r", {"Authorization": f"Bearer {secret}", "x-other": b"%s" % secret.encode()})
        try:
            raise ValueError(f"credential {secret} refused")
        except ValueError:
            fresh.exception("setup failed")
        fresh.debug("plain %s", "value")
    finally:
        logging.getLogger().removeHandler(handler)
        store.close()
    assert late.getvalue().count("\n") >= 4, late.getvalue()  # the late handler saw them all
    plain = [r for r in caplog.records if r.name == fresh.name and r.msg == "plain %s"]
    assert plain and plain[0].args == ("value",)  # a record naming no secret is left alone
    assert _leaks(late.getvalue(), secrets) == []
    assert _leaks(_formatted(caplog.records), secrets) == []
    assert _leaks(caplog.text, secrets) == []


# -- operation errors: the typed error's message and everything chained to it ---------------
#
# Azurite's own error replies name no credential (checked: bad SAS signature, read-only SAS,
# missing blob, missing container), nor do moto's or fake-gcs-server's (missing key or
# bucket, failed condition).  When the reply is not HTTP at all (an http:// endpoint on a
# TLS port, a broken proxy) aiohttp raises ClientResponseError, which keeps the request:
# its text is the full URL (an Azure SAS rides in the query string, ``sig=`` included, and
# azure-core's ServiceResponseError repeats that text), its args the request headers
# (S3's Authorization and X-Amz-Security-Token, GCS's Bearer token).


def _not_http_server() -> tuple[socket.socket, str]:
    """A listening socket answering every connection with bytes that are not HTTP, and its URL."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                try:
                    conn.recv(65536)
                    conn.sendall(b"\x15\x03\x03\x00\x02\x02\x46garbage, not HTTP\r\n\r\n")
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True, name="not-http").start()
    return srv, f"http://127.0.0.1:{srv.getsockname()[1]}"


@pytest.fixture
def not_http_endpoint() -> Iterator[str]:
    srv, url = _not_http_server()
    try:
        yield url
    finally:
        srv.close()


def _container_sas() -> tuple[str, str]:
    """A container SAS made with Azurite's key (as the portal would hand one out), and its signature."""
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    sas = generate_container_sas(AZURITE_ACCOUNT, SESSION_BUCKET, account_key=AZURITE_KEY, expiry=expiry,
                                 permission=ContainerSasPermissions(read=True, write=True, list=True, delete=True))
    return sas, parse_qs(sas)["sig"][0]


_OPERATIONS = {
    "put": lambda s: s.put("k", b"v"),
    "get": lambda s: s.get("k"),
    "stat": lambda s: s.stat("k"),
    "list": lambda s: list(s.list("a/")),
    "delete": lambda s: s.delete(["k"]),
}


def _assert_chain_names_none(err: BaseException, secrets: Iterable[str]) -> str:
    """No link of ``err``'s chain (causes, contexts) names a secret; returns the formatted chain."""
    formatted = "".join(traceback.format_exception(err, chain=True))
    assert _leaks(formatted, secrets) == [], formatted
    for exc in _chain(err):
        assert _leaks(str(exc), secrets) == [], type(exc)
        assert _leaks(repr(exc.args), secrets) == [], type(exc)
    return formatted


def _store_at(kind: str, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> tuple[BlobStore, list[str], str]:
    """A store of ``kind`` at ``endpoint`` with credentials, them, and the SDK error a non-HTTP reply makes."""
    if kind == "azure":
        sas, sig = _container_sas()
        conn = f"BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};SharedAccessSignature={sas}"
        store = open_store(f"az://{SESSION_BUCKET}/secrets", connection_string=conn, retry_attempts=1)
        return store, [sas, sig], "ServiceResponseError"
    if kind == "s3":
        store = open_store(f"s3://{SESSION_BUCKET}/secrets", endpoint_url=endpoint, key=KEY, secret=SECRET,
                           token=SESSION_TOKEN, retry_attempts=1)
        return store, [KEY, SECRET, SESSION_TOKEN], "HTTPClientError"
    monkeypatch.setenv("FETCH_RAW_TOKEN_EXPIRY", "false")  # no call to Google
    store = open_store(f"gs://{SESSION_BUCKET}/secrets", endpoint_url=endpoint, token=GCS_TOKEN, project="p",
                       retry_attempts=1)
    return store, [GCS_TOKEN], "ClientResponseError"


@pytest.mark.parametrize("op", sorted(_OPERATIONS))
@pytest.mark.parametrize("kind", ["azure", "s3", "gcs"])
def test_no_credential_is_in_an_operation_error_from_a_reply_that_is_not_http(
    kind: str, op: str, not_http_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # azure: the SAS signature is in the text of the chain (the URL aiohttp quotes);
    # s3, gcs: aiohttp's ClientResponseError keeps the request's headers in its args
    # (Authorization, X-Amz-Security-Token), shown by nothing but there for any repr.
    store, secrets, sdk_error = _store_at(kind, not_http_endpoint, monkeypatch)
    try:
        with pytest.raises(BlobStoreError) as info:
            _OPERATIONS[op](store)
    finally:
        store.close()
    formatted = _assert_chain_names_none(info.value, secrets)
    assert sdk_error in formatted  # the chain still says what the SDK met
    assert "could not set up" not in str(info.value)  # an operation error, not a set-up one


def test_a_sas_the_store_was_not_given_is_nowhere_in_an_operation_error(
    not_http_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # adlfs reads AZURE_STORAGE_CONNECTION_STRING itself: the store never sees the SAS, so
    # nothing registered it; its signature must still not show (sig=... in a URL).
    sas, sig = _container_sas()
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       f"BlobEndpoint={not_http_endpoint}/{AZURITE_ACCOUNT};SharedAccessSignature={sas}")
    store = open_store(f"az://{SESSION_BUCKET}/secrets", account_name=AZURITE_ACCOUNT, retry_attempts=1)
    try:
        with pytest.raises(TransientError) as info:
            store.get("k")
    finally:
        store.close()
    _assert_chain_names_none(info.value, [sig])


def test_an_error_naming_no_secret_keeps_the_sdk_exception_as_its_cause(azure_emulator: Emulator) -> None:
    store = open_store(azure_emulator.store_url(SESSION_BUCKET, f"secrets-{uuid.uuid4().hex[:8]}"),
                       **azure_emulator.store_options(), retry_attempts=1)
    try:
        with pytest.raises(BlobNotFound) as info:
            store.get("missing")
    finally:
        store.close()
    cause = info.value.__cause__
    assert type(cause).__name__ == "ResourceNotFoundError", type(cause)  # the SDK's own exception, untouched
    assert cause.__traceback__ is not None
    _assert_chain_names_none(info.value, [AZURITE_KEY])


# -- the same, unit-level: a store whose "SDK" fails with a message naming its credential ----

TOKEN = "tok-0123456789/SECRET+value=="


class _FailingStore(FsspecStore):
    """An FsspecStore whose every operation fails with ``self.failure`` (its classifier knows nothing)."""

    scheme = "fake"
    OPTIONS = {"token": Option("token", str, None, "a credential", secret=True)}
    failure: BaseException = RuntimeError("unset")

    def _make_fs(self) -> object:
        return types.SimpleNamespace(cat_file=lambda *a, **k: self._fail())

    def _classify(self, exc: BaseException, key: str | None) -> None:
        return None

    def _fail(self) -> None:
        raise self.failure

    def put(self, key: str, data: bytes, *, if_absent: bool = False, token: str | None = None) -> Any:
        return self._call(key, self._fail)

    def stat(self, key: str) -> Any:
        return self._call(key, self._fail)

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Any:
        return self._call(prefix or None, self._fail)

    def delete(self, keys: Iterable[str]) -> None:
        self._call(None, self._fail)


def _failing(failure: BaseException) -> _FailingStore:
    store = _FailingStore("fake://bucket/root", token=TOKEN)
    store.failure = failure
    return store


def _pieces(value: str, size: int = 6) -> list[str]:
    """Every ``size``-character piece of ``value`` (a secret cut anywhere shows one of these)."""
    return [value[i : i + size] for i in range(len(value) - size + 1)]


_CUT_FORMS = sorted({TOKEN, quote(TOKEN, safe=""), quote(TOKEN, safe="/"), quote_plus(TOKEN)})


@pytest.mark.parametrize("form", _CUT_FORMS)
@pytest.mark.parametrize("make, typed", [
    (PermissionError, AccessDenied),
    (ConnectionError, TransientError),
    (ValueError, RequestRejected),
])
def test_a_secret_cut_by_shortening_leaves_no_piece_in_the_message(form: str, make: type, typed: type) -> None:
    # 300 characters are kept: the secret starts ten before the cut.
    store = _failing(make("x" * 290 + form + " and more"))
    with pytest.raises(typed) as info:
        store.stat("k")
    message = str(info.value)
    assert [p for p in _pieces(form) if p in message] == [], message
    assert "<redacted>" in message
    _assert_chain_names_none(info.value, [TOKEN])


@pytest.mark.parametrize("form", _CUT_FORMS)
def test_a_url_encoded_secret_is_redacted_from_message_and_chain(form: str) -> None:
    failure = OSError(f"GET https://svc.example/o?access_token={form}&alt=json failed")
    failure.__context__ = KeyError(f"token {form}")  # what the SDK was handling when it failed
    store = _failing(failure)
    with pytest.raises(RequestRejected) as info:
        store.get("k")
    assert "<redacted>" in str(info.value) and "svc.example" in str(info.value)
    formatted = _assert_chain_names_none(info.value, [TOKEN])
    assert "KeyError" in formatted  # the sanitized chain still names every link


def test_a_detail_the_caller_already_cut_has_no_piece_of_a_secret_left() -> None:
    # plugins/gcs.py cuts an HttpError message to 300 characters before passing it on.
    store = _failing(RuntimeError())
    for form in _CUT_FORMS:
        err = store._typed("denied", 403, ("403: " + "y" * 285 + form)[:300], "k")
        assert [p for p in _pieces(form) if p in str(err)] == [], str(err)
        assert str(err).endswith("<redacted>)"), str(err)
    assert "trailing words" in str(store._typed("denied", 403, "403: trailing words", "k"))


def test_a_non_secret_cause_is_kept_as_it_is() -> None:
    failure = ConnectionResetError("peer reset the connection")
    store = _failing(failure)
    with pytest.raises(TransientError) as info:
        store.put("k", b"v")
    assert info.value.__cause__ is failure
