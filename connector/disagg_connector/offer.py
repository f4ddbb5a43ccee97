"""Signed, single-use offers: an engine reads another engine's KV only where that engine said so.

The engine that retains KV for another to read (decode after a turn, prefill for decode)
signs what it publishes: HMAC-SHA256, under a per-model key only prefill and decode hold,
over every field the reader acts on (see :data:`BOUND_KEYS`), a fresh offer id (one per
retention), when it was issued, the expiry and the model's identity. The reader checks the
signature (constant-time) before it plans a read, refuses an expired offer, and accepts each
offer id once: an honest offer replayed after its first read, once its blocks hold other
requests' KV, is refused. Pure logic, no vLLM.

Without a key this engine signs nothing and refuses every decode-to-prefill offer: reuse that
nobody can check is never granted. Prefill-to-decode offers are then accepted unsigned
(vLLM's own P/D, verdict ``unchecked``) so that a deployment without a key still serves; with
a key they are checked like the others.

What single use covers here: a replay to the engine that accepted the offer, for as long as
the offer lives (its lifetime, measured on the reader's own monotonic clock from when it first
read it), in bounded memory. Beyond that, a signed offer is judged on one clock only, its
issuer's: the reader compares none of the offer's times with its own, and before it reads it
claims the blocks on the issuer's lease service (see :mod:`claims`, :mod:`retention`), which
grants one reader, named by that reader's incarnation, and refuses blocks it freed, let lapse,
or never held (an issuer restarted since the offer). So a replay to another reader, to a
restarted reader or after the issuer restarted is refused whatever the two clocks say, in
both directions.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import json
import math
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from disagg_connector.offer_form import OFFERED_FIELDS, Direction
from disagg_connector.reuse_plan import Verdict
from disagg_contract import (
    EXPIRES_AT_KEY,
    EXPIRY_MARGIN_S,
    OFFER_KEY,
    OFFER_KEY_ENV,
    OFFER_KEY_FILE_ENV,
    OFFER_WIRE_VERSION,
)

BOUND_KEYS = ("do_remote_prefill", "do_remote_decode", *OFFERED_FIELDS)
"""The offer's fields the signature covers: every one vLLM's pull scheduler and worker read."""
MIN_KEY_CHARS = 32
"""Shortest signing key accepted (a 128-bit random key in hex is exactly this long)."""
SPENT_CAPACITY = 1 << 17
"""Most offer ids one engine remembers as read; past it the oldest are forgotten (see below)."""
_ID_BYTES = 16
_SIGNATURE_CHARS = 64


class OfferKeyError(ValueError):
    """The signing key is configured but unusable (unreadable, empty or too short)."""


@dataclass(frozen=True)
class OfferKeys:
    """The model's signing keys: the first signs, every one verifies (for a rotation)."""

    keys: tuple[bytes, ...]

    def sign(self, message: bytes) -> str:
        """Hex HMAC-SHA256 of ``message`` under the signing key."""
        return hmac.new(self.keys[0], message, hashlib.sha256).hexdigest()

    def verify(self, message: bytes, signature: str) -> bool:
        """Whether ``signature`` is ``message``'s under any key (constant-time per key)."""
        given = signature.encode("ascii", "replace")
        return any(
            hmac.compare_digest(hmac.new(key, message, hashlib.sha256).hexdigest().encode(), given)
            for key in self.keys
        )


def load_offer_keys(environ: Mapping[str, str]) -> OfferKeys | None:
    """The keys named by the environment, or None when neither variable is set.

    The file (or the variable) holds one key a line; blank lines are skipped. A key that is
    set but unusable raises :class:`OfferKeyError`, so the engine fails at start-up instead
    of silently serving without reuse.
    """
    path = environ.get(OFFER_KEY_FILE_ENV)
    value = environ.get(OFFER_KEY_ENV)
    if path is not None and value is not None:
        raise OfferKeyError(f"set {OFFER_KEY_FILE_ENV} or {OFFER_KEY_ENV}, not both")
    if path is not None:
        try:
            text = Path(path).read_bytes()
        except OSError as exc:
            raise OfferKeyError(f"{OFFER_KEY_FILE_ENV}={path} cannot be read: {exc}") from exc
        source = f"{OFFER_KEY_FILE_ENV}={path}"
    elif value is not None:
        text, source = value.encode(), OFFER_KEY_ENV
    else:
        return None
    keys = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not keys:
        raise OfferKeyError(f"{source} holds no key")
    if any(len(key) < MIN_KEY_CHARS for key in keys):
        raise OfferKeyError(f"{source} holds a key shorter than {MIN_KEY_CHARS} characters")
    return OfferKeys(keys)


def model_identity(served_model_name: str, block_size: int) -> str:
    """What an offer names as the model its KV belongs to."""
    return json.dumps([served_model_name, block_size])


def _message(
    params: Mapping[str, Any], offer_id: str, issued_at: float, expires_at: float, model: str
) -> bytes:
    fields = {key: params[key] for key in BOUND_KEYS if key in params}
    document = [OFFER_WIRE_VERSION, offer_id, issued_at, expires_at, model, fields]
    return json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


class SpentOffers:
    """Offer ids already accepted, each remembered until a time of the caller's clock, in
    bounded memory.

    Forgetting an id (when its time comes, or the soonest when the table is full) raises a
    floor: an offer to be remembered until at most the floor is refused as a possible replay,
    so under overload only the oldest offers are refused.
    """

    def __init__(self, capacity: int = SPENT_CAPACITY) -> None:
        self.capacity = capacity
        self._expiry: dict[str, float] = {}
        self._by_expiry: list[tuple[float, str]] = []
        self._floor = -math.inf

    def __len__(self) -> int:
        return len(self._expiry)

    def spend(self, offer_id: str, expires_at: float, now: float) -> bool:
        """Record ``offer_id`` as accepted until ``expires_at``; False if it was (or may have
        been) before. Both times are of one clock, the caller's."""
        while self._by_expiry and (
            self._by_expiry[0][0] <= now or len(self._expiry) >= self.capacity
        ):
            forgotten, old_id = heapq.heappop(self._by_expiry)
            del self._expiry[old_id]
            self._floor = max(self._floor, forgotten)
        if expires_at <= self._floor or offer_id in self._expiry:
            return False
        self._expiry[offer_id] = expires_at
        heapq.heappush(self._by_expiry, (expires_at, offer_id))
        return True


@dataclass(frozen=True)
class Admission:
    """Whether an offer may be read, with the verdict to count and a reason to log."""

    admitted: bool
    verdict: Verdict | None
    """None for an admitted signed offer: its verdict comes from the digest."""
    reason: str = ""


class OfferSigner:
    """Signs the offers this engine publishes and admits the ones it is asked to read."""

    def __init__(
        self,
        keys: OfferKeys | None,
        model: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock`` measures how long a spent offer id is remembered."""
        self.keys = keys
        self.model = model
        self._clock = clock
        self.spent = SpentOffers()

    def sign(self, params: dict[str, Any], issued_at: float, expires_at: float) -> None:
        """Add the signed envelope to ``params`` (nothing without a key)."""
        if self.keys is None:
            return
        offer_id = secrets.token_urlsafe(_ID_BYTES)
        message = _message(params, offer_id, issued_at, expires_at, self.model)
        params[OFFER_KEY] = {
            "v": OFFER_WIRE_VERSION,
            "id": offer_id,
            "iat": issued_at,
            "exp": expires_at,
            "model": self.model,
            "sig": self.keys.sign(message),
        }

    def admit(self, params: Mapping[str, Any], direction: Direction) -> Admission:
        """Check a well-formed offer's envelope and single use, in order.

        A decode-to-prefill offer's expiry must be its ``disagg_expires_at`` too (the router
        reads that one). Whether an offer still holds is its issuer's to say, through the
        claim: none of its times is compared with this engine's clock.
        """
        if self.keys is None:
            if direction is Direction.PREFILL_TO_DECODE:
                return Admission(True, Verdict.UNCHECKED)
            return Admission(False, Verdict.NO_KEY, "no signing key on this engine")
        envelope = params.get(OFFER_KEY)
        if envelope is None:
            return Admission(False, Verdict.UNSIGNED, "no signed envelope")
        problem = _envelope_problem(envelope)
        if problem is not None:
            return Admission(False, Verdict.MALFORMED, f"envelope {problem}")
        assert isinstance(envelope, Mapping)
        if envelope["model"] != self.model:
            return Admission(
                False, Verdict.OTHER_MODEL, f"for model {envelope['model']!r}, not {self.model!r}"
            )
        try:
            message = _message(params, envelope["id"], envelope["iat"], envelope["exp"], self.model)
        except (TypeError, ValueError) as exc:
            return Admission(False, Verdict.MALFORMED, f"fields cannot be encoded: {exc}")
        if not self.keys.verify(message, envelope["sig"]):
            return Admission(False, Verdict.BAD_SIGNATURE, "signature does not match")
        if (
            direction is Direction.DECODE_TO_PREFILL
            and params.get(EXPIRES_AT_KEY) != envelope["exp"]
        ):
            return Admission(False, Verdict.MALFORMED, f"{EXPIRES_AT_KEY} is not the envelope's")
        local_now = self._clock()
        lifetime = max(float(envelope["exp"]) - float(envelope["iat"]), 0.0)
        if not self.spent.spend(envelope["id"], local_now + lifetime + EXPIRY_MARGIN_S, local_now):
            return Admission(False, Verdict.REPLAYED, f"offer {envelope['id']} already read")
        return Admission(True, None)


def _envelope_problem(envelope: object) -> str | None:
    if not isinstance(envelope, Mapping):
        return "is not an object"
    version = envelope.get("v")
    if type(version) is not int or version != OFFER_WIRE_VERSION:
        return f"wire version {version!r} is not {OFFER_WIRE_VERSION}"
    offer_id = envelope.get("id")
    if not isinstance(offer_id, str) or not 16 <= len(offer_id) <= 64 or not offer_id.isascii():
        return "id is not a short ASCII string"
    for field in ("iat", "exp"):
        value = envelope.get(field)
        if not isinstance(value, int | float) or isinstance(value, bool):
            return f"{field} is not a number"
        if not math.isfinite(value):
            return f"{field} is not finite"
    if not isinstance(envelope.get("model"), str):
        return "model is not a string"
    signature = envelope.get("sig")
    if not isinstance(signature, str) or len(signature) != _SIGNATURE_CHARS:
        return f"sig is not {_SIGNATURE_CHARS} hex characters"
    return None
