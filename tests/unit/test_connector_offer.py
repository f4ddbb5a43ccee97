"""Signed, single-use offers: signing, the checks a reader makes, keys and the spent table."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from disagg_connector.offer import (
    BOUND_KEYS,
    MIN_KEY_CHARS,
    OfferKeyError,
    OfferKeys,
    OfferSigner,
    SpentOffers,
    load_offer_keys,
    model_identity,
)
from disagg_connector.offer_form import Direction
from disagg_connector.prefix_digest import TokenDigest
from disagg_connector.reuse_plan import Verdict
from disagg_contract import (
    EXPIRES_AT_KEY,
    EXPIRY_MARGIN_S,
    LEASE_KEY,
    OFFER_KEY,
    OFFER_KEY_ENV,
    OFFER_KEY_FILE_ENV,
    OFFER_WIRE_VERSION,
    TOKEN_DIGEST_KEY,
)

NOW = 1_700_000_000.0
TTL = 60.0
KEY = b"k" * MIN_KEY_CHARS
OTHER_KEY = b"o" * MIN_KEY_CHARS
MODEL = model_identity("tiny", 16)
D2P = Direction.DECODE_TO_PREFILL
P2D = Direction.PREFILL_TO_DECODE


def signer(*keys: bytes, model: str = MODEL) -> OfferSigner:
    return OfferSigner(OfferKeys(keys or (KEY,)), model)


def published(
    by: OfferSigner | None = None, issued_at: float = NOW, **changes: Any
) -> dict[str, Any]:
    """Decode's signed offer as the reader receives it: through JSON, as the router carries it."""
    params: dict[str, Any] = {
        "do_remote_prefill": False,
        "do_remote_decode": True,
        "remote_block_ids": ([3, 4, 5],),
        "remote_engine_id": "decode-0",
        "remote_request_id": "cmpl-1",
        "remote_host": "10.0.0.7",
        "remote_port": 5600,
        "tp_size": 1,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": 40,
        "remote_blocks_expiry_time": 81234.56789,
        "transfer_mode": "pull",
        TOKEN_DIGEST_KEY: TokenDigest.of_tokens(list(range(40)), 16).to_wire(),
        EXPIRES_AT_KEY: issued_at + TTL,
        LEASE_KEY: {"port": 5700, "term_s": 90.0},
    }
    params.update(changes)
    (by or signer()).sign(params, issued_at, issued_at + TTL)
    wire: dict[str, Any] = json.loads(json.dumps(params))
    return wire


def test_an_honest_offer_is_admitted_once() -> None:
    reader = signer()
    params = published()
    assert params[OFFER_KEY]["v"] == OFFER_WIRE_VERSION
    first = reader.admit(params, D2P)
    assert (first.admitted, first.verdict) == (True, None)
    again = reader.admit(copy.deepcopy(params), D2P)
    assert (again.admitted, again.verdict) == (False, Verdict.REPLAYED)


@pytest.mark.parametrize("direction", [D2P, P2D])
@pytest.mark.parametrize("skew_s", [-120.0, 0.0, 120.0])
def test_an_offer_is_judged_on_no_clock_of_the_reader(direction: Direction, skew_s: float) -> None:
    """The reader compares none of the issuer's times with its own, whatever the skew (these
    offers were issued in 2023): whether the blocks still hold is the issuer's to say, on its
    own clock, through the claim."""
    pulled = {"do_remote_prefill": True, "do_remote_decode": False} if direction is P2D else {}
    params = published(issued_at=NOW + skew_s, **pulled)
    reader = signer()
    admission = reader.admit(params, direction)
    assert (admission.admitted, admission.verdict) == (True, None)
    assert reader.admit(params, direction).verdict is Verdict.REPLAYED


def test_a_spent_offer_is_remembered_for_its_lifetime_on_the_readers_clock() -> None:
    local = [0.0]
    reader = OfferSigner(OfferKeys((KEY,)), MODEL, clock=lambda: local[0])
    params = published()
    assert reader.admit(params, D2P).admitted
    local[0] = TTL + EXPIRY_MARGIN_S - 1
    assert reader.admit(copy.deepcopy(params), D2P).verdict is Verdict.REPLAYED


def test_prefill_to_decode_offers_are_admitted_for_the_digest_to_judge() -> None:
    params = published(do_remote_prefill=True, do_remote_decode=False)
    admission = signer().admit(params, P2D)
    assert (admission.admitted, admission.verdict) == (True, None)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("remote_block_ids", [[3, 4, 6]]),  # one block id changed
        ("remote_block_ids", [[3, 4]]),
        ("remote_num_tokens", 39),
        ("remote_engine_id", "decode-1"),
        ("remote_request_id", "cmpl-2"),
        ("remote_host", "10.6.6.6"),
        ("remote_port", 5601),
        ("tp_size", 2),
        ("remote_blocks_expiry_time", 99999.0),
        (TOKEN_DIGEST_KEY, TokenDigest.of_tokens(list(range(1, 41)), 16).to_wire()),
        (EXPIRES_AT_KEY, NOW + 10 * TTL),
        ("do_remote_prefill", True),
        ("dcp_size", None),
        (LEASE_KEY, {"port": 5701, "term_s": 90.0}),
    ],
)
def test_any_altered_bound_field_breaks_the_signature(key: str, value: object) -> None:
    params = published()
    params[key] = value
    admission = signer().admit(params, D2P)
    assert (admission.admitted, admission.verdict) == (False, Verdict.BAD_SIGNATURE)


def test_a_removed_bound_field_breaks_the_signature() -> None:
    params = published()
    del params["tp_size"]
    assert signer().admit(params, D2P).verdict is Verdict.BAD_SIGNATURE


def test_every_bound_key_is_in_the_signed_offer() -> None:
    assert set(BOUND_KEYS) - {"remote_block_size"} <= set(published())


def test_unbound_keys_may_change() -> None:
    params = published()
    params["remote_prefill_cached_tokens"] = 5  # vLLM adds it after the connector signs
    assert signer().admit(params, D2P).admitted


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("exp", NOW + 10 * TTL),  # a longer life
        ("iat", NOW + 1),  # issued later, to pass a restart
        ("id", "A" * 22),  # a fresh id, to dodge the spent table
        ("sig", "0" * 64),
    ],
)
def test_an_altered_envelope_breaks_the_signature(field: str, value: object) -> None:
    params = published()
    params[OFFER_KEY][field] = value
    assert signer().admit(params, D2P).verdict is Verdict.BAD_SIGNATURE


def test_a_decode_offer_must_expire_when_its_envelope_does() -> None:
    """The reuse plan reads disagg_expires_at: it must be the expiry the signature covers."""
    later = published(**{EXPIRES_AT_KEY: NOW + 10 * TTL})
    assert signer().admit(later, D2P).verdict is Verdict.MALFORMED
    keyed = signer()
    params = published()
    del params[EXPIRES_AT_KEY]
    keyed.sign(params, NOW, NOW + TTL)
    assert keyed.admit(params, D2P).verdict is Verdict.MALFORMED
    assert keyed.admit(params, P2D).admitted  # prefill's offers carry none


def test_forged_offer_without_an_envelope_is_unsigned() -> None:
    params = published()
    del params[OFFER_KEY]
    admission = signer().admit(params, D2P)
    assert (admission.admitted, admission.verdict) == (False, Verdict.UNSIGNED)


def test_an_offer_signed_under_another_key_is_refused() -> None:
    params = published(by=signer(OTHER_KEY))
    assert signer().admit(params, D2P).verdict is Verdict.BAD_SIGNATURE


def test_an_offer_for_another_model_is_refused() -> None:
    other = model_identity("tiny", 32)
    params = published(by=signer(model=other))
    assert signer().admit(params, D2P).verdict is Verdict.OTHER_MODEL
    params[OFFER_KEY]["model"] = MODEL  # claiming ours does not make the signature fit
    assert signer().admit(params, D2P).verdict is Verdict.BAD_SIGNATURE


def test_rotation_verifies_under_every_key_and_signs_with_the_first() -> None:
    old, new = signer(OTHER_KEY), signer(KEY, OTHER_KEY)
    assert new.admit(published(by=old), D2P).admitted
    assert old.admit(published(by=new), D2P).verdict is Verdict.BAD_SIGNATURE
    assert signer(KEY).admit(published(by=new), D2P).admitted


@pytest.mark.parametrize(
    ("envelope", "named"),
    [
        ("signed", "is not an object"),
        ({"v": OFFER_WIRE_VERSION + 1}, "wire version"),
        ({"v": True}, "wire version"),
        ({"id": 7}, "id is not"),
        ({"id": "short"}, "id is not"),
        ({"exp": "later"}, "exp is not a number"),
        ({"iat": None}, "iat is not a number"),
        ({"iat": float("nan")}, "iat is not finite"),
        ({"exp": float("inf")}, "exp is not finite"),
        ({"model": ["tiny"]}, "model is not a string"),
        ({"sig": 12}, "sig is not 64 hex"),
        ({"sig": "ab"}, "sig is not 64 hex"),
    ],
)
def test_a_malformed_envelope_is_malformed(envelope: object, named: str) -> None:
    params = published()
    signed = params[OFFER_KEY]
    params[OFFER_KEY] = {**signed, **envelope} if isinstance(envelope, dict) else envelope
    admission = signer().admit(params, D2P)
    assert admission.verdict is Verdict.MALFORMED
    assert named in admission.reason


def test_without_a_key_nothing_is_signed_and_only_prefill_to_decode_is_read() -> None:
    keyless = OfferSigner(None, MODEL)
    params: dict[str, Any] = {"do_remote_decode": True}
    keyless.sign(params, NOW, NOW + TTL)
    assert OFFER_KEY not in params
    assert keyless.admit(published(), D2P).verdict is Verdict.NO_KEY
    p2d = keyless.admit({"do_remote_prefill": True}, P2D)
    assert (p2d.admitted, p2d.verdict) == (True, Verdict.UNCHECKED)


def test_spent_offers_forget_at_expiry_and_raise_the_floor() -> None:
    spent = SpentOffers()
    assert spent.spend("a", NOW + 10, NOW)
    assert not spent.spend("a", NOW + 10, NOW + 1)
    assert spent.spend("b", NOW + 20, NOW + 11)  # forgets a
    assert len(spent) == 1
    assert not spent.spend("a", NOW + 10, NOW - 100)  # the clock stepped back: still refused


def test_a_full_spent_table_forgets_the_oldest_and_refuses_anything_as_old() -> None:
    spent = SpentOffers(capacity=3)
    for index in range(3):
        assert spent.spend(f"id-{index}", NOW + 10 + index, NOW)
    assert spent.spend("id-3", NOW + 50, NOW)  # forgets id-0 (expiring at NOW + 10)
    assert len(spent) == 3
    assert not spent.spend("id-0", NOW + 10, NOW)
    assert not spent.spend("new-but-as-old", NOW + 10, NOW)
    assert spent.spend("new", NOW + 60, NOW)


def test_keys_from_a_file_one_a_line(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_bytes(KEY + b"\n\n" + OTHER_KEY + b"\n")
    keys = load_offer_keys({OFFER_KEY_FILE_ENV: str(path)})
    assert keys == OfferKeys((KEY, OTHER_KEY))


def test_key_from_the_environment() -> None:
    assert load_offer_keys({OFFER_KEY_ENV: KEY.decode()}) == OfferKeys((KEY,))
    assert load_offer_keys({}) is None


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({OFFER_KEY_ENV: ""}, "holds no key"),
        ({OFFER_KEY_ENV: "short"}, "shorter than"),
        ({OFFER_KEY_FILE_ENV: "/nonexistent/key"}, "cannot be read"),
        ({OFFER_KEY_ENV: KEY.decode(), OFFER_KEY_FILE_ENV: "/k"}, "not both"),
    ],
)
def test_an_unusable_key_is_an_error_not_a_silent_fallback(
    environ: dict[str, str], named: str
) -> None:
    with pytest.raises(OfferKeyError, match=named):
        load_offer_keys(environ)
