"""The one exception of the operations: a request an operator made that cannot be done.

It is raised before anything is written (a bad rate, filter or payload, an ignore without a
reason), and both front ends show its message as it is: a form error on the page, one line in
a terminal.
"""

from __future__ import annotations

from rabbitretry.errors import RabbitRetryError


class OperationError(RabbitRetryError):
    """An operator asked for something that cannot be done (a bad rate, an invalid payload)."""
