"""Which event loop the commands run on: RABBITRETRY_EVENT_LOOP."""

from __future__ import annotations

import sys

import pytest
import uvloop

from rabbitretry.cli.common import UserError, event_loop_factory


def test_asyncio_unless_uvloop_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RABBITRETRY_EVENT_LOOP", raising=False)
    assert event_loop_factory() is None
    monkeypatch.setenv("RABBITRETRY_EVENT_LOOP", "asyncio")
    assert event_loop_factory() is None
    monkeypatch.setenv("RABBITRETRY_EVENT_LOOP", " UVloop ")
    assert event_loop_factory() is uvloop.new_event_loop


def test_uvloop_asked_for_but_missing_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    monkeypatch.setenv("RABBITRETRY_EVENT_LOOP", "uvloop")
    with pytest.raises(UserError, match=r"pip install 'rabbitretry\[uvloop\]'"):
        event_loop_factory()


def test_an_unknown_loop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RABBITRETRY_EVENT_LOOP", "fast")
    with pytest.raises(UserError, match="use one of asyncio, uvloop"):
        event_loop_factory()
