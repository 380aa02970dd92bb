"""Which event loop the commands run on (RABBITRETRY_EVENT_LOOP and whether uvloop is installed)."""

from __future__ import annotations

import sys

import pytest
import uvloop

from rabbitretry.cli.common import UserError, event_loop_factory


def test_uvloop_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RABBITRETRY_EVENT_LOOP", raising=False)
    assert event_loop_factory() is uvloop.new_event_loop
    monkeypatch.setenv("RABBITRETRY_EVENT_LOOP", "UVloop")
    assert event_loop_factory() is uvloop.new_event_loop


def test_asyncio_when_asked_or_when_uvloop_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RABBITRETRY_EVENT_LOOP", "asyncio")
    assert event_loop_factory() is None
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    monkeypatch.setenv("RABBITRETRY_EVENT_LOOP", "auto")
    assert event_loop_factory() is None


def test_uvloop_asked_for_but_missing_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    monkeypatch.setenv("RABBITRETRY_EVENT_LOOP", "uvloop")
    with pytest.raises(UserError, match=r"pip install 'rabbitretry\[fast\]'"):
        event_loop_factory()
