"""MySQL's and MariaDB's SQL: the macros of the dialect, the named queries
(common.sql overridden by queries.sql, both with ``:name`` parameters), the
migrations. Below the notifier, the session and the backend, which all read it."""

from __future__ import annotations

from ..sql.loader import Dialect, load_migrations, load_queries

_NOW = "coalesce(CAST(%(now)s AS DATETIME(6)), UTC_TIMESTAMP(6))"
#: A change stamp: the writing transaction's number (see ``_change``), sent as a
#: parameter the backend adds to every statement that stamps.
_CHANGE = "%(change)s"
#: The first number that may still commit (see ``_horizon``), also a parameter.
_HORIZON = "%(horizon)s"


def _in(args: list[str]) -> str:
    # PyMySQL sends a tuple as "(a, b, ...)"; the backend sends (NULL) for an
    # empty list, which matches nothing (PostgreSQL: = ANY(array)).
    return f"IN {args[0]}"


DIALECT = Dialect(
    name="mysql",
    paramstyle="pyformat",
    macros={
        "NOW": lambda a: _NOW,
        # Whole microseconds: INTERVAL 1.5 SECOND would round to 2 seconds.
        # (an argument may hold commas: the loader split it, join it again)
        "NOW_PLUS": lambda a: f"({_NOW} + INTERVAL ROUND(({', '.join(a)}) * 1000000) MICROSECOND)",
        "NOW_MINUS": lambda a: f"({_NOW} - INTERVAL ROUND(({', '.join(a)}) * 1000000) MICROSECOND)",
        "SECONDS_SINCE": lambda a: f"(TIMESTAMPDIFF(MICROSECOND, {a[0]}, {_NOW}) / 1000000)",
        "IN": _in,
        "JSON": lambda a: a[0],
        "TS": lambda a: f"CAST({a[0]} AS DATETIME(6))",
        "FOR_UPDATE": lambda a: "FOR UPDATE",
        "INDEXED_BY": lambda a: "",  # the planner has statistics
        # The tables' collation is binary (exact keys): lower both sides.
        "ICONTAINS": lambda a: f"LOWER(CAST({a[0]} AS CHAR)) LIKE LOWER({a[1]})",
        "GREATEST": lambda a: f"GREATEST({', '.join(a)})",
        "CHANGE": lambda a: _CHANGE,
        "HORIZON": lambda a: _HORIZON,
        "CHANGED_AFTER": lambda a: (
            f"({a[0]} > CAST({a[2]} AS SIGNED)"
            f" OR ({a[0]} = CAST({a[2]} AS SIGNED) AND {a[1]} > {a[3]}))"
        ),
        "CHANGE_HORIZON": lambda a: f"{a[0]} < {_HORIZON}",
        "CHANGE_TEXT": lambda a: a[0],
    },
)
Q = load_queries(__package__ or "conveyor.backends.mysql", DIALECT, own_named=True)
MIGRATIONS = load_migrations(__package__ or "conveyor.backends.mysql")
