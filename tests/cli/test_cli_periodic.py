"""`conveyor periodic list`: an app's schedules and their next ticks."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta

import pytest

from conveyor.cli.periodic import next_tick
from conveyor.cron import Periodic, due_ticks

from .conftest import Invoke

CRON_APP = "tests.cli.cronapp:app"


def test_list(invoke: Invoke) -> None:
    # Reads only the app: no database is opened.
    table = invoke("periodic", "list", "--app", CRON_APP)
    assert table.exit_code == 0, table.output
    for text in (
        "nightly_report",
        "reports",
        "30 2 * * *",
        "Europe/Paris",
        "catch up 3",
        "refresh_rates",
        "*/5 * * * *",
        "skip (grace 60s)",
        "UTC",
    ):
        assert text in table.stdout

    before = datetime.now(UTC)
    rows = json.loads(invoke("periodic", "list", "--app", CRON_APP, "--json").stdout)
    assert [r["name"] for r in rows] == ["nightly_report", "refresh_rates"]
    nightly, rates = rows
    assert {k: nightly[k] for k in ("task", "queue", "cron", "timezone", "missed")} == {
        "task": "nightly_report",
        "queue": "reports",
        "cron": "30 2 * * *",
        "timezone": "Europe/Paris",
        "missed": "catch_up",
    }
    assert (nightly["catch_up"], nightly["args"], rates["grace_s"]) == (3, ["eu"], 60.0)

    local = datetime.fromisoformat(nightly["next_tick_local"])
    utc = datetime.fromisoformat(nightly["next_tick_utc"])
    assert (local.hour, local.minute) == (2, 30) and local == utc
    assert utc.utcoffset() == timedelta(0) and local.utcoffset() in (
        timedelta(hours=1),
        timedelta(hours=2),
    )
    assert before < utc <= before + timedelta(days=1, hours=1)
    tick = datetime.fromisoformat(rates["next_tick_utc"])
    assert tick.minute % 5 == 0 and tick.second == 0
    assert timedelta(0) < tick - before <= timedelta(minutes=5)
    assert 0 < rates["next_tick_in_s"] <= 300


def test_app_without_schedules(invoke: Invoke) -> None:
    result = invoke("periodic", "list", "--app", "tests.cli.cronapp:bare")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("no periodic tasks: tests.cli.cronapp:bare declares no")
    assert (
        json.loads(invoke("periodic", "list", "--app", "tests.cli.cronapp:bare", "--json").stdout)
        == []
    )


def test_needs_an_app(invoke: Invoke) -> None:
    result = invoke("periodic", "list")
    assert result.exit_code == 2 and "--app" in result.stderr


def test_status_counts_schedules(invoke: Invoke, db_url: str) -> None:
    invoke("migrate", url=db_url)
    table = invoke("status", "--app", CRON_APP, url=db_url)
    assert table.exit_code == 0, table.output
    assert f"periodic schedules: 2 (conveyor periodic list --app {CRON_APP})" in table.stdout
    assert (
        json.loads(invoke("status", "--app", CRON_APP, "--json", url=db_url).stdout)["periodics"]
        == 2
    )
    assert "periodic schedules" not in invoke("status", url=db_url).stdout


# Around both 2026 DST changes in Paris (29 March: 02:00 -> 03:00; 25 October: 03:00 -> 02:00).
NOWS = [
    datetime(2026, 3, 28, 23, 0, tzinfo=UTC),
    datetime(2026, 3, 29, 0, 59, tzinfo=UTC),
    datetime(2026, 10, 24, 23, 59, tzinfo=UTC),
    datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
    datetime(2026, 10, 25, 0, 45, tzinfo=UTC),
    datetime(2026, 10, 25, 1, 10, tzinfo=UTC),
]


@pytest.mark.parametrize("cron", ["30 2 * * *", "*/20 * * * *", "0 * * * *", "15 2 * * *"])
@pytest.mark.parametrize("now", NOWS, ids=lambda d: d.strftime("%m%d-%H%M"))
def test_next_tick_agrees_with_due_ticks(cron: str, now: datetime) -> None:
    """The next tick shown is the first tick the workers would enqueue after now."""
    p = Periodic(task="t", cron=cron, timezone="Europe/Paris")
    nxt = next_tick(p, now)
    assert nxt is not None and nxt > now and nxt.tzinfo == UTC
    # With a grace reaching back to just after `now`, due_ticks at `nxt` is exactly [nxt].
    window = dataclasses.replace(p, grace_s=(nxt - now).total_seconds() - 1e-3)
    assert due_ticks(window, nxt) == [nxt]


def test_next_tick_skips_the_repeated_hour_for_fixed_times() -> None:
    p = Periodic(task="t", cron="30 2 * * *", timezone="Europe/Paris")
    # 00:30 UTC on 25 October is 02:30 CEST, the first 02:30: the next one is a day later.
    first = datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    assert next_tick(p, first) == datetime(2026, 10, 26, 1, 30, tzinfo=UTC)
    wild = Periodic(task="t", cron="30 * * * *", timezone="Europe/Paris")
    assert next_tick(wild, first) == datetime(2026, 10, 25, 1, 30, tzinfo=UTC)


def test_next_tick_far_away() -> None:
    leap = Periodic(task="t", cron="0 0 29 2 *")  # only on 29 February
    assert next_tick(leap, datetime(2026, 1, 1, tzinfo=UTC)) == datetime(2028, 2, 29, tzinfo=UTC)
