"""The console's plumbing: configuration, sessions, CSRF checks and page rendering.

Every page needs a session (see :mod:`rabbitretry.console.security`); every POST also needs the
session's CSRF token and the console's own origin. Pages are rendered by Jinja2 with
autoescape on, and a Content-Security-Policy without scripts keeps a payload that slips
through inert.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from math import ceil
from typing import Any
from urllib.parse import quote

import jinja2
import pydantic
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

from rabbitretry import db
from rabbitretry.console import display, forms, paging, security
from rabbitretry.console.forms import key_value
from rabbitretry.console.ledgers import Ledger, Ledgers, outage_message
from rabbitretry.console.security import Auth, Session, Throttle
from rabbitretry.errors import RabbitRetryError, ServiceUnavailable
from rabbitretry.operations import OperationError
from rabbitretry.settings import mask_url

log = logging.getLogger("rabbitretry.console")
PUBLIC_PATHS = ("/login", "/static/", "/healthz")
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


# What an action's redirect may announce: fixed texts, so a crafted link cannot put words
# into the page.
NOTICES = {
    "retried": "Retried: the message is back on its work queue.",
    "ignored": "Ignored: it will not be retried or replayed.",
    "edited": "Payload saved; the message was edited and retried.",
    "not-dead": "Nothing done: the message is no longer dead.",
    "ignored-many": "Ignored {count} dead letter(s); Undo below puts them back.",
    "unignored": "Undone: {count} message(s) are dead letters again.",
    "downstream-held": (
        "Held open: the consumers that call it stop taking deliveries within a second, and "
        "no probe is tried. Close it when the service is back."
    ),
    "downstream-closed": (
        "Closed: the consumers that call it take deliveries again within a second; its "
        "failures count from zero."
    ),
}


@dataclass(frozen=True)
class ConsoleConfig:
    database_url: str
    amqp_url: str
    auth: Auth
    other_databases: tuple[str, ...] = ()
    """More ledger databases shown beside ``database_url`` (``console --database`` repeated)."""
    no_auth: bool = False
    models: Mapping[str, pydantic.TypeAdapter[Any]] = field(default_factory=dict)
    """Payload models by queue, from the consumers named at start: edits are checked."""
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    allowed_hosts: tuple[str, ...] = security.LOCAL_HOSTS
    canary_timeout: float = 60.0

    @property
    def database_urls(self) -> tuple[str, ...]:
        """Every ledger database the console shows, ``database_url`` first."""
        return tuple(dict.fromkeys((self.database_url, *self.other_databases)))


_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("rabbitretry.console", "templates"),
    autoescape=True,  # payloads, keys and errors are attacker-controlled
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    finalize=display.finalize,  # no bidi override or control character acts on the page
)
_templates.globals["key_value"] = key_value
_templates.filters["verbatim"] = display.verbatim
_templates.globals["link"] = paging.link
_templates.filters["q"] = lambda text: quote(str(text), safe="")


def config_of(request: Request) -> ConsoleConfig:
    config: ConsoleConfig = request.app.state.config
    return config


def ledgers_of(request: Request) -> Ledgers:
    ledgers: Ledgers = request.app.state.ledgers
    return ledgers


def ledger_of(request: Request, label: str | None) -> Ledger:
    """The database a link or a form names (none: the first); an outage while the request
    uses it is reported as this database's."""
    ledger = ledgers_of(request).get(label)
    request.state.ledger = ledger
    return ledger


def throttle_of(request: Request) -> Throttle:
    throttle: Throttle = request.app.state.throttle
    return throttle


def session_of(request: Request) -> Session:
    session: Session = request.state.session
    return session


def actor_of(request: Request) -> str:
    return f"console:{session_of(request).user}"


def render(request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
    config = config_of(request)
    session: Session | None = getattr(request.state, "session", None)
    html = _templates.get_template(template).render(
        request=request,
        user=session.user if session else None,
        csrf=security.csrf_token(session, config.secret) if session else "",
        database=", ".join(mask_url(url) for url in config.database_urls),
        several=len(config.database_urls) > 1,
        broker=mask_url(config.amqp_url),
        notice=notice_of(request),
        **context,
    )
    return HTMLResponse(html, status_code=status_code)


def notice_of(request: Request) -> str:
    """The announcement a redirect asked for: a fixed text, with at most a number in it (a
    count of up to 18 ASCII digits; any other, "some")."""
    count = forms.bounded_count(request.query_params.get("count", ""))
    text = NOTICES.get(request.query_params.get("notice", ""), "")
    return text.format(count="some" if count is None else f"{count:,}")


def refuse_cross_site(request: Request) -> None:
    """Raise 403 unless the request's Origin (or Referer) is this console."""
    if not security.same_origin(
        request.headers.get("origin"),
        request.headers.get("referer"),
        request.url.scheme,
        request.headers.get("host", ""),
    ):
        raise HTTPException(403, "cross-site request refused")


async def posted(request: Request) -> FormData:
    """The form of a POST, refused (403) unless it comes from a console page of this session."""
    config = config_of(request)
    refuse_cross_site(request)
    form = await request.form()
    forms.refuse_nul(*(value for value in form.values() if isinstance(value, str)))
    token = form.get("csrf")
    if not isinstance(token, str) or not security.csrf_ok(
        session_of(request), config.secret, token
    ):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
    return form


class Authenticate(BaseHTTPMiddleware):
    """A session for every page but the login page; security headers on every response.

    Before any page: the ``Host`` must be one of the console's names (in every mode, against
    DNS rebinding), and no query value may hold a NUL (PostgreSQL text cannot).
    """

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        request.state.session = None
        try:
            response = await self._checked(request, call_next)
        except HTTPException as error:
            response = await http_error(request, error)
        except RabbitRetryError as error:
            response = await operation_error(request, error)
        except db.UNAVAILABLE as error:
            response = await database_error(request, error)
        response.headers.update(HEADERS)
        return response

    async def _checked(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        config = config_of(request)
        host = request.headers.get("host", "")
        if not security.host_allowed(host, config.allowed_hosts):
            raise HTTPException(
                400, f"this console is not served as {host[:100]!r}: see --allowed-host"
            )
        forms.refuse_nul(*request.query_params.values())
        fresh: Session | None = None
        # Set before the revocation check, so that an outage's page keeps its navigation.
        session = request.state.session = self._session(request, config)
        if session is not None and session.issued and await is_revoked(request, session):
            session = None
        if session is None and config.no_auth:
            session = fresh = security.new_session("anonymous")
        request.state.session = session
        if session is None and not request.url.path.startswith(PUBLIC_PATHS):
            if request.method != "GET":
                return PlainTextResponse("log in first", status_code=401)
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/login?next={quote(target)}", status_code=303)
        response = await call_next(request)
        if fresh is not None:
            set_session_cookie(response, fresh, config, request)
        return response

    @staticmethod
    def _session(request: Request, config: ConsoleConfig) -> Session | None:
        """The session the request claims, before the check that it was not logged out."""
        header = request.headers.get("authorization")
        if header:
            refuse_throttled(request)
            user = config.auth.check_header(header)
            if user is None:
                failed_login(request, header.partition(" ")[0])
                return None
            return security.header_session(user, header, config.secret)
        cookie = request.cookies.get(security.SESSION_COOKIE)
        return security.decode_session(cookie, config.secret) if cookie else None


def client_of(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def refuse_throttled(request: Request) -> None:
    """429 while the client's address has failed too many logins (right credentials too)."""
    wait = throttle_of(request).wait(client_of(request))
    if wait > 0:
        raise HTTPException(
            429,
            f"too many failed logins from {client_of(request)}: try again in {ceil(wait)} s",
            headers={"Retry-After": str(ceil(wait))},
        )


def failed_login(request: Request, who: str) -> None:
    throttle_of(request).failed(client_of(request))
    log.warning("failed login from %s (as %r)", client_of(request), who[: security.MAX_NAME])


async def is_revoked(request: Request, session: Session) -> bool:
    """Whether ``session`` was logged out: in any ledger database that answers (a logout is
    written to each); an outage when none does."""
    ledgers = ledgers_of(request)

    async def revoked(ledger: Ledger) -> bool:
        return bool(await ledger.pool.fetchval(db.query("console_is_revoked"), session.nonce))

    answers, down = await ledgers.each(revoked)
    if not answers:
        raise ServiceUnavailable(down[0].message if down else "no ledger database")
    return any(answer for _, answer in answers)


async def revoke(request: Request, session: Session) -> None:
    """Refuse ``session`` from now on, here and in every console on these ledgers: written to
    each database. A database that is down fails the logout (after the others took it): a
    session is refused if any answering database has it logged out, so a revocation missing
    from one would let the session back in while the others are down."""
    expires = datetime.fromtimestamp(session.issued + security.SESSION_SECONDS, UTC)

    async def write(ledger: Ledger) -> None:
        await ledger.pool.execute(db.query("console_revoke"), session.nonce, expires)

    _, down = await ledgers_of(request).each(write)
    if down:
        raise ServiceUnavailable(
            f"the logout could not be recorded everywhere ({down[0].message}); "
            "log out again once it answers"
        )


def set_session_cookie(
    response: Response, session: Session, config: ConsoleConfig, request: Request
) -> None:
    response.set_cookie(
        security.SESSION_COOKIE,
        security.encode_session(session, config.secret),
        max_age=security.SESSION_SECONDS,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


async def http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    if not hasattr(request.state, "session"):
        return PlainTextResponse(error.detail, status_code=error.status_code)
    response = render(request, "error.html", error.status_code, message=error.detail)
    response.headers.update(error.headers or {})
    return response


async def database_error(request: Request, error: Exception) -> Response:
    """The ledger cannot be reached, or refuses service for now (read-only, not accepting
    connections, shutting down, out of resources): 503 and one line, on a page with its
    navigation."""
    if not db.is_outage(error):
        raise error
    ledger: Ledger | None = getattr(request.state, "ledger", None)
    url = ledger.url if ledger is not None else config_of(request).database_url
    return render(request, "error.html", 503, message=outage_message(url, error))


async def operation_error(request: Request, error: Exception) -> Response:
    """An operator's mistake (400) or a service that cannot be reached (503), in one line."""
    status = 400 if isinstance(error, OperationError) else 503
    return render(request, "error.html", status, message=str(error))
