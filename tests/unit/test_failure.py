"""What is kept of a failure: type, bounded message and traceback, grouping fingerprint."""

from __future__ import annotations

import traceback

import pytest

from rabbitretry.ledger.failures import (
    MAX_MESSAGE,
    MAX_TRACEBACK,
    Failure,
    describe,
    fingerprint,
    rejection,
)


class OrderMissing(Exception):
    pass


def raised(error: BaseException) -> BaseException:
    """``error`` after a real raise, so that it carries a traceback."""
    try:
        raise error
    except BaseException as caught:
        return caught


# --- describe --------------------------------------------------------------------------------


def test_describe_keeps_type_message_and_traceback() -> None:
    failure = describe("orders", raised(OrderMissing("order 42 not found")))
    assert isinstance(failure, Failure)
    assert failure.type == "OrderMissing"
    assert failure.message == "order 42 not found"
    assert failure.traceback.startswith("Traceback (most recent call last):")
    assert "in raised" in failure.traceback
    assert failure.traceback.rstrip().endswith("OrderMissing: order 42 not found")
    assert failure.fingerprint == fingerprint("orders", "OrderMissing", "order 42 not found")


def test_describe_uses_the_type_name_when_the_message_is_empty() -> None:
    failure = describe("orders", raised(TimeoutError()))
    assert failure.type == "TimeoutError"
    assert failure.message == "TimeoutError"


def test_describe_keeps_chained_causes_in_the_traceback() -> None:
    try:
        try:
            raise KeyError("sku")
        except KeyError as cause:
            raise OrderMissing("lookup failed") from cause
    except OrderMissing as error:
        failure = describe("orders", error)
    assert "KeyError: 'sku'" in failure.traceback
    assert "direct cause" in failure.traceback


def test_a_long_message_is_bounded_keeping_the_end() -> None:
    message = "start " + "x" * (3 * MAX_MESSAGE) + " THE END"
    failure = describe("orders", raised(ValueError(message)))
    assert len(failure.message) == MAX_MESSAGE
    assert failure.message.startswith("…")
    assert failure.message.endswith("x THE END")
    assert "start" not in failure.message


def test_a_message_at_the_limit_is_kept_whole() -> None:
    message = "y" * MAX_MESSAGE
    assert describe("orders", ValueError(message)).message == message
    longer = describe("orders", ValueError(message + "z")).message
    assert len(longer) == MAX_MESSAGE
    assert longer == "…" + "y" * (MAX_MESSAGE - 2) + "z"


def test_a_long_traceback_is_bounded_keeping_the_end() -> None:
    error = raised(RuntimeError("layer 0"))
    for layer in range(1, 200):
        try:
            raise RuntimeError(f"layer {layer}") from error
        except RuntimeError as caught:
            error = caught
    full_length = len("".join(traceback.format_exception(error)))
    failure = describe("orders", error)
    assert full_length > MAX_TRACEBACK  # the test really exercises the bound
    assert len(failure.traceback) == MAX_TRACEBACK
    assert failure.traceback.startswith("…")
    assert failure.traceback.endswith("RuntimeError: layer 199\n")
    assert "RuntimeError: layer 0\n" not in failure.traceback


def test_a_short_traceback_is_kept_whole() -> None:
    failure = describe("orders", raised(ValueError("short")))
    assert not failure.traceback.startswith("…")
    assert len(failure.traceback) < MAX_TRACEBACK


# --- fingerprint -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("order 123 not found", "order 98765 not found"),
        ("took 1.5 s after 3 tries", "took 20 s after 12 tries"),
        (
            "job 550e8400-e29b-41d4-a716-446655440000 failed",
            "job 6F9619FF-8B86-D011-B42D-00C04FC964FF failed",
        ),
        ("object at 0x7f3a2b1c", "object at 0xdeadbeef"),
        ("no such key 'alpha'", "no such key 'beta-gamma 7'"),
        ('column "price" is null', 'column "customer_id" is null'),
        ("KeyError 'a' in 'b'", "KeyError 'long value' in ''"),
        ("user 1 order 2 item 'x'", "user 100 order 200 item 'y z'"),
    ],
)
def test_messages_differing_only_in_variable_parts_share_a_fingerprint(
    one: str, other: str
) -> None:
    assert fingerprint("orders", "OrderMissing", one) == fingerprint(
        "orders", "OrderMissing", other
    )


def test_describe_groups_messages_differing_only_in_numbers() -> None:
    one = describe("orders", raised(OrderMissing("order 1 not found")))
    other = describe("orders", raised(OrderMissing("order 2000 not found")))
    assert one.fingerprint == other.fingerprint
    assert one.message != other.message


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("order 1 not found", "customer 1 not found"),
        ("order 1 not found", "order 1 was cancelled"),
        ("timeout", "time out"),
    ],
)
def test_different_messages_get_different_fingerprints(one: str, other: str) -> None:
    assert fingerprint("orders", "E", one) != fingerprint("orders", "E", other)


def test_the_fingerprint_differs_across_queues() -> None:
    assert fingerprint("orders", "E", "boom") != fingerprint("payments", "E", "boom")
    error = raised(OrderMissing("order 1"))
    assert describe("orders", error).fingerprint != describe("payments", error).fingerprint


def test_the_fingerprint_differs_across_types() -> None:
    assert fingerprint("orders", "ValueError", "boom") != fingerprint("orders", "KeyError", "boom")
    assert (
        describe("orders", raised(ValueError("boom"))).fingerprint
        != describe("orders", raised(TypeError("boom"))).fingerprint
    )


def test_fields_do_not_run_together_in_the_fingerprint() -> None:
    assert fingerprint("ab", "c", "d") != fingerprint("a", "bc", "d")
    assert fingerprint("a", "b", "cd") != fingerprint("a", "bc", "d")


def test_the_fingerprint_is_short_stable_hex() -> None:
    value = fingerprint("orders", "E", "order 7")
    assert len(value) == 12
    int(value, 16)
    assert value == fingerprint("orders", "E", "order 7")


def test_an_apostrophe_does_not_break_grouping_by_quoted_value() -> None:
    assert fingerprint("orders", "E", "Couldn't find 'a'") == fingerprint(
        "orders", "E", "Couldn't find 'b'"
    )


# --- rejection -------------------------------------------------------------------------------


def test_rejection_is_a_failure_without_a_traceback() -> None:
    failure = rejection("orders", "too-large", "body of 2048 bytes is over 1024")
    assert failure == Failure(
        type="too-large",
        message="body of 2048 bytes is over 1024",
        traceback="",
        fingerprint=fingerprint("orders", "too-large", "body of 2048 bytes is over 1024"),
    )


def test_rejections_group_by_reason_and_queue() -> None:
    one = rejection("orders", "too-large", "body of 2048 bytes")
    other = rejection("orders", "too-large", "body of 99999 bytes")
    assert one.fingerprint == other.fingerprint
    assert rejection("orders", "invalid", "body of 2048 bytes").fingerprint != one.fingerprint
    assert rejection("payments", "too-large", "body of 2048 bytes").fingerprint != one.fingerprint


def test_a_rejection_message_is_bounded() -> None:
    failure = rejection("orders", "invalid", "e" * (MAX_MESSAGE * 2) + "!")
    assert len(failure.message) == MAX_MESSAGE
    assert failure.message.startswith("…")
    assert failure.message.endswith("e!")
