"""Transient storage faults: which errors are worth retrying, and the retry loop.

Every remote call goes through :func:`with_retries`. An error is *transient* when a later
attempt can succeed: the connection failed, was closed before a response, or a response was
cut short (an incomplete read, a missing ``Content-Length``), a timeout, HTTP 5xx, 408, 429
and throttling. :func:`is_transient` decides by the exception's type first (the exception
classes of botocore, aiohttp, http.client, urllib3, requests and azure-core, matched by
module and name so none of them need be installed), then by an HTTP status carried on the
exception (``status``, ``code``, ``status_code`` or botocore's response metadata), and only
then by its text. Permanent errors (403, 404, a missing bucket, a certificate error, a bug)
fail at once, and so does a failed condition (HTTP 412: the object is no longer the
version a read was pinned to). Retries cost time, never a byte: the caller re-issues the
same read.
"""

from __future__ import annotations

import errno
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from zephon_nodes.core.errors import DataError
from zephon_nodes.core.settings import Settings, current

__all__ = ["RetryPolicy", "describe", "is_transient", "redact", "with_retries"]

T = TypeVar("T")

# A URI's user:password@ part, anywhere in a text (a password may hold "@" or ":").
_USERINFO = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^\s/'\"]*@")


def redact(uri: str) -> str:
    """Return ``uri`` (or a message) without any URI's ``user:password@`` part."""
    return _USERINFO.sub(r"\1", uri)


@dataclass(frozen=True)
class RetryPolicy:
    """How transient storage errors are retried (a physical setting: never in a fingerprint).

    Attributes:
        budget_s: Seconds of retrying before giving up (``ZEPHON_STORAGE_RETRY_S``, default
            120).
        base_s: First backoff delay; it doubles on each retry.
        max_s: Longest single delay (``ZEPHON_STORAGE_BACKOFF_MAX_S``, default 5).
    """

    budget_s: float = 120.0
    base_s: float = 0.1
    max_s: float = 5.0

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> RetryPolicy:
        """The policy of ``settings`` (default: the current ones).

        Its budget is ``storage_retry_s`` (``ZEPHON_STORAGE_RETRY_S``), its longest delay
        ``storage_backoff_max_s`` (``ZEPHON_STORAGE_BACKOFF_MAX_S``).
        """
        s = settings or current()
        return cls(budget_s=s.storage_retry_s, max_s=s.storage_backoff_max_s)


# Exception classes that mean "the connection or the response failed; try again", by the
# module that defines them (matched anywhere in the exception's class hierarchy).
_TRANSIENT_TYPES: dict[str, frozenset[str]] = {
    "botocore.exceptions": frozenset(
        {
            "HTTPClientError",  # ConnectionClosedError, EndpointConnectionError, timeouts...
            "ConnectionError",
            "ResponseStreamingError",  # a body cut short (IncompleteRead underneath)
            "IncompleteReadError",
        }
    ),
    "aiohttp.client_exceptions": frozenset(
        {"ClientConnectionError", "ClientPayloadError", "ServerDisconnectedError"}
    ),
    "aiohttp.http_exceptions": frozenset({"ContentLengthError", "TransferEncodingError"}),
    "http.client": frozenset({"IncompleteRead", "RemoteDisconnected", "BadStatusLine"}),
    "urllib3.exceptions": frozenset(
        {"ProtocolError", "IncompleteRead", "TimeoutError", "NewConnectionError"}
    ),
    "requests.exceptions": frozenset({"ConnectionError", "ChunkedEncodingError", "Timeout"}),
    "azure.core.exceptions": frozenset(
        {"ServiceRequestError", "ServiceResponseError", "IncompleteReadError"}
    ),
    "fsspec.exceptions": frozenset({"FSTimeoutError"}),
}
# Subclasses of the above that no retry can fix (a certificate or TLS setup problem), and
# a failed condition (the object is no longer the version a read was pinned to: HTTP 412).
_PERMANENT_NAMES = frozenset(
    {
        "SSLError",
        "ClientSSLError",
        "ClientConnectorCertificateError",
        "ClientConnectorSSLError",
        "ResourceModifiedError",  # azure-core: 412 ConditionNotMet
        "FileExpired",  # s3fs/fsspec: the ETag a file was opened with no longer holds
    }
)
# A response cut inside its headers reaches some clients as a missing header (aiobotocore:
# ``KeyError: 'ContentLength'``).
_HEADER_KEYS = frozenset({"ContentLength", "Content-Length", "content-length", "ContentRange"})
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "ServerBusy",
        "OperationTimedOut",
    }
)
_TRANSIENT_TEXT = re.compile(
    r"(connection (reset|refused|aborted|closed)|timed? ?out|temporar|throttl|slow ?down|"
    r"too many requests|service unavailable|internal ?error|bad gateway|gateway timeout|"
    r"cannot connect|could not connect|server disconnected|broken pipe|incomplete ?read|"
    r"payload is not completed|\b(408|429|500|502|503|504)\b|RequestTimeout|"
    r"EndpointConnectionError)",
    re.IGNORECASE,
)
_CONNECTION_ERRNOS = (
    errno.ECONNRESET,
    errno.ECONNREFUSED,
    errno.ECONNABORTED,
    errno.ETIMEDOUT,
    errno.EPIPE,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
)
_PERMANENT_TEXT = re.compile(
    r"(\b(403|404|412)\b|access ?denied|forbidden|no ?such ?(bucket|key)|not ?found|"
    r"pre-?conditions?\b|ConditionNotMet)",
    re.IGNORECASE,
)


_DENIED_TEXT = re.compile(r"(\b403\b|access ?denied|forbidden|AuthorizationFailure)", re.I)


def _by_type(exc: BaseException) -> bool | None:
    """True/False when the exception's class decides; None when it does not."""
    if isinstance(exc, KeyError) and exc.args and exc.args[0] in _HEADER_KEYS:
        return True
    names = [(c.__module__, c.__name__) for c in type(exc).__mro__]
    if type(exc).__name__ in _PERMANENT_NAMES:
        return False
    for module, name in names:
        if name in _TRANSIENT_TYPES.get(module, ()):
            return True
    return None


def status(exc: BaseException) -> int | None:
    """The HTTP status an exception carries, if any."""
    for attr in ("status", "status_code", "code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
        if isinstance(value, str) and value.isdigit() and 100 <= int(value) < 600:
            return int(value)
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        value = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(value, int):
            return value
    return None


def _error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code else None
    code = getattr(exc, "error_code", None)
    return str(code) if code else None


def _cause(exc: BaseException) -> BaseException:
    """The error behind a backend's ``FileNotFoundError`` when it is not a 404.

    fsspec's HTTP ``info`` turns every failure (a 403, a refused connection) into
    ``FileNotFoundError(url)``; the error it wraps tells them apart.
    """
    inner = exc
    for _ in range(8):
        if not isinstance(inner, FileNotFoundError) or inner.__cause__ is None:
            break
        inner = inner.__cause__
    if inner is exc:
        return exc
    code = status(inner)
    if code is not None:
        return inner if code != 404 else exc
    if _by_type(inner) or isinstance(inner, (TimeoutError, ConnectionError)):
        return inner
    if isinstance(inner, OSError) and inner.errno in _CONNECTION_ERRNOS:
        return inner
    text = f"{type(inner).__name__}: {inner}"
    if _TRANSIENT_TEXT.search(text) and not _PERMANENT_TEXT.search(text):
        return inner
    return exc


def _transient(exc: BaseException) -> bool | None:
    """The verdict of one exception by type, status and error code (None: undecided)."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    by_type = _by_type(exc)
    if by_type is not None:
        return by_type
    code = status(exc)
    if code is not None:
        return code in (408, 429) or 500 <= code < 600
    if _error_code(exc) in _TRANSIENT_CODES:
        return True
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, OSError) and exc.errno in _CONNECTION_ERRNOS:
        return True
    return None


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth retrying (see the module docstring for what counts)."""
    exc = _cause(exc)
    verdict = _transient(exc)
    if verdict is not None:
        return verdict
    # A wrapper (an OSError of s3fs, a ValueError of a reader) raised from a transient cause.
    inner = exc.__cause__
    for _ in range(4):
        if inner is None:
            break
        verdict = _transient(inner)
        if verdict is not None:
            return verdict
        inner = inner.__cause__
    text = f"{type(exc).__name__}: {exc}"
    if _PERMANENT_TEXT.search(text) and not re.search(r"\b(408|429|5\d\d)\b", text):
        return False
    return bool(_TRANSIENT_TEXT.search(text))


def describe(exc: BaseException) -> str:
    """A one-line description of a storage error for messages."""
    exc = _cause(exc)
    code = status(exc)
    if code == 404:
        return "not found (404)"
    if code == 403:
        return "access denied (403; check the backend's credentials)"
    if isinstance(exc, FileNotFoundError):
        return "not found (404 or a missing bucket)"
    if isinstance(exc, PermissionError):
        return "access denied (403; check the backend's credentials)"
    if isinstance(exc, KeyError) and exc.args and exc.args[0] in _HEADER_KEYS:
        return f"response without its {exc.args[0]} header (cut short)"
    if not is_transient(exc) and _DENIED_TEXT.search(f"{type(exc).__name__}: {exc}"):
        return "access denied (403; check the backend's credentials)"
    text = str(exc).strip().splitlines()
    return redact(f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": "))


_LAST_WARNING = [-1e9]


def _warn(text: str) -> None:
    """Say on stderr that a transient error is being retried (at most every 10 s)."""
    now = time.monotonic()
    if now - _LAST_WARNING[0] >= 10:
        _LAST_WARNING[0] = now
        print(f"zephon: {text}", file=sys.stderr)


def with_retries(
    fn: Callable[[], T],
    uri: str,
    policy: RetryPolicy | None = None,
    what: str = "read",
    on_retry: Callable[[], Any] | None = None,
) -> T:
    """Call ``fn()``; retry transient errors with backoff and full jitter within the budget.

    Args:
        fn: The call (it must be safe to repeat).
        uri: Named in messages (redacted).
        policy: Default: :meth:`RetryPolicy.from_settings`.
        what: The verb of messages (``read``, ``stat``, ``list``, ``write``).
        on_retry: Called before each retry (the storage layer drops its clients, so a
            restarted endpoint gets fresh connections).

    Raises:
        DataError: At once on a permanent error, or when the budget is spent, naming the
            URI and the last error.
    """
    policy = policy or RetryPolicy.from_settings()
    start = time.monotonic()
    attempt = 0
    while True:
        try:
            return fn()
        except DataError:
            raise
        except Exception as e:
            if not is_transient(e):
                raise DataError(f"{redact(uri)}: cannot {what}: {describe(e)}") from None
            elapsed = time.monotonic() - start
            if elapsed >= policy.budget_s:
                raise DataError(
                    f"{redact(uri)}: cannot {what}: transient errors for {elapsed:.1f} s "
                    f"({attempt + 1} attempts, retry budget {policy.budget_s:g} s, "
                    f"ZEPHON_STORAGE_RETRY_S); last error: {describe(e)}"
                ) from None
            _warn(f"{redact(uri)}: {describe(e)}; retrying (budget {policy.budget_s:g} s)")
            delay = min(policy.max_s, policy.base_s * 2**attempt)
            delay = random.uniform(0, delay)
            time.sleep(min(delay, max(0.0, policy.budget_s - elapsed)))
            attempt += 1
            if on_retry is not None:
                on_retry()
