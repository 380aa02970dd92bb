"""Who may use the console and how its forms are protected. Pure functions, no I/O.

- Authentication: a token (``RABBITRETRY_CONSOLE_TOKEN``) or a user and password
  (``RABBITRETRY_CONSOLE_USER`` / ``RABBITRETRY_CONSOLE_PASSWORD``), given on the login page
  (which sets a signed session cookie) or in an ``Authorization`` header (Bearer or Basic).
- Without either, the console serves only 127.0.0.1 and only when started with ``--no-auth``.
- CSRF: every form carries a token bound to the session (an HMAC of its nonce), and every
  POST must come from the console's own origin (``Origin``, else ``Referer``).
- Host: every request must name one of the console's own host names, in every mode, so that
  a page of another site whose name resolves to 127.0.0.1 (DNS rebinding) is not served.
- Guessing: an address with too many failed logins in a window is refused for a while.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import socket
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from urllib.parse import urlsplit

from rabbitretry.errors import RabbitRetryError

SESSION_COOKIE = "rabbitretry_session"
SESSION_SECONDS = 12 * 3600
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
CLOCK_SKEW = 60
"""Seconds a session may seem issued in the future (another console's clock ahead of ours)."""
LATEST_ISSUE = 2**40
"""A session's issue time is a Unix time below this (the year 36812)."""
MAX_NAME = 64
"""A longer name would make a cookie the browser may drop (a silent login loop)."""


class ConsoleRefused(RabbitRetryError):
    """The console's configuration is unsafe: it does not start."""


@dataclass(frozen=True)
class Auth:
    token: str | None = None
    user: str | None = None
    password: str | None = None
    users: Mapping[str, str] = field(default_factory=dict)
    """Users and their password hashes (:mod:`rabbitretry.console.users`)."""

    @property
    def enabled(self) -> bool:
        return bool(self.token or (self.user and self.password) or self.users)

    def check_login(self, user: str, password: str, token: str) -> bool:
        if self.token and token and _same(token, self.token):
            return True
        if self.users and user:
            # An unknown name costs a hash too, so timing does not tell which names exist.
            stored = self.users.get(user) or _decoy_hash()
            return verify_password(password, stored) and user in self.users
        return bool(
            self.user
            and self.password
            and _same(user, self.user)
            and _same(password, self.password)
        )

    def check_header(self, header: str) -> str | None:
        """The user an ``Authorization`` header authenticates, or None."""
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and self.token and _same(value.strip(), self.token):
            return "token"
        if scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(value.strip()).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return None
            if self.check_login(user, password, ""):
                return user
        return None


SCRYPT = {"n": 2**14, "r": 8, "p": 1}


def hash_password(password: str, salt: bytes | None = None) -> str:
    """``scrypt$N$r$p$SALT$KEY`` (base64): scrypt from the standard library, with its
    parameters, so that stronger ones can come later without breaking a users file."""
    salt = salt or secrets.token_bytes(16)
    key = hashlib.scrypt(password.encode(), salt=salt, **SCRYPT)
    parameters = (str(SCRYPT[k]) for k in ("n", "r", "p"))
    return "$".join(["scrypt", *parameters, _b64(salt), _b64(key)])


def verify_password(password: str, stored: str) -> bool:
    """Whether ``password`` is the one ``stored`` was made from (constant time)."""
    try:
        scheme, n, r, p, salt, key = stored.split("$")
        expected = base64.b64decode(key)
        actual = hashlib.scrypt(
            password.encode(),
            salt=base64.b64decode(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(expected),
        )
    except (ValueError, binascii.Error):
        return False
    return scheme == "scrypt" and hmac.compare_digest(actual, expected)


@cache
def _decoy_hash() -> str:
    return hash_password("", salt=bytes(16))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def check_startup(auth: Auth, host: str, no_auth: bool) -> None:
    """Refuse an unsafe start: no credentials, or --no-auth off 127.0.0.1."""
    if auth.user and not auth.password:
        raise ConsoleRefused("RABBITRETRY_CONSOLE_USER is set without RABBITRETRY_CONSOLE_PASSWORD")
    if no_auth and auth.enabled:
        raise ConsoleRefused("--no-auth was given but credentials are configured: drop one")
    if no_auth and host not in LOCAL_HOSTS:
        raise ConsoleRefused(
            f"--no-auth serves only 127.0.0.1, not {host}: set RABBITRETRY_CONSOLE_TOKEN "
            "(or RABBITRETRY_CONSOLE_USER and RABBITRETRY_CONSOLE_PASSWORD) instead"
        )
    if not no_auth and not auth.enabled:
        raise ConsoleRefused(
            "the console needs credentials: set RABBITRETRY_CONSOLE_TOKEN, "
            "RABBITRETRY_CONSOLE_USERS_FILE, or RABBITRETRY_CONSOLE_USER and "
            "RABBITRETRY_CONSOLE_PASSWORD (or, on 127.0.0.1 only, pass --no-auth)"
        )


def allowed_hosts(listen: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The host names a request may carry: the listen address (on a wildcard address, this
    machine's names and the loopback ones), and those the operator added."""
    names = [listen]
    if listen in LOCAL_HOSTS or listen in WILDCARD_HOSTS:
        names += LOCAL_HOSTS
    if listen in WILDCARD_HOSTS:
        names += [socket.gethostname(), socket.getfqdn()]
    return tuple(dict.fromkeys(n.lower() for n in [*names, *extra] if n))


def host_allowed(host_header: str, allowed: tuple[str, ...]) -> bool:
    """Whether a request's ``Host`` (with or without a port) is one of ``allowed``."""
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8089
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return bool(host) and host in allowed


class Throttle:
    """Failed logins per client address over a sliding window: past ``limit`` of them, every
    login from that address, right or wrong, waits until the oldest leaves the window."""

    MAX_CLIENTS = 10_000  # beyond this many addresses, the longest-quiet ones are forgotten

    def __init__(self, limit: int = 10, window: float = 300.0) -> None:
        self.limit = limit
        self.window = window
        self._failures: dict[str, deque[float]] = {}

    def wait(self, client: str, now: float | None = None) -> float:
        """Seconds before ``client`` may try again (0: now)."""
        moment = time.monotonic() if now is None else now
        failures = self._recent(client, moment) if client in self._failures else deque()
        if len(failures) < self.limit:
            return 0.0
        return failures[0] + self.window - moment

    def failed(self, client: str, now: float | None = None) -> None:
        moment = time.monotonic() if now is None else now
        self._recent(client, moment).append(moment)
        if len(self._failures) > self.MAX_CLIENTS:
            quiet = sorted(self._failures, key=lambda c: self._failures[c][-1])
            for forgotten in quiet[: len(quiet) - self.MAX_CLIENTS]:
                del self._failures[forgotten]

    def _recent(self, client: str, now: float) -> deque[float]:
        failures = self._failures.setdefault(client, deque())
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        return failures


@dataclass(frozen=True)
class Session:
    user: str
    nonce: str
    issued: int


def new_session(user: str, now: float | None = None) -> Session:
    return Session(user=user, nonce=secrets.token_urlsafe(16), issued=int(now or time.time()))


def header_session(user: str, header: str, secret: bytes) -> Session:
    """A session for header-authenticated requests: stable, so its CSRF token is too."""
    nonce = hmac.new(secret, f"header|{header}".encode(), hashlib.sha256).hexdigest()[:22]
    return Session(user=user, nonce=nonce, issued=0)


def encode_session(session: Session, secret: bytes) -> str:
    body = base64.urlsafe_b64encode(
        json.dumps({"u": session.user, "n": session.nonce, "t": session.issued}).encode()
    ).decode()
    return f"{body}.{_sign(secret, body)}"


def decode_session(cookie: str, secret: bytes, now: float | None = None) -> Session | None:
    """The session in a cookie, or None when it is forged, malformed or expired."""
    body, _, signature = cookie.partition(".")
    if not signature or not _same(signature, _sign(secret, body)):
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(body))
        session = Session(user=str(data["u"]), nonce=str(data["n"]), issued=data["t"])
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None
    # A whole number of seconds in range before any arithmetic: infinity or 10**400 would
    # overflow, and a time far ahead would never expire.
    if type(session.issued) is not int or not 0 <= session.issued <= LATEST_ISSUE:
        return None
    age = (now or time.time()) - session.issued
    if not -CLOCK_SKEW <= age <= SESSION_SECONDS:
        return None
    return session


def csrf_token(session: Session, secret: bytes) -> str:
    return _sign(secret, f"csrf|{session.nonce}")


def csrf_ok(session: Session, secret: bytes, submitted: str) -> bool:
    return bool(submitted) and _same(submitted, csrf_token(session, secret))


def same_origin(origin: str | None, referer: str | None, scheme: str, host: str) -> bool:
    """Whether a POST comes from the console's own pages (``Origin``, else ``Referer``)."""
    expected = f"{scheme}://{host}".lower()
    if origin and origin != "null":
        return origin.lower().rstrip("/") == expected
    if referer:
        parts = urlsplit(referer)
        return f"{parts.scheme}://{parts.netloc}".lower() == expected
    return False


def _sign(secret: bytes, text: str) -> str:
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
