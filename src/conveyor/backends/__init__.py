"""Choose a backend from a database URL."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from ..errors import ConfigError
from .interfaces import Backend

SUPPORTED = (
    "sqlite:///path/to/file.db, postgresql://user@host:5432/dbname "
    "or mysql://user:pass@host:3306/dbname"
)


def open_backend(url: str) -> Backend:
    """``sqlite:///relative.db``, ``sqlite:////absolute.db`` (``?synchronous=normal``),
    ``postgresql://`` / ``postgres://`` URLs as libpq understands them (behind a
    pooler in transaction mode such as PgBouncer's, with ``?pooler=transaction``
    and optionally ``&listen_url=...``: see PostgresBackend), or
    ``mysql://user:pass@host:3306/db`` / ``mariadb://`` (MySQL 8.0+, MariaDB 10.6+)."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"database URL is empty: expected {SUPPORTED}")
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in ("postgresql", "postgres"):
        from .postgres.backend import PostgresBackend

        return PostgresBackend(url)
    if scheme in ("mysql", "mariadb"):
        from .mysql.backend import MySQLBackend

        return MySQLBackend(url)
    if scheme == "sqlite":
        parts = urlsplit(url)
        path = sqlite_file(url) or ""
        options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(options) - {"synchronous", "busy_timeout"}
        if unknown:
            raise ConfigError(
                f"unknown SQLite URL option(s) {sorted(unknown)}: the options are "
                "'synchronous' (off, normal, full, extra) and 'busy_timeout' (seconds)"
            )
        try:
            busy = float(options.get("busy_timeout", 30))
        except ValueError:
            busy = -1.0
        if not 0 < busy <= 3600:
            raise ConfigError(
                f"busy_timeout must be seconds between 0 and 3600, got {options['busy_timeout']!r}"
            )
        from .sqlite.backend import SQLiteBackend

        return SQLiteBackend(
            path, synchronous=options.get("synchronous", "full"), busy_timeout_s=busy
        )
    raise ConfigError(f"unsupported database URL {url!r}: expected {SUPPORTED}")


def sqlite_file(url: str) -> str | None:
    """The file a ``sqlite:`` URL names, as given (relative to the working
    directory, or absolute); None for another kind of URL."""
    if not isinstance(url, str) or not url.lower().startswith("sqlite:"):
        return None
    parts = urlsplit(url)
    if parts.netloc:
        raise ConfigError(
            f"malformed SQLite URL {url!r}: use three slashes for a relative path "
            "(sqlite:///conveyor.db) or four for an absolute one (sqlite:////var/lib/app.db)"
        )
    return parts.path[1:] if parts.path.startswith("/") else parts.path
