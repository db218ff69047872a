"""The allowed origins of a CORS setting and how an origin is matched against them."""

from __future__ import annotations

import pytest

from vrambudget.http.cors import CorsPolicy, parse_origins


@pytest.mark.parametrize(
    ("value", "origins"),
    [
        ("", ()),
        (" , ", ()),
        ("*", ("*",)),
        (" * ", ("*",)),
        ("https://catalog.example.com", ("https://catalog.example.com",)),
        ("HTTPS://Catalog.Example.com", ("https://catalog.example.com",)),
        ("https://a.example:443", ("https://a.example",)),  # browsers omit the default port
        ("http://a.example:80,http://a.example", ("http://a.example",)),
        (
            "http://127.0.0.1:8080, https://*.example.com",
            ("http://127.0.0.1:8080", "https://*.example.com"),
        ),
        ("http://[::1]:3000", ("http://[::1]:3000",)),
    ],
)
def test_origins_are_parsed_and_normalised(value: str, origins: tuple[str, ...]) -> None:
    assert parse_origins(value, "X") == origins


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("*, https://a.example", "'\\*' allows every origin and must stand alone"),
        ("https://a.example/", "'https://a.example/' is not an origin"),
        ("https://a.example/path", "is not an origin"),
        ("a.example", "is not an origin"),
        ("ftp://a.example", "is not an origin"),
        ("https://*example.com", "is not an origin"),
        ("https://a.*.example.com", "is not an origin"),
        ("null", "is not an origin"),
        ("https://a.example:70000", "port 70000; allowed: 1 .. 65535"),
    ],
)
def test_a_malformed_origin_names_the_setting_and_the_form(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=rf"^VRAMBUDGET_CORS_ORIGINS: .*{message}"):
        parse_origins(value, "VRAMBUDGET_CORS_ORIGINS")


def _policy(*origins: str) -> CorsPolicy:
    return CorsPolicy(
        origins=origins, methods=("GET",), request_headers=(), expose_headers=(), setting="X"
    )


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("https://catalog.example.com", True),
        ("https://shop.example.com", True),  # a subdomain
        ("https://a.b.example.com", True),  # any depth
        ("https://example.com", False),  # the wildcard covers subdomains only
        ("http://shop.example.com", False),  # another scheme
        ("https://shop.example.com:8443", False),  # another port
        ("https://evilexample.com", False),
        ("https://example.com.evil.net", False),
        ("https://shop.example.com.evil.net", False),
        ("http://localhost:5173", True),
        ("http://localhost:5174", False),
        ("null", False),
    ],
)
def test_an_origin_is_allowed_exactly_or_as_a_subdomain(origin: str, allowed: bool) -> None:
    policy = _policy(*parse_origins("https://*.example.com, http://localhost:5173", "X"))
    assert policy.allows(origin) is allowed


def test_star_allows_every_origin_and_answers_star() -> None:
    policy = _policy("*")
    assert policy.allows("null") and policy.allows("https://anything.test")
    assert policy.allow_origin("https://anything.test") == "*"
    assert _policy("https://a.example").allow_origin("https://a.example") == "https://a.example"
