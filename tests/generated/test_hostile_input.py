"""Generated hostile messages through a real client into a real worker (concurrency 1).

Each property publishes Hypothesis-generated messages (see ``strategies``) and checks, for
every one, the invariant of ``rig``: the message ends in a terminal ledger row (with a reason
when dead) that keeps its body, a healthy message published right after it succeeds, and the
worker is still running, all within ``rig.BOUND`` seconds.

- ``test_any_message_is_settled_permissive``: a consumer whose payload is any JSON value and
  whose handler always succeeds, so every well-formed JSON body must end ``succeeded`` and
  everything else ``dead`` (``invalid-payload``, ``too-large``, ``missing-message-id``, or a
  content failure's own reason); nothing may stall or be lost.
- ``test_any_message_is_settled_strict``: a pydantic model with a validator that has a bug
  (a ``KeyError`` for an unknown kind: a bug, so a failed attempt under the retry policy, not
  a stall) and a handler that fails permanently or transiently for some values, so that the
  retry and dead-letter paths carry the hostile headers and properties too.

The seed is fixed (``derandomize``); ``HYPOTHESIS_PROFILE=fuzz`` (``make fuzz``) runs thousands.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, field_validator

from rabbitretry import Consumer, Context, Permanent, RetryPolicy
from tests.generated.profiles import FUZZ, PROFILE, examples
from tests.generated.rig import ConsumerFactory, Rig
from tests.generated.strategies import (
    TOKEN,
    Case,
    bodies,
    cases,
    client_refuses,
    integers,
    json_values,
    long_array_table,
    nasty_text,
    nested_table,
    wide_table,
)

pytestmark = [
    pytest.mark.generated,
    pytest.mark.asyncio,
    pytest.mark.timeout(0 if FUZZ else 900),
]

POLICY = RetryPolicy(max_attempts=2, initial_delay=1.0, max_delay=1.0, jitter=0.0)


def _configure(consumer: type[Consumer[Any]], queue: str) -> type[Consumer[Any]]:
    consumer.queue = queue
    consumer.retry = POLICY
    consumer.lease = 2.0
    consumer.timeout = 5.0
    return consumer


def permissive_consumer(queue: str) -> type[Consumer[Any]]:
    class Permissive(Consumer[Any]):
        # Its succeeded rows keep their snapshot, so that the rig checks every hostile body
        # and header is stored; the strict consumer's drop theirs, as by default.
        keep_payload = "always"

        async def handle(self, msg: Any, ctx: Context) -> None:
            return None

    return _configure(Permissive, queue)


KINDS = {"order": 1, "refund": -1}


class Movement(BaseModel):
    kind: str
    amount: int
    note: str = ""

    @field_validator("kind")
    @classmethod
    def known_kind(cls, kind: str) -> str:
        KINDS[kind]  # a user's bug: an unknown kind raises KeyError, not a ValueError
        return kind


def strict_consumer(queue: str) -> type[Consumer[Any]]:
    class Strict(Consumer[Movement]):
        async def handle(self, msg: Movement, ctx: Context) -> None:
            if msg.amount == 0:
                raise ConnectionError("the ledger service did not answer")  # retried
            if (msg.amount > 0) != (KINDS[msg.kind] > 0):
                raise Permanent(f"a {msg.kind} of {msg.amount}")

    return _configure(Strict, queue)


async def _rig(
    make: Callable[[ConsumerFactory, bytes], Rig], factory: ConsumerFactory, sentinel: bytes
) -> AsyncIterator[Rig]:
    rig = make(factory, sentinel)
    await rig.start()
    try:
        yield rig
    finally:
        await rig.close()


@pytest.fixture
async def permissive_rig(
    rig_services: Callable[[ConsumerFactory, bytes], Rig],
) -> AsyncIterator[Rig]:
    async for rig in _rig(rig_services, permissive_consumer, b'{"sentinel": true}'):
        yield rig


@pytest.fixture
async def strict_rig(rig_services: Callable[[ConsumerFactory, bytes], Rig]) -> AsyncIterator[Rig]:
    async for rig in _rig(rig_services, strict_consumer, b'{"kind": "order", "amount": 1}'):
        yield rig


def _case(body: bytes = b"{}", **fields: Any) -> Case:
    fields.setdefault("message_id", TOKEN)
    return Case(client=fields.pop("client", "aio-pika"), body=body, **fields)


# The inputs known to break the delivery path before the hostile-input work, kept as examples.
KNOWN_BAD = [
    _case(headers={"h": "a\x00b"}),
    _case(headers={"a\x00b": "v"}),
    _case(headers={"t": {"nested": ["x", {"k": "a\x00b"}]}}),
    _case(message_id=TOKEN + "\x00"),
    _case(correlation_id="c\x00" + TOKEN),
    _case(type="t\x00"),
    _case(body=b"\xff\xfe\x80"),
    _case(body=b""),
    _case(body=b"null"),
    _case(client="pika", message_id=None, body=b'{"no": "id"}'),
    _case(client="pika", message_id=b"\xff" + TOKEN.encode()),
    _case(client="pika", timestamp=2**64 - 1),
    _case(headers={"d": Decimal("-1.5")}),
    _case(timestamp=dt.datetime(2000, 1, 1, tzinfo=dt.UTC), content_encoding="gzip"),
    # Decoded recursively, these took the worker's connection down for every queue it served.
    _case(client="pika", raw_headers=nested_table(800)),
    _case(client="pika", raw_headers=nested_table(18_000, b"FA")),  # near the frame limit
    _case(client="pika", raw_headers=wide_table(12_000)),
    _case(client="pika", raw_headers=long_array_table(60_000)),
]


def with_examples(known: list[Case]) -> Callable[[Any], Any]:
    """Run these cases first, as explicit examples."""

    def decorate(test: Any) -> Any:
        for case in reversed(known):
            test = example(case=case)(test)
        return test

    return decorate


async def _check(rig: Rig, case: Case) -> None:
    refused = client_refuses(case)
    assume(refused is None)  # the client cannot send it: it never reaches a worker
    await rig.check(case)


@with_examples(KNOWN_BAD)
@settings(settings.get_profile(PROFILE), max_examples=examples(250, 3000))
@given(case=cases())
async def test_any_message_is_settled_permissive(permissive_rig: Rig, case: Case) -> None:
    await _check(permissive_rig, case)


movement_bodies = st.fixed_dictionaries(
    {
        "kind": st.one_of(st.sampled_from(sorted(KINDS)), nasty_text(max_size=8)),
        "amount": st.one_of(integers, st.floats(allow_nan=False), nasty_text(max_size=8)),
    },
    optional={"note": nasty_text(), "extra": json_values},
).map(lambda value: json.dumps(value).encode())


@with_examples(
    [
        _case(body=b'{"kind": "unknown", "amount": 1}'),
        _case(body=b'{"kind": "order", "amount": 0}', headers={"h": "a\x00b"}),
        _case(body=b'{"kind": "order", "amount": -1}', type="t\x00"),
        _case(body=b'{"kind": "order", "amount": -1}', headers={"d": Decimal("-1.5")}),
    ]
)
@settings(settings.get_profile(PROFILE), max_examples=examples(60, 700))
@given(case=cases(body=st.one_of(movement_bodies, movement_bodies, bodies)))
async def test_any_message_is_settled_strict(strict_rig: Rig, case: Case) -> None:
    await _check(strict_rig, case)
