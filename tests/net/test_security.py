"""Transport security with real certificates: TLS, mutual TLS, the cluster secret, the bind check."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import pytest

from shardstore.errors import InvalidError
from shardstore.net.flight import FlightTransport
from shardstore.net.security import InsecureBind, Security, SecurityConfigError, TransportAuthError, is_loopback
from shardstore.transport import NodeDisconnected
from tests.net.certs import Pki

Make = Callable[..., FlightTransport]
SECRET = "correct-horse-battery-staple-7f3a"


class Counter:
    """A handler that counts its calls and echoes."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, action: str, request: Any) -> Any:
        with self.lock:
            self.calls += 1
        return request


def server_security(pki: Pki, **kw: Any) -> Security:
    return Security(tls_cert=pki.server_cert, tls_key=pki.server_key, **kw)


def start(make: Make, security: Security) -> tuple[FlightTransport, Counter]:
    counter = Counter()
    server = make(security=security)
    server.register("srv", counter)
    return server, counter


def test_tls_round_trip(transports: Make, pki: Pki) -> None:
    server, counter = start(transports, server_security(pki))
    client = transports(security=Security(tls_ca=pki.ca), peers={"srv": server.address}, default_timeout=5)
    assert client.send("c", "srv", "echo", {"x": 1}) == {"x": 1} and counter.calls == 1
    # PEM given as bytes or str works as well as paths
    client2 = transports(security=Security(tls_ca=pki.ca.read_text()), peers={"srv": server.address})
    assert client2.send("c", "srv", "echo", 2) == 2


@pytest.mark.parametrize("client_security", ["plaintext", "wrong-ca"])
def test_a_client_that_cannot_verify_or_speak_tls_is_refused(transports: Make, pki: Pki, other_pki: Pki,
                                                             client_security: str) -> None:
    server, counter = start(transports, server_security(pki))
    sec = Security() if client_security == "plaintext" else Security(tls_ca=other_pki.ca)
    client = transports(security=sec, peers={"srv": server.address}, default_timeout=5)
    with pytest.raises(NodeDisconnected) as err:
        client.send("c", "srv", "echo", 1)
    assert err.value.delivered is False and counter.calls == 0


def test_mutual_tls(transports: Make, pki: Pki, other_pki: Pki) -> None:
    server, counter = start(transports, server_security(pki, tls_ca=pki.ca, mutual_tls=True))
    good = transports(security=Security(tls_cert=pki.client_cert, tls_key=pki.client_key, tls_ca=pki.ca,
                                        mutual_tls=True), peers={"srv": server.address}, default_timeout=5)
    assert good.send("c", "srv", "echo", 1) == 1
    for sec in (Security(tls_ca=pki.ca),  # no client certificate
                Security(tls_cert=other_pki.client_cert, tls_key=other_pki.client_key, tls_ca=pki.ca)):
        bad = transports(security=sec, peers={"srv": server.address}, default_timeout=5)
        with pytest.raises(NodeDisconnected) as err:
            bad.send("c", "srv", "echo", 1)
        assert err.value.delivered is False
    assert counter.calls == 1


@pytest.mark.parametrize("presented", [None, "wrong-secret-value-91c2", SECRET[:-1]])
def test_a_missing_or_wrong_secret_is_refused_before_the_handler(transports: Make, pki: Pki,
                                                                 caplog: pytest.LogCaptureFixture,
                                                                 presented: str | None) -> None:
    server, counter = start(transports, server_security(pki, secret=SECRET))
    ok = transports(security=Security(tls_ca=pki.ca, secret=SECRET), peers={"srv": server.address})
    assert ok.send("c", "srv", "echo", 1) == 1
    bad = transports(security=Security(tls_ca=pki.ca, secret=presented), peers={"srv": server.address})
    caplog.set_level(logging.WARNING, logger="shardstore.net")
    with pytest.raises(TransportAuthError) as err:
        bad.send("c", "srv", "echo", 2)
    exc = err.value
    verdict = "missing" if presented is None else "wrong"
    assert isinstance(exc, InvalidError) and not isinstance(exc, NodeDisconnected)
    assert exc.retryable is False and exc.delivered is False and f"{verdict} cluster secret" in str(exc)
    assert counter.calls == 1  # only the good call reached the handler
    warnings = [r for r in caplog.records if r.name == "shardstore.net" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    line = warnings[0].getMessage()
    assert "127.0.0.1" in line and f"{verdict} cluster secret" in line
    for text in (caplog.text, str(exc), repr(exc), "".join(getattr(exc, "__notes__", [])), repr(bad.security)):
        assert SECRET not in text
        if presented:
            assert presented not in text


def test_a_secret_over_plaintext_loopback(transports: Make) -> None:
    server, counter = start(transports, Security(secret=SECRET))
    client = transports(security=Security(secret=SECRET), peers={"srv": server.address})
    assert client.send("c", "srv", "echo", 1) == 1
    with pytest.raises(TransportAuthError):
        transports(peers={"srv": server.address}).send("c", "srv", "echo", 1)
    assert counter.calls == 1


@pytest.mark.parametrize(("security", "missing"), [
    ({}, "TLS (tls_cert/tls_key) and a cluster secret or mutual_tls"),
    ({"secret": SECRET}, "TLS (tls_cert/tls_key)"),
    ({"tls": True}, "a cluster secret or mutual_tls"),
])
def test_a_non_loopback_bind_needs_tls_and_peer_authentication(transports: Make, pki: Pki, security: dict[str, Any],
                                                               missing: str) -> None:
    sec = server_security(pki) if security.pop("tls", False) else Security(**security)
    t = transports(listen="0.0.0.0:0", security=sec)
    with pytest.raises(InsecureBind) as err:
        t.register("n", Counter())
    message = str(err.value)
    assert "\n" not in message and message.endswith(f"without {missing}") and "'0.0.0.0'" in message
    assert isinstance(err.value, InvalidError) and t.address is None
    assert SECRET not in message


def test_the_bind_check_allows_tls_with_a_secret_or_mutual_tls() -> None:
    Security(tls_cert="c", tls_key="k", secret=SECRET).check_bind("10.0.0.5")
    Security(tls_cert="c", tls_key="k", tls_ca="ca", mutual_tls=True).check_bind("0.0.0.0")
    Security().check_bind("127.0.0.1")
    Security().check_bind("localhost")
    Security().check_bind("::1")
    assert is_loopback("127.3.4.5") and is_loopback("[::1]") and not is_loopback("example.com")


def test_inconsistent_settings_are_refused() -> None:
    with pytest.raises(SecurityConfigError, match="go together"):
        Security(tls_cert="c.pem")
    with pytest.raises(SecurityConfigError, match="mutual_tls needs"):
        Security(mutual_tls=True)
    with pytest.raises(SecurityConfigError, match="non-empty"):
        Security(secret="")
    with pytest.raises(SecurityConfigError, match="cannot read tls_ca"):
        FlightTransport(security=Security(tls_ca="/no/such/ca.pem"))
    assert SECRET not in repr(Security(secret=SECRET))
