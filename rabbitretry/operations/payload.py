"""Payloads an operator reads and edits: shown as pretty JSON, checked before a replay.

Pure functions. An edited payload is refused unless it is JSON, and unless it fits the
consumer's model when that is known: a fix that the handler would reject at once would only
come back as the same dead letter.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic

from rabbitretry.operations.errors import OperationError


def checked_payload(text: str | bytes, payload_adapter: pydantic.TypeAdapter[Any] | None) -> bytes:
    """An edited payload as bytes, refused unless it is JSON (valid for the model, if known)."""
    body = text.encode() if isinstance(text, str) else text
    try:
        json.loads(body)
    except ValueError as error:
        raise OperationError(f"the payload is not valid JSON: {error}") from None
    if payload_adapter is not None:
        try:
            payload_adapter.validate_json(body)
        except pydantic.ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'payload'}: {e['msg']}"
                for e in error.errors()
            )
            raise OperationError(
                f"the payload does not fit the consumer's model: {problems}"
            ) from None
    return body


def payload_text(body: bytes) -> str:
    """A payload for people: pretty JSON when it is JSON, else text (undecodable bytes marked)."""
    try:
        return json.dumps(json.loads(body), indent=2, ensure_ascii=False)
    except (ValueError, UnicodeDecodeError):
        return body.decode("utf-8", errors="replace")
