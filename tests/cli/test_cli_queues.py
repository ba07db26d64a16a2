"""`conveyor queues`: list, pause/resume and limit, seen in `queues list` and `status`."""

from __future__ import annotations

import json

from conveyor import Conveyor

from .conftest import Invoke


def listed(invoke: Invoke, db_url: str) -> dict[str, dict]:
    result = invoke("queues", "list", "--json", url=db_url)
    assert result.exit_code == 0, result.output
    return {q["name"]: q for q in json.loads(result.stdout)}


def test_pause_resume_limit_round_trip(invoke: Invoke, db_url: str, producer: Conveyor) -> None:
    producer.tasks["add"].send(1, 2)
    producer.tasks["sleepy"].send(1, delay=60)
    before = listed(invoke, db_url)
    assert before["default"] == {
        "name": "default",
        "paused": False,
        "max_running": None,
        "rate_per_s": None,
        "rate_burst": None,
        "counts": {
            "scheduled": 0,
            "available": 1,
            "running": 0,
            "succeeded": 0,
            "failed": 0,
            "cancelled": 0,
        },
    }
    assert before["slow"]["counts"]["scheduled"] == 1

    paused = invoke("queues", "pause", "default", url=db_url)
    assert paused.exit_code == 0, paused.output
    assert paused.stdout == "queue 'default' paused: workers claim nothing new from it\n"
    again = invoke("queues", "pause", "default", url=db_url)
    assert again.stdout == "queue 'default' is already paused\n"

    limited = invoke("queues", "limit", "slow", "3", url=db_url)
    assert limited.exit_code == 0, limited.output
    assert limited.stdout == "queue 'slow': at most 3 job(s) run at once across every worker\n"
    lowered = invoke("queues", "limit", "slow", "2", url=db_url)
    assert "at most 2 job(s)" in lowered.stdout and "(was 3)" in lowered.stdout

    now = listed(invoke, db_url)
    assert (now["default"]["paused"], now["default"]["max_running"]) == (True, None)
    assert (now["slow"]["paused"], now["slow"]["max_running"]) == (False, 2)
    assert [q.name for q in producer.queues() if q.paused] == ["default"]

    table = invoke("queues", "list", url=db_url).stdout
    assert "paused" in table and "max running" in table

    # status marks the paused queue and shows the limit
    status = invoke("status", url=db_url).stdout
    assert "default (paused)" in status and "max running" in status
    assert "paused: default: workers claim nothing new from it" in status
    data = json.loads(invoke("status", "--json", url=db_url).stdout)
    assert data["queue_settings"] == {
        "default": {"paused": True, "max_running": None},
        "slow": {"paused": False, "max_running": 2},
    }
    assert data["queues"]["default"]["available"] == 1
    assert data["periodics"] is None  # no --app

    resumed = invoke("queues", "resume", "default", url=db_url)
    assert resumed.stdout == "queue 'default' resumed: workers claim from it again\n"
    assert invoke("queues", "resume", "default", url=db_url).stdout == (
        "queue 'default' is not paused: nothing to do\n"
    )
    removed = invoke("queues", "limit", "slow", "--none", url=db_url)
    assert removed.stdout == "queue 'slow': limit removed (was 2); its jobs run as workers allow\n"
    assert invoke("queues", "limit", "slow", "--none", url=db_url).stdout == (
        "queue 'slow' has no limit: nothing to do\n"
    )

    after = listed(invoke, db_url)
    assert [(q["paused"], q["max_running"]) for q in after.values()] == [(False, None)] * 2
    assert "(paused)" not in invoke("status", url=db_url).stdout


def test_settings_on_a_queue_with_no_jobs(invoke: Invoke, db_url: str) -> None:
    invoke("migrate", url=db_url)
    assert invoke("queues", "list", url=db_url).stdout.startswith("no queues yet")
    assert listed(invoke, db_url) == {}
    typo = invoke("queues", "pause", "emials", url=db_url)
    assert typo.exit_code == 2
    assert typo.stderr.startswith("error: no queue named 'emials' (known: default)")
    assert "--force" in typo.stderr
    paused = invoke("queues", "pause", "emials", "--force", url=db_url)
    assert paused.exit_code == 0
    assert "(no jobs on it yet)" in paused.stdout
    zero = invoke("queues", "limit", "llm", "0", "--force", url=db_url)
    assert "at most 0 job(s)" in zero.stdout and "as if the queue were paused" in zero.stdout
    queues = listed(invoke, db_url)
    assert (queues["emials"]["paused"], queues["llm"]["max_running"]) == (True, 0)
    assert queues["llm"]["counts"]["available"] == 0


def test_limit_needs_n_or_none(invoke: Invoke, db_url: str) -> None:
    invoke("migrate", url=db_url)
    neither = invoke("queues", "limit", "llm", url=db_url)
    assert neither.exit_code == 2
    assert neither.stderr.startswith("error: give the most jobs that may run at once")
    both = invoke("queues", "limit", "llm", "3", "--none", url=db_url)
    assert (both.exit_code, both.stderr) == (2, "error: give either N or --none, not both\n")
    for bad in ("many", "1.5"):
        result = invoke("queues", "limit", "llm", bad, url=db_url)
        assert result.exit_code == 2 and "is not a valid integer" in result.stderr
    huge = invoke("queues", "limit", "llm", str(2**31), url=db_url)
    assert huge.exit_code == 2 and "0<=x<=2147483647" in huge.stderr
    assert invoke("queues", "pause", " ", url=db_url).stderr == "error: the queue name is empty\n"
    assert listed(invoke, db_url) == {}  # nothing was written


def test_queue_rate_limit_round_trip(invoke: Invoke, db_url: str, producer: Conveyor) -> None:
    producer.migrate()
    ok = invoke("queues", "rate", "llm", "100/m", "--burst", "5", "--force", url=db_url)
    assert ok.exit_code == 0, ok.output
    assert "100/m" in ok.output and "5" in ok.output
    # seen where the queue is listed: as given, and in JSON
    assert "100/m (burst 5)" in invoke("queues", "list", url=db_url).output
    shown = listed(invoke, db_url)["llm"]
    assert (round(shown["rate_per_s"], 4), shown["rate_burst"]) == (1.6667, 5.0)
    bad = invoke("queues", "rate", "llm", "fast", url=db_url)
    assert bad.exit_code == 2 and "COUNT/UNIT" in bad.output
    off = invoke("queues", "rate", "llm", "--none", url=db_url)
    assert off.exit_code == 0 and "removed" in off.output
