"""Standard Webhooks signing: the secret, the ``webhook-signature`` value, and the receiver's
check (the package docstring says why not the reference library)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping

__all__ = ["WebhookVerificationError", "decode_secret", "sign", "verify"]

_SECRET_PREFIX = "whsec_"


class WebhookVerificationError(ValueError):
    """A delivery that must not be trusted: missing headers, stale timestamp, bad signature."""


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
        raise WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature")
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
