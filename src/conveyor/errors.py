"""Exceptions users see. Every message says what to fix."""

from __future__ import annotations

import re


class ConveyorError(Exception):
    """Base class for errors raised by Conveyor itself."""


class ConfigError(ConveyorError):
    """A setting, URL or argument is invalid."""


class KeyReused(ConfigError):
    """An idempotency key already named a different request. A key names one
    request, as payment APIs have it: a repeat asking for something else is an
    error, not the first request's answer. ``made``: what the key named (``job 7,
    task 'add'``); ``named`` words the error for where the key came from (the
    ``Idempotency-Key`` header over HTTP)."""

    def __init__(
        self, key: str, made: str, *, name: str = "idempotency_key", index: int | None = None
    ) -> None:
        super().__init__(
            f"{name}: {key!r} was already used by a different request ({made}); a key "
            "names one request: retry it unchanged, or send this one under a new key"
        )
        self.key = key
        self.made = made
        #: which of the jobs written together reused the key (None: the only one)
        self.index = index

    def named(self, name: str) -> KeyReused:
        return KeyReused(self.key, self.made, name=name, index=self.index)


class DatabaseUnavailable(ConveyorError):
    """The database could not be reached.

    ``transient``: the server did not answer yet, or is starting, stopping or
    restarting (refused, timed out, unknown host, too many connections): trying
    again later may work. False when it answered no (a wrong password, no such
    database) or the cause is unknown."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class SchemaError(ConveyorError):
    """The database schema is missing, or newer than this version of Conveyor."""


class SchemaTooNew(SchemaError):
    """The database schema is newer than this version of Conveyor: deploy the newer
    code (``conveyor worker`` exits with status 3 for it)."""


class BadArguments(ConfigError, TypeError):
    """Arguments do not fit the task's handler signature."""


class SerializationError(ConveyorError, TypeError):
    """Task arguments or a result could not be encoded as JSON."""


class UnknownTask(ConveyorError, LookupError):
    """No handler is registered under a task name."""


class JobNotFound(ConveyorError, LookupError):
    """No job (or batch, worker, queue) has the given id."""


class JobFailed(ConveyorError):
    """A job awaited for its result failed or was cancelled."""


class Conflict(ConveyorError):
    """An action the record's current state does not allow (retrying a running
    job, completing a job whose lease was lost, ...)."""


class Permanent(Exception):
    """Raise from a handler to fail the job at once, without retrying.

    ``raise Permanent("bad input")`` or ``raise Permanent("bad input") from exc``.
    """


class JobTimeout(TimeoutError):
    """A handler ran longer than its task's ``timeout``."""


def redact_url(url: str) -> str:
    """A database URL fit for logs and messages: its password replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    creds, _, host = rest.partition("@")
    user, has_password, _ = creds.partition(":")
    return f"{scheme}://{user}:***@{host}" if has_password else url


#: a server that answered: no such database / no such user or a wrong password
_NO_DATABASE = re.compile(r'database "[^"]*" does not exist|unknown database', re.I)
_BAD_LOGIN = re.compile(
    r'role "[^"]*" does not exist|password authentication failed|access denied', re.I
)


def connect_advice(error: str) -> str:
    """What to do about a failed connection, from what the server said."""
    if _NO_DATABASE.search(error):
        return (
            "The server answered: create that database (CREATE DATABASE <name>) or fix the"
            " URL's database name; Conveyor makes its tables, not the database."
        )
    if _BAD_LOGIN.search(error):
        return "The server answered: check the URL's user and password."
    return "Check that the server is running and the URL (host, port, user, database) is right."
