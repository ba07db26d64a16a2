"""The long-running parts of a worker start and stop as often as they are asked
(a second start or stop changes nothing, a start after a stop runs the part
again), and their loops can be stepped once with the time passed in. Real
databases; a real, never-run ``Worker`` is the heartbeat's client."""

from __future__ import annotations

import logging
import threading

import pytest

from conveyor import Conveyor
from conveyor.records import WorkerInfo
from conveyor.runtime.heartbeat import BLOCKED_AFTER_S, HeartbeatService
from conveyor.runtime.listener import Listener
from conveyor.runtime.worker import Worker

from .helpers import wait_for


def _new_threads(before: set[threading.Thread], name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in before and t.name == name]


def _heartbeat(app: Conveyor, worker: Worker, interval: float) -> HeartbeatService:
    info = WorkerInfo(id=worker.id, hostname="here", pid=1, queues=["default"], concurrency=1)
    return HeartbeatService(app.backend, info, worker, interval=interval, worker_ttl_s=7.0)


def _registered(app: Conveyor, worker_id: str) -> bool:
    return any(w.id == worker_id for w in app.workers())


def test_the_heartbeat_starts_and_stops_as_often_as_asked(app):
    worker = Worker(app)
    beats = _heartbeat(app, worker, interval=0.05)
    before = set(threading.enumerate())
    beats.start()
    beats.start()
    assert len(_new_threads(before, "conveyor-heartbeat")) == 1
    assert len(_new_threads(before, "conveyor-loop-watch")) == 1
    wait_for(lambda: _registered(app, worker.id), what="the first beat")
    beats.stop()
    beats.stop()
    assert not _new_threads(before, "conveyor-heartbeat")
    assert not _new_threads(before, "conveyor-loop-watch")

    app.backend.worker_deregister(worker_id=worker.id)
    beats.start()  # again, after a stop
    try:
        wait_for(lambda: _registered(app, worker.id), what="a beat after the restart")
        assert beats.health().running
        assert len(_new_threads(before, "conveyor-loop-watch")) == 1
    finally:
        beats.stop()


def test_the_watchdog_steps_with_the_clock_passed_in(app, caplog: pytest.LogCaptureFixture):
    worker = Worker(app)  # not running: its event loop last ticked when it was made
    beats = _heartbeat(app, worker, interval=60.0)
    tick = worker.loop_tick()

    def said(text: str) -> int:
        return sum(text in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.WARNING, logger="conveyor.worker"):
        beats.watch(tick + BLOCKED_AFTER_S / 2)
        assert not caplog.records
        beats.watch(tick + BLOCKED_AFTER_S + 1)
        beats.watch(tick + BLOCKED_AFTER_S + 2)  # the same episode: said once
        assert said("the event loop has been blocked") == 1
        beats.watch(tick)  # the loop ticked again
        assert said("the event loop ran again") == 1

        # Past the worker's 7 s ttl without a beat: not yet (the database may be
        # out of reach for the leader too, which then judges nobody); past two ttls
        # its jobs are stopped, once.
        beats.watch(beats.last_ok + 8.0)
        assert said("no heartbeat reached the database") == 0
        beats.watch(beats.last_ok + 15.0)
        beats.watch(beats.last_ok + 16.0)
        assert said("no heartbeat reached the database for 15s") == 1


def test_the_listener_starts_and_stops_as_often_as_asked(app):
    @app.task
    def noop() -> None: ...

    woken = threading.Event()
    listener = Listener(
        lambda: app.backend.notifier(),
        ["default"],
        on_work=woken.set,
        on_flow=lambda: None,
        on_cancel=lambda: None,
        me="me",
    )
    before = set(threading.enumerate())
    listener.start()
    listener.start()
    assert len(_new_threads(before, "conveyor-listen")) == 1
    listener.stop()
    listener.stop()
    assert not _new_threads(before, "conveyor-listen")

    listener.start()  # again, after a stop
    try:
        assert listener.health().running
        # hints may be lost: send until one arrives
        wait_for(lambda: noop.send() and woken.wait(0.5), what="a hint after the restart")
    finally:
        listener.stop()
