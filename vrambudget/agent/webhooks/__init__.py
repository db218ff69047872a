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

Modules: ``signing`` (sign, verify, the secret), ``allow_list`` (which callback URLs may be
posted to) and ``deliverer`` (the retry schedule and the :class:`Deliverer` thread).
"""

from __future__ import annotations

from .addresses import AddressRefused, Resolver, pin, system_resolver
from .allow_list import callback_allowed, validate_allow_list
from .deliverer import Deliverer, backoff_s
from .signing import WebhookVerificationError, decode_secret, sign, verify

__all__ = [
    "AddressRefused",
    "Deliverer",
    "Resolver",
    "WebhookVerificationError",
    "backoff_s",
    "callback_allowed",
    "decode_secret",
    "pin",
    "sign",
    "system_resolver",
    "validate_allow_list",
    "verify",
]
