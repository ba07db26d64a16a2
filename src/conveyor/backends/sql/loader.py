"""Named queries and numbered migrations kept as ``.sql`` files.

A query file is a sequence of blocks, each introduced by ``-- name: <name>``;
comments before the SQL explain why the query is shaped as it is. A block
introduced by ``-- fragment: <name>`` is no query: it is text that queries of the
same file share, written once and placed where a query says
``{FRAGMENT(<name>)}`` (at load, before anything else, as if written there).

``backends/sql/common.sql`` holds the queries every dialect runs as they are. It
is written with ``:name`` parameters and a few macros for what truly differs
between databases; a dialect's own ``queries.sql`` (in its native parameter
style) overrides any of them and adds its own. Macros, expanded once at load:

``{NOW}``                 the statement's time (the ``now`` parameter, or the server clock)
``{NOW_PLUS(x)}``         that time plus ``x`` seconds (``{NOW_MINUS(x)}``: minus)
``{SECONDS_SINCE(col)}``  seconds from ``col`` to that time
``{IN(:p)}``              membership in the list parameter ``p`` (``{IN(:p, bigint)}``)
``{JSON(:p)}``            a parameter stored in a JSON column
``{TS(:p)}``              a timestamp parameter
``{FOR_UPDATE}``          row locks for read-then-write (nothing where the
                          transaction holds the only write lock already)
``{INDEXED_BY(index)}``    after a table name: plan through that index (SQLite, which has
                          no statistics to choose between two partial indexes)
``{ICONTAINS(col, :p)}``  ``col`` contains the text of ``p``, ignoring case
``{CHANGE}``              the change stamp of the statement's transaction (events)
``{CHANGED_AFTER(c, id, :c, :id)}``  the row's (stamp, id) comes after a cursor
``{CHANGE_HORIZON(c)}``   the stamp belongs to a transaction no earlier one can follow
``{CHANGE_TEXT(c)}``      a stamp as the client reads it

Slots filled per call (``{FILTER}``) are left for the backend.
Migrations are ``migrations/NNNN_<what>.sql``, applied in order.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources

_BLOCK = re.compile(r"^--\s*(name|fragment):\s*(\w+)\s*$", re.MULTILINE)
_USE_FRAGMENT = re.compile(r"\{FRAGMENT\((\w+)\)\}")
_MACRO = re.compile(r"\{([A-Z_]+)(?:\(([^{}]*)\))?\}")
#: slots the backend fills per call, not at load
SLOTS = frozenset({"FILTER"})

Macro = Callable[[list[str]], str]


@dataclass(frozen=True)
class Dialect:
    """How a database differs in the SQL we write: its parameter style and macros."""

    name: str
    #: "named" (:name, sqlite3) or "pyformat" (%(name)s, psycopg and PyMySQL)
    paramstyle: str
    macros: Mapping[str, Macro]

    def param(self, name: str) -> str:
        return f"%({name})s" if self.paramstyle == "pyformat" else f":{name}"

    def expand(self, sql: str) -> str:
        """Replace macros; leave runtime slots alone."""

        def one(m: re.Match[str]) -> str:
            name, raw = m.group(1), m.group(2)
            if name in SLOTS:
                return m.group(0)
            if name not in self.macros:
                raise ValueError(f"unknown SQL macro {{{name}}} for {self.name}")
            args = [a.strip() for a in raw.split(",")] if raw is not None else []
            args = [self.param(a[1:]) if a.startswith(":") else a for a in args]
            return self.macros[name](args)

        # Macros may nest ({NOW_PLUS(x)} uses {NOW}): expand until nothing changes.
        for _ in range(5):
            expanded = _MACRO.sub(one, sql)
            if expanded == sql:
                return expanded
            sql = expanded
        return sql


def _split(text: str, where: str) -> dict[str, str]:
    parts = _BLOCK.split(text)
    blocks: dict[str, dict[str, str]] = {"name": {}, "fragment": {}}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        if name in blocks[kind]:
            what = "query" if kind == "name" else kind
            raise ValueError(f"{where}: {what} {name!r} defined twice")
        blocks[kind][name] = body
    fragments = blocks["fragment"]

    def fragment(m: re.Match[str]) -> str:
        if m.group(1) not in fragments:
            raise ValueError(f"{where}: no fragment {m.group(1)!r}")
        return fragments[m.group(1)]

    return {
        name: _clean(_USE_FRAGMENT.sub(fragment, body)) for name, body in blocks["name"].items()
    }


def _clean(body: str) -> str:
    # Without comment lines and indentation: psycopg caches the conversion of a
    # query text only up to 4 KB, and the hot statements must stay under it.
    sql = "\n".join(
        ln.strip() for ln in body.splitlines() if ln.strip() and not ln.lstrip().startswith("--")
    )
    return sql.strip().rstrip(";")


def to_pyformat(sql: str) -> str:
    """``:name`` parameters to ``%(name)s``, doubling literal ``%``; text inside
    quotes and ``::`` casts are left alone."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c == "'":
            j = sql.index("'", i + 1)
            while j + 1 < n and sql[j + 1] == "'":  # '' is an escaped quote
                j = sql.index("'", j + 2)
            out.append(sql[i : j + 1].replace("%", "%%"))
            i = j + 1
        elif c == "%":
            out.append("%%")
            i += 1
        elif c == ":" and i + 1 < n and sql[i + 1] == ":":
            out.append("::")
            i += 2
        elif c == ":" and i + 1 < n and (sql[i + 1].isalpha() or sql[i + 1] == "_"):
            m = re.match(r"[A-Za-z_]\w*", sql[i + 1 :])
            assert m is not None
            out.append(f"%({m.group(0)})s")
            i += 1 + m.end(0)
        else:
            out.append(c)
            i += 1
    return "".join(out)


def load_queries(package: str, dialect: Dialect, *, own_named: bool = False) -> dict[str, str]:
    """The shared queries, in ``dialect``'s parameter style, overridden and extended
    by ``package``'s own ``queries.sql``; macros expanded. ``own_named``: the
    dialect's own file is written with ``:name`` parameters too (MySQL)."""
    common_text = resources.files(__package__ or "conveyor.backends.sql")
    common = _split(common_text.joinpath("common.sql").read_text("utf-8"), "common.sql")
    if dialect.paramstyle == "pyformat":
        common = {k: to_pyformat(v) for k, v in common.items()}
    own_text = resources.files(package).joinpath("queries.sql").read_text("utf-8")
    own = _split(own_text, f"{package}/queries.sql")
    if own_named and dialect.paramstyle == "pyformat":
        own = {k: to_pyformat(v) for k, v in own.items()}
    return {name: dialect.expand(sql) for name, sql in {**common, **own}.items()}


def shared_query_names() -> set[str]:
    text = resources.files(__package__ or "conveyor.backends.sql").joinpath("common.sql")
    return set(_split(text.read_text("utf-8"), "common.sql"))


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
    """Split a migration into statements at top-level ``;``: not inside quotes, a
    dollar-quoted body (``$$ ... $$``, PostgreSQL functions), or a trigger body
    (``CREATE TRIGGER ... BEGIN ...; END;``, SQLite and MySQL; MySQL's ``CREATE
    PROCEDURE ... BEGIN ...; END;`` too, whose body holds no other BEGIN and no
    statement that ends in END but the last)."""
    lines = [ln for ln in sql.splitlines() if not ln.lstrip().startswith("--")]
    text = "\n".join(lines)
    out: list[str] = []
    start = i = 0
    quote: str | None = None  # "'" or a dollar tag
    while i < len(text):
        c = text[i]
        if quote is not None:
            if text.startswith(quote, i):
                i += len(quote)
                quote = None
                continue
            i += 1
            continue
        if c == "'":
            quote = "'"
        elif c == "$":
            m = re.match(r"\$\w*\$", text[i:])
            if m:
                quote = m.group(0)
                i += len(quote)
                continue
        elif c == ";":
            stmt = text[start:i].strip()
            trigger = re.match(
                r"CREATE\s+(?:TRIGGER|PROCEDURE)\b", stmt, re.IGNORECASE
            ) and re.search(r"\bBEGIN\b", stmt, re.IGNORECASE)
            if not trigger or re.search(r"\bEND\s*$", stmt, re.IGNORECASE):
                if stmt:
                    out.append(stmt)
                start = i + 1
        i += 1
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out
