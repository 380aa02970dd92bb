"""The callback receiver: an ASGI app that stores third-party callbacks and answers.

It only receives, stores and lets the outbox relay dispatch: no handler runs inline. A valid
event is written, in one statement that commits before the answer, as a receipt keyed by its
kind and business message id plus an outbox row for the kind's queue; a retry of the same
callback finds the receipt and stores nothing new. Whatever the answer, it tells the sender
what to do next:

======  ===============================================================================
200     stored (or already stored): do not send it again
400     the body is not a valid event; it is kept as a dead letter (reason
        ``invalid-callback``) for a person to fix and replay
401     the signature is missing, wrong or stale; nothing is stored
404     no such callback kind
413     the body is over the kind's limit; nothing is read past it
503     the database is unreachable: nothing was stored, send it again later
======  ===============================================================================

Mount it in your own app (``Mount("/callbacks", app=receiver)``) or serve it with
``rabbitretry callbacks serve MODULE:NAME``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from rabbitretry import db, ledger
from rabbitretry.callbacks.decision import Accepted, Invalid, Unauthorized, decide
from rabbitretry.callbacks.kinds import CallbackKind
from rabbitretry.errors import ConfigurationError, ServiceUnavailable
from rabbitretry.ledger.failures import rejection
from rabbitretry.ledger.statements import record_rejected
from rabbitretry.retry import RetryPolicy

log = logging.getLogger("rabbitretry.callbacks")

KIND_HEADER = "rabbitretry-callback"
INVALID_REASON = "invalid-callback"
# Request headers kept with a dead letter: enough to see who sent it and how, nothing that
# could be a credential of ours (Authorization, cookies).
KEPT_HEADERS = ("content-type", "user-agent", "x-forwarded-for")
RETRY_AFTER_SECONDS = "5"


class CallbackReceiver:
    """An ASGI app with a route ``POST /{kind.name}`` for each :class:`CallbackKind`.

    Give it the ledger's ``database_url`` (a pool is opened on the first request, so the
    receiver also works mounted in an app whose lifespan it does not see) or a ``pool`` of
    your own. ``store_timeout`` bounds how long a request waits for the database before it
    answers 503, a silent one included (a partition, a hung server): the request's connection
    is then closed, not given back to the pool.
    """

    def __init__(
        self,
        kinds: Sequence[CallbackKind],
        *,
        database_url: str | None = None,
        pool: db.Pool | None = None,
        pool_size: int = 10,
        store_timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if (database_url is None) == (pool is None):
            raise ConfigurationError("a CallbackReceiver needs either a database_url or a pool")
        self.kinds = _by_name(kinds)
        self.database_url = database_url
        self.pool_size = pool_size
        self.store_timeout = store_timeout
        self.clock = clock
        self._pool = pool
        self._owns_pool = pool is None
        self._opening = asyncio.Lock()
        self._app = Starlette(
            routes=[Route("/{kind}", self._receive, methods=["POST"])],
            lifespan=self._lifespan,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    async def close(self) -> None:
        """Close the pool the receiver opened (a pool you passed in stays yours)."""
        if self._owns_pool and self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await self.close()

    async def _receive(self, request: Request) -> Response:
        kind = self.kinds.get(request.path_params["kind"])
        if kind is None:
            return _answer(404, "unknown callback kind")
        body = await _bounded_body(request, kind.max_body_bytes)
        if body is None:
            return _answer(413, f"the body is over {kind.max_body_bytes} bytes")
        verdict = decide(kind, request.headers, body, self.clock())
        try:
            async with asyncio.timeout(self.store_timeout):
                return await self._act(kind, verdict, body, request)
        except ServiceUnavailable as error:
            return self._unavailable(kind, error)
        except Exception as error:
            if not db.is_outage(error):
                raise
            return self._unavailable(kind, error)

    async def _act(
        self,
        kind: CallbackKind,
        verdict: Unauthorized | Invalid | Accepted,
        body: bytes,
        request: Request,
    ) -> Response:
        if isinstance(verdict, Unauthorized):
            log.warning("callback %s refused (401): %s", kind.name, verdict.reason)
            return _answer(401, verdict.reason)
        if isinstance(verdict, Invalid):
            await self._keep_invalid(kind, verdict, body, request)
            return _answer(400, "the body is not a valid event", reasons=verdict.reasons)
        stored = await self._store(kind, verdict.message_id, body)
        return _answer(200, "stored" if stored else "duplicate", message_id=verdict.message_id)

    async def _store(self, kind: CallbackKind, message_id: str, body: bytes) -> bool:
        """Receipt and outbox row in one committed statement; False for a duplicate."""
        async with self._connection() as connection:
            queued = await connection.fetchval(
                db.query("callback_store"),
                kind.name,
                message_id,
                kind.target_queue,
                body,
                json.dumps({KIND_HEADER: kind.name}),
                "application/json",
            )
        return queued is not None

    async def _keep_invalid(
        self, kind: CallbackKind, verdict: Invalid, body: bytes, request: Request
    ) -> None:
        queue = kind.target_queue
        detail = "; ".join(verdict.reasons)
        kept = {name: request.headers[name] for name in KEPT_HEADERS if name in request.headers}
        async with self._connection() as connection:
            new = await record_rejected(
                connection,
                ledger.Key(queue, verdict.key),
                max_attempts=_max_attempts(kind),
                reason=INVALID_REASON,
                failure=rejection(queue, INVALID_REASON, detail),
                snapshot=ledger.Snapshot(
                    body=body,
                    headers={KIND_HEADER: kind.name, **kept},
                    properties={"content_type": "application/json"},
                    exchange="",
                    routing_key=queue,
                ),
            )
        if new:  # a retry of the same bad request is the same dead letter, logged once
            log.error("%s/%s: dead (%s): %s", queue, verdict.key, INVALID_REASON, detail)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[db.PooledConnection]:
        """A pooled connection for one request, within the request's ``store_timeout``: one
        that timed out is terminated, so a silent database ties up no connection of the pool."""
        async with db.held(await self._open_pool()) as connection:
            yield connection

    async def _open_pool(self) -> db.Pool:
        if self._pool is None:
            async with self._opening:
                if self._pool is None:
                    assert self.database_url is not None
                    self._pool = await db.create_pool(
                        self.database_url, min_size=1, max_size=self.pool_size
                    )
        return self._pool

    def _unavailable(self, kind: CallbackKind, error: BaseException) -> Response:
        log.error("callback %s not stored, the database is unreachable (503): %s", kind.name, error)
        response = _answer(503, "the database is unreachable: nothing was stored, send it again")
        response.headers["Retry-After"] = RETRY_AFTER_SECONDS
        return response


def _by_name(kinds: Sequence[CallbackKind]) -> dict[str, CallbackKind]:
    by_name: dict[str, CallbackKind] = {}
    for kind in kinds:
        if kind.name in by_name:
            raise ConfigurationError(f"two callback kinds are named {kind.name!r}")
        by_name[kind.name] = kind
    if not by_name:
        raise ConfigurationError("a CallbackReceiver needs at least one CallbackKind")
    return by_name


def _max_attempts(kind: CallbackKind) -> int:
    policy = kind.consumer.retry if kind.consumer is not None else RetryPolicy()
    return policy.max_attempts


async def _bounded_body(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as it is known to be over ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    # A Content-Length is the caller's text: only plain digits, and no more than a limit has.
    if declared.isascii() and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def _answer(status: int, message: str, **details: Any) -> JSONResponse:
    return JSONResponse({"status": status, "message": message, **details}, status_code=status)
