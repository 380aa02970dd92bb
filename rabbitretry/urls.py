"""Service URLs: checked before any connection is tried, and masked wherever they are shown.

Pure: no I/O. :func:`check_amqp_url` and :func:`check_database_url` refuse a URL the client
libraries would misread (aio-pika retries a URL without a scheme forever, asyncpg takes the
password for a database name or fails with a traceback on a port that is not a number), in
one sentence that names where the URL came from and shows it masked.

:func:`mask_url` hides the password of anything that looks like a URL, however malformed:
every message, log line and exception text that shows a URL goes through it.

An AMQP setting may name several nodes of a cluster: several URLs separated by commas
(``amqp://u:p@node1:5672/,amqp://u:p@node2:5672/``). :func:`split_urls` cuts such a list only
before a scheme, so a comma inside a password stays where it is; :func:`check_amqp_urls`
checks each, and :func:`mask_url` masks each.

An AMQP URL's ``heartbeat=N`` (seconds, 0 to 65535; 0 turns heartbeats off) is checked too: the
client would take anything else for 0. :func:`with_heartbeat` adds one to a URL without it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import unquote

from rabbitretry.errors import ConfigurationError

AMQP_SCHEMES = ("amqp", "amqps")
DATABASE_SCHEMES = ("postgresql", "postgres")
AMQP_SHAPE = "amqp://USER:PASSWORD@HOST:PORT/VHOST"
DATABASE_SHAPE = "postgresql://USER:PASSWORD@HOST:PORT/DATABASE"

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_SCHEME_AND_SLASHES = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/{1,2}")
# A comma that starts another URL: followed by a scheme and "://" (not by a password's text).
_NEXT_URL = re.compile(r"\s*,\s*(?=[A-Za-z][A-Za-z0-9+.-]*://)")
_QUERY_SECRET = re.compile(r"(?i)([?&](?:password|sslpassword)=)[^&#]*")
_MASK = "***"


@dataclass(frozen=True)
class Endpoint:
    """What a checked URL points at, for messages: ``host:port``, the user, vhost or database."""

    scheme: str
    address: str
    """``host:port`` (several, comma-separated, for a PostgreSQL URL with several hosts)."""
    user: str
    path: str
    """The AMQP virtual host, or the PostgreSQL database (empty: the server's default)."""


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, safe to print and log.

    Total: it never raises, and it hides the password of a malformed URL too (no scheme,
    one slash, an unescaped ``@`` or ``/`` in the password), at the cost of hiding a little
    more than the password when an ``@`` appears after the host. Each URL of a
    comma-separated list (:func:`split_urls`) is masked on its own.
    """
    parts = split_urls(url)
    if len(parts) > 1:
        masked = ",".join(mask_url(part) for part in parts)
        # A password holding ",scheme://" is cut in two: mask the whole as one URL instead.
        whole = password_of(url)
        if whole is None or whole not in masked:
            return masked
    text = _QUERY_SECRET.sub(rf"\g<1>{_MASK}", url)
    head, at, tail = text.rpartition("@")
    if not at:
        return text
    prefix_match = _SCHEME_AND_SLASHES.match(head)
    prefix = prefix_match.group(0) if prefix_match else ""
    user, colon, _ = head[len(prefix) :].partition(":")
    if not colon:
        return text
    return f"{prefix}{user}:{_MASK}@{tail}"


def split_urls(text: str) -> list[str]:
    """The URLs of a comma-separated list, in order (one URL: a list of one)."""
    return _NEXT_URL.split(text)


def password_of(url: str) -> str | None:
    """The password in ``url`` as :func:`mask_url` sees it (raw, not percent-decoded)."""
    head, at, _ = url.rpartition("@")
    if not at:
        return None
    prefix_match = _SCHEME_AND_SLASHES.match(head)
    userinfo = head[len(prefix_match.group(0)) if prefix_match else 0 :]
    _, colon, password = userinfo.partition(":")
    return password if colon and password else None


def scrub(text: str, url: str) -> str:
    """``text`` (a driver's error message) without the URL's password, in case it echoes it."""
    parts = split_urls(url)
    if len(parts) > 1:
        for part in parts:
            text = scrub(text, part)
        return text
    text = text.replace(url, mask_url(url))
    password = password_of(url)
    # A very short password would mask ordinary letters of the message; it cannot be told
    # apart in it anyway.
    if password is not None and len(password) >= 4:
        for form in {password, unquote(password)}:
            text = text.replace(form, _MASK)
    return text


def check_amqp_url(url: str, source: str = "the AMQP URL") -> Endpoint:
    """``url`` checked as an AMQP URL; a :class:`ConfigurationError` naming ``source`` if not."""
    scheme, user, hosts, path = _split(url, source, AMQP_SCHEMES, AMQP_SHAPE, several=False)
    amqp_heartbeat(url, source)
    vhost = unquote(path[1:]) if len(path) > 1 else "/"
    default_port = 5671 if scheme == "amqps" else 5672
    address = ",".join(_address(host, port or default_port) for host, port in hosts)
    return Endpoint(scheme=scheme, address=address, user=unquote(user) or "guest", path=vhost)


def check_amqp_urls(text: str, source: str = "the AMQP URL") -> list[Endpoint]:
    """Each URL of a comma-separated list of AMQP URLs (a cluster's nodes), checked in order."""
    return [check_amqp_url(url, source) for url in split_urls(text)]


MAX_HEARTBEAT = 65535


def amqp_heartbeat(url: str, source: str = "the AMQP URL") -> int | None:
    """The ``heartbeat=`` of an AMQP URL's query, in seconds (None: it sets none).

    Anything but a whole number from 0 to 65535 is a :class:`ConfigurationError`: the client
    would silently take it for 0, which turns heartbeats off."""
    text = query_value(url, "heartbeat")
    if text is None:
        return None
    if not (text.isascii() and text.isdigit() and int(text) <= MAX_HEARTBEAT):
        raise ConfigurationError(
            f"{source} ({mask_url(url)}) has heartbeat={text!r}: write a whole number of "
            f"seconds from 0 to {MAX_HEARTBEAT} (0 turns heartbeats off)"
        )
    return int(text)


def with_heartbeat(url: str, seconds: int) -> str:
    """``url`` with ``heartbeat=seconds`` added to its query, unless it sets a heartbeat."""
    if query_value(url, "heartbeat") is not None:
        return url
    head, hash_mark, fragment = url.partition("#")
    separator = "&" if "?" in head else "?"
    if head.endswith(("?", "&")):
        separator = ""
    return f"{head}{separator}heartbeat={seconds}{hash_mark}{fragment}"


def query_value(url: str, name: str) -> str | None:
    """The (percent-decoded) value of query parameter ``name`` in ``url``; None if absent."""
    query = url.partition("?")[2].partition("#")[0]
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        if unquote(key) == name:
            return unquote(value)
    return None


def check_database_url(url: str, source: str = "the database URL") -> Endpoint:
    """``url`` checked as a PostgreSQL URL; a :class:`ConfigurationError` naming ``source``."""
    scheme, user, hosts, path = _split(url, source, DATABASE_SCHEMES, DATABASE_SHAPE, several=True)
    address = ",".join(_address(host, port or 5432) for host, port in hosts if host)
    if not address:  # a Unix socket given as ?host=/path
        address = _query_host(url) or ""
    return Endpoint(scheme=scheme, address=address, user=unquote(user), path=unquote(path[1:]))


def database_labels(database_urls: Iterable[str]) -> dict[str, str]:
    """A short, stable label for each database URL, never its password: the database's name
    (``orders``); when two URLs name the same database, ``name@host:port``; when those agree
    too (another user, another option), a number is added, in the URLs' sorted order. The
    same set of URLs always gets the same labels, whatever order they come in."""
    wanted = list(dict.fromkeys(database_urls))
    named = {url: _database_name(url) for url in wanted}
    labels = {}
    for url in wanted:
        same = [other for other in wanted if named[other] == named[url]]
        labels[url] = named[url] if len(same) == 1 else f"{named[url]}@{_database_address(url)}"
    first = dict(labels)
    for url in wanted:
        same = sorted(other for other in wanted if first[other] == first[url])
        if len(same) > 1:
            labels[url] = f"{first[url]}#{same.index(url) + 1}"
    by_label: dict[str, list[str]] = {}
    for url, label in labels.items():
        by_label.setdefault(label, []).append(mask_url(url))
    for label, urls in by_label.items():
        if len(urls) > 1:  # a database named like another's label (orders@host:5432#1)
            raise ConfigurationError(
                f"the databases {' and '.join(urls)} would both be labelled {label!r}, and "
                "an action on one could reach the other: rename one of them"
            )
    return labels


def _database_name(url: str) -> str:
    try:
        endpoint = check_database_url(url)
    except ConfigurationError:
        return mask_url(url)
    return endpoint.path or endpoint.user or "postgres"


def _database_address(url: str) -> str:
    try:
        return check_database_url(url).address
    except ConfigurationError:
        return "?"


def _split(
    url: str, source: str, schemes: tuple[str, ...], shape: str, *, several: bool
) -> tuple[str, str, list[tuple[str, int | None]], str]:
    """(scheme, user, [(host, port)], path) of ``url``, or the first thing wrong with it."""

    def refuse(problem: str) -> ConfigurationError:
        shown = f" ({mask_url(url)})" if url.strip() else ""
        return ConfigurationError(f"{source}{shown} {problem}; expected {shape}")

    allowed = " or ".join(schemes)
    if not url.strip():
        raise refuse("is empty")
    if any(c.isspace() for c in url):
        raise refuse("contains whitespace")
    scheme, separator, rest = url.partition("://")
    if not separator:
        named = _SCHEME.match(url)
        if named and named[1].lower() in schemes and url[named.end() :].startswith("/"):
            raise refuse(f"has no host: write two slashes after {named[1]}:")
        raise refuse("has no scheme")
    if not _SCHEME.fullmatch(scheme + ":"):
        raise refuse("has no scheme")
    scheme = scheme.lower()
    if scheme not in schemes:
        raise refuse(f"has scheme {scheme!r}, not {allowed}")
    # Where urllib and yarl (aio-pika's parser) end the authority part.
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, path = rest[:end], rest[end:].partition("?")[0].partition("#")[0]
    userinfo, _, hostlist = netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    if "," in hostlist and not several:
        raise refuse(
            f"has a comma in its host {hostlist!r}: write each node as a URL of its own, "
            "the URLs separated by commas"
        )
    hosts: list[tuple[str, int | None]] = []
    for hostport in hostlist.split(",") if several else [hostlist]:
        host, port = _host_and_port(hostport, refuse)
        hosts.append((host, port))
    if not any(host for host, _ in hosts) and not (several and _query_host(url)):
        raise refuse("has no host")
    if any(not host for host, _ in hosts) and len(hosts) > 1:
        raise refuse("has an empty host in its list of hosts")
    return scheme, user, hosts, path


def _host_and_port(
    hostport: str, refuse: Callable[[str], ConfigurationError]
) -> tuple[str, int | None]:
    if hostport.startswith("["):
        host, bracket, after = hostport[1:].partition("]")
        if not bracket or not host:
            raise refuse(f"has a malformed IPv6 host {hostport!r}")
        if after and not after.startswith(":"):
            raise refuse(f"has text after its IPv6 host: {after!r}")
        port_text = after[1:] if after else None
    else:
        host, colon, port_text_or_empty = hostport.partition(":")
        port_text = port_text_or_empty if colon else None
        if ":" in port_text_or_empty:
            raise refuse(f"has a malformed host and port {hostport!r}")
    if port_text is None:
        return host, None
    if not port_text:
        raise refuse(f"has an empty port after {host}:")
    if not port_text.isascii() or not port_text.isdigit():
        raise refuse(f"has port {port_text!r}, which is not a number")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise refuse(f"has port {port}, out of range 1-65535")
    return host, port


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _query_host(url: str) -> str | None:
    """The ``host=`` query parameter of a PostgreSQL URL (a Unix socket directory), if any."""
    query = url.partition("?")[2].partition("#")[0]
    for pair in query.split("&"):
        name, _, value = pair.partition("=")
        if name == "host" and value:
            return unquote(value)
    return None
