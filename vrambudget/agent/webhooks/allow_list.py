"""The callback allow-list: which ``scheme://host[:port][/path]`` entries a callback URL may
match, with URLs parsed by httpx (the parser that sends the request)."""

from __future__ import annotations

import re

import httpx
from publicsuffixlist import PublicSuffixList

__all__ = ["callback_allowed", "validate_allow_list"]

_DEFAULT_PORTS = {"http": 80, "https": 443}
# What a host may look like once httpx has IDNA-encoded it: DNS labels, IPv4, or IPv6 (colons).
_HOST = re.compile(r"[a-z0-9.:-]+")
_IP_LIKE = re.compile(r"[0-9.:]+")


def _parse(url: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` as httpx will connect, or None if the URL must be refused.

    The URL is parsed by httpx -- the same parser that sends the request -- so the check and
    the connection cannot disagree about which host a tricky URL names (the classic
    allow-list bypass, e.g. ``https://evil.example\\@hooks.example.com``)."""
    if not isinstance(url, str) or "#" in url:
        # A fragment is never sent, and with one a caller picks any path of an allowed
        # origin (``service_url`` gets paths appended): refused, like userinfo.
        return None
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return None
    if parsed.scheme not in _DEFAULT_PORTS or parsed.userinfo or "@" in url.split("?", 1)[0]:
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
    if wildcard and (
        "." not in parsed[1] or _IP_LIKE.fullmatch(parsed[1]) or _public_suffix(parsed[1])
    ):
        # "*.com" or "*.co.uk" would let in half the internet; a pattern needs a registrable
        # name under it.
        raise ValueError(
            f"allow-list pattern {entry!r} must be *.<name>.<public suffix>, "
            "not a wildcard over a public suffix"
        )
    return (*parsed, wildcard)


# The Public Suffix List (ICANN and private sections: ``co.uk``, ``github.io``,
# ``s3.amazonaws.com`` ...), shipped as data by the ``publicsuffixlist`` package: no network.
_PSL = PublicSuffixList()


def _public_suffix(host: str) -> bool:
    """Is ``host`` (a wildcard's base) a public suffix: ``co.uk``, ``com.au``, ``github.io``?"""
    return bool(_PSL.is_public(host))


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
