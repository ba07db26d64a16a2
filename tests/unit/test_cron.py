"""Which ticks of a cron schedule are due: pure, no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from conveyor import BadArguments, ConfigError, Conveyor
from conveyor.cron import MAX_TICKS, Periodic, due_ticks, tick_key
from conveyor.registry import user_tasks

PARIS = ZoneInfo("Europe/Paris")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def paris(ticks: list[datetime]) -> list[str]:
    return [t.astimezone(PARIS).isoformat() for t in ticks]


def test_skip_enqueues_the_tick_while_it_is_within_grace():
    p = Periodic("report", "*/5 * * * *")
    assert p.missed == "skip" and p.grace_s == 60 and p.name == "report"
    assert due_ticks(p, utc(2024, 1, 1, 12, 5)) == [utc(2024, 1, 1, 12, 5)]  # exactly on it
    assert due_ticks(p, utc(2024, 1, 1, 12, 5, 59)) == [utc(2024, 1, 1, 12, 5)]
    assert due_ticks(p, utc(2024, 1, 1, 12, 6)) == [utc(2024, 1, 1, 12, 5)]  # 60 s: still in
    assert due_ticks(p, utc(2024, 1, 1, 12, 6, 1)) == []  # too late: skipped
    assert due_ticks(p, utc(2024, 1, 1, 12, 4, 59)) == []  # never a future tick


def test_skip_returns_every_tick_within_grace_so_a_short_pause_loses_none():
    p = Periodic("t", "* * * * * *", grace_s=3)  # every second (6th field: seconds)
    assert due_ticks(p, utc(2024, 1, 1, 0, 0, 10)) == [
        utc(2024, 1, 1, 0, 0, s) for s in (7, 8, 9, 10)
    ]
    assert due_ticks(p, utc(2024, 1, 1, 0, 0, 10) + timedelta(microseconds=500)) == [
        utc(2024, 1, 1, 0, 0, s) for s in (8, 9, 10)
    ]
    big = Periodic("t", "* * * * * *", grace_s=10 * MAX_TICKS)
    assert len(due_ticks(big, utc(2024, 1, 1))) == MAX_TICKS  # bounded


def test_catch_up_returns_the_n_most_recent_ticks_however_old():
    p = Periodic("t", "0 * * * *", catch_up=3)
    assert p.missed == "catch_up"
    now = utc(2024, 1, 2, 12, 30)
    assert due_ticks(p, now) == [utc(2024, 1, 2, h) for h in (10, 11, 12)]
    # with a horizon (the service's retention guard), older ticks are left out
    assert due_ticks(p, now, max_age_s=5400) == [utc(2024, 1, 2, h) for h in (11, 12)]
    assert due_ticks(Periodic("t", "0 * * * *", missed="catch_up", catch_up=1), now) == [
        utc(2024, 1, 2, 12)
    ]


def test_timezone_is_the_wall_clock_of_the_schedule():
    p = Periodic("t", "0 9 * * *", timezone="Europe/Paris", catch_up=2)
    # 09:00 in Paris is 08:00 UTC in winter and 07:00 UTC in summer
    assert due_ticks(p, utc(2024, 1, 10, 12)) == [utc(2024, 1, 9, 8), utc(2024, 1, 10, 8)]
    assert due_ticks(p, utc(2024, 7, 10, 12)) == [utc(2024, 7, 9, 7), utc(2024, 7, 10, 7)]


def test_dst_spring_forward_runs_a_missing_time_at_the_next_existing_minute():
    # 2024-03-31: Paris clocks jump from 02:00 to 03:00, so 02:30 does not exist
    p = Periodic("t", "30 2 * * *", timezone="Europe/Paris", catch_up=3)
    assert paris(due_ticks(p, utc(2024, 4, 1, 12))) == [
        "2024-03-30T02:30:00+01:00",
        "2024-03-31T03:00:00+02:00",
        "2024-04-01T02:30:00+02:00",
    ]
    every_30 = Periodic("t", "*/30 * * * *", timezone="Europe/Paris", grace_s=2 * 3600)
    assert paris(due_ticks(every_30, utc(2024, 3, 31, 1, 30))) == [
        "2024-03-31T00:30:00+01:00",
        "2024-03-31T01:00:00+01:00",
        "2024-03-31T01:30:00+01:00",
        "2024-03-31T03:00:00+02:00",  # 30 minutes after 01:30 in real time
        "2024-03-31T03:30:00+02:00",
    ]


def test_dst_fall_back_fixed_time_runs_once_and_wildcards_keep_their_pace():
    # 2024-10-27: Paris clocks go back from 03:00 to 02:00, so 02:00-02:59 happens twice
    daily = Periodic("t", "30 2 * * *", timezone="Europe/Paris", catch_up=3)
    assert paris(due_ticks(daily, utc(2024, 10, 28, 12))) == [
        "2024-10-26T02:30:00+02:00",
        "2024-10-27T02:30:00+02:00",  # the first 02:30 only, not the second one
        "2024-10-28T02:30:00+01:00",
    ]
    hourly = Periodic("t", "0 * * * *", timezone="Europe/Paris", grace_s=4 * 3600)
    ticks = due_ticks(hourly, utc(2024, 10, 27, 3))
    assert paris(ticks) == [
        "2024-10-27T01:00:00+02:00",
        "2024-10-27T02:00:00+02:00",
        "2024-10-27T02:00:00+01:00",  # an hour later in real time: its own tick
        "2024-10-27T03:00:00+01:00",
        "2024-10-27T04:00:00+01:00",
    ]
    assert [b - a for a, b in pairwise(ticks)] == [timedelta(hours=1)] * 4
    assert len({tick_key(hourly, t) for t in ticks}) == 5  # the two 02:00s: two keys


def test_tick_key_is_stable_and_in_utc():
    p = Periodic("t", "0 9 * * *", timezone="Europe/Paris", name="morning")
    tick = datetime(2024, 1, 10, 9, tzinfo=PARIS)
    assert tick_key(p, tick) == "conveyor:cron:morning:2024-01-10T08:00:00+00:00"
    assert tick_key(p, tick.astimezone(UTC)) == tick_key(p, tick)


def test_naive_now_is_utc():
    p = Periodic("t", "0 * * * *")
    assert due_ticks(p, datetime(2024, 1, 1, 12, 0, 30)) == [utc(2024, 1, 1, 12)]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("61 * * * *", "bad cron expression '61 \\* \\* \\* \\*'.*5 fields"),
        ("every five minutes", "bad cron expression"),
        ("* * *", "5 fields"),
        ("", "bad cron expression"),
        ("0 0 31 2 *", "never fires"),
    ],
)
def test_bad_cron_expression_says_what_to_fix(expr, message):
    with pytest.raises(ConfigError, match=message):
        Periodic("t", expr)


@pytest.mark.parametrize("tz", ["Europe/Pariss", "Mars/Olympus", "", "../etc/passwd"])
def test_unknown_timezone_says_what_to_fix(tz):
    with pytest.raises(ConfigError, match=r"timezone.*IANA time zone name"):
        Periodic("t", "* * * * *", timezone=tz)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"catch_up": 0}, "catch_up must be"),
        ({"catch_up": MAX_TICKS + 1}, "catch_up must be"),
        ({"missed": "catch_up"}, "catch_up must be"),
        ({"missed": "run_all"}, "missed must be 'skip'"),
        ({"grace_s": 0}, "grace_s must be"),
        ({"args": "abc"}, "args must be a tuple"),
    ],
)
def test_bad_policy_options_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        Periodic("t", "* * * * *", **options)


def test_app_periodic_registers_a_task_and_a_schedule(tmp_path):
    app = Conveyor(f"sqlite:///{tmp_path}/c.db")  # never opened: nothing here needs it

    @app.periodic("*/5 * * * *", timezone="Europe/Paris", args=(3,), queue="cron")
    def report(n):
        return n

    assert app.tasks["report"] is report and report.defaults.queue == "cron"
    p = app.periodics["report"]
    assert (p.task, p.cron, p.timezone, p.args, p.missed) == (
        report,
        "*/5 * * * *",
        "Europe/Paris",
        (3,),
        "skip",
    )
    # an existing task may get a second schedule under another name
    app.periodic("0 0 * * *", name="report-nightly", args=(9,))(report)
    assert app.periodics["report-nightly"].task is report
    with pytest.raises(ConfigError, match="already registered"):
        app.periodic("0 0 * * *", args=(1,))(report)  # the name "report" is taken
    with pytest.raises(ConfigError, match=r"pass its options to @app\.task"):
        app.periodic("0 0 * * *", name="x", queue="q")(report)


def test_app_periodic_refuses_bad_schedules_and_arguments_before_registering(tmp_path):
    app = Conveyor(f"sqlite:///{tmp_path}/c.db")
    with pytest.raises(ConfigError, match="unknown timezone"):

        @app.periodic("* * * * *", timezone="Nowhere/Land")
        def a():
            pass

    with pytest.raises(BadArguments, match="bad arguments for task 'b'"):

        @app.periodic("* * * * *", args=(1, 2))
        def b(x):
            pass

    assert user_tasks(app.tasks) == [] and app.periodics == {}
