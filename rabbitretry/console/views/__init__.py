"""The console's URLs: one view module per page family, every action an
:mod:`rabbitretry.operations` call.

- :mod:`.login`: signing in and out
- :mod:`.overview`: the landing page (with the downstream breakers, held open or closed
  there), /metrics and /healthz
- :mod:`.lists`: messages and error groups, and their export
- :mod:`.message`: one message
- :mod:`.actions`: retry, ignore, edit, bulk actions, and the audit and replay-job pages
"""

from __future__ import annotations

from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rabbitretry.console.views import actions, lists, login, message, overview


def routes() -> list[Route | Mount]:
    return [
        Route("/", overview.overview),
        Route("/login", login.login_page, methods=["GET"]),
        Route("/login", login.login, methods=["POST"]),
        Route("/logout", login.logout, methods=["POST"]),
        Route("/messages", lists.messages),
        Route("/groups", lists.groups),
        Route("/message", message.message),
        Route("/audit", actions.audit),
        Route("/jobs/{job_id}", actions.job),
        Route("/metrics", overview.prometheus),
        Route("/healthz", overview.healthz),
        Route("/export.jsonl", lists.export),
        Route("/actions/replay", actions.replay, methods=["POST"]),
        Route("/actions/confirm", actions.confirm, methods=["POST"]),
        Route("/actions/bulk", actions.bulk, methods=["POST"]),
        Route("/actions/unignore", actions.unignore, methods=["POST"]),
        Route("/actions/ignore", actions.ignore, methods=["POST"]),
        Route("/actions/edit", actions.edit, methods=["POST"]),
        Route("/actions/downstream", overview.downstream_action, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("rabbitretry.console", "static")]), name="static"),
    ]
