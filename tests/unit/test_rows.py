"""Rows to records: the decoders that skip a dataclass's ``__init__`` must build
exactly what the constructor builds."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from conveyor.backends.sql.rows import job_from_row, job_reader
from conveyor.records import JobRecord, JobState

NOW = datetime(2026, 11, 26, 6, 0, tzinfo=UTC)


def _row(**changes: object) -> dict[str, object]:
    row: dict[str, object] = {
        "id": 7, "queue": "q", "task": "t", "state": "running", "priority": 3,
        "args": '{"args": [1, "x"], "kwargs": {"k": 2}, "headers": {"traceparent": "00-a"}}',
        "attempt": 2, "max_attempts": 5, "created_at": NOW, "scheduled_at": NOW,
        "started_at": NOW + timedelta(seconds=1), "finished_at": None, "result": '{"r": 1}',
        "error": "boom", "stage": "second", "timeout_s": 2.5, "backoff": '{"base": 2.0}',
        "unique_key": "u", "idempotency_key": "i", "lease_owner": "w", "lease_token": "tok",
        "lease_expires_at": NOW, "batch_id": 3, "context": '{"c": true}', "chain_root": 1,
        "chain_next": 9, "chain": '[{"task": "n"}]', "tenant": "acme", "base_priority": 1,
        "concurrency_key": "user=1", "rate_key": "r", "pinned_to": ["w", "gpu"],
        "cancel_requested": True,
    }  # fmt: skip
    row.update(changes)
    return row


@pytest.mark.parametrize(
    "row",
    [
        _row(),
        _row(state="succeeded", pinned_to=None, result=None, backoff=None, context=None),
        {k: v for k, v in _row(state="available").items() if k not in ("pinned_to", "result")},
    ],
)
def test_a_decoded_job_is_what_the_constructor_builds(row):
    record = job_from_row(row, lambda v: v)
    fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(JobRecord)}
    assert set(vars(record)) == set(fields)  # every field set, nothing else
    built = JobRecord(**fields)
    assert record == built and repr(record) == repr(built)
    assert record.state is JobState(row["state"])
    assert record.headers == {"traceparent": "00-a"} and record.kwargs == {"k": 2}
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.state = JobState.FAILED  # type: ignore[misc]
    assert dataclasses.replace(record, priority=9).priority == 9


def test_an_unknown_state_is_refused_as_before():
    with pytest.raises(ValueError):
        job_from_row(_row(state="exploded"), lambda v: v)


@pytest.mark.parametrize(
    "row",
    [
        _row(),
        _row(state="succeeded", pinned_to=None, result=None, backoff=None, context=None),
        # a result without some optional columns: read as NULL, as a dict's get does
        {k: v for k, v in _row(state="available").items() if k not in ("pinned_to", "result")},
        # extra columns (the limited claim's), in another order: read by name
        dict(reversed(list(_row(spread_group="g", changed=4).items()))),
    ],
)
def test_a_job_read_by_position_is_the_job_read_by_name(row):
    names = list(row)
    read = job_reader(names, lambda v: v)
    by_position = read(tuple(row.values()))
    assert by_position == job_from_row(row, lambda v: v)
    assert vars(by_position) == vars(job_from_row(row, lambda v: v))


def test_a_column_named_twice_is_read_at_its_last_as_a_dict_keeps_it():
    names = [*_row(), "state"]
    values = (*_row().values(), "succeeded")
    assert job_reader(names, lambda v: v)(values).state is JobState.SUCCEEDED


def test_a_result_without_a_jobs_required_column_is_refused_when_read():
    names = [n for n in _row() if n != "lease_token"]
    with pytest.raises(KeyError, match="lease_token"):
        job_reader(names, lambda v: v)
    with pytest.raises(KeyError):
        job_from_row({n: v for n, v in _row().items() if n != "lease_token"}, lambda v: v)
