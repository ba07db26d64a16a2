"""SQLite: a claim commits without waiting for the disk (synchronous NORMAL for its
own transaction, as a PostgreSQL claim turns synchronous_commit off), and only the
claim: the connection must be back at the configured setting before anything else
commits on it, or enqueues and outcomes could be lost to a power cut."""

from __future__ import annotations

import pytest

from conveyor.backends.sqlite.backend import SQLiteBackend

from .helpers import done, fetch, ins

NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def _traced(backend: SQLiteBackend) -> list[str]:
    """The statements this thread's connection runs from now on."""
    seen: list[str] = []
    backend._conn().set_trace_callback(seen.append)
    return seen


def _setting(backend: SQLiteBackend) -> str:
    return NAMES[backend._conn().execute("PRAGMA synchronous").fetchone()[0]]


@pytest.fixture
def make(tmp_path):
    made: list[SQLiteBackend] = []

    def open_(synchronous: str = "full") -> SQLiteBackend:
        b = SQLiteBackend(str(tmp_path / "c.db"), synchronous=synchronous)
        b.migrate()
        made.append(b)
        return b

    yield open_
    for b in made:
        b.close()


@pytest.mark.parametrize("synchronous", ["full", "extra"])
def test_a_claim_commits_unsynced_and_puts_the_setting_back(make, synchronous):
    backend = make(synchronous)
    backend.job_insert_many(jobs=[ins(), ins()])
    seen = _traced(backend)
    [job] = fetch(backend, 1)
    claim = [s for s in seen if s.startswith(("PRAGMA", "BEGIN", "COMMIT"))]
    assert claim == [
        "PRAGMA synchronous=NORMAL",
        "BEGIN IMMEDIATE",
        "COMMIT",
        f"PRAGMA synchronous={synchronous.upper()}",
    ]
    assert _setting(backend) == synchronous.upper()
    # what follows on the same connection commits as configured: no NORMAL again
    seen.clear()
    backend.job_insert_many(jobs=[ins()])
    backend.job_finalize_many(worker_id="w1", outcomes=[done(job)])
    assert not [s for s in seen if "synchronous" in s]
    assert _setting(backend) == synchronous.upper()


def test_a_claim_that_fails_still_puts_the_setting_back(make, monkeypatch):
    backend = make()
    backend.job_insert_many(jobs=[ins()])

    def broken(cur, name, params=None):
        raise RuntimeError(f"{name} broke")

    monkeypatch.setattr(backend, "_q", broken)
    with pytest.raises(RuntimeError, match="queue_limits broke"):
        fetch(backend, 1)
    monkeypatch.undo()
    assert _setting(backend) == "FULL"
    assert len(fetch(backend, 1)) == 1  # nothing was left half-done


@pytest.mark.parametrize("synchronous", ["normal", "off"])
def test_settings_that_do_not_sync_are_left_alone(make, synchronous):
    backend = make(synchronous)
    backend.job_insert_many(jobs=[ins()])
    seen = _traced(backend)
    assert len(fetch(backend, 1)) == 1
    assert not [s for s in seen if "synchronous" in s]
    assert _setting(backend) == synchronous.upper()
