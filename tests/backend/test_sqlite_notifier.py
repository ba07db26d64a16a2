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
