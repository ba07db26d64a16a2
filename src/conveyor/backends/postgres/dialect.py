"""PostgreSQL's SQL: the macros of its dialect, its named queries (common.sql
overridden by queries.sql), its migrations, and the statements made from them
once at import (the limited claim's function, the keyless bulk insert).

Below the session, the notifier and the backend, which all read it."""

from __future__ import annotations

import re

from ..sql.loader import Dialect, load_migrations, load_queries

_NOW = "coalesce(%(now)s::timestamptz, now())"
DIALECT = Dialect(
    name="postgresql",
    paramstyle="pyformat",
    macros={
        "NOW": lambda a: _NOW,
        "NOW_PLUS": lambda a: f"({_NOW} + make_interval(secs => {a[0]}))",
        "NOW_MINUS": lambda a: f"({_NOW} - make_interval(secs => {a[0]}))",
        "SECONDS_SINCE": lambda a: f"extract(epoch FROM {_NOW} - {a[0]})",
        "IN": lambda a: f"= ANY({a[0]}::{a[1] if len(a) > 1 else 'text'}[])",
        "JSON": lambda a: f"{a[0]}::jsonb",
        "TS": lambda a: f"{a[0]}::timestamptz",
        "FOR_UPDATE": lambda a: "FOR UPDATE",
        "INDEXED_BY": lambda a: "",  # the planner has statistics
        "ICONTAINS": lambda a: f"{a[0]}::text ILIKE {a[1]}",
        "GREATEST": lambda a: f"greatest({', '.join(a)})",
        # The writing transaction's id: event streams read changes in this order, up
        # to the oldest transaction still running, so none is skipped (events.py).
        "CHANGE": lambda a: "pg_current_xact_id()",
        "CHANGED_AFTER": lambda a: f"({a[0]}, {a[1]}) > ({a[2]}::text::xid8, {a[3]})",
        "CHANGE_HORIZON": lambda a: f"{a[0]} < pg_snapshot_xmin(pg_current_snapshot())",
        "CHANGE_TEXT": lambda a: f"{a[0]}::text",
        # Not finished: the live partition, by a constant the planner prunes the
        # finished ones by (schema v17; "Live" at the top of queries.sql).
        "UNFINISHED": lambda a: f"{a[0]}.state NOT IN ('succeeded', 'failed', 'cancelled')",
        # How a claim commits (job_claim): without waiting for its WAL, unless a
        # synchronous standby is configured, which a failover would promote.
        "CLAIM_COMMIT": lambda a: (
            "CASE WHEN current_setting('synchronous_standby_names') = '' THEN 'off'"
            " ELSE current_setting('synchronous_commit') END"
        ),
    },
)
Q = load_queries(__package__ or "conveyor.backends.postgres", DIALECT)

_FRAGMENT = re.compile(r"\{\{(\w+)((?:\s+\w+=[^\s}]+)*)\s*\}\}")
_PARAM = re.compile(r"%\((\w+)\)[sb]")


def plpgsql(template: str, queries: dict[str, str]) -> str:
    """A function made of named statements (see job_claim_limited_function): each
    ``{{name}}`` becomes that statement, its ``%(p)s`` parameters the function's
    ``p_p``, or what the slot gives (``{{name p=expression}}``)."""

    def fragment(m: re.Match[str]) -> str:
        given = dict(arg.split("=", 1) for arg in m.group(2).split())
        sql = _PARAM.sub(lambda p: given.get(p.group(1), f"p_{p.group(1)}"), queries[m.group(1)])
        return f"\n{sql}\n"  # on lines of its own: a statement may end in a comment

    made = _FRAGMENT.sub(fragment, template)
    if "%" in made:  # sent without parameters, so a %% would reach the server as is
        raise ValueError(f"a parameter or a % left in the function: {made!r}")
    return made


#: the session's functions for limited claims, made on a connection's first one
CLAIM_LIMITED_FUNCTION = (
    plpgsql(Q["job_claim_limited_function"], Q) + ";\n" + plpgsql(Q["queue_room_function"], Q)
)
MIGRATIONS = load_migrations(__package__ or "conveyor.backends.postgres")
#: work hints: queue names, "@flow", "@cancel"
CHANNEL = "conveyor_jobs"
#: change hints for waiters and event streams ("done")
EVENTS = "conveyor_events"


def _keyless(sql: str) -> str:
    """job_insert_many for jobs without keys: no row can conflict, and ON CONFLICT
    checking costs ~10% of a bulk insert; no idempotency key to look for in every
    partition either."""
    held = re.search(r"\), held AS \(.*?(?=\), ins AS \()", sql, re.S)
    kept = (
        "WHERE v.idempotency_key IS NULL"
        " OR v.idempotency_key NOT IN (SELECT idempotency_key FROM held)\n"
    )
    if held is None or kept not in sql or "ON CONFLICT DO NOTHING" not in sql:
        raise RuntimeError("job_insert_many lost its held CTE or ON CONFLICT clause")
    return sql.replace(held.group(0), "").replace(kept, "").replace("ON CONFLICT DO NOTHING", "")


KEYLESS_INSERT = _keyless(Q["job_insert_many"])


def _queue_limited(sql: str) -> str:
    """job_claim in one queue under a queue limit alone: sized by the room its
    function leaves (queue_room_function), evaluated once, before any job is
    locked (a materialized CTE, read by the LIMITs' initplans)."""
    head = "WITH t AS ("
    if not sql.startswith(head) or sql.count("LIMIT %(limit)s") != 2:
        raise RuntimeError("job_claim lost its head or its two LIMITs")
    room = (
        "WITH room AS MATERIALIZED (SELECT pg_temp.conveyor_queue_room("
        "%(queue)s::text, %(max_running)s::bigint, %(limit)s::bigint) AS n), t AS ("
    )
    return room + sql[len(head) :].replace("LIMIT %(limit)s", "LIMIT (SELECT n FROM room)")


#: job_claim_queue_limited (see queue_room_function)
QUEUE_LIMITED_CLAIM = _queue_limited(Q["job_claim"])
