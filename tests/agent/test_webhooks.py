"""Callbacks: Standard Webhooks signing (against the specification's published test vector),
the allow-list, backoff, and the deliverer -- with httpx.MockTransport for the HTTP cases, and
once against a real HTTP server on 127.0.0.1 that is down at first and then up."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from vrambudget.agent.store import Store
from vrambudget.agent.webhooks import (
    Deliverer,
    WebhookVerificationError,
    backoff_s,
    callback_allowed,
    decode_secret,
    sign,
    validate_allow_list,
    verify,
)

# The Standard Webhooks specification's test vector, as the reference libraries' own tests
# use it (standard-webhooks/standard-webhooks, libraries/*/tests).
VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"

VECTOR_TS = 1614265330

VECTOR_BODY = b'{"test": 2432232314}'

VECTOR_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

SECRET = "whsec_" + "c2VjcmV0LWZvci10ZXN0cy0zMi1ieXRlcy1sb25nISE="  # base64 of 32 ASCII bytes

T0 = 1_700_000_000.0


# -- signing ---------------------------------------------------------------------------------


def test_sign_reproduces_the_specification_test_vector() -> None:
    assert sign(VECTOR_SECRET, VECTOR_ID, VECTOR_TS, VECTOR_BODY) == VECTOR_SIG
    # The prefix is optional, and the secret may come as bytes (read from a file).
    assert sign(VECTOR_SECRET.removeprefix("whsec_"), VECTOR_ID, VECTOR_TS, VECTOR_BODY) == (
        VECTOR_SIG
    )
    assert sign(VECTOR_SECRET.encode() + b"\n", VECTOR_ID, VECTOR_TS, VECTOR_BODY) == VECTOR_SIG
    raw = decode_secret(VECTOR_SECRET)
    assert sign(raw, VECTOR_ID, VECTOR_TS, VECTOR_BODY) == VECTOR_SIG


def test_verify_accepts_the_vector_and_multiple_signatures() -> None:
    headers = {
        "webhook-id": VECTOR_ID,
        "webhook-timestamp": str(VECTOR_TS),
        "webhook-signature": VECTOR_SIG,
    }
    verify(VECTOR_SECRET, headers, VECTOR_BODY, now=VECTOR_TS + 10)
    # Header names are case-insensitive; other versions and wrong v1 entries are skipped.
    multi = {
        "Webhook-Id": VECTOR_ID,
        "Webhook-Timestamp": str(VECTOR_TS),
        "Webhook-Signature": f"v1a,abc v1,bm9wZQ== {VECTOR_SIG}",
    }
    verify(VECTOR_SECRET, multi, VECTOR_BODY, now=VECTOR_TS)


def test_round_trip_and_rejections() -> None:
    body = json.dumps({"probe": "p1", "status": "succeeded"}).encode()
    ts = int(T0)
    headers = {
        "webhook-id": "evt-1",
        "webhook-timestamp": str(ts),
        "webhook-signature": sign(SECRET, "evt-1", ts, body),
    }
    verify(SECRET, headers, body, now=T0)
    verify(SECRET, headers, body, now=T0 + 300)  # at the tolerance edge
    verify(SECRET, headers, body, now=T0 - 300)

    bad = [
        ("tampered body", SECRET, headers, body + b" ", T0),
        ("wrong secret", VECTOR_SECRET, headers, body, T0),
        ("expired timestamp", SECRET, headers, body, T0 + 301),
        ("timestamp from the future", SECRET, headers, body, T0 - 301),
        ("id swapped", SECRET, {**headers, "webhook-id": "evt-2"}, body, T0),
        ("timestamp changed", SECRET, {**headers, "webhook-timestamp": str(ts + 1)}, body, T0),
        ("non-numeric timestamp", SECRET, {**headers, "webhook-timestamp": "soon"}, body, T0),
        (
            "missing signature",
            SECRET,
            {k: v for k, v in headers.items() if k != "webhook-signature"},
            body,
            T0,
        ),
        (
            "only other versions",
            SECRET,
            {**headers, "webhook-signature": headers["webhook-signature"].replace("v1,", "v2,")},
            body,
            T0,
        ),
    ]
    for why, secret, hdrs, b, now in bad:
        with pytest.raises(WebhookVerificationError):
            verify(secret, hdrs, b, now=now)
            pytest.fail(why)
    with pytest.raises(WebhookVerificationError):
        verify(SECRET, headers, body, now=T0 + 11, tolerance_s=10)


def test_bad_secrets() -> None:
    for secret in ("", "whsec_", b"", "whsec_not*base64"):
        with pytest.raises(ValueError):
            decode_secret(secret)


# -- allow-list ------------------------------------------------------------------------------

ALLOW = (
    "https://hooks.example.com",
    "*.example.org",
    "http://127.0.0.1:8080",
    "https://bücher.example",
    "https://*.internal.example:8443",
)

ALLOWED = [
    "https://hooks.example.com/probe/1?x=y",
    "https://HOOKS.Example.COM/",
    "https://hooks.example.com:443/x",  # the default port, written out
    "https://hooks.example.com./x",  # trailing dot: the same host
    "https://a.example.org/",
    "https://a.b.example.org/deep",
    "http://127.0.0.1:8080/cb",
    "https://xn--bcher-kva.example/",  # IDNA form of an entry written in Unicode
    "https://BÜCHER.example/",
    "https://ci.internal.example:8443/",
]

REFUSED = [
    "http://hooks.example.com/",  # entry is https: no downgrade
    "https://hooks.example.com:444/",  # other port
    "https://evil.example.com/",  # exact origin is not a pattern
    "https://hooks.example.com.evil.net/",
    "https://example.org/",  # *.example.org does not include the apex
    "https://aexample.org/",
    "http://a.example.org/",  # patterns are https unless they say http
    "https://127.0.0.1:8080/",  # entry is http
    "http://127.0.0.1:8081/",
    "http://localhost:8080/",  # a different name for the same host is a different host
    "https://user:pass@hooks.example.com/",  # userinfo
    "https://user@hooks.example.com/",
    "https://evil.example\\@hooks.example.com/",  # parsed as userinfo: refused
    "https://ci.internal.example/",  # pattern entry names port 8443
    "ftp://hooks.example.com/",
    "file:///etc/passwd",
    "javascript:alert(1)",
    "hooks.example.com/x",  # no scheme
    "https:///nohost",
    "https://hooks%2eexample.com/",  # percent-encoded host
    "",
    "not a url at all",
]


@pytest.mark.parametrize("url", ALLOWED)
def test_allowed_urls(url: str) -> None:
    assert callback_allowed(url, ALLOW)


@pytest.mark.parametrize("url", REFUSED)
def test_refused_urls(url: str) -> None:
    assert not callback_allowed(url, ALLOW)


def test_empty_allow_list_turns_callbacks_off() -> None:
    assert not callback_allowed("https://hooks.example.com/", ())


def test_allow_list_validation() -> None:
    assert validate_allow_list(ALLOW) == ALLOW
    for entry in (
        "https://hooks.example.com/only/this/path",
        "*.com",
        "*",
        "ftp://x.example",
        "https://u@x.example",
        "https://*.1.2.3",
    ):
        with pytest.raises(ValueError):
            validate_allow_list((entry,))
        assert not callback_allowed("https://x.example/", (entry,))


# -- backoff ---------------------------------------------------------------------------------


def test_backoff_bounds() -> None:
    for attempt, window in [(1, 1.0), (2, 2.0), (3, 4.0), (9, 256.0), (10, 300.0), (1000, 300.0)]:
        assert backoff_s(attempt, rng=lambda: 0.0) == 0.0
        top = backoff_s(attempt, rng=lambda: 0.999999)
        assert window * 0.999 < top < window
    assert backoff_s(4, base=0.5, cap=2.0, rng=lambda: 0.5) == 1.0
    samples = [backoff_s(6) for _ in range(2000)]
    assert all(0.0 <= s < 32.0 for s in samples)
    assert min(samples) < 4.0 and max(samples) > 28.0  # full jitter spreads over the window


# -- deliverer with a mock transport ---------------------------------------------------------


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def store(tmp_path: Path):
    s = Store(tmp_path / "agent.sqlite3")
    yield s
    s.close()


def _enqueue(store: Store, pid: str, url: str, now: float = T0) -> str:
    store.create_probe(pid, "{}", "gpu0", now)
    payload = json.dumps({"type": "probe.finished", "data": {"id": pid}})
    assert store.finish_with_callback(pid, "succeeded", now, "{}", (url, payload, f"msg_{pid}"))
    return f"msg_{pid}"


PUBLIC_IP = "93.184.216.34"


def _deliverer(store: Store, handler, clock, **kw) -> tuple[Deliverer, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request, len(seen))

    kw.setdefault("backoff", lambda attempt: 10.0 * attempt)
    kw.setdefault("resolver", lambda host, port: [PUBLIC_IP])  # no DNS in tests
    d = Deliverer(
        store,
        SECRET,
        ("https://hooks.example.com",),
        transport=httpx.MockTransport(record),
        clock=clock,
        **kw,
    )
    return d, seen


def test_500_then_200_is_delivered_once_after_a_retry(store: Store) -> None:
    clock = Clock()
    event = _enqueue(store, "p1", "https://hooks.example.com/cb")
    d, seen = _deliverer(store, lambda req, n: httpx.Response(500 if n == 1 else 200), clock)
    try:
        assert d.deliver_due() == 0
        row = store.get_callback(event)
        assert row is not None
        assert (row.attempts, row.next_attempt_at, row.last_error) == (1, T0 + 10.0, "HTTP 500")
        assert d.deliver_due() == 0 and len(seen) == 1  # not due yet
        clock.t = T0 + 10.0
        assert d.deliver_due() == 1
        clock.t = T0 + 1000.0
        assert d.deliver_due() == 0  # nothing left to send
    finally:
        d.stop()
    assert len(seen) == 2
    row = store.get_callback(event)
    assert row is not None and (row.delivered_at, row.attempts, row.last_error) == (
        T0 + 10.0,
        2,
        None,
    )
    assert store.pending_count() == 0
    # Same id on both attempts, fresh timestamp and signature, and each verifies.
    first, second = seen
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == event
    assert (first.headers["webhook-timestamp"], second.headers["webhook-timestamp"]) == (
        str(int(T0)),
        str(int(T0 + 10)),
    )
    for req, now in ((first, T0), (second, T0 + 10)):
        assert req.method == "POST" and req.headers["content-type"] == "application/json"
        # Sent to the address the check resolved (pinned), the name in Host and SNI.
        assert str(req.url) == f"https://{PUBLIC_IP}/cb"
        assert req.headers["host"] == "hooks.example.com"
        assert req.extensions["sni_hostname"] == "hooks.example.com"
        verify(SECRET, req.headers, req.content, now=now)
        assert json.loads(req.content)["data"]["id"] == "p1"


def test_a_redirect_is_not_followed_and_is_retried(store: Store) -> None:
    clock = Clock()
    event = _enqueue(store, "p1", "https://hooks.example.com/cb")

    def handler(req: httpx.Request, n: int) -> httpx.Response:
        if n == 1:
            return httpx.Response(301, headers={"location": "https://evil.example.net/steal"})
        return httpx.Response(204)

    d, seen = _deliverer(store, handler, clock)
    try:
        assert d.deliver_due() == 0
        row = store.get_callback(event)
        assert row is not None and row.attempts == 1 and row.next_attempt_at == T0 + 10
        assert row.last_error is not None and "301" in row.last_error
        assert "not followed" in row.last_error
        clock.t += 10
        assert d.deliver_due() == 1
    finally:
        d.stop()
    assert [str(r.url) for r in seen] == [f"https://{PUBLIC_IP}/cb"] * 2  # never evil
    assert [r.headers["host"] for r in seen] == ["hooks.example.com"] * 2


def test_connection_errors_retry_then_give_up_keeping_the_error(store: Store) -> None:
    clock = Clock()
    event = _enqueue(store, "p1", "https://hooks.example.com/cb")

    def handler(req: httpx.Request, n: int) -> httpx.Response:
        if n % 2:
            raise httpx.ConnectError("connection refused", request=req)
        return httpx.Response(503)

    d, seen = _deliverer(store, handler, clock, max_attempts=3)
    try:
        for _ in range(5):
            d.deliver_due()
            clock.t += 1000
    finally:
        d.stop()
    assert len(seen) == 3
    row = store.get_callback(event)
    assert row is not None
    assert (row.attempts, row.next_attempt_at, row.delivered_at) == (3, None, None)
    assert row.last_error is not None and "ConnectError" in row.last_error
    assert store.pending_count() == 0


def test_the_allow_list_is_checked_again_at_send_time(store: Store) -> None:
    """A callback accepted under an older configuration is not sent once its host is gone."""
    clock = Clock()
    event = _enqueue(store, "p1", "https://old-hooks.example.com/cb")
    d, seen = _deliverer(store, lambda req, n: httpx.Response(200), clock)
    try:
        assert d.deliver_due() == 0
    finally:
        d.stop()
    assert seen == []
    row = store.get_callback(event)
    assert row is not None and row.next_attempt_at is None and row.delivered_at is None
    assert row.last_error is not None and "allow-list" in row.last_error


def test_one_bad_row_does_not_block_the_others(store: Store) -> None:
    clock = Clock()
    bad = _enqueue(store, "p1", "https://hooks.example.com/a", now=T0 - 1)
    good = _enqueue(store, "p2", "https://hooks.example.com/b")

    def handler(req: httpx.Request, n: int) -> httpx.Response:
        if req.url.path == "/a":
            raise RuntimeError("bug in a transport")
        return httpx.Response(200)

    d, _ = _deliverer(store, handler, clock)
    try:
        assert d.deliver_due() == 1
    finally:
        d.stop()
    bad_row, good_row = store.get_callback(bad), store.get_callback(good)
    assert (
        bad_row is not None and bad_row.attempts == 1 and "RuntimeError" in str(bad_row.last_error)
    )
    assert good_row is not None and good_row.delivered_at is not None


def test_the_thread_wakes_on_enqueue_and_stops_cleanly(store: Store) -> None:
    delivered = threading.Event()

    def handler(req: httpx.Request, n: int) -> httpx.Response:
        delivered.set()
        return httpx.Response(200)

    d, seen = _deliverer(store, handler, time.time, poll_interval_s=60.0)
    d.start()
    try:
        time.sleep(0.05)  # let it finish its first (empty) pass and go to sleep for 60 s
        _enqueue(store, "p1", "https://hooks.example.com/cb", now=time.time())
        d.wake()
        assert delivered.wait(2.0)
    finally:
        t0 = time.monotonic()
        d.stop()
        assert time.monotonic() - t0 < 2.0
    assert not d.running
    assert len(seen) == 1 and store.pending_count() == 0
    d.stop()  # idempotent


# -- a real receiver, down then up -----------------------------------------------------------


class _Receiver(BaseHTTPRequestHandler):
    received: list[tuple[dict[str, str], bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.received.append((dict(self.headers.items()), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(condition, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_a_real_receiver_that_is_down_then_up_gets_the_callback_once(store: Store) -> None:
    port = _free_port()  # nothing listens on it yet: connections are refused
    url = f"http://127.0.0.1:{port}/hooks/probe"
    d = Deliverer(
        store,
        SECRET,
        (f"http://127.0.0.1:{port}",),
        timeout_s=2.0,
        backoff=lambda attempt: backoff_s(attempt, base=0.05, cap=0.2),
    )
    received: list[tuple[dict[str, str], bytes]] = []
    handler = type("Receiver", (_Receiver,), {"received": received})
    server = None
    d.start()
    try:
        event = _enqueue(store, "p1", url, now=time.time())
        d.wake()
        # At least one attempt has failed against the closed port...
        assert _wait_for(
            lambda: (row := store.get_callback(event)) is not None and row.attempts >= 1
        )
        row = store.get_callback(event)
        assert row is not None and row.delivered_at is None
        assert row.last_error is not None and "ConnectError" in row.last_error
        # ...then the receiver comes up on that port and the next retry gets through.
        server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        assert _wait_for(lambda: store.pending_count() == 0)
        time.sleep(0.3)  # several backoff windows: a duplicate would have arrived by now
    finally:
        d.stop()
        if server is not None:
            server.shutdown()
            server.server_close()
    assert len(received) == 1
    headers, body = received[0]
    assert headers["webhook-id"] == event
    verify(SECRET, headers, body, now=time.time())
    assert json.loads(body) == {"type": "probe.finished", "data": {"id": "p1"}}
    row = store.get_callback(event)
    assert row is not None and row.delivered_at is not None and row.attempts >= 2


def test_a_comparison_attempt_that_raises_still_sends_the_callback(tmp_path: Path) -> None:
    """An exception inside a comparison attempt counts against the comparison limit; when it is
    reached the probe's callback is still enqueued (with the error), not given up silently."""
    from vrambudget.agent.store import Store
    from vrambudget.agent.webhooks import Deliverer

    store = Store(tmp_path / "a.sqlite3")
    store.create_probe("p", "{}", "cpu", 1.0)
    store.transition("p", "running", 2.0, expected={"queued"})
    store.finish_with_callback(
        "p", "succeeded", 3.0, "{}", None, comparison=("http://svc/v1/comparisons", "{}", "cmp_p")
    )
    calls = []

    def settle(row, body, error):  # type: ignore[no-untyped-def]
        calls.append(error)
        if len(calls) == 1:
            raise RuntimeError("database is locked")
        store.complete_comparison(
            row.id,
            9.0,
            None,
            error,
            lambda probe: ("https://cb/x", probe.comparison_error, "msg_p"),
        )

    clock = [10.0]
    d = Deliverer(
        store,
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        (),
        transport=httpx.MockTransport(lambda r: httpx.Response(200, text="{}")),
        service_allow_list=("http://svc",),
        on_comparison=settle,
        comparison_max_attempts=2,
        backoff=lambda n: 1.0,
        clock=lambda: clock[0],
    )
    d.deliver_due()  # the handler raises: rescheduled (attempt 1 of 2)
    assert store.get_callback("cmp_p").attempts == 1  # type: ignore[union-attr]
    clock[0] = 20.0
    d.deliver_due()  # the answer is not a comparison -> settle(error) -> callback enqueued
    assert [r.id for r in store.due_callbacks(30.0, 10)] == ["msg_p"]
    store.close()
