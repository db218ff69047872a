"""Signed callbacks: Standard Webhooks signing, the callback allow-list, and the deliverer that
drains the store's outbox.

Signing follows the Standard Webhooks specification, implemented here with ``hmac``/``hashlib``
(about fifteen lines) rather than the reference ``standardwebhooks`` package: that package takes
no clock (it reads the wall clock itself), has a fixed five-minute tolerance and accepts text
bodies only, while the agent signs bytes at a time it controls and tests pin the clock. The
tests reproduce the specification's published test vector exactly, which is what says a
receiver's own Standard Webhooks library will accept what the agent sends.

Delivery is at least once: a callback whose 2xx was received but not yet recorded when the
agent died is sent again after the restart, with the same ``webhook-id`` (receivers dedupe on
it) and a fresh timestamp and signature, as the specification asks of retries.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Self

import httpx

from vrambudget.agent.store import OutboxRow, Store

__all__ = [
    "Deliverer",
    "WebhookVerificationError",
    "backoff_s",
    "callback_allowed",
    "decode_secret",
    "sign",
    "validate_allow_list",
    "verify",
]

log = logging.getLogger(__name__)

_SECRET_PREFIX = "whsec_"
_DEFAULT_PORTS = {"http": 80, "https": 443}
# What a host may look like once httpx has IDNA-encoded it: DNS labels, IPv4, or IPv6 (colons).
_HOST = re.compile(r"[a-z0-9.:-]+")
_IP_LIKE = re.compile(r"[0-9.:]+")


class WebhookVerificationError(ValueError):
    """A delivery that must not be trusted: missing headers, stale timestamp, bad signature."""


# -- signing ---------------------------------------------------------------------------------


def decode_secret(secret: bytes | str) -> bytes:
    """The HMAC key. A ``whsec_<base64>`` secret (text or bytes, as read from the environment
    or a file) is base64-decoded, as every Standard Webhooks library does; other text is taken
    as base64 too (the reference libraries' rule); other bytes are the raw key."""
    if isinstance(secret, bytes) and secret.startswith(_SECRET_PREFIX.encode()):
        secret = secret.decode("ascii").strip()
    if isinstance(secret, str):
        text = secret.strip().removeprefix(_SECRET_PREFIX)
        try:
            key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError("webhook secret is not valid base64") from exc
    else:
        key = secret
    if not key:
        raise ValueError("webhook secret may not be empty")
    return key


def sign(secret: bytes | str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,`` + base64(HMAC-SHA256(key, "id.timestamp.body"))
    over the exact body bytes sent."""
    key = decode_secret(secret)
    signed = f"{msg_id}.{int(timestamp)}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def verify(
    secret: bytes | str,
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    tolerance_s: float = 300,
) -> None:
    """Check a delivery as a receiver would; raise :class:`WebhookVerificationError` if it must
    be rejected. The timestamp must be within ``tolerance_s`` of ``now`` either way (replays),
    and one of the space-separated ``v1,`` signatures must match, compared in constant time
    (other versions, e.g. ``v1a`` asymmetric ones, are skipped as the specification says)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    msg_id = lowered.get("webhook-id")
    timestamp = lowered.get("webhook-timestamp")
    signatures = lowered.get("webhook-signature")
    if not (msg_id and timestamp and signatures):
        raise WebhookVerificationError(
            "missing webhook-id, webhook-timestamp or webhook-signature"
        )
    if not (timestamp.isascii() and timestamp.isdigit()):
        raise WebhookVerificationError(f"invalid webhook-timestamp {timestamp!r}")
    ts = int(timestamp)
    if abs(now - ts) > tolerance_s:
        raise WebhookVerificationError(
            f"webhook-timestamp {ts} is more than {tolerance_s:g} s from now ({now:.0f})"
        )
    expected = sign(secret, msg_id, ts, body).encode()
    for candidate in signatures.split():
        version, _, _ = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(candidate.encode(), expected):
            return
    raise WebhookVerificationError("no matching signature")


# -- allow-list ------------------------------------------------------------------------------


def _parse(url: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` as httpx will connect, or None if the URL must be refused.

    The URL is parsed by httpx -- the same parser that sends the request -- so the check and
    the connection cannot disagree about which host a tricky URL names (the classic
    allow-list bypass, e.g. ``https://evil.example\\@hooks.example.com``)."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return None
    if parsed.scheme not in _DEFAULT_PORTS or parsed.userinfo:
        return None
    host = parsed.raw_host.decode("ascii", "replace").lower().rstrip(".")
    if not host or not _HOST.fullmatch(host):
        return None
    return parsed.scheme, host, parsed.port or _DEFAULT_PORTS[parsed.scheme]


def _parse_entry(entry: str) -> tuple[str, str, int, bool]:
    """``(scheme, host, port, wildcard)`` of one allow-list entry; ValueError if malformed."""
    text = entry.strip()
    if "://" not in text:
        text = "https://" + text
    wildcard = "://*." in text
    target = text.replace("://*.", "://", 1) if wildcard else text
    parsed = _parse(target)
    try:
        path_and_query = httpx.URL(target).raw_path
    except (httpx.InvalidURL, TypeError, ValueError):
        path_and_query = b""
    if parsed is None or path_and_query not in (b"", b"/"):
        # A path would look like a restriction this check does not make: refuse the entry.
        raise ValueError(f"allow-list entry {entry!r} is not [scheme://][*.]host[:port]")
    if wildcard and ("." not in parsed[1] or _IP_LIKE.fullmatch(parsed[1])):
        # "*.com" would let in half the internet; a pattern needs a registrable name under it.
        raise ValueError(f"allow-list pattern {entry!r} must be *.<name>.<tld>")
    return (*parsed, wildcard)


def validate_allow_list(allow_list: tuple[str, ...]) -> tuple[str, ...]:
    """Return the list unchanged, or raise ValueError naming the first malformed entry: for the
    agent's configuration to fail at startup instead of silently matching nothing."""
    for entry in allow_list:
        _parse_entry(entry)
    return allow_list


def _entry_matches(entry: str, scheme: str, host: str, port: int) -> bool:
    try:
        e_scheme, e_host, e_port, wildcard = _parse_entry(entry)
    except ValueError:
        return False
    if (e_scheme, e_port) != (scheme, port):
        return False
    return host.endswith("." + e_host) if wildcard else host == e_host


def callback_allowed(url: str, allow_list: tuple[str, ...]) -> bool:
    """May the agent post to ``url``? Empty allow-list: no (callbacks are off by default).

    Entries, each ``[scheme://]host[:port]``:

    - an exact origin, ``https://hooks.example.com`` or ``http://127.0.0.1:8080``;
    - a host pattern, ``*.example.com`` (or ``https://*.example.com:8443``): any subdomain, at
      any depth, but not ``example.com`` itself.

    With no scheme an entry means https; with no port, the scheme's default port. The URL's
    scheme and port must equal the entry's, so plain http is allowed only where an entry says
    ``http://`` explicitly. URLs with userinfo (``user:pass@``), schemes other than http(s),
    and hosts that are not plain DNS names or IP literals after normalization are refused.
    Hosts compare normalized: lowercase, IDNA-encoded (``bücher.example`` equals
    ``xn--bcher-kva.example``), trailing dot removed. The URL's path and query are not
    restricted; an entry with a path is malformed and matches nothing (see
    :func:`validate_allow_list`).
    """
    parsed = _parse(url)
    if parsed is None:
        return False
    return any(_entry_matches(entry, *parsed) for entry in allow_list)


# -- retries ---------------------------------------------------------------------------------


def backoff_s(
    attempt: int,
    *,
    base: float = 1.0,
    cap: float = 300.0,
    rng: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait after ``attempt`` failed attempts (1 after the first failure):
    exponential with full jitter, uniform in ``[0, min(cap, base * 2 ** (attempt - 1)))``.
    Full jitter spreads the retries of many callbacks that failed together (a receiver that
    was down) instead of bringing them back in lockstep."""
    exponent = min(max(attempt - 1, 0), 64)  # 2**64 * base is past any sane cap already
    return rng() * min(cap, base * 2.0**exponent)


# -- delivery --------------------------------------------------------------------------------


_MAX_COMPARISON_BYTES = 4 << 20


class Deliverer:
    """Drains the outbox: a daemon thread with its own ``httpx.Client``.

    A thread rather than an asyncio task: the store is synchronous SQLite and every send
    blocks for up to its timeout, neither of which belongs on the web server's event loop;
    a thread also runs the same under uvicorn, under a test, or with no event loop at all, and
    its lifetime (``start``/``stop``) is the agent's, not a request's. One pass is
    :meth:`deliver_due`, which tests call directly with a pinned clock and an
    ``httpx.MockTransport``; the thread only repeats it, sleeping until the next callback is
    due or :meth:`wake` is called (the agent calls it right after enqueuing one).

    Each attempt re-checks the allow-list (configuration may have changed since the callback
    was accepted), signs with a fresh timestamp, never follows redirects (a 3xx is a failure:
    following one would post to a host nobody allowed), and does not read the response body.
    A 2xx is delivered; anything else is retried with :func:`backoff_s` until
    ``max_attempts``, then given up (the row keeps ``last_error``). The client ignores the
    environment (``trust_env=False``): no proxy variables, and no ``.netrc`` credentials sent to
    callback hosts.
    """

    def __init__(
        self,
        store: Store,
        secret: bytes | str,
        allow_list: tuple[str, ...],
        *,
        transport: httpx.BaseTransport | None = None,
        max_attempts: int = 24,
        timeout_s: float = 10.0,
        poll_interval_s: float = 30.0,
        batch_size: int = 16,
        backoff: Callable[[int], float] = backoff_s,
        clock: Callable[[], float] = time.time,
        service_allow_list: tuple[str, ...] = (),
        on_comparison: Callable[[OutboxRow, str | None, str | None], None] | None = None,
        comparison_max_attempts: int = 10,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._store = store
        self._key = decode_secret(secret)
        self._allow_list = allow_list
        self._max_attempts = max_attempts
        self._poll_interval_s = poll_interval_s
        self._batch_size = batch_size
        self._backoff = backoff
        self._clock = clock
        self._service_allow_list = service_allow_list
        self._on_comparison = on_comparison
        self._comparison_max_attempts = comparison_max_attempts
        self._client = httpx.Client(
            transport=transport,
            follow_redirects=False,
            timeout=httpx.Timeout(timeout_s),
            trust_env=False,
            headers={"user-agent": "vrambudget-agent"},
        )
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the deliverer was already started")
        self._thread = threading.Thread(target=self._run, name="webhook-deliverer", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop after the send in flight (bounded by its timeout) and close the client.
        Undelivered callbacks stay in the outbox for the next start. Idempotent."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("webhook deliverer did not stop within %.1f s", timeout_s)
                return
        self._client.close()

    def wake(self) -> None:
        """Look at the outbox now (a callback was just enqueued)."""
        self._wake.set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before the pass: a wake() during it makes the wait return
            try:
                self.deliver_due()
                sleep_s = self._sleep_s()
            except Exception:  # a locked or broken file must not kill the thread, nor spin it
                log.exception("webhook delivery pass failed")
                sleep_s = self._poll_interval_s
            self._wake.wait(sleep_s)

    def _sleep_s(self) -> float:
        due = self._store.next_attempt_at()
        if due is None:
            return self._poll_interval_s
        return min(self._poll_interval_s, max(0.0, due - self._clock()))

    # -- one pass ---------------------------------------------------------------------------

    def deliver_due(self) -> int:
        """Attempt every callback due now, once; return how many were delivered."""
        delivered = 0
        for row in self._store.due_callbacks(self._clock(), self._batch_size):
            if self._stop.is_set():
                break
            try:
                delivered += self._attempt(row)
            except Exception as exc:
                # Count it as a failed attempt, so one poison row cannot block the outbox forever.
                log.exception("callback %s: attempt failed unexpectedly", row.id)
                error = f"{type(exc).__name__}: {exc}"
                if row.kind == "comparison":
                    self._fail_comparison(row, error)
                else:
                    self._fail(row, error)
        return delivered

    def _fail_comparison(self, row: OutboxRow, error: str) -> None:
        """A comparison attempt that raised: retried under the comparison limit, and when that is
        reached the probe's callback still goes out (with the error), never silently dropped."""
        attempts = row.attempts + 1
        if attempts < self._comparison_max_attempts:
            self._store.reschedule(row.id, attempts, self._clock() + self._backoff(attempts),
                                   error)
            return
        try:
            if self._on_comparison is not None:
                self._on_comparison(row, None, f"{error} (after {attempts} attempt(s))")
                return
        except Exception:  # the handler itself is broken: give the row up, keep the thread
            log.exception("comparison %s: settling failed", row.id)
        self._store.reschedule(row.id, attempts, None, error)

    def _attempt(self, row: OutboxRow) -> bool:
        if row.kind == "comparison":
            return self._attempt_comparison(row)
        if row.attempts >= self._max_attempts:  # max_attempts lowered since it was scheduled
            self._store.reschedule(row.id, row.attempts, None,
                                   row.last_error or "max attempts reached")
            return False
        if not callback_allowed(row.url, self._allow_list):
            # Not retried: it would not become allowed without a restart with a new list.
            log.warning("callback %s to %s is not on the allow-list; dropped", row.id, row.url)
            self._store.reschedule(row.id, row.attempts + 1, None,
                                   "callback URL not on the allow-list at send time")
            return False
        error = self._post(row)
        if error is None:
            self._store.mark_delivered(row.id, self._clock())
            return True
        self._fail(row, error)
        return False

    def _fail(self, row: OutboxRow, error: str) -> None:
        attempts = row.attempts + 1
        if attempts >= self._max_attempts:
            log.warning("callback %s to %s given up after %d attempts: %s",
                        row.id, row.url, attempts, error)
            self._store.reschedule(row.id, attempts, None, error)
        else:
            retry_at = self._clock() + self._backoff(attempts)
            self._store.reschedule(row.id, attempts, retry_at, error)

    # -- the service round trip -------------------------------------------------------------

    def _attempt_comparison(self, row: OutboxRow) -> bool:
        """POST the report to the service's ``/v1/comparisons``. A 2xx hands the body to
        ``on_comparison`` (which stores it and enqueues the callback in one transaction); a 4xx
        other than 408/429 is final (the service will not change its mind); anything else is
        retried with backoff until ``comparison_max_attempts``, then handed over as an
        error, so the callback is sent without a comparison rather than never."""
        settle = self._on_comparison
        if settle is None:
            self._store.reschedule(row.id, row.attempts + 1, None, "no comparison handler")
            return False
        if not callback_allowed(row.url, self._service_allow_list):
            settle(row, None, "service URL not on the agent's service allow-list at send time")
            return False
        body, error, final = self._post_comparison(row)
        if body is not None:
            settle(row, body, None)
            return True
        attempts = row.attempts + 1
        if final or attempts >= self._comparison_max_attempts:
            settle(row, None, f"{error} (after {attempts} attempt(s))")
        else:
            self._store.reschedule(row.id, attempts, self._clock() + self._backoff(attempts),
                                   error or "failed")
        return False

    def _post_comparison(self, row: OutboxRow) -> tuple[str | None, str | None, bool]:
        """(answer body, error, whether the error is final)."""
        try:
            response = self._client.post(row.url, content=row.payload.encode("utf-8"),
                                         headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, (
                False)
        if response.is_success:
            if len(response.content) > _MAX_COMPARISON_BYTES:
                return None, f"comparison larger than {_MAX_COMPARISON_BYTES} bytes", True
            return response.text, None, False
        detail = response.text[:500]
        final = 400 <= response.status_code < 500 and response.status_code not in (408, 429)
        return None, f"HTTP {response.status_code}: {detail}", final

    def _post(self, row: OutboxRow) -> str | None:
        """Send once; None on a 2xx, else why not."""
        body = row.payload.encode("utf-8")
        timestamp = int(self._clock())
        headers = {
            "content-type": "application/json",
            "webhook-id": row.id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(self._key, row.id, timestamp, body),
        }
        request = self._client.build_request("POST", row.url, content=body, headers=headers)
        try:
            response = self._client.send(request, stream=True)  # status only; body unread
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        response.close()
        if response.is_success:
            return None
        if response.is_redirect:
            location = response.headers.get("location", "")
            return f"HTTP {response.status_code} redirect to {location!r} (not followed)"
        return f"HTTP {response.status_code}"
