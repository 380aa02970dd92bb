"""The pure decisions behind operator actions."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel, TypeAdapter

from rabbitretry.operations import (
    Filter,
    OperationError,
    ReplayReport,
    checked_payload,
    export_line,
    parse_rate,
    pause_before,
    payload_text,
)


class Order(BaseModel):
    order: int


@pytest.mark.parametrize(
    ("text", "per_second"),
    [("20/s", 20.0), ("20", 20.0), ("300/m", 5.0), ("0.5/sec", 0.5), (" 6 / min ", 0.1)],
)
def test_rates(text: str, per_second: float) -> None:
    assert parse_rate(text) == pytest.approx(per_second)


@pytest.mark.parametrize("text", ["", "fast", "0/s", "-1/s", "20/h", "20/s/s"])
def test_bad_rates_are_refused(text: str) -> None:
    with pytest.raises(OperationError, match="rate"):
        parse_rate(text)


def test_pacing_spreads_publishes_at_the_rate() -> None:
    assert pause_before(0, 20, started=100.0, now=100.0) == 0
    assert pause_before(10, 20, started=100.0, now=100.2) == pytest.approx(0.3)
    assert pause_before(10, 20, started=100.0, now=101.0) == 0  # behind: no wait
    assert pause_before(1000, None, started=100.0, now=100.0) == 0


def test_filters_refuse_nonsense() -> None:
    with pytest.raises(OperationError, match="status"):
        Filter(statuses=("succeeded",))
    with pytest.raises(OperationError, match="status"):
        Filter(statuses=())
    with pytest.raises(OperationError, match="limit"):
        Filter(limit=0)
    now = datetime.now(UTC)
    with pytest.raises(OperationError, match="range"):
        Filter(since=now, until=now - timedelta(hours=1))
    assert Filter(queue="", text="").params()[1:8] == [None, None, None, None, None, None, 100]


def test_edited_payloads_are_checked_against_the_model() -> None:
    adapter = TypeAdapter(Order)
    assert checked_payload('{"order": 3}', adapter) == b'{"order": 3}'
    assert checked_payload(b'{"anything": 1}', None) == b'{"anything": 1}'
    with pytest.raises(OperationError, match="not valid JSON"):
        checked_payload("{", adapter)
    with pytest.raises(OperationError, match="order: Input should be a valid integer"):
        checked_payload('{"order": "x"}', adapter)


def test_payload_text_is_pretty_json_or_text() -> None:
    assert payload_text(b'{"a":1}') == '{\n  "a": 1\n}'
    assert payload_text(b"\xffplain") == "\ufffdplain"


def test_export_line_keeps_binary_payloads_as_base64() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    row = {
        "queue": "q",
        "message_id": "k",
        "status": "dead",
        "attempts": 2,
        "reason": "permanent-error",
        "error_type": "Permanent",
        "error_message": "no",
        "error_fingerprint": "abc",
        "exchange": "",
        "routing_key": "q",
        "replays": 0,
        "first_seen": now,
        "finished_at": None,
        "headers": "{}",
        "properties": '{"content_type": "application/json"}',
        "payload": b"\x00\x01",
    }
    line = json.loads(export_line(row))  # type: ignore[arg-type]
    assert line["payload_base64"] == "AAE=" and "payload" not in line
    assert line["first_seen"] == "2026-01-01T00:00:00+00:00"
    row["payload"] = b'{"x": 1}'
    assert json.loads(export_line(row))["payload"] == {"x": 1}  # type: ignore[arg-type]


def test_report_summary_says_why_it_stopped() -> None:
    report = ReplayReport(targets=5, replayed=1, canary="q/1 dead", stopped="the canary is dead")
    assert report.summary() == "replayed 1 of 5; canary q/1 dead; stopped: the canary is dead"


@pytest.mark.parametrize("text", ["1" * 10_000, "0.001/s", "0.5/m", "100001/s"])
def test_a_rate_outside_one_a_minute_to_100000_a_second_is_refused(text: str) -> None:
    with pytest.raises(OperationError, match="is not a rate from 1/m to 100,000/s"):
        parse_rate(text)


def test_the_bounds_themselves_are_rates() -> None:
    assert (parse_rate("1/m"), parse_rate("100000/s")) == (1 / 60, 100_000.0)
