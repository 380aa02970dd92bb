"""``rabbitretry job``: run a scheduled job once, with its overlap lock and checkpoint."""

from __future__ import annotations

from typing import Annotated

import typer

from rabbitretry import db
from rabbitretry.cli.common import (
    DatabaseOption,
    UserError,
    VerboseOption,
    configure_logging,
    fail,
    load_attribute,
    out,
    run_async,
    settings,
)
from rabbitretry.scheduled_jobs import Job, run_job

app = typer.Typer(
    help="Scheduled jobs: run from cron on any number of machines, one instance at a time.",
    no_args_is_help=True,
)


@app.command()
@run_async
async def run(
    target: Annotated[
        str, typer.Argument(help="The job as MODULE:NAME (a function decorated with @job).")
    ],
    verbose: VerboseOption = False,
    database: DatabaseOption = None,
) -> None:
    """Run a job once. If it is already running elsewhere, say so and exit 0.

    The job resumes from its last checkpoint; its start, end, counts or error are recorded
    as its heartbeat (rabbitretry status shows it). Exit 1 when the job failed.
    """
    found = load_attribute(target, "MODULE:NAME (for example myapp.jobs:expire_coupons)")
    if not isinstance(found, Job):
        raise UserError(
            f"{target} is not a job: decorate it with @rabbitretry.scheduled_jobs.job(every=...)"
        )
    configure_logging(verbose)
    pool = await db.create_pool(settings().database(database), min_size=2, max_size=4)
    try:
        outcome = await run_job(pool, found)
    finally:
        await pool.close()
    if outcome.status == "failed":
        fail(outcome.message)
    out.print(outcome.message, highlight=False)
