"""Signing in and out: the login form, checking what it sends, and ending a session."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from rabbitretry.console import security
from rabbitretry.console.app import (
    config_of,
    failed_login,
    posted,
    refuse_cross_site,
    refuse_throttled,
    render,
    revoke,
    session_of,
    set_session_cookie,
)


async def login_page(request: Request) -> Response:
    if request.state.session is not None:
        return RedirectResponse(_local(request.query_params.get("next")), status_code=303)
    return _login_form(request)


def _login_form(
    request: Request, error: str = "", status_code: int = 200, target: str | None = None
) -> Response:
    auth = config_of(request).auth
    return render(
        request,
        "login.html",
        status_code,
        error=error,
        with_token=bool(auth.token),
        with_password=bool(auth.user or auth.users),
        next=_local(target or request.query_params.get("next")),
    )


async def login(request: Request) -> Response:
    refuse_cross_site(request)
    refuse_throttled(request)
    form = await request.form()
    user, password, token, name = (
        str(form.get(k) or "").strip() for k in ("user", "password", "token", "name")
    )
    config = config_of(request)
    if not config.auth.check_login(user, password, token):
        failed_login(request, user or "token")
        return _login_form(request, "wrong credentials", 401, str(form.get("next") or ""))
    who = user if user and not token else (name or "token")
    if len(who) > security.MAX_NAME:
        too_long = f"the name is too long (at most {security.MAX_NAME} characters)"
        return _login_form(request, too_long, 400, str(form.get("next") or ""))
    response = RedirectResponse(_local(str(form.get("next") or "")), status_code=303)
    set_session_cookie(response, security.new_session(who), config, request)
    return response


async def logout(request: Request) -> Response:
    await posted(request)
    session = session_of(request)
    if session.issued:  # a cookie's session; one from an Authorization header has no end
        await revoke(request, session)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(security.SESSION_COOKIE)
    return response


def _local(target: str | None) -> str:
    """Only a path on this site (never //elsewhere or /\\elsewhere): no open redirect."""
    if target and target.startswith("/") and not target.startswith(("//", "/\\")):
        return target
    return "/"
