"""``rabbitretry dead``: list, group, inspect, replay, ignore, edit and export dead letters.

Every command is a thin shell over :mod:`rabbitretry.operations`, which the console uses too.
The commands that only read live in :mod:`.reading`, those that change a message in
:mod:`.acting`; they are registered here, in one place, because the order of registration is
the order ``rabbitretry dead --help`` lists them in.
"""

from __future__ import annotations

import typer

from rabbitretry.cli.dead import acting, reading

app = typer.Typer(
    help="Dead letters: messages that will not be retried again until someone replays them.",
    no_args_is_help=True,
)

app.command("list")(reading.list_)
app.command("show")(reading.show)
app.command("replay")(acting.replay)
app.command("ignore")(acting.ignore)
app.command("edit")(acting.edit)
app.command("export")(reading.export)
