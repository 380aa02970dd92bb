"""rabbitretry.urls: URLs checked before connecting, and masked however malformed."""

from __future__ import annotations

from pathlib import Path

import pytest

from rabbitretry.errors import ConfigurationError
from rabbitretry.urls import (
    Endpoint,
    amqp_heartbeat,
    check_amqp_url,
    check_amqp_urls,
    check_database_url,
    database_labels,
    mask_url,
    password_of,
    scrub,
    split_urls,
    with_heartbeat,
)

# --- mask_url: total ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("amqp://guest:s3cret@127.0.0.1:5672/", "amqp://guest:***@127.0.0.1:5672/"),
        ("amqp://guest@127.0.0.1:5672/", "amqp://guest@127.0.0.1:5672/"),
        ("amqp://127.0.0.1/", "amqp://127.0.0.1/"),
        ("guest:s3cret@127.0.0.1:5672", "guest:***@127.0.0.1:5672"),
        ("amqp:/guest:s3cret@127.0.0.1:5672/", "amqp:/guest:***@127.0.0.1:5672/"),
        ("amqp:guest:s3cret@h", "amqp:***@h"),
        ("amqp://u:pa/ss@h/v", "amqp://u:***@h/v"),
        ("amqp://u:pa@ss@h/v", "amqp://u:***@h/v"),
        ("amqp://u:pa?ss@h/v", "amqp://u:***@h/v"),
        ("amqp://u:p%40ss@[::1]:5672/", "amqp://u:***@[::1]:5672/"),
        ("postgresql://u@h/db?password=s3cret&x=1", "postgresql://u@h/db?password=***&x=1"),
        ("postgresql://u@h/db?sslpassword=s3cret", "postgresql://u@h/db?sslpassword=***"),
        ("", ""),
        ("not a url at all", "not a url at all"),
    ],
)
def test_mask_url_hides_the_password_of_any_shape(url: str, masked: str) -> None:
    assert mask_url(url) == masked


@pytest.mark.parametrize(
    "url",
    [
        "amqp://u:s3cret@h/",
        "u:s3cret@h",
        "amqp:/u:s3cret@h",
        "amqp://u:s3/cret@h",
        "amqp://u:s3@cret@h",
        "amqp://u:s3cret@h/v@x",
        "postgres:s3cret@127.0.0.1:5432/postgres",
        "postgresql://h/db?user=u&password=s3cret",
    ],
)
def test_mask_url_never_shows_the_secret(url: str) -> None:
    assert "s3cret" not in mask_url(url)


def test_scrub_removes_the_password_from_a_driver_message() -> None:
    url = "postgres:s3cret@127.0.0.1:5432/postgres"
    message = 'database "s3cret@127.0.0.1:5432/postgres" does not exist'
    assert "s3cret" not in scrub(message, url)
    assert scrub(f"cannot reach {url}", url) == f"cannot reach {mask_url(url)}"
    assert scrub("p%40ss and p@ss", "amqp://u:p%40ss@h/") == "*** and ***"


def test_scrub_leaves_a_message_alone_for_a_very_short_password() -> None:
    assert scrub("a broker said no", "amqp://u:a@h/") == "a broker said no"


def test_password_of() -> None:
    assert password_of("amqp://u:pw@h/") == "pw"
    assert password_of("amqp://u@h/") is None
    assert password_of("amqp://h/") is None


# --- check_amqp_url -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        ("amqp://guest:guest@127.0.0.1:5672/", Endpoint("amqp", "127.0.0.1:5672", "guest", "/")),
        ("amqp://u:p@rabbit/orders", Endpoint("amqp", "rabbit:5672", "u", "orders")),
        ("amqps://rabbit", Endpoint("amqps", "rabbit:5671", "guest", "/")),
        ("AMQP://rabbit:1/%2F", Endpoint("amqp", "rabbit:1", "guest", "/")),
        ("amqp://[::1]:5672/", Endpoint("amqp", "[::1]:5672", "guest", "/")),
        ("amqp://rabbit/?heartbeat=30", Endpoint("amqp", "rabbit:5672", "guest", "/")),
    ],
)
def test_good_amqp_urls(url: str, endpoint: Endpoint) -> None:
    assert check_amqp_url(url) == endpoint


SHAPE = "; expected amqp://USER:PASSWORD@HOST:PORT/VHOST"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "X is empty"),
        ("   ", "X is empty"),
        ("guest:s3cret@127.0.0.1:5672", "X (guest:***@127.0.0.1:5672) has no scheme"),
        ("127.0.0.1:5672", "X (127.0.0.1:5672) has no scheme"),
        (
            "amqp:/guest:s3cret@h/",
            "X (amqp:/guest:***@h/) has no host: write two slashes after amqp:",
        ),
        ("amqp:/h", "X (amqp:/h) has no host: write two slashes after amqp:"),
        ("amqp://guest:s3cret@/", "X (amqp://guest:***@/) has no host"),
        ("amqp:///vhost", "X (amqp:///vhost) has no host"),
        ("http://h/", "X (http://h/) has scheme 'http', not amqp or amqps"),
        ("postgresql://h/", "X (postgresql://h/) has scheme 'postgresql', not amqp or amqps"),
        ("amqp://h:56x2/", "X (amqp://h:56x2/) has port '56x2', which is not a number"),
        ("amqp://h:-1/", "X (amqp://h:-1/) has port '-1', which is not a number"),
        ("amqp://h:0/", "X (amqp://h:0/) has port 0, out of range 1-65535"),
        ("amqp://h:65536/", "X (amqp://h:65536/) has port 65536, out of range 1-65535"),
        ("amqp://h:/", "X (amqp://h:/) has an empty port after h:"),
        ("amqp://h:1:2/", "X (amqp://h:1:2/) has a malformed host and port 'h:1:2'"),
        ("amqp://[::1/", "X (amqp://[::1/) has a malformed IPv6 host '[::1'"),
        ("amqp://h /", "X (amqp://h /) contains whitespace"),
        (
            "amqp://h1,h2/",
            "X (amqp://h1,h2/) has a comma in its host 'h1,h2': write each node as a URL of "
            "its own, the URLs separated by commas",
        ),
        ("amqp://u:pa/ss@h/", "X (amqp://u:***@h/) has port 'pa', which is not a number"),
    ],
)
def test_bad_amqp_urls_are_one_sentence_naming_the_source(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        check_amqp_url(url, "X")
    assert str(raised.value) == message + SHAPE
    assert "s3cret" not in str(raised.value)


def test_the_default_source_is_named_generically() -> None:
    with pytest.raises(ConfigurationError, match=r"^the AMQP URL \(h\) has no scheme"):
        check_amqp_url("h")
    with pytest.raises(ConfigurationError, match=r"^the database URL \(h\) has no scheme"):
        check_database_url("h")


# --- check_database_url -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        (
            "postgresql://postgres@127.0.0.1:5432/postgres",
            Endpoint("postgresql", "127.0.0.1:5432", "postgres", "postgres"),
        ),
        ("postgres://u:p@db/app", Endpoint("postgres", "db:5432", "u", "app")),
        ("postgresql://db", Endpoint("postgresql", "db:5432", "", "")),
        (
            "postgresql://u@h1:5433,h2/app",
            Endpoint("postgresql", "h1:5433,h2:5432", "u", "app"),
        ),
        (
            "postgresql:///app?host=/var/run/postgresql",
            Endpoint("postgresql", "/var/run/postgresql", "", "app"),
        ),
    ],
)
def test_good_database_urls(url: str, endpoint: Endpoint) -> None:
    assert check_database_url(url) == endpoint


PG_SHAPE = "; expected postgresql://USER:PASSWORD@HOST:PORT/DATABASE"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "postgres:s3cret@127.0.0.1:5432/postgres",
            "X (postgres:***@127.0.0.1:5432/postgres) has no scheme",
        ),
        (
            "postgresql:/h/db",
            "X (postgresql:/h/db) has no host: write two slashes after postgresql:",
        ),
        ("postgresql:///db", "X (postgresql:///db) has no host"),
        ("mysql://h/db", "X (mysql://h/db) has scheme 'mysql', not postgresql or postgres"),
        (
            "postgresql://u:s3cret@h:54x2/db",
            "X (postgresql://u:***@h:54x2/db) has port '54x2', which is not a number",
        ),
        ("postgresql://h1,/db", "X (postgresql://h1,/db) has an empty host in its list of hosts"),
        (
            "postgresql://h1:5432,h2:x/db",
            "X (postgresql://h1:5432,h2:x/db) has port 'x', which is not a number",
        ),
    ],
)
def test_bad_database_urls(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        check_database_url(url, "X")
    assert str(raised.value) == message + PG_SHAPE
    assert "s3cret" not in str(raised.value)


def test_no_module_interpolates_a_raw_url() -> None:
    """Every URL a message shows goes through mask_url: no f-string in the package puts a URL
    variable in a message as it is."""
    package = Path(__file__).resolve().parents[2] / "rabbitretry"
    offenders = [
        f"{path.name}:{number}: {line.strip()}"
        for path in package.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(name in line for name in ("url}", "url!r}", "url!s}"))
    ]
    assert offenders == []


# --- several AMQP URLs (a cluster's nodes) ------------------------------------------------


def test_a_list_of_urls_is_split_before_each_scheme_only() -> None:
    assert split_urls("amqp://a:5701/,amqp://b:5702/") == ["amqp://a:5701/", "amqp://b:5702/"]
    assert split_urls("amqp://a/ , AMQPS://b/") == ["amqp://a/", "AMQPS://b/"]
    # A comma in a password is not a separator.
    assert split_urls("amqp://u:p,w@h/") == ["amqp://u:p,w@h/"]
    assert split_urls("amqp://h/") == ["amqp://h/"]


def test_each_url_of_a_list_is_checked() -> None:
    assert check_amqp_urls("amqp://u:p@a:5701/v,amqp://u:p@b:5702/v") == [
        Endpoint("amqp", "a:5701", "u", "v"),
        Endpoint("amqp", "b:5702", "u", "v"),
    ]
    with pytest.raises(ConfigurationError) as raised:
        check_amqp_urls("amqp://u:s3cret@a/,amqp://u:s3cret@b:x/", "X")
    assert str(raised.value) == "X (amqp://u:***@b:x/) has port 'x', which is not a number" + SHAPE


def test_a_trailing_comma_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"has a comma in its host 'a,'"):
        check_amqp_urls("amqp://a,", "X")


def test_every_password_of_a_list_is_masked_and_scrubbed() -> None:
    both = "amqp://u:s3cret1@a:5701/,amqp://v:s3cret2@b:5702/"
    assert mask_url(both) == "amqp://u:***@a:5701/,amqp://v:***@b:5702/"
    assert scrub(f"failed: {both}; s3cret2", both) == f"failed: {mask_url(both)}; ***"
    # A password that looks like the start of another URL is still masked.
    assert "pw" not in mask_url("amqp://u:pw,x://@h/")
    # A PostgreSQL host list is one URL, not several.
    assert mask_url("postgresql://u:pw@h1:1,h2:2/db") == "postgresql://u:***@h1:1,h2:2/db"


# --- the heartbeat of an AMQP URL ----------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "dialled"),
    [
        ("amqp://u:p@h:5672/", "amqp://u:p@h:5672/?heartbeat=10"),
        ("amqp://u:p@h:5672/v?timeout=5", "amqp://u:p@h:5672/v?timeout=5&heartbeat=10"),
        ("amqp://u:p@h/?", "amqp://u:p@h/?heartbeat=10"),
        ("amqp://u:p@h/#x", "amqp://u:p@h/?heartbeat=10#x"),
        # A heartbeat the URL sets is kept, 0 (off) included.
        ("amqp://u:p@h/?heartbeat=30", "amqp://u:p@h/?heartbeat=30"),
        ("amqp://u:p@h/?timeout=5&heartbeat=0", "amqp://u:p@h/?timeout=5&heartbeat=0"),
    ],
)
def test_a_url_without_a_heartbeat_gets_the_default(url: str, dialled: str) -> None:
    assert with_heartbeat(url, 10) == dialled
    assert check_amqp_url(dialled) == check_amqp_url(url)


def test_the_heartbeat_a_url_sets_is_read() -> None:
    assert amqp_heartbeat("amqp://h/") is None
    assert amqp_heartbeat("amqp://h/?heartbeat=7") == 7
    assert amqp_heartbeat("amqp://h/?timeout=1&heartbeat=0") == 0


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "65536", "", "\uff11\uff10"])
def test_a_heartbeat_that_is_not_a_number_of_seconds_is_refused(value: str) -> None:
    # aiormq would take any of these for 0, which turns heartbeats off without a word.
    with pytest.raises(ConfigurationError) as raised:
        check_amqp_url(f"amqp://u:s3cret@h/?heartbeat={value}", "X")
    assert str(raised.value) == (
        f"X (amqp://u:***@h/?heartbeat={value}) has heartbeat={value!r}: write a whole number "
        "of seconds from 0 to 65535 (0 turns heartbeats off)"
    )


def test_database_labels_are_short_unique_stable_and_never_the_password() -> None:
    orders = "postgresql://app:s3cret@db1:5432/orders"
    app = "postgresql://app:s3cret@db1:5432/app"
    assert database_labels([orders, app]) == {orders: "orders", app: "app"}
    elsewhere = "postgresql://app:s3cret@db2:5433/orders"
    assert database_labels([orders, elsewhere]) == {
        orders: "orders@db1:5432",
        elsewhere: "orders@db2:5433",
    }
    other_user = "postgresql://ops:pw@db1:5432/orders"
    both = database_labels([orders, other_user])
    assert both == database_labels([other_user, orders])  # whatever the order given
    assert sorted(both.values()) == ["orders@db1:5432#1", "orders@db1:5432#2"]
    labels = database_labels([orders, "postgresql://u:s3cret@h/x?host=/sock", "nonsense:s3cret@"])
    assert not any("s3cret" in label for label in labels.values())


def test_a_database_named_like_another_ones_label_is_refused() -> None:
    # Two databases must never share a label: the console routes actions by it.
    first = "postgresql://u1:s3cret@h1:5432/a"
    second = "postgresql://u2@h1:5432/a"
    look_alike = "postgresql://u3@h1:5432/a@h1:5432%231"  # a database named 'a@h1:5432#1'
    with pytest.raises(ConfigurationError, match="would both be labelled 'a@h1:5432#1'") as e:
        database_labels([first, second, look_alike])
    assert "s3cret" not in str(e.value)
