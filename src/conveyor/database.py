"""The database of one app: opened on first use, once, under a lock, and
migrated (or its schema checked) before anything else uses it; waited for at
start while it does not answer yet (``Conveyor.connect``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from .backends import open_backend
from .backends.interfaces import Backend
from .errors import DatabaseUnavailable, SchemaError, SchemaTooNew

log = logging.getLogger("conveyor")
#: the schema that records sensitive parameters (conveyor_task_sensitive)
SENSITIVE_SCHEMA = 20


class DatabaseHost(Protocol):
    """What the database reads of the app when it opens (``Conveyor`` is one):
    both may be set after the app was made (the CLI's ``--database-url``)."""

    @property
    def url(self) -> str: ...

    @property
    def auto_migrate(self) -> bool: ...


class Replica:
    """What a replica's Database reads of the app: its ``read_url`` (which the
    CLI may set after the app was made), never migrated there (a replica is
    read-only: its schema comes from the primary)."""

    auto_migrate = False

    def __init__(self, host: ReplicaHost) -> None:
        self._host = host

    @property
    def url(self) -> str:
        url = self._host.read_url
        if url is None:
            raise RuntimeError("no read_url: the app reads from its primary")
        return url


class ReplicaHost(Protocol):
    @property
    def read_url(self) -> str | None: ...


class Database:
    """The app's one backend. ``on_open(backend)`` runs whenever one is opened or
    migrated at a schema that records sensitive parameters."""

    def __init__(self, host: DatabaseHost, on_open: Callable[[Backend], None]) -> None:
        self._host = host
        self._on_open = on_open
        self._lock = threading.Lock()
        #: the backend, once opened
        self.opened: Backend | None = None

    def get(self) -> Backend:
        """The backend, opened now if it is not yet."""
        if self.opened is None:
            with self._lock:
                if self.opened is None:
                    backend = open_backend(self._host.url)
                    try:
                        self._prepare(backend)
                    except BaseException:
                        backend.close()
                        raise
                    self.opened = backend
        return self.opened

    def connect(self, wait_s: float) -> None:
        """Open it, trying again while it does not answer, for up to ``wait_s`` seconds."""
        deadline = time.monotonic() + wait_s
        began, delay = time.monotonic(), 0.25
        while True:
            try:
                self.get()
            except DatabaseUnavailable as exc:
                left = deadline - time.monotonic()
                if not exc.transient or left <= 0:
                    raise
                if delay == 0.25:
                    log.warning(
                        "the database does not answer yet; trying again for up to %.0fs "
                        "(--wait-for-database): %s",
                        left,
                        exc,
                    )
                time.sleep(min(delay, left))
                delay = min(delay * 2, 5.0)
                continue
            if delay > 0.25:
                log.warning("the database answers, after %.1fs", time.monotonic() - began)
            return

    def _prepare(self, backend: Backend) -> None:
        url = self._host.url
        if self._host.auto_migrate:
            backend.migrate()  # also refuses a schema newer than this code
            self._on_open(backend)
            return
        version = backend.schema_version()
        if version == 0:
            raise SchemaError(f"no Conveyor schema in {url}: run `conveyor migrate` first")
        if version > backend.latest_schema:
            raise SchemaTooNew(
                f"{url} has schema version {version}, but this Conveyor only knows up to "
                f"version {backend.latest_schema}: upgrade the conveyor package"
            )
        if version >= SENSITIVE_SCHEMA:
            self._on_open(backend)

    def migrate(self) -> list[int]:
        """Apply pending migrations (refusing a newer schema); return the versions applied."""
        with self._lock:
            if self.opened is not None:
                applied = self.opened.migrate()
                self._on_open(self.opened)
                return applied
            backend = open_backend(self._host.url)
            try:
                applied = backend.migrate()
                self._on_open(backend)
            except BaseException:
                backend.close()
                raise
            self.opened = backend
            return applied

    def close(self) -> None:
        if self.opened is not None:
            self.opened.close()
            self.opened = None
