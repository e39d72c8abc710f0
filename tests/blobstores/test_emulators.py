"""The test support itself: emulators start, answer raw fsspec calls, stop; the proxy
forwards byte for byte and answers with each service's real throttling response."""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from shardstore.testing import emulators
from shardstore.testing.emulators import Emulator, EmulatorError, start_emulator
from shardstore.testing.fault_proxy import FaultProxy, emu_via_proxy_options, start_fault_proxy
from tests.conftest import CLOUD, SESSION_BUCKET

kinds = pytest.mark.parametrize("kind", CLOUD)

# moto checks that an Authorization header is present, not that it is valid.
MOTO_AUTH = "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0"


@pytest.fixture
def emu(kind: str, emulator_for) -> Emulator:  # type: ignore[no-untyped-def]
    return emulator_for(kind)


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).read()
        return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


@kinds
def test_emulator_raw_fsspec_round_trip(kind: str, emu: Emulator) -> None:
    assert emu.kind == kind and emu.running
    assert emu.endpoint.startswith("http://127.0.0.1:")
    emu.make_bucket("raw-bucket")
    emu.make_bucket("raw-bucket")  # idempotent
    fs = emu.raw_fs()
    fs.pipe_file("raw-bucket/dir/a.txt", b"hello raw")
    assert fs.cat_file("raw-bucket/dir/a.txt") == b"hello raw"
    assert fs.cat_file("raw-bucket/dir/a.txt", start=1, end=4) == b"ell"
    assert [p.rsplit("/", 1)[-1] for p in fs.ls("raw-bucket/dir", detail=False)] == ["a.txt"]
    with pytest.raises(FileExistsError):
        fs.pipe_file("raw-bucket/dir/a.txt", b"x", mode="create")
    scheme = {"s3": "s3", "oci": "oci", "gcs": "gs", "azure": "az"}[kind]
    assert emu.store_url("b", "p/q") == f"{scheme}://b/p/q"
    assert emu.store_url("b") == f"{scheme}://b"
    opts = emu.store_options()
    expected_keys = {
        "s3": {"endpoint_url", "key", "secret"},
        "oci": {"endpoint_url", "key", "secret", "region", "namespace"},
        "gcs": {"endpoint_url", "token", "project"},
        "azure": {"connection_string"},
    }[kind]
    assert set(opts) == expected_keys
    if kind == "azure":
        assert f"BlobEndpoint={emu.endpoint}/devstoreaccount1;" in opts["connection_string"]
    else:
        assert opts["endpoint_url"] == emu.endpoint
    assert "region" not in emu.store_options() or kind == "oci"


@kinds
def test_proxy_forwards_everything(kind: str, emu: Emulator) -> None:
    with start_fault_proxy(emu) as proxy:
        assert proxy.flavor == kind
        opts = emu_via_proxy_options(emu, proxy)
        assert proxy.endpoint in json.dumps(opts)
        fs = emu.raw_fs(endpoint=proxy.endpoint)
        big = os.urandom(12 * 1024 * 1024 + 3)  # several requests: parts, resumable chunks, blocks
        with fs.open(f"{SESSION_BUCKET}/proxy/big", "wb", block_size=5 * 1024 * 1024) as f:
            f.write(big)
        assert fs.cat_file(f"{SESSION_BUCKET}/proxy/big") == big
        assert fs.info(f"{SESSION_BUCKET}/proxy/big")["size"] == len(big)
        seen = proxy.total_requests
        assert seen >= 3
        assert all(status < 400 for _, _, status in proxy.log), proxy.log
        # Every request went through the proxy (GCS resumable uploads follow a rewritten Location).
        if kind == "gcs":
            assert sum(1 for m, t, _ in proxy.log if "upload_id=" in t) >= 2, proxy.log
        assert not proxy.throttled


def _raw_get(kind: str, emu: Emulator, endpoint: str, key: str) -> tuple[int, dict[str, str], bytes]:
    """A GET of a blob straight through urllib (moto wants an Authorization header, not a
    valid one; Azurite refuses an unsigned read with 403, which still proves forwarding)."""
    headers = {}
    if kind in ("s3", "oci"):
        url = f"{endpoint}/{SESSION_BUCKET}/{key}"
        headers["Authorization"] = MOTO_AUTH
    elif kind == "gcs":
        url = f"{endpoint}/storage/v1/b/{SESSION_BUCKET}/o/{key}?alt=media"
    else:
        url = f"{endpoint}/devstoreaccount1/{SESSION_BUCKET}/{key}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


@kinds
def test_proxy_throttles_with_the_service_response(kind: str, emu: Emulator) -> None:
    emu.raw_fs().pipe_file(f"{SESSION_BUCKET}/thr/raw", b"raw body")
    with FaultProxy(emu.endpoint, kind) as proxy:
        proxy.throttle(2, method="GET", path=r"thr/raw|thr%2Fraw")
        proxy.throttle(1, method="PUT", path="never-requested")
        status, headers, body = _raw_get(kind, emu, proxy.endpoint, "thr/raw")
        if kind in ("s3", "oci"):
            assert status == 503
            assert b"<Code>SlowDown</Code>" in body
        elif kind == "gcs":
            assert status == 429
            err = json.loads(body)["error"]
            assert err["code"] == 429 and err["message"] == "rateLimitExceeded"
            assert err["errors"][0]["reason"] == "rateLimitExceeded"
        else:
            assert status == 503
            assert headers.get("x-ms-error-code") == "ServerBusy"
            assert b"<Code>ServerBusy</Code>" in body
        assert _raw_get(kind, emu, proxy.endpoint, "thr/raw")[0] in (429, 503)
        # The two throttles are used up; the PUT rule does not match a GET.
        if kind != "azure":  # Azurite refuses unsigned reads (403): the point is it is forwarded
            assert _raw_get(kind, emu, proxy.endpoint, "thr/raw")[2] == b"raw body"
        else:
            assert _raw_get(kind, emu, proxy.endpoint, "thr/raw")[0] == 403
        assert proxy.throttled == {"GET": 2}
        assert proxy.requests == {"GET": 3}
        assert proxy.pending() == 1
        proxy.clear()
        assert proxy.pending() == 0


def test_proxy_drops_replies_after_forwarding(emulator_for) -> None:  # type: ignore[no-untyped-def]
    emu = emulator_for("s3")
    with FaultProxy(emu.endpoint, "s3") as proxy:
        proxy.drop_reply(1, method="PUT")
        conn = http.client.HTTPConnection("127.0.0.1", int(proxy.endpoint.rsplit(":", 1)[1]), timeout=10)
        conn.request("PUT", f"/{SESSION_BUCKET}/dropped/key", body=b"landed anyway",
                     headers={"Authorization": MOTO_AUTH})
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            conn.getresponse()
        conn.close()
        assert proxy.dropped == {"PUT": 1}
        assert proxy.log[-1][2] == -200  # the service had answered 200
        assert _raw_get("s3", emu, emu.endpoint, "dropped/key")[2] == b"landed anyway"


def test_proxy_dechunks_request_bodies(emulator_for) -> None:  # type: ignore[no-untyped-def]
    emu = emulator_for("s3")
    with FaultProxy(emu.endpoint, "s3") as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", int(proxy.endpoint.rsplit(":", 1)[1]), timeout=10)
        conn.request("PUT", f"/{SESSION_BUCKET}/chunked/key", body=iter([b"part one, ", b"part two"]),
                     headers={"Authorization": MOTO_AUTH}, encode_chunked=True)
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
        # Keep-alive: a second request on the same connection works.
        conn.request("GET", f"/{SESSION_BUCKET}/chunked/key", headers={"Authorization": MOTO_AUTH})
        resp = conn.getresponse()
        assert resp.read() == b"part one, part two"
        conn.close()


def test_emulator_stop_is_final_and_idempotent() -> None:
    emu = start_emulator("gcs")
    probe = f"{emu.endpoint}/storage/v1/b"
    assert _answers(probe)
    assert "STORAGE_EMULATOR_HOST" not in os.environ or not os.environ["STORAGE_EMULATOR_HOST"].endswith(
        f":{emu.port}"
    )
    log_path = emu.log_path
    with emu:
        pass
    assert emu.process.poll() is not None
    assert not emu.running
    assert not _answers(probe)
    assert not Path(log_path).exists()
    emu.stop()
    with pytest.raises(EmulatorError, match="not running"):
        emu.make_bucket("late")
    assert os.environ.get("STORAGE_EMULATOR_HOST", "").endswith(f":{emu.port}") is False


def test_gcsfs_hns_probe_disabled() -> None:
    assert os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] == "false"


def test_unknown_kind_is_an_error() -> None:
    with pytest.raises(EmulatorError, match="unknown emulator kind"):
        start_emulator("ftp")


def test_missing_azurite_says_to_run_npm_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SHARDSTORE_AZURITE", raising=False)
    monkeypatch.setattr(emulators, "repo_root", lambda: tmp_path)
    with pytest.raises(EmulatorError, match="npm install"):
        start_emulator("azure")
    monkeypatch.setenv("SHARDSTORE_AZURITE", str(tmp_path / "nope"))
    with pytest.raises(EmulatorError, match="SHARDSTORE_AZURITE"):
        start_emulator("azure")


def test_a_crashing_emulator_reports_its_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = tmp_path / "fake-gcs"
    script.write_text("#!/bin/sh\necho 'boom: cannot start' >&2\nexit 3\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("SHARDSTORE_FAKE_GCS", str(script))
    with pytest.raises(EmulatorError) as ei:
        start_emulator("gcs")
    assert "status 3" in str(ei.value) and "boom: cannot start" in str(ei.value)


def test_a_silent_emulator_times_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = tmp_path / "fake-gcs"
    script.write_text("#!/bin/sh\necho 'starting slowly'\nexec sleep 30\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("SHARDSTORE_FAKE_GCS", str(script))
    with pytest.raises(EmulatorError) as ei:
        start_emulator("gcs", timeout=1)
    assert "within 1s" in str(ei.value) and "starting slowly" in str(ei.value)


def test_free_port_is_free() -> None:
    port = emulators._free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
