"""Configuration read at the edge (CLI, console): environment variables ``RABBITRETRY_*``."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

from rabbitretry.urls import mask_url

__all__ = ["DEFAULT_AMQP_URL", "DEFAULT_DATABASE_URL", "Settings", "mask_url"]

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

AMQP_URL_VARIABLE = "RABBITRETRY_AMQP_URL"
DATABASE_URL_VARIABLE = "RABBITRETRY_DATABASE_URL"


class Settings(BaseSettings):
    """The ``RABBITRETRY_*`` variables, as given: the URLs are checked where they are used
    (:mod:`rabbitretry.urls`), so that a command names only a URL it needs."""

    model_config = SettingsConfigDict(env_prefix="RABBITRETRY_", extra="ignore")

    amqp_url: str = DEFAULT_AMQP_URL
    database_url: str = DEFAULT_DATABASE_URL
    alert_webhook_url: str | None = None
    console_token: str | None = None
    console_user: str | None = None
    console_password: str | None = None
    console_users_file: str | None = None
