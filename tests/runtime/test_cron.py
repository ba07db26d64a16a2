"""Periodic tasks on both backends: one job per tick however many workers enqueue it."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from itertools import pairwise

from conveyor import Conveyor, current_job
from conveyor.runtime.cron_service import CronService

from .helpers import Running, wait_for

T0 = datetime(2024, 5, 6, 10, 0, 5, tzinfo=UTC)


def schedule(app: Conveyor, *, since: datetime | None = T0 - timedelta(days=1), **options) -> None:
    """What every worker process would import: the same periodic on its own app,
    first seen by the cluster at ``since``."""
    options.setdefault("name", "sweep")
    if since is not None:
        app.backend.cron_first_seen(names=[options["name"]], now=since)

    @app.periodic(options.pop("cron", "*/15 * * * *"), args=("all",), **options)
    def sweep(scope):
        return scope


def keys(app: Conveyor, name: str = "sweep") -> list[str]:
    return sorted(j.idempotency_key or "" for j in app.list_jobs(task=name, limit=500))


def race(services: list[CronService], at: datetime) -> list[int]:
    """Step every service at once, each on its own thread; the jobs each created."""
    barrier = threading.Barrier(len(services))
    created: list[int] = []
    errors: list[BaseException] = []

    def run(service: CronService) -> None:
        try:
            barrier.wait(5)
            created.append(service.step(at))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in services]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert errors == []
    return created


def test_three_workers_stepping_the_same_instant_make_one_job_per_tick(app, db_url):
    others = [Conveyor(db_url), Conveyor(db_url)]
    try:
        apps = [app, *others]
        for a in apps:
            schedule(a, grace_s=21 * 60)  # ticks up to 21 minutes late still run
        services = [CronService(a) for a in apps]
        now = T0 + timedelta(minutes=5)  # 10:05:05: ticks 09:45 and 10:00 are within grace
        assert [s.step(now) for s in services] == [2, 0, 0]
        assert [s.step(now) for s in services] == [0, 0, 0]
        assert keys(app) == [
            "conveyor:cron:sweep:2024-05-06T09:45:00+00:00",
            "conveyor:cron:sweep:2024-05-06T10:00:00+00:00",
        ]
        job = app.get_job(app.list_jobs(task="sweep")[0].id)
        assert (job.args, job.state.value, job.queue) == (["all"], "available", "default")

        # real threads racing, each with its own app (its own connections), round after
        # round: at hh:05:05 the ticks hh-1:45 and hh:00 are new
        fresh = [CronService(a) for a in apps]
        for hour in range(1, 6):
            created = race(fresh, now + timedelta(hours=hour))
            assert sum(created) == 2 and len(created) == 3
        assert len(keys(app)) == 2 + 5 * 2 == len(set(keys(app)))
    finally:
        for a in others:
            a.close()


def test_catch_up_after_downtime_enqueues_at_most_n_missed_ticks(app):
    schedule(app, cron="0 * * * *", name="hourly-catch-up", catch_up=3)
    schedule(app, cron="0 * * * *", name="hourly-skip")  # default: skip, grace 60 s
    service = CronService(app)
    # first pass at 10:00:05: catch-up takes the 3 most recent ticks, skip the current one
    assert service.step(T0) == 3 + 1
    assert service.step(T0 + timedelta(seconds=30)) == 0
    # everything down from 10:01 to 20:10: ten ticks missed
    back = T0 + timedelta(hours=10, minutes=10)
    assert service.step(back) == 3  # 18:00, 19:00, 20:00 for catch-up; skip: too late
    hours = [int(k.split("T")[1][:2]) for k in keys(app, "hourly-catch-up")]
    assert hours == [8, 9, 10, 18, 19, 20]
    assert keys(app, "hourly-skip") == ["conveyor:cron:hourly-skip:2024-05-06T10:00:00+00:00"]
    # another worker that never saw any of it agrees: nothing new to enqueue
    assert CronService(app).step(back) == 0
    # back to normal: the 21:00 tick, once per periodic
    assert service.step(T0.replace(hour=21)) == 2


def test_a_new_schedule_runs_no_tick_from_before_it_existed(app):
    schedule(app, cron="* * * * *", name="fresh", since=None)  # deployed at 10:00:05
    service = CronService(app)
    assert service.step(T0) == 0  # the 10:00:00 tick is 5 s old, but predates it
    assert service.step(T0 + timedelta(seconds=56)) == 1  # 10:01:00
    assert keys(app, "fresh") == ["conveyor:cron:fresh:2024-05-06T10:01:00+00:00"]
    # a worker started later (a restart) still catches a tick missed within grace
    assert CronService(app).step(T0 + timedelta(minutes=2, seconds=30)) == 1


def test_catch_up_never_reaches_past_retention(db_url):
    # a tick older than the retention of finished jobs may have lost its job (and
    # its key) to pruning: enqueuing it again would run it twice, so it is left out
    with Conveyor(db_url, retention={"succeeded": 5000}) as app:
        schedule(app, cron="0 * * * *", catch_up=5)
        assert CronService(app).horizon_s() == 5000
        assert CronService(app).step(T0.replace(minute=30)) == 1  # 10:00 only, not 09:00


def test_a_real_worker_runs_a_periodic_task_every_second(app):
    ran: list[str] = []

    @app.periodic("* * * * * *", grace_s=2)  # 6 fields: the last one is seconds
    def tick():
        ran.append(current_job().idempotency_key)

    started = datetime.now(UTC)
    with Running(app, concurrency=4), Running(app, concurrency=4):  # two workers
        wait_for(lambda: len(ran) >= 6, timeout=15, what="6 runs of the periodic task")
    assert len(ran) == len(set(ran))  # no tick ran twice
    jobs = app.list_jobs(task="tick", limit=500)
    ticks = sorted(datetime.fromisoformat(j.idempotency_key.split(":", 3)[3]) for j in jobs)
    assert len(ticks) == len(jobs) >= 6
    assert ticks[0] >= started - timedelta(seconds=3)  # at most grace_s late at start
    assert ticks[-1] - started >= timedelta(seconds=2)  # and then live, tick after tick
    # consecutive seconds, with no gap and no duplicate
    assert all(b - a == timedelta(seconds=1) for a, b in pairwise(ticks))
