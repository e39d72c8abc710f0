"""Credential values kept out of log records and out of client-setup errors.

**Logs.**  With DEBUG logging on, botocore logs every prepared request (its Authorization
header names the access key id, ``X-Amz-Security-Token`` is the session token) and every
canonical request; urllib3 logs the URLs it fetches (gcsfs checks a raw token at
``/tokeninfo?access_token=...``).  The cloud plugins register the secret option values
they are given (:func:`set_up_client`, :func:`register_secrets`); from then on every log
record made in the process has those values, and their URL-encoded forms, replaced by
``<redacted>`` in its message and in the traceback it carries.

How: a log-record factory (:func:`logging.setLogRecordFactory`) wrapping the one in
place, installed by the first registration.  It sees every record of every logger once,
when the record is made, before any filter or handler.  Chosen over:

- a ``logging.Filter`` on the SDK loggers: a logger's filters run only for records logged
  on that very logger, not for those its children propagate (``botocore.endpoint``,
  ``botocore.auth``, ...), and SDK modules make their loggers as they are imported;
- a filter on handlers: misses handlers added later (``basicConfig`` after a store is
  opened, pytest's ``caplog`` in each test);
- lowering the SDK loggers' levels: hides what a user turned DEBUG on to see, and any
  later ``setLevel`` undoes it.

Only records that pass their logger's level check are made, so with DEBUG off the SDKs'
debug calls cost nothing more; a record is formatted once more to be checked, and one
that names no secret is left as it was.  Values shorter than :data:`MIN_LENGTH` and
gcsfs' token keywords (``anon``, ``google_default``, ...) are not registered.  Registered
values stay registered for the life of the process.  Not covered: records built without
the factory (``logging.makeLogRecord``), or a factory installed later that does not call
the one it replaces; and credentials an SDK finds itself (environment, profiles).

**Errors.**  :func:`set_up_client` turns a failure to build a client into a ConfigError
whose message is redacted (before it is shortened, so no part of a secret is left) and
which chains nothing, not even a suppressed ``__context__``: the SDK's exception may
quote a credential (requests' errors quote the URL they failed on, token included).

Errors of normal operations (:mod:`shardstore.blobstores.fsspec_store`) are built with
:func:`redact` then :func:`shorten`, and chained to the SDK's exception only through
:func:`safe_cause`: when any link of that chain names a credential (its message, its
``args``, its attributes: aiohttp's ClientResponseError keeps the request's URL, SAS
``sig=`` included, and its headers, ``Authorization`` included), a
:class:`RedactedException` summing up the chain with the secrets replaced stands in for it.
Besides the values given, :func:`redact` replaces what is a credential by its name wherever
it shows (``sig=``, ``X-Amz-Security-Token``, ``Authorization: ...``, ``AccountKey=``...),
so one an SDK found itself (adlfs reads ``AZURE_STORAGE_CONNECTION_STRING``) goes too.
"""

from __future__ import annotations

import logging
import re
import threading
import traceback
from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import quote, quote_plus

from shardstore.blobstores.errors import BlobStoreError, ConfigError

T = TypeVar("T")

REDACTED = "<redacted>"
#: Shorter values are not scrubbed from logs (they would blank out ordinary words).
MIN_LENGTH = 8
#: gcsfs ``token`` values that name a method, not a credential.
NOT_SECRETS = frozenset({"anon", "google_default", "cache", "cloud", "browser", "token"})
#: What error messages are cut to (the first line, this many characters), after redaction.
SHORT = 300
#: A text cut short before it was redacted: a tail this long (or longer) that starts a secret goes too.
MIN_TAIL = 4

#: Query parameters, headers and connection-string fields whose value is a credential,
#: wherever they show: ``name=value`` (up to ``&``, ``;``, a quote or a space) or
#: ``'name': 'value'`` (a header mapping's repr).
_NAMED = re.compile(
    r"(?i)\b(sig|signature|x-amz-signature|x-amz-security-token|x-amz-credential|x-goog-signature|"
    r"x-goog-credential|access_token|refresh_token|id_token|client_secret|accountkey|sharedaccesssignature|"
    r"x-ms-encryption-key)(['\"]?\s*[:=]\s*['\"]?)[^&;\s'\"<>,)]+"
)
#: An Authorization header's value (its scheme too: "Bearer ...", "AWS4-HMAC-SHA256 Credential=...").
_AUTHORIZATION = re.compile(r"(?i)\b((?:proxy-)?authorization['\"]?\s*[:=]\s*['\"]?)[^'\"\r\n]+")

_lock = threading.Lock()
_secrets: tuple[str, ...] = ()  # every registered form, longest first


def secret_forms(value: str) -> set[str]:
    """``value`` as given and as it shows URL-encoded in paths and query strings."""
    return {value, quote(value, safe=""), quote(value, safe="/"), quote_plus(value)}


def _wanted(value: object, min_length: int) -> bool:
    return isinstance(value, str) and len(value) >= min_length and value not in NOT_SECRETS


def register_secrets(values: Iterable[object]) -> None:
    """Scrub these values (strings of MIN_LENGTH or more) from every log record made from now on."""
    global _secrets
    new: set[str] = set()
    for value in values:
        if _wanted(value, MIN_LENGTH):
            new |= secret_forms(value)  # type: ignore[arg-type]
    if not new:
        return
    with _lock:
        if not new <= set(_secrets):
            _secrets = tuple(sorted(set(_secrets) | new, key=len, reverse=True))
        _install()


def redact(text: str, values: Iterable[object] = (), *, cut: bool = False) -> str:
    """``text`` with every registered secret, every one of ``values`` (4+ chars) and every
    credential known by its name (``sig=...``, ``Authorization: ...``) replaced.

    ``cut``: ``text`` may have been cut short before it got here, so a tail of it that is
    the start of a secret (:data:`MIN_TAIL` characters or more) is replaced as well.
    """
    forms = _forms(values)
    text = _replace(text, forms)
    text = _AUTHORIZATION.sub(lambda m: m.group(1) + REDACTED, text)
    text = _NAMED.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    if cut:
        for form in forms:
            for n in range(len(form) - 1, MIN_TAIL - 1, -1):
                if text.endswith(form[:n]):
                    return text[:-n] + REDACTED
    return text


def shorten(text: str, limit: int = SHORT) -> str:
    """The first line of ``text``, at most ``limit`` characters (redact first: a cut can split a secret)."""
    lines = text.strip().splitlines()
    return lines[0][:limit] if lines else ""


def _forms(values: Iterable[object]) -> list[str]:
    """Every form of ``values`` (4+ chars) and of the registered secrets, longest first."""
    extra: set[str] = set()
    for value in values:
        if _wanted(value, 4):
            extra |= secret_forms(value)  # type: ignore[arg-type]
    return sorted(extra, key=len, reverse=True) + list(_secrets)


def _replace(text: str, forms: Iterable[str]) -> str:
    for form in forms:
        if form in text:
            text = text.replace(form, REDACTED)
    return text


def store_secrets(store: Any) -> list[str]:
    """The string values of a store's options declared secret."""
    return [v for name, opt in store.OPTIONS.items() if opt.secret and isinstance(v := store.options.get(name), str)]


def set_up_client(store: Any, make: Callable[[], T], extra_secrets: Iterable[str] = ()) -> T:
    """Register the store's secrets for log scrubbing, then ``make()`` its client.

    A failure becomes a ConfigError naming no secret and chaining no exception.
    """
    secrets = [*store_secrets(store), *extra_secrets]
    register_secrets(secrets)
    try:
        return make()
    except BlobStoreError:
        raise
    except Exception as exc:
        failure = ConfigError(
            f"could not set up the {store.scheme} client: {type(exc).__name__}: "
            f"{shorten(redact(text_of(exc), secrets))}",
            location=store.location,
        )
    # Raised here, out of the except block, so the SDK's exception is not its __context__.
    raise failure


# -- exception chains -----------------------------------------------------------------


class RedactedException(Exception):
    """Stands in for an exception chain that named a credential.

    Its message has one line per link of the chain (outermost first): the exception's
    qualified type name and its message, secrets replaced.  No traceback, no links.
    ``types`` holds those qualified type names.
    """

    def __init__(self, summary: str, types: tuple[str, ...]) -> None:
        super().__init__(summary)
        self.types = types


#: Per link, at most this many characters of (redacted) message in a RedactedException.
LINK_TEXT = 1000


def safe_cause(exc: BaseException, values: Iterable[object] = ()) -> BaseException:
    """``exc`` itself when no link of its chain names a secret, else a RedactedException of it.

    Every link counts, suppressed ``__context__`` too, and every link is checked in its
    message, its notes, ``repr(args)`` and ``repr(vars())`` (where SDK errors keep the
    request: URL, headers); a link that cannot be shown is taken to name one.
    """
    values = list(values)
    links = list(_links(exc))
    if not any(_names_secret(link, values) for link in links):
        return exc
    types = tuple(_qualname(link) for link in links)
    lines = []
    for i, link in enumerate(links):
        text = redact(text_of(link), values)[:LINK_TEXT].strip().replace("\n", "\n    ")
        lines.append(f"{'' if i == 0 else 'from '}{types[i]}: {text}")
    summary = "\n".join(lines) + "\n(the chain named a credential: shown redacted, without tracebacks)"
    return RedactedException(summary, types)


def _links(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception linked from it (causes and contexts), outermost first."""
    seen: set[int] = set()
    out: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo:
        cur = todo.pop(0)
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        out.append(cur)
        todo += [e for e in (cur.__cause__, cur.__context__) if e is not None]
    return out


def _names_secret(link: BaseException, values: list[object]) -> bool:
    try:
        texts = [
            "".join(traceback.format_exception_only(type(link), link)),
            repr(link.args),
            repr(vars(link)) if hasattr(link, "__dict__") else "",
        ]
    except Exception:  # a repr that fails: what it would show is unknown
        return True
    return any(redact(text, values) != text for text in texts)


def text_of(exc: BaseException) -> str:
    """``str(exc)`` stripped ("" when it fails: the type name is shown anyway)."""
    try:
        return str(exc).strip()
    except Exception:
        return ""


def _qualname(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


# -- the log-record factory -----------------------------------------------------------


def _install() -> None:
    """Wrap the current record factory, unless it is already ours (called under _lock)."""
    current = logging.getLogRecordFactory()
    if getattr(current, "_shardstore_redacting", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = current(*args, **kwargs)
        secrets = _secrets
        if secrets:
            _scrub(record, secrets)
        return record

    factory._shardstore_redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def _scrub(record: logging.LogRecord, secrets: tuple[str, ...]) -> None:
    """Replace secrets in the record's message (args folded in) and in its traceback."""
    try:
        message = record.getMessage()
    except Exception:  # a bad format string: logging reports msg and args as they are
        message = f"{record.msg} (arguments: {record.args!r})"
    clean = _replace(message, secrets)
    if clean != message:
        record.msg, record.args = clean, None
    if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
        try:
            text = logging.Formatter().formatException(record.exc_info)
        except Exception:  # an exception whose str() fails: the handler's own formatting reports it
            return
        clean = _replace(text, secrets)
        if clean != text:
            record.exc_text = clean  # what formatters print instead of formatting exc_info
