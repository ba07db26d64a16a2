"""A bulk action's stored filter reads back as the filter it was
(``serialize.job_filter_of``), and a bad one is refused naming the field."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from conveyor import Conveyor, serialize
from conveyor.errors import ConfigError
from conveyor.records import JobFilter, JobState
from conveyor.registry import BUILTIN_TASKS, user_tasks


def test_a_stored_filter_reads_back_as_it_was():
    f = JobFilter(
        ids=(3, 4),
        queues=("q",),
        tasks=("t",),
        states=(JobState.FAILED, JobState.CANCELLED),
        tenant="acme",
        created_after=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        due_before=datetime(2026, 2, 1, tzinfo=UTC),
        search="x",
        unpaused=True,
    )
    stored = json.loads(json.dumps(serialize.job_filter(f)))
    assert serialize.job_filter_of(stored) == f
    assert serialize.job_filter_of({}) == JobFilter()


def test_a_bad_stored_filter_names_the_field():
    with pytest.raises(ConfigError, match="nope"):
        serialize.job_filter_of({"nope": 1})
    with pytest.raises(ConfigError, match="created_after"):
        serialize.job_filter_of({"created_after": "yesterday"})


def test_every_app_has_the_builtin_task_on_its_own_queue(tmp_path):
    app = Conveyor(f"sqlite:///{tmp_path / 'c.db'}")

    @app.task
    def mine() -> None: ...

    assert set(app.tasks) >= BUILTIN_TASKS
    assert app.tasks["conveyor.bulk_action"].defaults.queue == "conveyor"
    assert [t.name for t in user_tasks(app.tasks)] == ["mine"]
    with pytest.raises(ConfigError, match="already registered"):
        app.task(name="conveyor.bulk_action")(lambda: None)
