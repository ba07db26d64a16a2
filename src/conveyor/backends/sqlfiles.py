"""Named queries and numbered migrations kept as ``.sql`` files beside each dialect.

A query file is a sequence of blocks, each introduced by ``-- name: <name>``;
comments before the SQL explain why the query is shaped as it is.
Migrations are ``migrations/NNNN_<what>.sql``, applied in order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def load_queries(package: str, filename: str = "queries.sql") -> dict[str, str]:
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"{package}/{filename}: query {name!r} defined twice")
        sql = "\n".join(ln for ln in body.splitlines() if not ln.lstrip().startswith("--"))
        queries[name] = sql.strip().rstrip(";")
    return queries


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations(package: str) -> list[Migration]:
    folder = resources.files(package).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        m = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda mig: mig.version)
    versions = [mig.version for mig in found]
    if versions != list(range(1, len(found) + 1)):
        raise ValueError(
            f"{package}: migrations must be numbered 1..n without gaps, got {versions}"
        )
    return found


def split_statements(sql: str) -> list[str]:
    """Split a migration into statements (our migrations contain no ``;`` in literals)."""
    cleaned = "\n".join(ln for ln in sql.splitlines() if not ln.lstrip().startswith("--"))
    return [s.strip() for s in cleaned.split(";") if s.strip()]
