"""``rabbitretry callbacks serve``: receive third-party callbacks over HTTP."""

from __future__ import annotations

import logging
from typing import Annotated, Any

import typer
import uvicorn

from rabbitretry.callbacks import CallbackKind, CallbackReceiver
from rabbitretry.cli.common import (
    UserError,
    VerboseOption,
    command,
    configure_logging,
    fail,
    load_attribute,
    require_migrated,
    run_async,
    settings,
)
from rabbitretry.settings import mask_url

log = logging.getLogger("rabbitretry.callbacks")

app = typer.Typer(
    help="Third-party callbacks: verified, stored through the outbox, answered 200 once stored.",
    no_args_is_help=True,
)

SHAPE = "MODULE:NAME (for example examples.payments:payment_callbacks)"


@app.command()
@command
def serve(
    targets: Annotated[
        list[str],
        typer.Argument(
            help="Each a CallbackKind, a list of them or a CallbackReceiver, as MODULE:NAME.",
            show_default=False,
        ),
    ],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8090,
    verbose: VerboseOption = False,
) -> None:
    """Serve POST /KIND for each callback kind until Ctrl-C or SIGTERM.

    Each request is checked (size, signature, body) and stored in one commit: a receipt
    under its business message id and an outbox row for the kind's queue. It answers 200
    once stored (again 200 for a duplicate, storing nothing), 503 while the database is
    unreachable, 400 for a body the model rejects (kept as a dead letter), 401 for a bad
    signature, 404 for an unknown kind, 413 for a body over the limit.

    Nothing is handled here: run `rabbitretry outbox relay` to publish the stored events,
    and the kind's consumer with `rabbitretry run`.
    """
    try:
        kinds = [kind for target in targets for kind in _kinds_of(target)]
    except UserError as error:
        fail(str(error), 2)
    config = settings()
    # Fail at start, in one line, rather than answer 503 to every callback.
    run_async(require_migrated)(config.database_url)
    configure_logging(verbose)
    receiver = CallbackReceiver(kinds, database_url=config.database_url)
    for kind in kinds:
        log.info(
            "POST http://%s:%d/%s → queue %s",
            host,
            port,
            kind.name,
            kind.target_queue,
        )
    log.info("callbacks stored in %s", mask_url(config.database_url))
    uvicorn.run(receiver, host=host, port=port, log_level="info" if verbose else "warning")


def _kinds_of(target: str) -> list[CallbackKind]:
    found: Any = load_attribute(target, SHAPE)
    if isinstance(found, CallbackReceiver):
        return list(found.kinds.values())
    if isinstance(found, CallbackKind):
        return [found]
    if (
        isinstance(found, list | tuple)
        and found
        and all(isinstance(k, CallbackKind) for k in found)
    ):
        return list(found)
    raise UserError(f"{target} is not a CallbackKind, a list of them or a CallbackReceiver")
