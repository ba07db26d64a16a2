"""SQLite's change hints (no LISTEN: ``PRAGMA data_version`` polled): fast while
the file changes, so a busy worker notices new work within a poll of 2 ms; slow
once it has been quiet a while, so an idle worker costs little; and a change is
noticed either way."""

from __future__ import annotations

import time

import pytest

from conveyor.backends.sqlite.backend import SQLiteBackend, SQLiteNotifier

from .helpers import ins


@pytest.fixture
def sqlite_backend(tmp_path):
    backend = SQLiteBackend(str(tmp_path / "n.db"))
    backend.migrate()
    yield backend
    backend.close()


def _counting(notifier: SQLiteNotifier) -> list[int]:
    polls = [0]
    version = notifier._version

    def counted() -> int:
        polls[0] += 1
        return version()

    notifier._version = counted  # type: ignore[method-assign]
    return polls


def test_polls_fast_while_the_file_changes_and_slowly_once_quiet(sqlite_backend):
    notifier = SQLiteNotifier(sqlite_backend, interval=0.002, idle_interval=0.25, idle_after=0.3)
    polls = _counting(notifier)
    try:
        assert notifier.wait(0.2) == set()  # made just now: counts as a change
        assert polls[0] >= 10, f"only {polls[0]} polls in 0.2 s at a 2 ms interval"
        time.sleep(0.3)  # quiet for longer than idle_after
        polls[0] = 0
        assert notifier.wait(0.5) == set()
        assert polls[0] <= 4, f"{polls[0]} polls in 0.5 s at a 250 ms interval"
        # a change is noticed while quiet, and makes the notifier fast again
        sqlite_backend.job_insert_many(jobs=[ins()])
        assert notifier.wait(2.0) == {"*"}
        polls[0] = 0
        assert notifier.wait(0.2) == set()
        assert polls[0] >= 10
    finally:
        notifier.close()


def test_polls_slowly_while_its_worker_is_busy_and_at_once_when_it_waits(sqlite_backend):
    """pace(False): the worker claims full batches without hints, so the notifier
    polls every busy_interval; pace(True) wakes it, and the change made meanwhile
    is noticed at once, not a busy_interval later."""
    import threading

    notifier = SQLiteNotifier(sqlite_backend, interval=0.002, busy_interval=30.0)
    polls = _counting(notifier)
    got: list[set[str]] = []
    try:
        notifier.pace(False)
        waiting = threading.Thread(target=lambda: got.append(notifier.wait(20.0)))
        waiting.start()
        time.sleep(0.1)
        sqlite_backend.job_insert_many(jobs=[ins()])
        time.sleep(0.3)
        assert got == [] and polls[0] == 1  # the first look only, before the change
        notifier.pace(True)
        waiting.join(10.0)
        assert got == [{"*"}]
        polls[0] = 0
        assert notifier.wait(0.2) == set()  # eager: fast again
        assert polls[0] >= 10
        # close() ends a busy wait too
        notifier.pace(False)
        waiting = threading.Thread(target=lambda: got.append(notifier.wait(20.0)))
        waiting.start()
        time.sleep(0.1)
    finally:
        notifier.close()
    waiting.join(10.0)
    assert not waiting.is_alive() and got[-1] == set()
