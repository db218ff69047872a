"""Where a callback or the service round trip may connect: the host is resolved, and every
address it resolves to must be public -- not loopback, link-local (cloud metadata,
169.254.169.254), private, shared (100.64/10), multicast, reserved or unspecified -- unless an
allow-list entry names that exact address (``http://127.0.0.1:8080``) or that exact host name
(``http://vrambudget.vrambudget.svc:8000``: a name the administrator wrote out may resolve to a
private or loopback address, as a Kubernetes Service's ClusterIP does -- never to a link-local,
metadata, shared, multicast or unspecified one). The request then goes
to the checked address (``Host`` header and TLS SNI keep the name), so a second DNS answer
cannot point it somewhere else (DNS rebinding).

The allow-list says which *names* are wanted; this says which *addresses* are reachable: a
wildcard entry, or a name under an allowed domain, can no longer reach the host itself or the
metadata service; only a name written out in full may reach a private address.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

import httpx

__all__ = ["AddressRefused", "Resolver", "pin", "system_resolver"]

Resolver = Callable[[str, int], list[str]]
"""``(host, port) -> addresses`` (textual IPs); a test passes its own."""

_IP = ipaddress.IPv4Address | ipaddress.IPv6Address
_EXTRA_BLOCKED = (
    ipaddress.ip_network("100.64.0.0/10"),  # carrier-grade NAT; Alibaba's metadata service
    ipaddress.ip_network("192.0.0.0/24"),
    ipaddress.ip_network("fd00:ec2::/32"),  # AWS's IPv6 metadata service
)


class AddressRefused(ValueError):
    """The URL's host resolves to an address the agent will not connect to (or none:
    ``unresolved``, which may be transient)."""

    def __init__(self, message: str, *, unresolved: bool = False) -> None:
        super().__init__(message)
        self.unresolved = unresolved


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _ip(text: str) -> _IP | None:
    try:
        return ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


def forbidden(ip: _IP) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        ip.is_loopback
        or ip.is_link_local
        or ip.is_private
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or any(ip in net for net in _EXTRA_BLOCKED if net.version == ip.version)
    )


def exact_addresses(allow_list: tuple[str, ...]) -> frozenset[_IP]:
    """The addresses allow-list entries name literally (``http://10.0.0.5:8080``)."""
    out: set[_IP] = set()
    for entry in allow_list:
        text = entry.strip()
        if "://*." in text or text.startswith("*."):
            continue
        try:
            host = httpx.URL(text if "://" in text else "https://" + text).host
        except (httpx.InvalidURL, TypeError, ValueError):
            continue
        ip = _ip(host)
        if ip is not None:
            out.add(ip)
    return frozenset(out)


def exact_hosts(allow_list: tuple[str, ...]) -> frozenset[str]:
    """The host names (not addresses, not wildcards) allow-list entries name in full, lower
    case (``http://vrambudget.vrambudget.svc:8000`` -> ``vrambudget.vrambudget.svc``)."""
    out: set[str] = set()
    for entry in allow_list:
        text = entry.strip()
        if "*" in text:
            continue
        try:
            host = httpx.URL(text if "://" in text else "https://" + text).host
        except (httpx.InvalidURL, TypeError, ValueError):
            continue
        if host and _ip(host) is None:
            out.add(host.lower().rstrip("."))
    return frozenset(out)


def _named_private(ip: _IP) -> bool:
    """A private or loopback address an exactly named host may resolve to: not link-local
    (cloud metadata), not shared (100.64/10) or a metadata range, not multicast, reserved or
    unspecified."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        (ip.is_private or ip.is_loopback)
        and not ip.is_link_local
        and not ip.is_multicast
        and not ip.is_unspecified
        and not any(ip in net for net in _EXTRA_BLOCKED if net.version == ip.version)
    )


def pin(
    url: str, allow_list: tuple[str, ...], resolver: Resolver | None = None
) -> tuple[httpx.URL, dict[str, str], dict[str, str]]:
    """``(url to connect to, extra headers, request extensions)`` for ``url`` (already matched
    against ``allow_list``), or :class:`AddressRefused` saying why not."""
    parsed = httpx.URL(url)
    host = parsed.host
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    allowed = exact_addresses(allow_list)
    literal = _ip(host)
    if literal is not None:
        if forbidden(literal) and literal not in allowed:
            raise AddressRefused(f"{literal} is not a public address")
        return parsed, {}, {}
    try:
        addresses = (resolver or system_resolver)(host, port)
    except OSError as exc:
        raise AddressRefused(f"{host} does not resolve: {exc}", unresolved=True) from None
    ips = [ip for ip in (_ip(a) for a in addresses) if ip is not None]
    if not ips:
        raise AddressRefused(f"{host} does not resolve", unresolved=True)
    named = host.lower().rstrip(".") in exact_hosts(allow_list)
    for ip in ips:  # all of them: a name with one bad address is refused
        if forbidden(ip) and ip not in allowed and not (named and _named_private(ip)):
            raise AddressRefused(f"{host} resolves to {ip}, not a public address")
    target = ips[0]
    headers = {"host": parsed.netloc.decode("ascii")}
    extensions = {"sni_hostname": host} if parsed.scheme == "https" else {}
    return parsed.copy_with(host=str(target)), headers, extensions
