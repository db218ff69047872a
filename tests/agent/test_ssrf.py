"""Issue 13 (agent): callbacks and the service round trip by *resolved address* (a local
resolver seam: no DNS, no traffic outside 127.0.0.1), fragments and userinfo, public-suffix
wildcards, concurrent delivery, and no query strings in httpx's log lines."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import httpx
import pytest
from litestar.testing import TestClient

from tests.support.workloads import INFER
from vrambudget.agent.api import create_agent_app
from vrambudget.agent.settings import AgentSettings
from vrambudget.agent.store import Store
from vrambudget.agent.webhooks import (
    AddressRefused,
    Deliverer,
    callback_allowed,
    pin,
    validate_allow_list,
)

PUBLIC = "93.184.216.34"
DNS = {
    "hooks.example.com": [PUBLIC],
    "rebind.example.com": ["127.0.0.1"],
    "meta.example.com": ["169.254.169.254"],
    "internal.example.com": ["10.0.0.5"],
    "mixed.example.com": [PUBLIC, "192.168.1.1"],
    "mapped.example.com": ["::ffff:127.0.0.1"],
    "cgnat.example.com": ["100.100.100.200"],
    "vrambudget.vrambudget.svc": ["10.96.12.34"],
    "meta.vrambudget.svc": ["169.254.169.254"],
    "cgnat.vrambudget.svc": ["100.100.100.200"],
}


def resolver(host: str, port: int) -> list[str]:
    if host not in DNS:
        raise OSError(f"unknown host {host}")
    return DNS[host]


WILD = ("https://*.example.com",)


@pytest.mark.parametrize(
    "url",
    [
        "https://rebind.example.com/cb",
        "https://meta.example.com/latest/meta-data",
        "https://internal.example.com/cb",
        "https://mixed.example.com/cb",
        "https://mapped.example.com/cb",
        "https://cgnat.example.com/cb",
    ],
)
def test_a_name_under_an_allowed_domain_may_not_reach_a_private_address(url: str) -> None:
    assert callback_allowed(url, WILD)  # the name matches ...
    with pytest.raises(AddressRefused, match="not a public address"):
        pin(url, WILD, resolver)  # ... the address does not


def test_a_public_address_is_pinned_with_host_and_sni() -> None:
    target, headers, ext = pin("https://hooks.example.com:8443/cb?x=1", WILD, resolver)
    assert str(target) == f"https://{PUBLIC}:8443/cb?x=1"
    assert headers == {"host": "hooks.example.com:8443"} and ext == {
        "sni_hostname": "hooks.example.com"
    }


def test_only_an_entry_naming_the_exact_address_allows_a_private_one() -> None:
    with pytest.raises(AddressRefused):
        pin("http://127.0.0.1:8080/cb", ("http://127.0.0.2:8080",), resolver)
    target, _, _ = pin("http://127.0.0.1:8080/cb", ("http://127.0.0.1:8080",), resolver)
    assert target.host == "127.0.0.1"
    # A name resolving to an address an entry names exactly.
    target, _, _ = pin("https://internal.example.com/cb", (*WILD, "https://10.0.0.5"), resolver)
    assert target.host == "10.0.0.5"
    for literal in ("http://169.254.169.254/", "http://[::1]/", "http://0.0.0.0/"):
        with pytest.raises(AddressRefused):
            pin(literal, ("http://*.example.com",), resolver)


def test_a_host_named_in_full_may_reach_a_private_address_but_never_metadata() -> None:
    # A Kubernetes Service name resolves to a private ClusterIP: an entry that writes the name
    # out in full lets that name (and only it) reach it, pinned to the address.
    entry = ("http://vrambudget.vrambudget.svc:8000",)
    target, headers, _ = pin("http://vrambudget.vrambudget.svc:8000/v1/budgets", entry, resolver)
    assert target.host == "10.96.12.34"
    assert headers == {"host": "vrambudget.vrambudget.svc:8000"}
    with pytest.raises(AddressRefused):  # a wildcard never reaches a private address
        pin("http://vrambudget.vrambudget.svc:8000/", ("http://*.vrambudget.svc",), resolver)
    for host in ("meta.vrambudget.svc", "cgnat.vrambudget.svc"):  # named, but metadata / shared
        with pytest.raises(AddressRefused):
            pin(f"http://{host}/", (f"http://{host}",), resolver)
    with pytest.raises(AddressRefused):  # another name is not the one written out
        pin("https://internal.example.com/cb", entry, resolver)


def test_unresolvable_names_are_refused_as_unresolved() -> None:
    with pytest.raises(AddressRefused) as info:
        pin("https://nowhere.example.com/", WILD, resolver)
    assert info.value.unresolved


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/cb#/../admin",
        "https://hooks.example.com/cb#",
        "https://user:pw@hooks.example.com/cb",
        "https://user@hooks.example.com/cb",
    ],
)
def test_fragments_and_userinfo_are_refused(url: str) -> None:
    assert not callback_allowed(url, ("https://hooks.example.com",))


@pytest.mark.parametrize(
    "entry",
    [
        "*.co.uk",
        "https://*.com.au",
        "*.github.io",
        "*.herokuapp.com",
        "*.org.uk",
        # beyond the common <generic>.<country> pairs: only the Public Suffix List knows these
        "*.s3.amazonaws.com",
        "*.pvt.k12.ma.us",
        "*.kawasaki.jp",
    ],
)
def test_public_suffix_wildcards_are_refused(entry: str) -> None:
    with pytest.raises(ValueError, match="public suffix"):
        validate_allow_list((entry,))


def test_ordinary_wildcards_stay_allowed() -> None:
    assert validate_allow_list(("*.example.co.uk", "*.example.com")) == (
        "*.example.co.uk",
        "*.example.com",
    )


def test_submission_refuses_a_callback_resolving_to_loopback(tmp_path: Path) -> None:
    settings = AgentSettings(data_dir=tmp_path, tokens=(b"t",), callback_allow_list=WILD)
    with TestClient(create_agent_app(settings, resolver=resolver)) as client:
        r = client.post(
            "/v1/probes",
            json={"workload": INFER, "callback": {"url": "https://rebind.example.com/cb"}},
            headers={"Authorization": "Bearer t"},
        )
        assert r.status_code == 422 and "$.callback.url" in r.text and "127.0.0.1" in r.text


def _enqueue(store: Store, probe_id: str, url: str) -> str:
    store.create_probe(probe_id, "{}", "cpu", 1.0)
    store.finish_with_callback(
        probe_id, "failed", 1.0, None, (url, '{"x": 1}', f"msg_{probe_id}"), "x"
    )
    return f"msg_{probe_id}"


def test_the_deliverer_refuses_at_send_time_by_address(tmp_path: Path) -> None:
    """The name resolved to a public address when the probe was accepted; at send time it
    points at loopback (rebinding): nothing is sent."""
    seen: list[httpx.Request] = []
    with Store(tmp_path / "s.sqlite3") as store:
        event = _enqueue(store, "p1", "https://rebind.example.com/cb")
        d = Deliverer(
            store,
            b"k" * 32,
            WILD,
            transport=httpx.MockTransport(lambda r: seen.append(r) or httpx.Response(200)),
            clock=lambda: 2.0,
            resolver=resolver,
        )
        assert d.deliver_due() == 0
        row = store.get_callback(event)
        assert row is not None and row.last_error is not None and "127.0.0.1" in row.last_error
        d.stop()
    assert seen == []


def test_deliveries_run_concurrently_with_a_bound(tmp_path: Path) -> None:
    """Three slow receivers no longer delay the fourth callback by their sum."""
    active, peak = [0], [0]
    lock = threading.Lock()

    def handler(request: httpx.Request) -> httpx.Response:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.4 if request.url.path == "/slow" else 0.0)
        with lock:
            active[0] -= 1
        return httpx.Response(204)

    with Store(tmp_path / "s.sqlite3") as store:
        for i in range(6):
            _enqueue(store, f"p{i}", f"https://hooks.example.com/{'slow' if i < 5 else 'fast'}")
        d = Deliverer(
            store,
            b"k" * 32,
            WILD,
            transport=httpx.MockTransport(handler),
            clock=lambda: 2.0,
            resolver=resolver,
            concurrency=3,
        )
        t0 = time.monotonic()
        assert d.deliver_due() == 6
        elapsed = time.monotonic() - t0
        d.stop()
    assert peak[0] == 3  # bounded
    assert elapsed < 5 * 0.4  # concurrent: two rounds of slow ones, not five


def test_httpx_log_lines_carry_no_query_strings(caplog: pytest.LogCaptureFixture) -> None:
    import vrambudget.agent.webhooks.deliverer  # noqa: F401 -- installs the filter

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("httpx")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        with httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200))) as c:
            c.post("https://hooks.example.com/cb?token=s3cret")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    text = " ".join(r.getMessage() for r in records)
    assert "hooks.example.com/cb" in text and "s3cret" not in text
