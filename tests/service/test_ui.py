"""The fit table's static files (vrambudget/service/ui.py, docs/EMBED.md) through the app:
media types, validators and 304s, left out of the OpenAPI, carried by the wheel, nothing
loaded from elsewhere, and the element's component words cover the component vocabulary.
The table itself runs in a browser in tests/e2e/test_fit_table.py."""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import re
import tomllib
from collections.abc import Iterator
from typing import Any

import pytest
from litestar.testing import TestClient

from tests.support import ROOT
from vrambudget.core.components import Component
from vrambudget.service.app import create_app
from vrambudget.service.ui import ASSETS

STATIC = ROOT / "vrambudget" / "service" / "static"
SERVED = {
    "/ui/fits": ("fits.html", "text/html; charset=utf-8"),
    "/ui/fits-page.js": ("fits-page.js", "text/javascript; charset=utf-8"),
    "/ui/vrambudget-fits.js": ("vrambudget-fits.js", "text/javascript; charset=utf-8"),
}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient[Any]]:
    with TestClient(create_app()) as c:
        yield c


@pytest.mark.parametrize("path", sorted(SERVED))
def test_each_file_is_served_as_it_is_with_a_strong_validator(
    client: TestClient[Any],
    path: str,
) -> None:
    name, media_type = SERVED[path]
    body = (STATIC / name).read_bytes()
    identity = {"accept-encoding": "identity"}
    r = client.get(path, headers=identity)
    assert r.status_code == 200
    assert r.content == body
    assert r.headers["content-type"] == media_type
    assert r.headers["cache-control"] == "no-cache"
    assert r.headers["access-control-allow-origin"] == "*"
    # the app's strong validator (docs/HTTP.md): base64url of the first 16 bytes of the SHA-256
    digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()[:16]).decode().rstrip("=")
    etag = f'"{digest}"'
    assert r.headers["etag"] == etag
    # RFC 9110 13.1.2: If-None-Match compares weakly; a list matches if one entry does
    for header in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        r = client.get(path, headers={**identity, "if-none-match": header})
        assert (r.status_code, r.content, r.headers["etag"]) == (304, b"", etag), header
    for header in ('"other"', etag[:-2] + '"', ""):
        r = client.get(path, headers={**identity, "if-none-match": header})
        assert r.status_code == 200, header
    # gzip: the same bytes decoded, under the gzip representation's own tag
    r = client.get(path, headers={"accept-encoding": "gzip"})
    assert r.content == body and r.headers["cache-control"] == "no-cache"
    if len(body) >= 1024:
        assert r.headers["content-encoding"] == "gzip"
        assert r.headers["etag"] == f'"{digest}-gzip"'


def test_the_pages_are_not_in_the_openapi_document(client: TestClient[Any]) -> None:
    paths = client.get("/schema/openapi.json").json()["paths"]
    assert "/v1/fits" in paths
    assert not [p for p in paths if p.startswith("/ui")]


def test_every_static_file_is_served_and_carried_by_the_wheel() -> None:
    files = sorted(p.name for p in STATIC.iterdir())
    assert sorted(a for a, _ in SERVED.values()) == files
    assert set(ASSETS) == set(SERVED)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["vrambudget.service"]
    for name in files:
        assert any(fnmatch.fnmatch(f"static/{name}", g) for g in globs), name


def test_nothing_is_loaded_from_another_origin() -> None:
    """No CDN: the only absolute URL in the files is the example in the element's comment."""
    for path in STATIC.iterdir():
        urls = set(re.findall(r"https?://[^\s\"'`<>)]+", path.read_text()))
        assert urls <= {"https://vram.example.com/ui/vrambudget-fits.js"}, (path.name, urls)
    html = (STATIC / "fits.html").read_text()
    assert re.findall(r'<script[^>]*src="([^"]+)"', html) == ["fits-page.js"]
    page = (STATIC / "fits-page.js").read_text()
    assert re.findall(r'^import\s+"([^"]+)"', page, re.M) == ["./vrambudget-fits.js"]


def test_the_element_names_every_component_in_words() -> None:
    js = (STATIC / "vrambudget-fits.js").read_text()
    block = re.search(r"COMPONENT_LABELS = Object\.freeze\(\{(.*?)\}\)", js, re.S)
    assert block is not None
    labels = dict(re.findall(r'^\s*(\w+): "([^"]+)",$', block.group(1), re.M))
    assert set(labels) == {c.value for c in Component}
    for key, label in labels.items():
        assert "_" not in label and label[0].isupper(), (key, label)
    assert labels["kv_cache"] == "KV cache" and labels["cuda_context"] == "CUDA context"
