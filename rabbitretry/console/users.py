"""Console users from a file, each with a password hash, so the audit names who acted.

The file (``RABBITRETRY_CONSOLE_USERS_FILE``) has one user a line, ``name:hash``; blank lines
and lines starting with ``#`` are skipped. A hash is scrypt (standard library), with its
parameters and salt: ``scrypt$16384$8$1$SALT$KEY`` (base64). Make a line with

    python -m rabbitretry.console.users NAME      # asks for the password twice
"""

from __future__ import annotations

import getpass
import re
import sys
from pathlib import Path

from rabbitretry.console.security import MAX_NAME, ConsoleRefused, hash_password

NAME = re.compile(r"^[\w.@-]+$")


def load(path: str) -> dict[str, str]:
    """Users and their hashes; :class:`ConsoleRefused` (one line) for a file that is wrong."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ConsoleRefused(f"cannot read the users file {path}: {error.strerror}") from None
    users: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, stored = line.strip().partition(":")
        if not NAME.match(name) or len(name) > MAX_NAME or not stored.startswith("scrypt$"):
            raise ConsoleRefused(
                f"{path}:{number}: expected NAME:scrypt$... (make one with "
                "python -m rabbitretry.console.users NAME)"
            )
        users[name] = stored
    if not users:
        raise ConsoleRefused(f"the users file {path} names no user")
    return users


def main(arguments: list[str]) -> int:
    if len(arguments) != 1 or not NAME.match(arguments[0]):
        print("usage: python -m rabbitretry.console.users NAME", file=sys.stderr)
        return 2
    password = getpass.getpass(f"password for {arguments[0]}: ")
    if not password or password != getpass.getpass("again: "):
        print("the passwords are empty or differ", file=sys.stderr)
        return 1
    print(f"{arguments[0]}:{hash_password(password)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
