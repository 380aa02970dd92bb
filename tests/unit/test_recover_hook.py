"""The recover hook's vocabulary: which consumers have one, their queue, what a run is told."""

from __future__ import annotations

from pydantic import BaseModel

from rabbitretry import Consumer, Context, topology_of
from rabbitretry.consumer import Death
from rabbitretry.delivery.recovery import death_of, recovery_consumer


class Order(BaseModel):
    order_id: int


class Plain(Consumer[Order]):
    queue = "orders.plain"

    async def handle(self, msg: Order, ctx: Context) -> None: ...


class Refunding(Consumer[Order]):
    queue = "orders.ship"
    queue_type = "quorum"
    seen: list[tuple[Order | None, Death]] = []

    async def handle(self, msg: Order, ctx: Context) -> None: ...

    async def on_dead(self, msg: Order | None, ctx: Context, death: Death) -> None:
        self.seen.append((msg, death))


def test_only_a_consumer_that_writes_on_dead_has_a_hook_and_its_queue() -> None:
    assert not Plain.has_recover_hook()
    assert Refunding.has_recover_hook()
    names = [q.name for q in topology_of([Plain, Refunding]).queues]
    assert names == ["orders.plain", "orders.ship", "orders.ship.recover"]
    assert Refunding.recover_queue().type == "quorum"


def test_a_compensation_has_an_id_of_its_own() -> None:
    death = Death("orders.ship", "order-42", "permanent-error", "Permanent", "no", 1)
    assert death.compensation_id("refund") == "compensate:refund:order-42"


def test_a_run_reads_its_death_from_headers_a_foreign_producer_may_have_mangled() -> None:
    assert death_of("q", {"x-rabbitretry-dead-attempts": True, "x-rabbitretry-recover-of": 5}) == (
        Death("q", "", "", "", "", 0)
    )


async def test_a_run_hands_the_hook_the_message_or_none_when_it_never_validated() -> None:
    owner = Refunding()
    runner = recovery_consumer(owner)
    headers = {"x-rabbitretry-recover-of": "order-1", "x-rabbitretry-dead-attempts": 3}
    Refunding.seen.clear()
    await runner().handle(b'{"order_id": 1}', _ctx(headers))
    await runner().handle(b"not json", _ctx(headers))
    assert [msg for msg, _ in Refunding.seen] == [Order(order_id=1), None]
    assert Refunding.seen[0][1].attempts == 3
    assert runner.queue == "orders.ship.recover"


def _ctx(headers: dict[str, object]) -> Context:
    return Context(
        queue="orders.ship.recover",
        message_id="recover:order-1:0",
        attempt=1,
        max_attempts=3,
        redelivered=False,
        headers=headers,
    )
