"""Shared CLI helpers: time arguments, ages, and loading consumer classes and topologies."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from rabbitretry.cli.common import UserError, age, load_consumer, load_topology, parse_time
from rabbitretry.consumer import Consumer
from rabbitretry.errors import RabbitRetryError

# --- parse_time ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ago"),
    [
        ("30s", timedelta(seconds=30)),
        ("30m", timedelta(minutes=30)),
        ("2h", timedelta(hours=2)),
        ("7d", timedelta(days=7)),
        ("1w", timedelta(weeks=1)),
        ("0s", timedelta(0)),
        (" 15 m ", timedelta(minutes=15)),
        ("90m", timedelta(minutes=90)),
    ],
)
def test_a_duration_means_that_long_ago(text: str, ago: timedelta) -> None:
    before = datetime.now(UTC)
    moment = parse_time(text)
    after = datetime.now(UTC)
    assert moment.tzinfo is not None
    assert before - ago <= moment <= after - ago


def test_a_timestamp_without_a_zone_is_utc() -> None:
    assert parse_time("2026-01-31T12:00") == datetime(2026, 1, 31, 12, 0, tzinfo=UTC)
    assert parse_time("2026-01-31").tzinfo == UTC


def test_a_timestamp_with_a_zone_keeps_it() -> None:
    moment = parse_time("2026-01-31T12:00:00+02:00")
    assert moment.utcoffset() == timedelta(hours=2)
    assert moment == datetime(2026, 1, 31, 10, 0, tzinfo=UTC)
    assert parse_time("2026-01-31T12:00:00Z") == datetime(2026, 1, 31, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("text", ["yesterday", "30x", "m30", "-5m", "1.5h", "", "2026-13-01"])
def test_anything_else_is_a_user_error(text: str) -> None:
    with pytest.raises(UserError, match="neither a duration"):
        parse_time(text)


def test_user_error_is_a_rabbitretry_error() -> None:
    assert issubclass(UserError, RabbitRetryError)


# --- age -------------------------------------------------------------------------------------

NOW = datetime(2026, 1, 31, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (42, "42s"),
        (59.9, "59s"),
        (60, "1m"),
        (5 * 60 + 59, "5m"),
        (3599, "59m"),
        (3600, "1h"),
        (3 * 3600 + 1800, "3h"),
        (86399, "23h"),
        (86400, "1d"),
        (2 * 86400 + 3600, "2d"),
        (400 * 86400, "400d"),
    ],
)
def test_age_is_short_and_rounds_down(seconds: float, text: str) -> None:
    assert age(NOW - timedelta(seconds=seconds), now=NOW) == text


def test_age_of_nothing_is_a_dash() -> None:
    assert age(None) == "-"
    assert age(None, now=NOW) == "-"


def test_an_age_in_the_future_is_zero() -> None:
    assert age(NOW + timedelta(hours=1), now=NOW) == "0s"


def test_age_defaults_to_now() -> None:
    assert age(datetime.now(UTC) - timedelta(minutes=10, seconds=5)) == "10m"


def test_age_compares_across_time_zones() -> None:
    plus_two = timezone(timedelta(hours=2))
    assert age(datetime(2026, 1, 31, 13, 0, tzinfo=plus_two), now=NOW) == "1h"


# --- load_consumer ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _restore_sys_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """load_consumer may put the working directory on sys.path: undo it after each test."""
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.mark.parametrize(
    "target", ["rabbitretry.consumer", "rabbitretry.consumer:", ":Consumer", ""]
)
def test_a_target_that_is_not_module_colon_class_is_a_user_error(target: str) -> None:
    with pytest.raises(UserError, match="is not MODULE:CLASS"):
        load_consumer(target)


@pytest.mark.parametrize("module", ["no_such_module_rr_test", "rabbitretry.no_such_module"])
def test_a_missing_module_is_a_user_error(module: str) -> None:
    with pytest.raises(UserError, match=f"cannot import module '{module}'") as caught:
        load_consumer(f"{module}:Anything")
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)


def test_a_missing_attribute_is_a_user_error() -> None:
    with pytest.raises(
        UserError, match=r"module 'rabbitretry\.consumer' has no attribute 'NoSuchConsumer'"
    ):
        load_consumer("rabbitretry.consumer:NoSuchConsumer")


@pytest.mark.parametrize(
    "target",
    [
        "rabbitretry.consumer:Context",  # a class, but not a Consumer
        "rabbitretry.consumer:MAX_ATTEMPT_TIMEOUT",  # not a class at all
        "rabbitretry.consumer:_check",  # a function
    ],
)
def test_something_that_is_not_a_consumer_is_a_user_error(target: str) -> None:
    with pytest.raises(UserError, match=f"{target} is not a Consumer subclass"):
        load_consumer(target)


def test_a_consumer_class_is_loaded_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "rr_unit_points.py").write_text(
        "from rabbitretry import Consumer\n"
        "\n"
        "class AwardPoints(Consumer[dict]):\n"
        "    queue = 'points.award'\n"
        "\n"
        "    async def handle(self, msg, ctx):\n"
        "        pass\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "rr_unit_points", raising=False)
    try:
        consumer = load_consumer("rr_unit_points:AwardPoints")
    finally:
        sys.modules.pop("rr_unit_points", None)
    assert issubclass(consumer, Consumer)
    assert consumer.__name__ == "AwardPoints"
    assert consumer.queue == "points.award"


# --- load_topology -----------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def test_consumer_classes_alone_are_a_topology() -> None:
    """`topology declare examples.points:AwardPoints`, as the README says, with no files."""
    topology = load_topology(["examples.points:AwardPoints"])
    assert [e.name for e in topology.exchanges] == ["orders"]
    assert [q.name for q in topology.queues] == ["points.award"]


def test_files_and_consumer_classes_merge() -> None:
    """The README offers topology/demo.toml instead of the class: both must say the same."""
    demo = str(ROOT / "topology" / "demo.toml")
    assert load_topology([demo, "examples.points:AwardPoints"]) == load_topology([demo])
    both = load_topology([demo, "examples.shop:AwardOrderPoints"])
    assert {q.name for q in both.queues} == {"points.award", "shop.points"}


def test_no_target_is_a_user_error() -> None:
    with pytest.raises(UserError, match="name at least one topology file"):
        load_topology([])
