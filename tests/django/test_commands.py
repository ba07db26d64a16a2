"""The management commands, as real processes."""

from __future__ import annotations

from conftest import manage


def test_worker_help_lists_conveyor_worker_options() -> None:
    done = manage("conveyor_worker", "--help")
    assert done.returncode == 0, done.stderr
    for option in ("--backend", "--queues", "--concurrency", "--processes", "--burst", "--grace"):
        assert option in done.stdout


def test_worker_names_a_backend_that_is_not_conveyor_s() -> None:
    done = manage("conveyor_worker", "--backend", "nope", "--burst")
    assert done.returncode == 2
    assert "no task backend 'nope'" in done.stderr


def test_migrate_again_is_a_no_op_for_conveyor() -> None:
    done = manage("migrate", "--no-input")
    assert done.returncode == 0, done.stderr
    assert "No migrations to apply" in done.stdout
