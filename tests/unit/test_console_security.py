"""Console security decisions: who may start it, sessions, CSRF tokens and origins."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from rabbitretry.console import chart, display, security, users
from rabbitretry.console.forms import filter_from, key_from, key_value, located_key_from, moment
from rabbitretry.console.security import Auth, ConsoleRefused, check_startup
from rabbitretry.ledger import Key
from rabbitretry.operations import OperationError

SECRET = b"s" * 32


def test_start_needs_credentials_or_local_no_auth() -> None:
    check_startup(Auth(token="t"), "0.0.0.0", no_auth=False)
    check_startup(Auth(user="u", password="p"), "10.0.0.5", no_auth=False)
    check_startup(Auth(), "127.0.0.1", no_auth=True)
    with pytest.raises(ConsoleRefused, match="needs credentials"):
        check_startup(Auth(), "127.0.0.1", no_auth=False)
    with pytest.raises(ConsoleRefused, match=r"only 127\.0\.0\.1"):
        check_startup(Auth(), "0.0.0.0", no_auth=True)
    with pytest.raises(ConsoleRefused, match="without RABBITRETRY_CONSOLE_PASSWORD"):
        check_startup(Auth(user="u"), "127.0.0.1", no_auth=False)
    with pytest.raises(ConsoleRefused, match="drop one"):
        check_startup(Auth(token="t"), "127.0.0.1", no_auth=True)


def test_logins_and_headers() -> None:
    auth = Auth(token="tok", user="ops", password="pw")
    assert auth.check_login("", "", "tok")
    assert auth.check_login("ops", "pw", "")
    assert not auth.check_login("ops", "wrong", "")
    assert not auth.check_login("", "", "")
    assert not Auth(token="tok").check_login("", "", "")
    assert auth.check_header("Bearer tok") == "token"
    assert auth.check_header("Bearer nope") is None
    basic = base64.b64encode(b"ops:pw").decode()
    assert auth.check_header(f"Basic {basic}") == "ops"
    assert auth.check_header("Basic !!!") is None


def test_sessions_are_signed_and_expire() -> None:
    session = security.new_session("ops", now=1000)
    cookie = security.encode_session(session, SECRET)
    assert security.decode_session(cookie, SECRET, now=2000) == session
    assert security.decode_session(cookie, b"x" * 32, now=2000) is None
    _, _, signature = cookie.partition(".")
    forged = base64.urlsafe_b64encode(b'{"u": "admin", "n": "x", "t": 1000}').decode()
    assert security.decode_session(f"{forged}.{signature}", SECRET, now=2000) is None
    assert security.decode_session(cookie, SECRET, now=1000 + security.SESSION_SECONDS + 1) is None
    assert security.decode_session("garbage", SECRET) is None


@pytest.mark.parametrize("issued", ["1e309", "NaN", "-1", "1" + "0" * 400, '"soon"'])
def test_a_cookie_with_an_absurd_time_is_no_session_not_a_crash(issued: str) -> None:
    # Only the console signs cookies, but a leaked secret or an older format must not be a 500.
    body = base64.urlsafe_b64encode(f'{{"u": "a", "n": "x", "t": {issued}}}'.encode()).decode()
    cookie = f"{body}.{security._sign(SECRET, body)}"
    assert security.decode_session(cookie, SECRET, now=2000) is None


def test_csrf_tokens_are_bound_to_the_session() -> None:
    one, two = security.new_session("a"), security.new_session("a")
    token = security.csrf_token(one, SECRET)
    assert security.csrf_ok(one, SECRET, token)
    assert not security.csrf_ok(two, SECRET, token)
    assert not security.csrf_ok(one, SECRET, "")


@pytest.mark.parametrize(
    ("origin", "referer", "ok"),
    [
        ("http://127.0.0.1:8089", None, True),
        ("http://evil.example", "http://127.0.0.1:8089/messages", False),
        (None, "http://127.0.0.1:8089/groups?x=1", True),
        (None, "http://127.0.0.1:9999/groups", False),
        ("null", None, False),
        (None, None, False),
    ],
)
def test_only_our_own_origin_may_post(origin: str | None, referer: str | None, ok: bool) -> None:
    assert security.same_origin(origin, referer, "http", "127.0.0.1:8089") is ok


def test_forms() -> None:
    selection = filter_from(
        {"status": "all", "queue": "", "q": "boom", "since": "2026-01-02T03:04"}
    )
    assert selection.statuses == ("dead", "retrying", "ignored")
    assert selection.queue is None and selection.text == "boom"
    assert selection.since is not None and selection.since.tzinfo is not None
    assert moment("") is None
    with pytest.raises(OperationError, match="not a time"):
        moment("tomorrow")
    assert key_from(key_value("a/b", "c")).queue == "a/b"
    with pytest.raises(OperationError, match="reload"):
        key_from("nonsense")


def test_a_key_carries_the_database_its_row_came_from() -> None:
    assert key_value("a/b", "c") == '["a/b", "c"]'  # one database: as before
    assert located_key_from(key_value("a/b", "c", "orders")) == (Key("a/b", "c"), "orders")
    assert located_key_from('["q", "k"]') == (Key("q", "k"), "")
    for damaged in ('["q"]', '["q", "k", "db", "more"]', '{"q": "k"}', '"q"'):
        with pytest.raises(OperationError, match="reload"):
            located_key_from(damaged)
    with pytest.raises(OperationError, match="NUL"):
        located_key_from('["q", "k", "db\\u0000"]')


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1:8089", True),
        ("localhost", True),
        ("[::1]:8089", True),
        ("LOCALHOST:1", True),
        ("evil.example:8089", False),
        ("127.0.0.1.evil.example", False),
        ("", False),
    ],
)
def test_only_our_own_host_names_are_served(host: str, ok: bool) -> None:
    assert security.host_allowed(host, security.allowed_hosts("127.0.0.1")) is ok


def test_allowed_hosts_follow_the_listen_address() -> None:
    assert security.allowed_hosts("10.0.0.5") == ("10.0.0.5",)
    assert security.allowed_hosts("10.0.0.5", ("Console.Example",)) == (
        "10.0.0.5",
        "console.example",
    )
    assert "localhost" in security.allowed_hosts("0.0.0.0")


def test_failed_logins_are_throttled_per_address_for_a_window() -> None:
    throttle = security.Throttle(limit=3, window=60)
    for second in range(3):
        assert throttle.wait("a", now=second) == 0
        throttle.failed("a", now=second)
    assert throttle.wait("a", now=10) == pytest.approx(50)
    assert throttle.wait("b", now=10) == 0
    assert throttle.wait("a", now=60.5) == 0  # the first failure left the window


def test_users_have_scrypt_hashes() -> None:
    stored = security.hash_password("correct horse", salt=b"s" * 16)
    assert stored.startswith("scrypt$16384$8$1$")
    assert security.verify_password("correct horse", stored)
    assert not security.verify_password("wrong", stored)
    assert not security.verify_password("x", "md5$abc")
    auth = Auth(users={"dana": stored})
    assert auth.enabled and auth.check_login("dana", "correct horse", "")
    assert not auth.check_login("dana", "wrong", "") and not auth.check_login("eve", "x", "")


def test_a_users_file_is_read_or_refused_in_one_line(tmp_path: Path) -> None:
    good = tmp_path / "users"
    good.write_text(f"# ops\n\ndana:{security.hash_password('pw')}\n")
    assert list(users.load(str(good))) == ["dana"]
    bad = tmp_path / "bad"
    bad.write_text("dana:plain-password\n")
    with pytest.raises(ConsoleRefused, match=r"bad:1: expected NAME:scrypt"):
        users.load(str(bad))
    with pytest.raises(ConsoleRefused, match="cannot read the users file"):
        users.load(str(tmp_path / "missing"))


def test_hidden_characters_are_spelled_out() -> None:
    assert display.visible("invoice-\u202egpj.exe") == "invoice-[U+202E]gpj.exe"
    assert display.visible("a\tb\nc\x00") == "a\tb\nc[U+0000]"
    shown = display.payload(bytes([0, 1, 0xFF]))
    assert (shown.size, shown.text, shown.hex, shown.base64) == (
        3,
        None,
        "00000000  00 01 ff",
        "AAH/",
    )
    assert display.payload(b'{"a":1}').text == '{\n  "a": 1\n}'


def test_the_chart_is_svg_without_script() -> None:
    drawn = chart.svg([chart.Minute(3, 1), chart.Minute(0, 2)], "<orders>")
    assert drawn.startswith("<svg") and "<script" not in drawn
    assert "&lt;orders&gt;: 3 handled, 3 died in the last 2 minutes" in drawn


def test_a_users_file_line_is_made_from_a_typed_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(users.getpass, "getpass", lambda prompt: "typed twice")
    assert users.main(["dana"]) == 0
    name, _, stored = capsys.readouterr().out.strip().partition(":")
    assert name == "dana" and security.verify_password("typed twice", stored)
    assert users.main(["not a name"]) == 2
