"""Which ledger databases ``rabbitretry reconcile`` acts on, and where each reconciliation runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime

import pytest
from pydantic import BaseModel

from rabbitretry import Consumer, Context
from rabbitretry.cli.reconcile import ledger_shares
from rabbitretry.reconcile.expected import Expected, Reconciliation, reconciliation

DEFAULT = "postgresql://127.0.0.1/ledger"
ORDERS = "postgresql://u:s3cret@10.0.0.2/orders"


class Body(BaseModel):
    pass


class Payments(Consumer[Body]):
    queue = "payments"

    async def handle(self, msg: Body, ctx: Context) -> None:
        pass


class Orders(Payments):
    queue = "orders"
    database_url = ORDERS


def expects(queue: str) -> Reconciliation:
    @reconciliation(queue=queue, name=f"{queue}-expected")
    async def source(start: datetime, end: datetime) -> AsyncIterator[Expected]:
        for _ in ():
            yield _

    return source


def test_by_default_the_variable_and_each_consumer_database() -> None:
    shares = ledger_shares([DEFAULT], DEFAULT, [Payments, Orders], [expects("orders")])
    assert list(shares) == [DEFAULT, ORDERS]
    # A reconciliation runs where its queue's ledger is: elsewhere all would look missing.
    assert [r.name for r in shares[ORDERS]] == ["orders-expected"]
    assert shares[DEFAULT] == []


def test_given_databases_are_the_ones_acted_on() -> None:
    shares = ledger_shares([ORDERS], None, [Payments, Orders], [expects("orders")])
    assert list(shares) == [ORDERS]
    assert [r.name for r in shares[ORDERS]] == ["orders-expected"]


def test_a_reconciliation_whose_ledger_is_not_given_is_refused() -> None:
    with pytest.raises(ValueError) as raised:
        ledger_shares([DEFAULT], None, [Orders], [expects("orders")])
    assert "whose ledger is in postgresql://u:***@10.0.0.2/orders: add --database" in str(
        raised.value
    )
