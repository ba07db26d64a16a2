"""Bulk actions run as jobs of the built-in task ``conveyor.bulk_action`` on the
``conveyor`` queue: the server's own worker runs them (started through the API);
with no server, the job waits, and a ``conveyor worker --queues conveyor`` runs
it, going on from where an earlier attempt stopped; a second run changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys

from conveyor import Conveyor, JobState
from conveyor.records import JobFilter
from conveyor.registry import BULK_TASK, INTERNAL_QUEUE
from tests.server.conftest import APP, ROOT, wait_for


def test_a_bulk_retry_from_the_api_runs_as_a_job_in_the_job_list(server, producer):
    for i in range(600):  # more than one transaction of 500
        producer.enqueue("bulk_rt", [i])
    assert producer.cancel_jobs(task="bulk_rt").done == 600
    with server.client() as api:
        started = api.post(
            "/v1/jobs/bulk-retry",
            json={"task": ["bulk_rt"], "state": ["cancelled"], "background": True},
        )
        assert started.status_code == 202, started.text
        action = started.json()
        final = wait_for(
            lambda: (
                (a := api.get(f"/v1/actions/{action['id']}").json())["state"] != "running" and a
            ),
            what="the bulk action",
        )
        assert (final["state"], final["matched"], final["done"]) == ("done", 600, 600)
        listed = api.get("/v1/jobs", params={"task": BULK_TASK}).json()["jobs"]
        assert [(j["queue"], j["args"]) for j in listed] == [(INTERNAL_QUEUE, [action["id"]])]
    [job] = producer.list_jobs(task=BULK_TASK)
    done = wait_for(lambda: (j := producer.get_job(job.id)).state.finished and j, what="the job")
    assert done.state == JobState.SUCCEEDED
    assert producer.count_jobs(task="bulk_rt") == {"available": 600}


def _burst_worker(db_url: str) -> None:
    """``conveyor worker --app ... --queues conveyor --burst``: the app's own tasks
    use other queues."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    argv = ["-m", "conveyor.cli.main", "-d", db_url, "worker", "--app", APP]
    argv += ["--queues", INTERNAL_QUEUE]
    done = subprocess.run(
        [sys.executable, *argv, "--burst"], cwd=ROOT, env=env, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()


def test_a_bulk_action_waits_for_a_worker_and_goes_on_where_it_stopped(db_url):
    app = Conveyor(db_url)  # no server, no worker of the conveyor queue
    try:
        sent = [app.enqueue("bulk_rs", [i]) for i in range(700)]
        assert app.cancel_jobs(task="bulk_rs").done == 700
        f = JobFilter(tasks=("bulk_rs",), states=(JobState.CANCELLED,))
        action = app.plumbing.start_bulk("retry", f, actor="test")
        assert (action.state, action.matched, action.done) == ("running", 700, 0)
        [job] = app.list_jobs(task=BULK_TASK)
        assert (job.state, job.queue, job.args) == (JobState.AVAILABLE, INTERNAL_QUEUE, [action.id])
        # an earlier attempt retried 200 of them and wrote so, then its process died
        assert app.retry_jobs(ids=[j.id for j in sent[:200]]).done == 200
        app.backend.action_update(action_id=action.id, done=200, requested=0, state="running")

        _burst_worker(db_url)
        record = app.plumbing.bulk_action(action.id)
        assert (record.state, record.matched, record.done) == ("done", 700, 700)
        assert app.get_job(job.id).state == JobState.SUCCEEDED
        assert app.count_jobs(task="bulk_rs") == {"available": 700}

        # run twice: the action that ended is left as it is
        app.cancel_jobs(task="bulk_rs")
        again = app.enqueue(BULK_TASK, [action.id])
        _burst_worker(db_url)
        assert app.get_job(again.id).state == JobState.SUCCEEDED
        assert app.plumbing.bulk_action(action.id) == record
        assert app.count_jobs(task="bulk_rs") == {"cancelled": 700}
    finally:
        app.close()


def test_a_bulk_actions_job_is_sent_as_every_job_is(db_url):
    """Through the enqueue hooks (which may add headers, a tracing context) and
    the on_enqueued ones, with its record in the same transaction."""
    from conveyor import Middleware

    class Seen(Middleware):
        def __init__(self) -> None:
            self.enqueue: list[str] = []
            self.enqueued: list[str] = []

        def on_enqueue(self, jobs):
            self.enqueue += [j.task for j in jobs]
            return jobs

        def on_enqueued(self, jobs):
            self.enqueued += [j.task for j in jobs]

    seen = Seen()
    app = Conveyor(db_url, middleware=[seen])
    try:
        app.enqueue("bulk_hk", [1])
        f = JobFilter(tasks=("bulk_hk",))
        action = app.plumbing.start_bulk("cancel", f, actor="test")
        assert seen.enqueue == seen.enqueued == ["bulk_hk", BULK_TASK]
        [job] = app.list_jobs(task=BULK_TASK)
        assert job.args == [action.id]
    finally:
        app.close()
