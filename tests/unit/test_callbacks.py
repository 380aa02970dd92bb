"""Callbacks without services: signatures, the receiver's verdicts, the state machine's rules."""

from __future__ import annotations

import hashlib
import hmac
from typing import Literal

import pytest
from pydantic import BaseModel

from rabbitretry import Permanent, Retry
from rabbitretry.callbacks import (
    CallbackKind,
    CallbackReceiver,
    Change,
    HmacSignature,
    StateMachine,
    sign,
)
from rabbitretry.callbacks.decision import Accepted, Invalid, Unauthorized, decide
from rabbitretry.callbacks.states import decide as decide_move
from rabbitretry.callbacks.states import quote_identifier, reachable
from rabbitretry.errors import ConfigurationError

NOW = 1_700_000_000.0
SIGNATURE = HmacSignature(secret="s3cret", tolerance=300)
ORDER = {
    "pending": {"paid", "closed"},
    "paid": {"refunding", "refunded"},
    "refunding": {"refunded"},
}


class Event(BaseModel):
    transaction_id: str
    type: Literal["paid", "refunded"]


KIND = CallbackKind(
    name="payment",
    model=Event,
    queue="payments",
    message_id=lambda e: f"{e.transaction_id}-{e.type}",
    signature=SIGNATURE,
)
BODY = b'{"transaction_id": "t1", "type": "paid"}'


def lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def test_sign_is_hmac_sha256_of_timestamp_dot_body() -> None:
    expected = hmac.new(b"k", b"1700000000." + BODY, hashlib.sha256).hexdigest()
    assert sign("k", 1_700_000_000, BODY) == expected == sign(b"k", 1_700_000_000, BODY)


def test_a_signature_made_by_headers_is_accepted() -> None:
    headers = lower(SIGNATURE.headers(BODY, NOW))
    assert SIGNATURE.refusal(headers, BODY, NOW + 299) is None
    prefixed = headers | {"x-signature": "sha256=" + headers["x-signature"]}
    assert SIGNATURE.refusal(prefixed, BODY, NOW) is None


@pytest.mark.parametrize(
    ("change", "now", "why"),
    [
        ({"x-signature": None}, NOW, "missing X-Signature"),
        ({"x-signature-timestamp": "soon"}, NOW, "not a Unix time"),
        ({}, NOW + 301, "more than 300 s from now"),
        ({}, NOW - 301, "more than 300 s from now"),  # a clock ahead of ours, too far
        ({"x-signature": "ab" * 32}, NOW, "does not match"),
        ({"x-signature": "é"}, NOW, "does not match"),
    ],
)
def test_refusals_say_why(change: dict[str, str | None], now: float, why: str) -> None:
    headers = lower(SIGNATURE.headers(BODY, NOW)) | change
    present = {k: v for k, v in headers.items() if v is not None}
    refusal = SIGNATURE.refusal(present, BODY, now)
    assert refusal is not None and why in refusal


@pytest.mark.parametrize(
    "stamp",
    [
        "1" + "0" * 400,  # an int too large for a float: the subtraction overflowed (a 500)
        "9" * 10_000,  # past Python's int-parsing digit limit
        "-" + "9" * 400,
        "-1",
        "1e309",
        "NaN",
        "inf",
        "1_700_000_000",  # int() reads it; no sender writes it
        "\u0661\u0667" + "\u0660" * 8,  # Arabic-Indic 1700000000: int() reads them too
        " 1700000000",
        "",
    ],
)
def test_an_absurd_timestamp_is_refused_with_a_reason_not_raised(stamp: str) -> None:
    headers = lower(SIGNATURE.headers(BODY, NOW)) | {"x-signature-timestamp": stamp}
    refusal = SIGNATURE.refusal(headers, BODY, NOW)
    assert refusal is not None and "X-Signature-Timestamp" in refusal, refusal
    assert len(refusal) < 200  # the header is not echoed whole
    assert isinstance(decide(KIND, headers, BODY, NOW), Unauthorized)


def test_a_signature_does_not_cover_another_body_or_timestamp() -> None:
    headers = lower(SIGNATURE.headers(BODY, NOW))
    assert SIGNATURE.refusal(headers, BODY + b" ", NOW) == "the signature does not match"
    moved = headers | {"x-signature-timestamp": str(int(NOW) + 1)}
    assert SIGNATURE.refusal(moved, BODY, NOW) == "the signature does not match"


def test_signature_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="secret"):
        HmacSignature(secret="")
    with pytest.raises(ValueError, match="tolerance"):
        HmacSignature(secret="k", tolerance=0)


def test_a_valid_signed_body_is_accepted_under_its_business_key() -> None:
    verdict = decide(KIND, lower(SIGNATURE.headers(BODY, NOW)), BODY, NOW)
    assert verdict == Accepted("t1-paid")


def test_the_sender_is_checked_before_the_body() -> None:
    # An unsigned bad body must not become a dead letter: strangers could fill them.
    assert isinstance(decide(KIND, {}, b"not json", NOW), Unauthorized)


def test_an_invalid_body_gets_reasons_and_a_key_of_its_own_bytes() -> None:
    body = b'{"type": "lost"}'
    verdict = decide(KIND, lower(SIGNATURE.headers(body, NOW)), body, NOW)
    assert isinstance(verdict, Invalid)
    assert verdict.key.startswith("invalid-callback:payment:")
    assert decide(KIND, lower(SIGNATURE.headers(body, NOW + 5)), body, NOW + 5) == verdict
    assert any(r.startswith("transaction_id:") for r in verdict.reasons)
    assert any(r.startswith("type:") for r in verdict.reasons)


@pytest.mark.parametrize(
    ("key", "why"), [("", "not a text"), ("a\x00b", "NUL"), ("x" * 256, "255 bytes")]
)
def test_a_key_that_cannot_be_carried_is_invalid(key: str, why: str) -> None:
    kind = CallbackKind(name="k", model=Event, queue="q", message_id=lambda e: key)
    verdict = decide(kind, {}, BODY, NOW)  # no signature declared: anyone may post
    assert isinstance(verdict, Invalid) and why in verdict.reasons[0]


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"name": "a/b", "queue": "q"}, "letters, digits"),
        ({"name": "k"}, "either its consumer or its queue"),
        ({"name": "k", "queue": "q", "max_body_bytes": 0}, "max_body_bytes"),
    ],
)
def test_kind_declarations_are_checked(options: dict[str, object], why: str) -> None:
    with pytest.raises(ConfigurationError, match=why):
        CallbackKind(model=Event, message_id=str, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("current", "target", "kind"),
    [
        ("pending", "paid", "moved"),
        ("paid", "paid", "already-there"),
        ("pending", "refunded", "not-yet-possible"),  # refunded before paid
        ("pending", "refunding", "not-yet-possible"),
        ("refunding", "paid", "not-allowed"),  # the late duplicate "paid"
        ("refunded", "refunding", "not-allowed"),
        ("closed", "paid", "not-allowed"),
        ("unheard-of", "paid", "not-allowed"),
    ],
)
def test_the_declared_transitions_decide(current: str, target: str, kind: str) -> None:
    assert decide_move(ORDER, current, target) == kind


def test_reachable_follows_transitions_and_stops_on_cycles() -> None:
    assert reachable(ORDER, "pending") == {"paid", "closed", "refunding", "refunded"}
    assert reachable(ORDER, "refunded") == set()
    assert reachable({"a": {"b"}, "b": {"a"}}, "a") == {"a", "b"}


def test_a_machine_knows_its_states_and_where_a_target_comes_from() -> None:
    machine = StateMachine(name="order", table="orders", transitions=ORDER)
    assert machine.states == {"pending", "paid", "closed", "refunding", "refunded"}
    assert machine.allowed_from("refunded") == ["paid", "refunding"]
    assert machine.allowed_from("pending") == []
    with pytest.raises(ConfigurationError, match="no transitions"):
        StateMachine(name="empty", table="t", transitions={})


def test_identifiers_are_quoted() -> None:
    assert quote_identifier("shop.Orders") == '"shop"."Orders"'
    assert quote_identifier('we"ird') == '"we""ird"'
    for bad in ("", "a..b", "a.b.c"):
        with pytest.raises(ConfigurationError):
            quote_identifier(bad)
    with pytest.raises(ConfigurationError):
        quote_identifier("orders.id", max_parts=1)  # a column is one name


def change(kind: str, not_allowed: Literal["succeed", "dead"] = "succeed") -> Change:
    return Change(kind, "o1", "refunding", "paid", not_allowed=not_allowed, retry_delay=2.0)  # type: ignore[arg-type]


def test_settle_turns_a_change_into_the_messages_outcome() -> None:
    change("moved").settle()
    change("already-there").settle()
    change("not-allowed").settle()
    with pytest.raises(Permanent, match="o1: refunding → paid is not allowed"):
        change("not-allowed", "dead").settle()
    with pytest.raises(Retry) as retry:
        change("not-yet-possible").settle()
    assert retry.value.delay == 2.0


def test_a_message_id_function_that_fails_makes_the_body_invalid_not_a_crash() -> None:
    kind = CallbackKind(name="k", model=Event, queue="q", message_id=lambda e: e.missing)
    verdict = decide(kind, {}, BODY, NOW)
    assert isinstance(verdict, Invalid)
    assert verdict.reasons[0].startswith("the message id could not be derived: AttributeError")


@pytest.mark.parametrize(
    ("kinds", "options", "why"),
    [
        ([], {"database_url": "postgresql://127.0.0.1/x"}, "at least one CallbackKind"),
        ([KIND, KIND], {"database_url": "postgresql://127.0.0.1/x"}, "two callback kinds"),
        ([KIND], {}, "either a database_url or a pool"),
    ],
)
def test_a_receiver_that_cannot_work_is_refused(
    kinds: list[CallbackKind], options: dict[str, str], why: str
) -> None:
    with pytest.raises(ConfigurationError, match=why):
        CallbackReceiver(kinds, **options)  # type: ignore[arg-type]
