"""Configuration read at the edge (CLI, console): environment variables ``RABBITRETRY_*``."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RABBITRETRY_", extra="ignore")

    amqp_url: str = DEFAULT_AMQP_URL
    database_url: str = DEFAULT_DATABASE_URL
    alert_webhook_url: str | None = None
    console_token: str | None = None
    console_user: str | None = None
    console_password: str | None = None


def mask_url(url: str) -> str:
    """The URL with its password replaced by ``***``, safe to print and log."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
