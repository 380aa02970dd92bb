"""``rabbitretry console``: a web page to see failed messages and act on them.

Server-rendered (Starlette + Jinja2, no JavaScript); every action goes through
:mod:`rabbitretry.operations`, as the CLI's do, and is recorded in the audit table.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware

from rabbitretry.console import views
from rabbitretry.console.app import Authenticate, ConsoleConfig, http_error, operation_error
from rabbitretry.console.ledgers import open_ledgers
from rabbitretry.console.security import Auth, ConsoleRefused, Throttle, check_startup
from rabbitretry.errors import RabbitRetryError

__all__ = ["Auth", "ConsoleConfig", "ConsoleRefused", "check_startup", "create_app"]


def create_app(config: ConsoleConfig) -> Starlette:
    """The console as an ASGI application (serve it with uvicorn)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.ledgers = ledgers = await open_ledgers(config.database_urls)
        try:
            yield
        finally:
            await ledgers.close()

    app = Starlette(
        routes=views.routes(),
        middleware=[Middleware(Authenticate)],
        exception_handlers={HTTPException: http_error, RabbitRetryError: operation_error},
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.throttle = Throttle()
    return app
