"""The console's plumbing: configuration, sessions, CSRF checks and page rendering.

Every page needs a session (see :mod:`rabbitretry.console.security`); every POST also needs the
session's CSRF token and the console's own origin. Pages are rendered by Jinja2 with
autoescape on, and a Content-Security-Policy without scripts keeps a payload that slips
through inert.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
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
from rabbitretry.console import security
from rabbitretry.console.forms import key_value
from rabbitretry.console.jobs import Jobs
from rabbitretry.console.security import Auth, Session
from rabbitretry.operations import OperationError
from rabbitretry.settings import mask_url

PUBLIC_PATHS = ("/login", "/static/")
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
}


@dataclass(frozen=True)
class ConsoleConfig:
    database_url: str
    amqp_url: str
    auth: Auth
    no_auth: bool = False
    models: Mapping[str, pydantic.TypeAdapter[Any]] = field(default_factory=dict)
    """Payload models by queue, from the consumers named at start: edits are checked."""
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))


_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("rabbitretry.console", "templates"),
    autoescape=True,  # payloads, keys and errors are attacker-controlled
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_templates.globals["key_value"] = key_value
_templates.filters["q"] = lambda text: quote(str(text), safe="")


def config_of(request: Request) -> ConsoleConfig:
    config: ConsoleConfig = request.app.state.config
    return config


def pool_of(request: Request) -> db.Pool:
    pool: db.Pool = request.app.state.pool
    return pool


def jobs_of(request: Request) -> Jobs:
    jobs: Jobs = request.app.state.jobs
    return jobs


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
        database=mask_url(config.database_url),
        broker=mask_url(config.amqp_url),
        notice=NOTICES.get(request.query_params.get("notice", ""), ""),
        **context,
    )
    return HTMLResponse(html, status_code=status_code)


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
    token = form.get("csrf")
    if not isinstance(token, str) or not security.csrf_ok(
        session_of(request), config.secret, token
    ):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
    return form


class Authenticate(BaseHTTPMiddleware):
    """A session for every page but the login page; security headers on every response."""

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        config = config_of(request)
        fresh: Session | None = None
        session = self._session(request, config)
        if session is None and config.no_auth:
            session = fresh = security.new_session("anonymous")
        request.state.session = session
        if session is None and not request.url.path.startswith(PUBLIC_PATHS):
            if request.method != "GET":
                response: Response = PlainTextResponse("log in first", status_code=401)
            else:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                response = RedirectResponse(f"/login?next={quote(target)}", status_code=303)
        else:
            response = await call_next(request)
        if fresh is not None:
            set_session_cookie(response, fresh, config, request)
        response.headers.update(HEADERS)
        return response

    @staticmethod
    def _session(request: Request, config: ConsoleConfig) -> Session | None:
        header = request.headers.get("authorization")
        if header:
            user = config.auth.check_header(header)
            return security.header_session(user, header, config.secret) if user else None
        cookie = request.cookies.get(security.SESSION_COOKIE)
        return security.decode_session(cookie, config.secret) if cookie else None


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
    return render(request, "error.html", error.status_code, message=error.detail)


async def operation_error(request: Request, error: Exception) -> Response:
    """An operator's mistake (400) or a service that cannot be reached (503), in one line."""
    status = 400 if isinstance(error, OperationError) else 503
    return render(request, "error.html", status, message=str(error))
