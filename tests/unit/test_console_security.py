"""Console security decisions: who may start it, sessions, CSRF tokens and origins."""

from __future__ import annotations

import base64

import pytest

from rabbitretry.console import security
from rabbitretry.console.forms import filter_from, key_from, key_value, moment
from rabbitretry.console.security import Auth, ConsoleRefused, check_startup
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
