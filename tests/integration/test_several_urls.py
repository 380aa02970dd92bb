"""Several AMQP URLs against the local broker: the first that answers is used, and when none
does, one error names each URL (masked) and why it failed."""

from __future__ import annotations

import socket

import pytest

from rabbitretry import amqp, urls
from rabbitretry.errors import ConfigurationError, ServiceUnavailable

pytestmark = pytest.mark.asyncio


def closed_port() -> int:
    """A local port where nothing listens (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_url_that_does_not_answer_is_passed_over(amqp_url: str) -> None:
    connection = await amqp.connect(f"amqp://u:s3cret@127.0.0.1:{closed_port()}/,{amqp_url}")
    try:
        assert amqp.node_url(connection) == urls.mask_url(amqp_url)
        assert amqp.is_up(connection)
    finally:
        await connection.close()


async def test_when_no_url_answers_the_error_names_each() -> None:
    first, second = closed_port(), closed_port()
    with pytest.raises(ServiceUnavailable) as raised:
        await amqp.connect(
            f"amqp://u:s3cret@127.0.0.1:{first}/,amqp://u:s3cret@127.0.0.1:{second}/"
        )
    message = str(raised.value)
    assert message.startswith("cannot connect to RabbitMQ at any of its 2 URLs: ")
    assert f"amqp://u:***@127.0.0.1:{first}/: nothing listens on 127.0.0.1:{first}" in message
    assert f"amqp://u:***@127.0.0.1:{second}/: nothing listens on 127.0.0.1:{second}" in message
    assert "s3cret" not in message and "\n" not in message


async def test_a_malformed_url_in_the_list_is_refused_before_any_connection(
    amqp_url: str,
) -> None:
    with pytest.raises(ConfigurationError, match=r"\(amqp://u:\*\*\*@h:x/\) has port 'x'"):
        await amqp.connect(f"{amqp_url},amqp://u:s3cret@h:x/")
