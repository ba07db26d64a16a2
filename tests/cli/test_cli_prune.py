"""`conveyor prune`: retention now, or what it would delete."""

from __future__ import annotations

import json

import pytest

from conveyor import Conveyor
from conveyor.cli.prune import duration_text, parse_duration
from conveyor.runtime.worker import Worker

from .conftest import TEST_APP, Invoke


def test_dry_run_then_prune(invoke: Invoke, db_url: str, producer: Conveyor) -> None:
    producer.tasks["add"].send_many([(i, i) for i in range(3)])
    producer.tasks["boom"].send()
    waiting = producer.tasks["add"].send(9, 9, delay=60)
    Worker(producer, queues="default", burst=True, poll_s=0.05).run(install_signals=False)

    # The defaults (7 days): nothing that finished a moment ago is old enough.
    default = invoke("prune", "--dry-run", url=db_url)
    assert default.exit_code == 0, default.output
    assert "7d" in default.stdout and "30d" in default.stdout
    assert "dry run: 0 job(s) would be deleted" in default.stdout

    args = ["prune", "--older-than", "succeeded=0s"]
    dry = invoke(*args, "--dry-run", url=db_url)
    assert dry.exit_code == 0, dry.output
    assert "would be pruned" in dry.stdout
    assert "dry run: 3 job(s) would be deleted; nothing was deleted" in dry.stdout
    data = json.loads(invoke(*args, "--dry-run", "--json", url=db_url).stdout)
    assert data["dry_run"] is True
    assert data["states"]["succeeded"] == {"older_than_s": 0.0, "jobs": 3, "kept_forever": False}
    assert data["states"]["failed"]["jobs"] == 0  # 30 days by default
    assert len(producer.list_jobs(limit=100)) == 5  # the dry runs deleted nothing

    real = invoke(*args, "--older-than", "failed=0s", "--older-than", "cancelled=never", url=db_url)
    assert real.exit_code == 0, real.output
    assert "jobs pruned" in real.stdout and "kept forever" in real.stdout
    assert "4 job(s) deleted" in real.stdout
    assert [j.id for j in producer.list_jobs(limit=100)] == [waiting.id]

    again = json.loads(invoke(*args, "--json", url=db_url).stdout)
    assert again["dry_run"] is False and again["states"]["succeeded"]["jobs"] == 0


def test_uses_the_apps_retention(invoke: Invoke, db_url: str, producer: Conveyor) -> None:
    producer.tasks["add"].send(1, 1)
    Worker(producer, queues="default", burst=True, poll_s=0.05).run(install_signals=False)
    result = invoke("prune", "--dry-run", "--json", "--app", TEST_APP, url=db_url)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["states"]["succeeded"]["older_than_s"] == 7 * 86400


def test_needs_a_schema(invoke: Invoke, tmp_path) -> None:
    result = invoke("prune", "--dry-run", url=f"sqlite:///{tmp_path}/fresh.db")
    assert result.exit_code == 2 and "conveyor migrate" in result.stderr


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("succeeded", "expected STATE=DURATION"),
        ("=7d", "expected STATE=DURATION"),
        ("succeeded=", "expected STATE=DURATION"),
        ("running=1d", "'running' is not a finished state"),
        ("succeeded=7", "'7' is not a duration"),
        ("succeeded=1y", "'1y' is not a duration"),
        ("succeeded=-1d", "'-1d' is not a duration"),
        ("succeeded=99999999d", "up to 100 years"),
    ],
)
def test_bad_older_than(invoke: Invoke, value: str, expected: str) -> None:
    # Checked before the database is opened: no URL needed.
    result = invoke("prune", "--older-than", value)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: --older-than") and expected in line
    assert "90s, 15m, 12h, 7d" in line or "succeeded, failed, cancelled" in line


def test_older_than_twice(invoke: Invoke) -> None:
    result = invoke("prune", "--older-than", "failed=1d", "--older-than", "FAILED=2d")
    assert (result.exit_code, result.stderr) == (
        2,
        "error: --older-than failed=... is given twice\n",
    )


def test_durations() -> None:
    assert [parse_duration(v) for v in ("90s", "15m", "12h", "7d", "1.5h", "2w", " Never ")] == [
        90,
        900,
        43200,
        604800,
        5400,
        1209600,
        None,
    ]
    assert [duration_text(v) for v in (0, 90, 900, 5400, 604800, 2592000, 1.5, None)] == [
        "0s",
        "90s",
        "15m",
        "90m",
        "7d",
        "30d",
        "1.5s",
        "kept forever",
    ]
