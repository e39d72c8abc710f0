"""Security of the network transport: TLS, mutual TLS and the cluster secret.

- A node listens on loopback unless told otherwise.  Listening on any other address
  requires TLS *and* an authenticated peer (a cluster secret or mutual TLS):
  :meth:`Security.check_bind` raises :class:`InsecureBind` at register time otherwise.
- TLS: the server presents ``tls_cert``/``tls_key``; clients verify it against ``tls_ca``
  (``grpc+tls://``).  With ``mutual_tls`` the server also requires a client certificate
  signed by ``tls_ca``, and clients present ``tls_cert``/``tls_key`` (a node's certificate
  serves both ends).
- Cluster secret: every call carries ``authorization: Bearer <secret>`` (a Flight client
  middleware); the server compares it with :func:`hmac.compare_digest` before any handler
  runs.  A missing or wrong secret is refused with :class:`TransportAuthError` on the
  caller's side (never retryable, nothing applied) and a warning on the server naming the
  peer's address and whether the secret was missing or wrong, never the secret or the value
  presented.  The secret is kept out of ``repr`` as well.

PEM material is given as ``bytes`` (the PEM itself), a ``str`` starting with ``-----BEGIN``
(the PEM itself) or a path (``str`` or :class:`~pathlib.Path`) to a PEM file.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.flight as flight

from shardstore.errors import InvalidError
from shardstore.transport import TransportError

log = logging.getLogger("shardstore.net")

Pem = bytes | str | Path
AUTH_HEADER = "authorization"
_BEARER = "Bearer "


class SecurityConfigError(TransportError, InvalidError):
    """The transport's security settings are inconsistent (e.g. a key without a certificate)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"invalid transport security: {reason}")
        self.reason = reason


class InsecureBind(SecurityConfigError):
    """Refused to listen on a non-loopback address without TLS and peer authentication."""


class TransportAuthError(TransportError, InvalidError):
    """The peer refused the call: the cluster secret was missing or wrong (the handler did not run)."""

    retryable = False

    def __init__(self, sender: str, target: str, action: str, reason: str) -> None:
        super().__init__(f"[{action}] {sender} -> {target}: refused by the peer: {reason}; "
                         f"nothing was applied (check the cluster secret of both nodes)")
        self.sender = sender
        self.target = target
        self.action = action
        self.reason = reason
        self.delivered = False


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP literal or ``localhost``) names the loopback interface."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read_pem(value: Pem, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str) and value.lstrip().startswith("-----BEGIN"):
        return value.encode()
    try:
        return Path(value).read_bytes()
    except OSError as exc:
        raise SecurityConfigError(f"cannot read {what} from {str(value)!r}: {exc.strerror or exc}") from exc


@dataclass(frozen=True)
class Security:
    """TLS material, mutual TLS and the cluster secret of one node (client and server side)."""

    tls_cert: Pem | None = None
    tls_key: Pem | None = field(default=None, repr=False)
    tls_ca: Pem | None = None
    secret: str | None = field(default=None, repr=False)
    mutual_tls: bool = False

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise SecurityConfigError("tls_cert and tls_key go together (one is missing)")
        if self.secret is not None and (not isinstance(self.secret, str) or not self.secret):
            raise SecurityConfigError("the cluster secret must be a non-empty string")
        if self.mutual_tls and (self.tls_ca is None or self.tls_cert is None):
            raise SecurityConfigError("mutual_tls needs tls_ca (to verify peers) and tls_cert/tls_key (to present)")

    def __repr__(self) -> str:
        return (f"Security(tls={self.tls}, mutual_tls={self.mutual_tls}, "
                f"secret={'set' if self.secret else 'none'})")

    @property
    def tls(self) -> bool:
        """Whether calls use TLS (a certificate or a CA is configured)."""
        return self.tls_cert is not None or self.tls_ca is not None

    @property
    def scheme(self) -> str:
        """The Flight URI scheme: ``grpc+tls`` or ``grpc+tcp``."""
        return "grpc+tls" if self.tls else "grpc+tcp"

    def check_bind(self, host: str) -> None:
        """Raise :class:`InsecureBind` unless listening on ``host`` is allowed by these settings."""
        if is_loopback(host):
            return
        missing = []
        if self.tls_cert is None:
            missing.append("TLS (tls_cert/tls_key)")
        if not self.secret and not self.mutual_tls:
            missing.append("a cluster secret or mutual_tls")
        if missing:
            raise InsecureBind(f"refusing to listen on non-loopback {host!r} without " + " and ".join(missing))

    def server_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`pyarrow.flight.FlightServerBase` for these settings."""
        out: dict[str, Any] = {}
        if self.tls_cert is not None:
            assert self.tls_key is not None
            out["tls_certificates"] = [flight.CertKeyPair(cert=_read_pem(self.tls_cert, "tls_cert"),
                                                          key=_read_pem(self.tls_key, "tls_key"))]
        elif self.tls_ca is not None:
            raise SecurityConfigError("a TLS server needs tls_cert/tls_key (only tls_ca is set)")
        if self.mutual_tls:
            assert self.tls_ca is not None
            out["verify_client"] = True
            out["root_certificates"] = _read_pem(self.tls_ca, "tls_ca")
        if self.secret:
            out["middleware"] = {"secret": _SecretServerFactory(self.secret)}
        return out

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`pyarrow.flight.FlightClient` for these settings."""
        out: dict[str, Any] = {}
        if self.tls_ca is not None:
            out["tls_root_certs"] = _read_pem(self.tls_ca, "tls_ca")
        if self.tls_cert is not None:  # presented to servers that verify clients (mutual TLS)
            assert self.tls_key is not None
            out["cert_chain"] = _read_pem(self.tls_cert, "tls_cert")
            out["private_key"] = _read_pem(self.tls_key, "tls_key")
        if self.secret:
            out["middleware"] = [_SecretClientFactory(self.secret)]
        return out


# -- the cluster secret -------------------------------------------------------------------------


class _SecretClientMiddleware(flight.ClientMiddleware):
    def __init__(self, header: str) -> None:
        super().__init__()
        self._header = header

    def sending_headers(self) -> dict[str, str]:
        return {AUTH_HEADER: self._header}


class _SecretClientFactory(flight.ClientMiddlewareFactory):
    """Adds ``authorization: Bearer <secret>`` to every call."""

    def __init__(self, secret: str) -> None:
        super().__init__()
        self._header = _BEARER + secret

    def start_call(self, info: flight.CallInfo) -> flight.ClientMiddleware:
        return _SecretClientMiddleware(self._header)


class SecretCheck(flight.ServerMiddleware):
    """The verdict on one call's cluster secret: ``ok``, ``missing`` or ``wrong``."""

    def __init__(self, verdict: str) -> None:
        super().__init__()
        self.verdict = verdict


class _SecretServerFactory(flight.ServerMiddlewareFactory):
    """Checks every call's cluster secret (constant-time); RPC methods read the verdict via :func:`check_secret`."""

    def __init__(self, secret: str) -> None:
        super().__init__()
        self._expected = (_BEARER + secret).encode()

    def start_call(self, info: flight.CallInfo, headers: dict[str, Any]) -> SecretCheck:
        values = headers.get(AUTH_HEADER) or []
        presented = values[0] if values else None
        if presented is None:
            verdict = "missing"
        else:
            raw = presented.encode() if isinstance(presented, str) else bytes(presented)
            verdict = "ok" if hmac.compare_digest(raw, self._expected) else "wrong"
        if verdict != "ok" and info.method not in (flight.FlightMethod.DO_ACTION, flight.FlightMethod.DO_EXCHANGE):
            log.warning("refused a %s call from an unknown peer: %s cluster secret", info.method.name, verdict)
            raise flight.FlightUnauthenticatedError(f"{verdict} cluster secret")
        return SecretCheck(verdict)


def check_secret(context: flight.ServerCallContext) -> None:
    """Refuse the call (before any handler) unless its cluster secret checked out; no-op without a secret."""
    check = context.get_middleware("secret")
    if check is None or check.verdict == "ok":
        return
    log.warning("refused a transport call from %s: %s cluster secret", context.peer(), check.verdict)
    raise flight.FlightUnauthenticatedError(f"{check.verdict} cluster secret")
