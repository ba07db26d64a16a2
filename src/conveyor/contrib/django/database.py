"""Where a Django task backend keeps its jobs, and the one Conveyor app per backend.

A backend joins a Django database (``OPTIONS["DATABASE"]``, default ``"default"``):
Conveyor's URL is made from that alias's settings, and an enqueue writes through
Django's own connection. ``OPTIONS["URL"]`` names a Conveyor database of its
own instead (no shared transaction then).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.backends.signals import connection_created

from conveyor import Conveyor

#: OPTIONS keys Django's PostgreSQL backend reads itself: they are not libpq's
_DJANGO_PG_OPTIONS = frozenset(
    {"isolation_level", "server_side_binding", "assume_role", "pool", "cursor_factory", "context"}
)
VENDORS = ("sqlite", "postgresql", "mysql")

_apps: dict[str, Conveyor] = {}
_lock = threading.Lock()
#: Django database alias -> the aliases of the task backends kept in it
_backends_in: dict[str, set[str]] = {}


def url_for(alias: str) -> str:
    """Conveyor's URL for the Django database ``alias``, from its settings as they
    are now (the test runner renames a database after settings are read)."""
    if alias not in connections.settings:
        raise ImproperlyConfigured(f"there is no database {alias!r} in DATABASES")
    wrapper = connections[alias]
    settings: Mapping[str, Any] = wrapper.settings_dict
    vendor = wrapper.vendor
    if vendor == "sqlite":
        return _sqlite_url(alias, settings)
    if vendor == "postgresql":
        return _postgres_url(settings)
    if vendor == "mysql":
        return _mysql_url(settings)
    raise ImproperlyConfigured(
        f"database {alias!r} is a {vendor} database: Conveyor runs on SQLite, PostgreSQL "
        "and MySQL/MariaDB"
    )


def _sqlite_url(alias: str, settings: Mapping[str, Any]) -> str:
    name = str(settings.get("NAME") or "")
    if not name or name == ":memory:" or "mode=memory" in name:
        raise ImproperlyConfigured(
            f"database {alias!r} is an in-memory SQLite database: Conveyor's workers run in "
            "other processes and need a file (for tests, set DATABASES[...]['TEST']['NAME'] "
            "to a file name)"
        )
    return "sqlite:///" + os.path.abspath(name)


def _credentials(settings: Mapping[str, Any]) -> str:
    user = settings.get("USER") or ""
    password = settings.get("PASSWORD") or ""
    if not user:
        return ""
    if password:
        return f"{quote(str(user), safe='')}:{quote(str(password), safe='')}@"
    return f"{quote(str(user), safe='')}@"


def _postgres_url(settings: Mapping[str, Any]) -> str:
    host = settings.get("HOST") or ""
    query: dict[str, str] = {}
    if host.startswith("/"):  # a Unix socket directory
        query["host"], host = host, ""
    port = f":{settings['PORT']}" if settings.get("PORT") else ""
    for key, value in (settings.get("OPTIONS") or {}).items():
        if key not in _DJANGO_PG_OPTIONS and isinstance(value, str | int):
            query[key] = str(value)
    name = quote(str(settings.get("NAME") or "postgres"), safe="")
    tail = f"?{urlencode(query)}" if query else ""
    return f"postgresql://{_credentials(settings)}{host}{port}/{name}{tail}"


def _mysql_url(settings: Mapping[str, Any]) -> str:
    host = settings.get("HOST") or "127.0.0.1"
    query = ""
    if host.startswith("/"):
        query, host = "?" + urlencode({"unix_socket": host}), "localhost"
    port = f":{settings['PORT']}" if settings.get("PORT") else ""
    name = quote(str(settings.get("NAME") or ""), safe="")
    return f"mysql://{_credentials(settings)}{host}{port}/{name}{query}"


def app_for(alias: str, url: str, make: Any) -> Conveyor:
    """The process's one Conveyor app of backend ``alias`` (Django makes a backend
    object per thread), pointed at ``url``: when the database's settings changed
    (the test runner's test database), the app moves to the new URL."""
    app = _apps.get(alias)
    if app is None:
        with _lock:
            app = _apps.get(alias)
            if app is None:
                app = _apps[alias] = make(url)
    if app.url != url:
        with _lock:
            if app.url != url:
                app.close()
                app.url = url
    return app


def open_with(database: str, backend_alias: str) -> None:
    """Open backend ``backend_alias``'s app whenever Django connects to SQLite
    database ``database`` (see ``_open_first``)."""
    _backends_in.setdefault(database, set()).add(backend_alias)
    connection_created.connect(_open_first, dispatch_uid="conveyor.contrib.django.open")


def _open_first(sender: Any, connection: Any, **kwargs: Any) -> None:
    """On SQLite, the app is opened as Django connects, before any transaction of
    Django's: opening reads the schema version in a write transaction of its own
    connection, which would wait for the one writer SQLite allows if the first
    enqueue did it inside ``atomic()``. Once open, an enqueue writes through
    Django's connection and reads only (settings) through Conveyor's, which WAL
    lets run beside a writer. A database not migrated yet (``manage.py migrate``
    is itself connecting) is left for the first enqueue to report."""
    if connection.vendor != "sqlite":
        return
    from django.tasks import task_backends

    for alias in sorted(_backends_in.get(connection.alias, ())):
        try:
            task_backends[alias].app.connect()
        except Exception:
            pass
