"""The service's HTTP conventions over real requests (docs/HTTP.md): CORS preflights and
answers, gzip and brotli by Accept-Encoding, ETag / Cache-Control / If-None-Match, Vary, and
errors that are never cached."""

from __future__ import annotations

import base64
import gzip
import hashlib
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import brotli
import msgspec
import pytest
from litestar.testing import TestClient

from tests.hub.fake_hub import FakeHub
from tests.service.test_hub_models import TOKEN, _local_only, hub  # noqa: F401 (fixtures)
from tests.support.reports import cuda_report
from vrambudget.http.representation import Representation, no_store_errors
from vrambudget.hub import HubSettings
from vrambudget.service.app import Settings, create_app
from vrambudget.service.settings import SettingsError

BUDGET = {
    "workloads": [
        {
            "kind": "inference",
            "model": {"source": "preset", "id": "llama-3.1-8b"},
            "batch_size": 1,
            "prompt_tokens": 4096,
            "generated_tokens": 512,
        }
    ],
    "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
}
FIT = {"workloads": BUDGET["workloads"], "device_counts": [1, 2, 4, 8]}
IDENTITY = {"accept-encoding": "identity"}
PREFLIGHT = {
    "origin": "https://catalog.example.com",
    "access-control-request-method": "POST",
    "access-control-request-headers": "content-type, if-none-match",
}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient[Any]]:
    with TestClient(create_app(Settings(compute_workers=1))) as c:
        yield c


@pytest.fixture(scope="module")
def listed() -> Iterator[TestClient[Any]]:
    """A service whose pages are only the catalog's and a local development server."""
    settings = Settings(
        compute_workers=1,
        cors_origins=("https://catalog.example.com", "http://localhost:5173"),
    )
    with TestClient(create_app(settings)) as c:
        yield c


def _raw(client: TestClient[Any], method: str, url: str, **kw: Any) -> tuple[Any, bytes]:
    """The answer and its bytes as sent (httpx would decode the coding)."""
    with client.stream(method, url, **kw) as r:
        return r, b"".join(r.iter_raw())


def _vary(r: Any) -> list[str]:
    return [v.strip() for v in r.headers.get("vary", "").split(",") if v.strip()]


# ----------------------------------------------------------------------------------- CORS --


def test_a_preflight_is_answered_with_every_allow_header(client: TestClient[Any]) -> None:
    r = client.options("/v1/budgets", headers=PREFLIGHT)
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "*"
    assert r.headers["access-control-allow-methods"] == "GET, POST"
    assert r.headers["access-control-allow-headers"] == (
        "accept, content-type, if-none-match, x-request-id"
    )
    assert r.headers["access-control-max-age"] == "7200"
    assert "vary" not in r.headers  # "*" does not depend on the Origin
    # a preflight for a path the service does not have is answered too; the 404 then reaches
    # the page with its problem
    assert client.options("/v1/nothing", headers=PREFLIGHT).status_code == 204
    r = client.get("/v1/nothing", headers={"origin": "https://catalog.example.com"})
    assert r.status_code == 404 and r.headers["access-control-allow-origin"] == "*"


def test_a_simple_answer_carries_allow_origin_and_exposes_the_tag(
    client: TestClient[Any],
) -> None:
    r = client.post("/v1/budgets", json=BUDGET, headers={"origin": "https://any.example"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "*"
    assert r.headers["access-control-expose-headers"] == (
        "ETag, Retry-After, X-Request-ID, X-Unsafe-Integers"
    )
    assert "Origin" not in _vary(r)
    # an error reaches the page too (its problem is readable)
    r = client.get("/v1/gpus/nope", headers={"origin": "https://any.example"})
    assert r.status_code == 404 and r.headers["access-control-allow-origin"] == "*"
    # without an Origin (not a browser's cross-origin call): no CORS headers
    assert "access-control-allow-origin" not in client.get("/v1/gpus").headers


def test_a_listed_origin_is_echoed_and_every_answer_varies_by_origin(
    listed: TestClient[Any],
) -> None:
    r = listed.options("/v1/fits", headers=PREFLIGHT)
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "https://catalog.example.com"
    assert r.headers["vary"] == "Origin"
    r = listed.get("/v1/models", headers={"origin": "http://localhost:5173"})
    assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert _vary(r) == ["Accept-Encoding", "Origin"]
    # a refused origin gets the answer without the header (the browser withholds it) and the
    # same Vary, so that no cache hands it to an allowed origin
    r = listed.get("/v1/models", headers={"origin": "https://evil.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    assert _vary(r) == ["Accept-Encoding", "Origin"]
    assert _vary(listed.get("/v1/models")) == ["Accept-Encoding", "Origin"]


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        (
            {**PREFLIGHT, "origin": "https://evil.example"},
            "origin 'https://evil.example' may not call this service from a page; allowed: "
            "https://catalog.example.com, http://localhost:5173 (the setting "
            "VRAMBUDGET_CORS_ORIGINS)",
        ),
        (
            {**PREFLIGHT, "access-control-request-method": "DELETE"},
            "method 'DELETE' is not allowed cross-origin; allowed: GET, POST",
        ),
        (
            {**PREFLIGHT, "access-control-request-headers": "content-type, x-debug, cookie"},
            "request header(s) x-debug, cookie not allowed cross-origin; allowed: accept, "
            "content-type, if-none-match, x-request-id",
        ),
    ],
)
def test_a_refused_preflight_is_a_403_problem_naming_what_is_allowed(
    listed: TestClient[Any], headers: dict[str, str], detail: str
) -> None:
    r = listed.options("/v1/budgets", headers=headers)
    assert r.status_code == 403
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["cache-control"] == "no-store"
    assert "access-control-allow-origin" not in r.headers
    assert r.json()["detail"] == detail


def test_cors_off_leaves_litestar_s_options_answer() -> None:
    with TestClient(create_app(Settings(compute_workers=1, cors_origins=()))) as c:
        r = c.options("/v1/budgets", headers=PREFLIGHT)
        # what every preflight got before the CORS setting: 204 with Allow only, so a browser
        # refuses the call
        assert r.status_code == 204 and r.headers["allow"] == "OPTIONS, POST"
        assert "access-control-allow-origin" not in r.headers
        r = c.get("/healthz", headers={"origin": "https://catalog.example.com"})
        assert "access-control-allow-origin" not in r.headers


def test_the_cors_setting_is_read_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VRAMBUDGET_CORS_ORIGINS", "https://Catalog.example.com:443, ")
    assert Settings.from_env().cors_origins == ("https://catalog.example.com",)
    monkeypatch.setenv("VRAMBUDGET_CORS_ORIGINS", "")
    assert Settings.from_env().cors_origins == ()
    monkeypatch.setenv("VRAMBUDGET_CORS_ORIGINS", "catalog.example.com")
    with pytest.raises(SettingsError, match=r"^VRAMBUDGET_CORS_ORIGINS: 'catalog\.example\.com'"):
        Settings.from_env()
    monkeypatch.delenv("VRAMBUDGET_CORS_ORIGINS")
    assert Settings.from_env().cors_origins == ("*",)
    with pytest.raises(SettingsError, match="VRAMBUDGET_CACHE_MAX_AGE_S"):
        Settings(cache_max_age_s=-1)


# ---------------------------------------------------------------------------- compression --


@pytest.mark.parametrize("coding", ["gzip", "br"])
@pytest.mark.parametrize(
    ("method", "url", "body"),
    [("GET", "/v1/gpus", None), ("POST", "/v1/fits", FIT), ("POST", "/v1/budgets", BUDGET)],
)
def test_a_large_answer_decodes_to_the_identity_bytes(
    client: TestClient[Any], coding: str, method: str, url: str, body: Any
) -> None:
    plain, identity = _raw(client, method, url, json=body, headers=IDENTITY)
    assert "content-encoding" not in plain.headers
    assert int(plain.headers["content-length"]) == len(identity) > 4096
    r, packed = _raw(client, method, url, json=body, headers={"accept-encoding": coding})
    assert r.status_code == 200
    assert r.headers["content-encoding"] == coding
    assert int(r.headers["content-length"]) == len(packed)
    decode = gzip.decompress if coding == "gzip" else brotli.decompress
    assert decode(packed) == identity
    assert len(packed) < len(identity) // 2
    assert "Accept-Encoding" in _vary(r)


def test_q_values_choose_the_coding(client: TestClient[Any]) -> None:
    for accept, chosen in [
        ("gzip, deflate, br", "br"),
        ("br;q=0.5, gzip", "gzip"),
        ("br;q=0, gzip;q=0", None),
        ("*;q=0", None),
    ]:
        r, _ = _raw(client, "GET", "/v1/gpus", headers={"accept-encoding": accept})
        assert r.headers.get("content-encoding") == chosen, accept


def test_a_repeated_answer_is_compressed_once() -> None:
    app = create_app(Settings(compute_workers=1))
    middleware = next(m for m in app.middleware if isinstance(m, Representation))
    with TestClient(app) as c:
        first = _raw(c, "POST", "/v1/fits", json=FIT, headers={"accept-encoding": "gzip"})[1]
        assert len(middleware.packed) == 1
        second = _raw(c, "POST", "/v1/fits", json=FIT, headers={"accept-encoding": "gzip"})[1]
        assert second == first and len(middleware.packed) == 1
        _raw(c, "POST", "/v1/fits", json=FIT, headers={"accept-encoding": "br"})
        assert len(middleware.packed) == 2  # one entry per coding
        # an answer with no freshness (the metrics) is compressed but not kept
        r, _ = _raw(c, "GET", "/metrics", headers={"accept-encoding": "br"})
        assert r.headers["content-encoding"] == "br" and "etag" not in r.headers
        assert len(middleware.packed) == 2


def test_a_small_answer_is_never_compressed(client: TestClient[Any]) -> None:
    r, raw = _raw(client, "GET", "/healthz", headers={"accept-encoding": "br, gzip"})
    assert raw == b'{"status":"ok"}' and "content-encoding" not in r.headers
    r, raw = _raw(client, "GET", "/readyz", headers={"accept-encoding": "gzip"})
    assert len(raw) < 1024 and "content-encoding" not in r.headers


# --------------------------------------------------------------------------------- caching --


def _tag_of(identity: bytes, coding: str | None = None) -> str:
    """By hand: base64url of the first 16 bytes of the identity bytes' SHA-256."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(identity).digest()[:16]).decode()
    return f'"{digest.rstrip("=")}{"-" + coding if coding else ""}"'


def test_catalog_tags_are_stable_per_coding_and_revalidate_with_304(
    client: TestClient[Any],
) -> None:
    r, identity = _raw(client, "GET", "/v1/gpus", headers=IDENTITY)
    assert r.headers["etag"] == _tag_of(identity)
    assert r.headers["cache-control"] == "public, max-age=3600"
    r, _ = _raw(client, "GET", "/v1/gpus", headers={"accept-encoding": "gzip"})
    assert r.headers["etag"] == _tag_of(identity, "gzip")
    assert client.get("/v1/gpus", headers={"accept-encoding": "gzip"}).headers["etag"] == (
        _tag_of(identity, "gzip")
    )
    tag = r.headers["etag"]
    for sent in (tag, f"W/{tag}", f'"other", {tag}', "*"):
        r, raw = _raw(
            client, "GET", "/v1/gpus", headers={"accept-encoding": "gzip", "if-none-match": sent}
        )
        assert r.status_code == 304 and raw == b"", sent
        assert r.headers["etag"] == tag
        assert r.headers["cache-control"] == "public, max-age=3600"
        assert _vary(r) == ["Accept-Encoding"]
        assert "content-length" not in r.headers and "content-encoding" not in r.headers
    # the tag of another coding is another representation: the answer is sent
    r = client.get("/v1/gpus", headers={"accept-encoding": "br", "if-none-match": tag})
    assert r.status_code == 200 and r.headers["etag"] == _tag_of(identity, "br")
    # one GPU, one model, the models list: tagged too
    for url in ("/v1/gpus/h100-sxm5-80gb", "/v1/models", "/v1/models/llama-3.1-8b"):
        r = client.get(url)
        assert r.headers["cache-control"] == "public, max-age=3600" and r.headers["etag"], url
        r = client.get(url, headers={"if-none-match": r.headers["etag"]})
        assert r.status_code == 304, url
    r = client.get("/schema/openapi.json")
    assert r.headers["cache-control"] == "public, max-age=3600"
    assert (
        client.get("/schema/openapi.json", headers={"if-none-match": r.headers["etag"]}).status_code
        == 304
    )


def test_post_answers_are_tagged_by_their_bytes(client: TestClient[Any]) -> None:
    r, identity = _raw(client, "POST", "/v1/budgets", json=BUDGET, headers=IDENTITY)
    assert r.headers["etag"] == _tag_of(identity)
    assert r.headers["cache-control"] == "max-age=3600"
    # the same request with its keys in another order and spaces: the same answer, the same tag
    reordered = json.dumps(dict(reversed(list(BUDGET.items()))), indent=2).encode()
    r2 = client.post("/v1/budgets", content=reordered, headers=IDENTITY)
    assert r2.headers["etag"] == r.headers["etag"]
    # another request: another tag
    other = {**BUDGET, "device": {"source": "catalog", "id": "l40s-48gb"}}
    assert (
        client.post("/v1/budgets", json=other, headers=IDENTITY).headers["etag"]
        != (r.headers["etag"])
    )
    fit = client.post("/v1/fits", json=FIT)
    assert fit.headers["etag"] and fit.headers["cache-control"] == "max-age=3600"


def test_a_post_whose_if_none_match_matches_is_412_per_rfc_9110(
    client: TestClient[Any],
) -> None:
    tag = client.post("/v1/budgets", json=BUDGET, headers=IDENTITY).headers["etag"]
    r = client.post("/v1/budgets", json=BUDGET, headers={**IDENTITY, "if-none-match": tag})
    assert r.status_code == 412
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["cache-control"] == "no-store" and r.headers["etag"] == tag
    assert r.json()["type"] == "https://vrambudget.dev/problems/not-modified"
    assert tag in r.json()["detail"]
    r = client.post("/v1/budgets", json=BUDGET, headers={**IDENTITY, "if-none-match": '"x"'})
    assert r.status_code == 200


def test_vary_names_accept_where_the_media_type_follows_it(client: TestClient[Any]) -> None:
    assert _vary(client.post("/v1/budgets", json=BUDGET)) == ["Accept", "Accept-Encoding"]
    assert _vary(client.post("/v1/fits", json=FIT)) == ["Accept-Encoding"]
    cluster = {"source": {"from": "budget", "request": BUDGET}}
    as_json = client.post("/v1/cluster-requests", json=cluster)
    as_yaml = client.post(
        "/v1/cluster-requests", json=cluster, headers={"accept": "application/yaml"}
    )
    assert as_yaml.headers["content-type"].startswith("application/yaml")
    assert _vary(as_json) == _vary(as_yaml) == ["Accept", "Accept-Encoding"]
    assert as_json.headers["etag"] != as_yaml.headers["etag"]
    report = msgspec.json.encode(cuda_report())
    assert _vary(client.post("/v1/comparisons", content=report)) == ["Accept", "Accept-Encoding"]
    svg = client.post("/v1/budgets", json=BUDGET, headers={"accept": "image/svg+xml"})
    assert svg.headers["content-type"].startswith("image/svg+xml")
    assert _vary(svg) == ["Accept", "Accept-Encoding"]
    assert svg.headers["etag"] != client.post("/v1/budgets", json=BUDGET).headers["etag"]


def test_errors_are_never_cached(client: TestClient[Any]) -> None:
    for r in (
        client.get("/v1/gpus/nope"),
        client.post("/v1/budgets", json={**BUDGET, "device": {"source": "catalog", "id": "x"}}),
        client.post("/v1/budgets", content=b"{"),
        client.post("/v1/budgets", content=b"x", headers={"content-type": "text/plain"}),
        client.get("/v1/nothing"),  # routing's 404 and 405: outside every route's middleware
        client.put("/v1/gpus"),
    ):
        assert r.status_code >= 400
        assert r.headers["cache-control"] == "no-store", r.status_code
        assert "etag" not in r.headers


def test_the_error_hook_is_a_coroutine() -> None:
    # Litestar runs a plain-function before_send hook in a worker thread, twice per request:
    # /healthz under wrk lost 40 % of its rate that way
    assert inspect.iscoroutinefunction(no_store_errors)


def test_max_age_zero_means_revalidate_every_time() -> None:
    with TestClient(create_app(Settings(compute_workers=1, cache_max_age_s=0))) as c:
        r = c.get("/v1/models")
        assert r.headers["cache-control"] == "no-cache" and r.headers["etag"]
        assert c.get("/v1/models", headers={"if-none-match": r.headers["etag"]}).status_code == 304


def test_an_answer_that_read_a_hub_branch_is_revalidated(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    server, _ = request.getfixturevalue("hub")
    assert isinstance(server, FakeHub)
    settings = Settings(
        compute_workers=1,
        hub=HubSettings(endpoint=server.url, token=TOKEN, cache_dir=str(tmp_path), timeout_s=5),
    )

    def budget(revision: str | None) -> dict[str, Any]:
        model = {"source": "hub", "id": "org/tiny-phi", "revision": revision}
        return {**BUDGET, "workloads": [{"kind": "inference", "model": model}]}

    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/budgets", json=budget(None))  # main: can move
        assert r.status_code == 200, r.text
        assert r.headers["cache-control"] == "no-cache" and r.headers["etag"]
        sha = server.repos["org/tiny-phi"].sha
        r = c.post("/v1/budgets", json=budget(sha))  # a commit: cannot
        assert r.status_code == 200, r.text
        assert r.headers["cache-control"] == "max-age=3600"
