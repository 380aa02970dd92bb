"""``rabbitretry console``: serve the web console."""

from __future__ import annotations

import logging
from typing import Annotated

import typer
import uvicorn

from rabbitretry import amqp
from rabbitretry.cli.common import (
    Config,
    DatabasesOption,
    UserError,
    VerboseOption,
    command,
    configure_logging,
    fail,
    load_consumer,
    require_migrated,
    run_async,
    settings,
)
from rabbitretry.console import (
    Auth,
    ConsoleConfig,
    ConsoleRefused,
    check_startup,
    create_app,
    security,
    users,
)
from rabbitretry.settings import mask_url

log = logging.getLogger("rabbitretry.console")


@command
def console(
    host: Annotated[
        str, typer.Option(help="Address to listen on; anything but 127.0.0.1 needs credentials.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8089,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth", help="Serve without a login (only on 127.0.0.1, for a local look)."
        ),
    ] = False,
    allowed_hosts: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            help="Another host name (or address) the console is reached by, e.g. behind a "
            "proxy (repeat for several); other Host headers are refused.",
        ),
    ] = None,
    consumers: Annotated[
        list[str] | None,
        typer.Option(
            "--consumer",
            help="MODULE:CLASS whose payload model checks edited payloads of its queue "
            "(repeat for several).",
        ),
    ] = None,
    database: DatabasesOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Serve the web console: dead and retrying messages, groups, retries, ignores and edits.

    Log in with RABBITRETRY_CONSOLE_TOKEN, a user of RABBITRETRY_CONSOLE_USERS_FILE, or
    RABBITRETRY_CONSOLE_USER and RABBITRETRY_CONSOLE_PASSWORD. Every action is recorded in the
    audit table with your name.

    Ledgers spread over several databases: repeat --database, and every page shows each
    database's rows, labelled with its name; an action goes to the database of its row.
    """
    config = settings()
    try:
        auth = Auth(
            config.console_token,
            config.console_user,
            config.console_password,
            users.load(config.console_users_file) if config.console_users_file else {},
        )
        check_startup(auth, host, no_auth)
        models = {c.queue: c.payload_adapter for c in map(load_consumer, consumers or [])}
    except (ConsoleRefused, UserError) as error:
        fail(str(error), 2)
    databases = run_async(_check_services)(config, database)
    configure_logging(verbose)
    app = create_app(
        ConsoleConfig(
            database_url=databases[0],
            other_databases=tuple(databases[1:]),
            amqp_url=config.amqp_url,
            auth=auth,
            no_auth=no_auth,
            models=models,
            allowed_hosts=security.allowed_hosts(host, tuple(allowed_hosts or ())),
        )
    )
    log.info(
        "console on http://%s:%d (ledger %s, broker %s)",
        host,
        port,
        ", ".join(mask_url(url) for url in databases),
        mask_url(config.amqp_url),
    )
    uvicorn.run(app, host=host, port=port, log_level="info" if verbose else "warning")


async def _check_services(config: Config, given: list[str] | None) -> list[str]:
    """The ledger databases to show; fail at start, in one line, rather than on the first
    page or the first replay, when one of them or the broker cannot be used."""
    databases = config.databases(given)
    connection = await amqp.connect(config.amqp_url, name="rabbitretry-console-check")
    await connection.close()
    for url in databases:
        await require_migrated(url)
    return databases
