"""Workers in any language: a worker in plain Python (httpx only, no Conveyor
import) and one in bash (curl and jq) run jobs a Python producer created; a
remote worker killed mid-job loses it to another, and its late completion is
refused with 409."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx

from conveyor import JobState

from .conftest import wait_for

HERE = Path(__file__).parent
PY_WORKER = HERE / "remote_worker.py"
BASH_WORKER = HERE / "remote_worker.sh"


def python_worker(server, worker_id: str, *tasks: str, jobs: int = 1, hold=False, token=None):
    cmd = [
        sys.executable,
        str(PY_WORKER),
        "--url",
        server.url,
        "--worker",
        worker_id,
        "--jobs",
        str(jobs),
    ]
    for t in tasks:
        cmd += ["--task", t]
    if hold:
        cmd.append("--hold")
    if token:
        cmd += ["--token", token]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def test_the_worker_imports_nothing_of_conveyor():
    source = PY_WORKER.read_text()
    assert "conveyor" not in source.replace("Conveyor import", "")


def test_a_python_worker_with_only_httpx_runs_what_a_producer_sent(start_server, producer):
    token = producer.create_token("worker", name="py")[1]
    server = start_server()  # no --app: a pure task service
    squares = [producer.enqueue("square", [n]) for n in range(20)]
    by_kw = producer.enqueue("square", kwargs={"n": 12})
    staged = producer.enqueue("stages", [4])
    flaky = producer.enqueue("flaky", max_attempts=3)
    worker = python_worker(server, "py-1", "square", "stages", "flaky", jobs=23, token=token)
    out, _ = worker.communicate(timeout=120)
    assert worker.returncode == 0, out
    for job in squares:
        got = producer.get_job(job.id)
        assert (got.state, got.result) == (JobState.SUCCEEDED, job.args[0] ** 2)
    assert producer.get_job(by_kw.id).result == 144
    s = producer.get_job(staged.id)
    assert (s.state, s.stage, s.result) == (JobState.SUCCEEDED, "second", 40)
    f = producer.get_job(flaky.id)
    assert (f.state, f.result, f.attempts) == (JobState.SUCCEEDED, "second try", 2)
    assert [a.outcome for a in producer.job_attempts(flaky.id)] == ["retry", "succeeded"]
    assert {a.worker_id for a in producer.job_attempts(staged.id)} == {"py-1"}


def test_a_bash_worker_with_curl_and_jq(start_server, producer):
    token = producer.create_token("worker", name="bash")[1]
    server = start_server()
    jobs = [producer.enqueue("double", [n]) for n in range(7)]
    out = subprocess.run(
        ["bash", str(BASH_WORKER), server.url, "bash-1", token, "7"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split()[1::2]) == sorted(str(j.id) for j in jobs)
    for job in jobs:
        got = producer.get_job(job.id)
        assert (got.state, got.result) == (JobState.SUCCEEDED, job.args[0] * 2)


def test_a_killed_remote_worker_loses_its_job_and_its_late_completion_gets_409(
    start_server, producer
):
    server = start_server("--worker-ttl", "1.5")  # runs the rescue (cluster services)
    job = producer.enqueue("square", [9])
    holder = python_worker(server, "doomed", "square", hold=True)
    line = holder.stdout.readline().split()
    assert line[:2] == ["holding", str(job.id)]
    token = line[2]
    assert producer.get_job(job.id).lease_owner == "doomed"
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    holder.stdout.close()
    # its worker row goes silent; the server's leader rescues the job
    wait_for(
        lambda: producer.get_job(job.id).state == JobState.AVAILABLE,
        timeout=60,
        what="the job to be rescued",
    )
    late = httpx.post(
        f"{server.url}/v1/leases/{job.id}/complete",
        json={"worker": "doomed", "token": token, "result": 0},
    )
    assert late.status_code == 409
    assert late.json()["reason"] == "lease_lost" and "lost" in late.json()["detail"]
    assert producer.get_job(job.id).state == JobState.AVAILABLE  # nothing changed
    rescuer = python_worker(server, "rescuer", "square", jobs=1)
    out, _ = rescuer.communicate(timeout=60)
    assert rescuer.returncode == 0, out
    got = producer.get_job(job.id)
    assert (got.state, got.result) == (JobState.SUCCEEDED, 81)
    attempts = [(a.worker_id, a.outcome) for a in producer.job_attempts(job.id)]
    assert attempts == [("doomed", "lost"), ("rescuer", "succeeded")]
    # and once it finished elsewhere, the late completion is still refused
    again = httpx.post(
        f"{server.url}/v1/leases/{job.id}/complete",
        json={"worker": "doomed", "token": token, "result": 0},
    )
    assert again.status_code == 409 and producer.get_job(job.id).result == 81


def test_lease_protocol_details(api, producer):
    # long-poll: a lease waiting for work gets the job enqueued meanwhile
    import threading

    got = {}

    def poll():
        got["r"] = api.post("/v1/leases", json={"worker": "lp", "tasks": ["later"], "wait_s": 20})

    t = threading.Thread(target=poll)
    t.start()
    producer.enqueue("later")
    t.join(30)
    assert [j["task"] for j in got["r"].json()["jobs"]] == ["later"]
    job = got["r"].json()["jobs"][0]
    held = {"worker": "lp", "token": job["token"]}
    beat = api.post(f"/v1/leases/{job['id']}/heartbeat", json=held).json()
    assert beat == {"job_id": job["id"], "cancel_requested": False, "stop": False}
    snoozed = api.post(f"/v1/leases/{job['id']}/snooze", json={**held, "delay_s": 0})
    assert snoozed.status_code == 200 and snoozed.json()["state"] == "scheduled"
    assert api.post(f"/v1/leases/{job['id']}/heartbeat", json=held).status_code == 409
    [job] = api.post("/v1/leases", json={"worker": "lp", "tasks": ["later"]}).json()["jobs"]
    assert job["attempts"] == 1  # a snooze does not use the attempt
    held = {"worker": "lp", "token": job["token"]}
    staged = api.post(
        f"/v1/leases/{job['id']}/next-stage",
        json={**held, "stage": "two", "context": {"k": [1]}, "priority": 5},
    )
    assert staged.json()["state"] == "available"
    [job] = api.post("/v1/leases", json={"worker": "lp", "tasks": ["later"]}).json()["jobs"]
    assert (job["stage"], job["context"], job["priority"]) == ("two", {"k": [1]}, 5)
    held = {"worker": "lp", "token": job["token"]}
    released = api.post(f"/v1/leases/{job['id']}/release", json=held)
    assert released.status_code == 200
    [job] = api.post("/v1/leases", json={"worker": "lp", "tasks": ["later"]}).json()["jobs"]
    held = {"worker": "lp", "token": job["token"]}
    failed = api.post(
        f"/v1/leases/{job['id']}/fail", json={**held, "error": "bad", "permanent": True}
    )
    assert failed.json()["state"] == "failed"
    assert "permanent" in producer.get_job(job["id"]).error
    # outcomes in bulk: one per job, duplicates refused
    dup = api.post(
        "/v1/leases/outcomes",
        json={
            "worker": "lp",
            "outcomes": [
                {"job_id": 1, "token": "t", "kind": "complete"},
                {"job_id": 1, "token": "t", "kind": "complete"},
            ],
        },
    )
    assert dup.status_code == 422
    missing = api.post(f"/v1/leases/{10**9}/complete", json={"worker": "lp", "token": "x"})
    assert missing.status_code == 404
    bad_kind = api.post(
        "/v1/leases/outcomes",
        json={"worker": "lp", "outcomes": [{"job_id": 1, "token": "t", "kind": "explode"}]},
    )
    assert bad_kind.status_code == 422


def test_a_leased_job_carries_the_trace_context_it_was_sent_in(api, db_url):
    from opentelemetry.sdk.trace import TracerProvider

    from conveyor import Conveyor
    from conveyor.observability.tracing import Tracing

    provider = TracerProvider()
    app = Conveyor(db_url, middleware=[Tracing(provider)])
    try:
        with provider.get_tracer("web").start_as_current_span("POST /signup") as request:
            job = app.enqueue("remote_traced", ["x"])
        untraced = app.enqueue("remote_traced", ["y"])  # sent outside any span
    finally:
        app.close()
    r = api.post("/v1/leases", json={"worker": "tw", "tasks": ["remote_traced"], "limit": 2})
    leased = {j["id"]: j for j in r.json()["jobs"]}
    trace_id = format(request.get_span_context().trace_id, "032x")
    version, tid, _parent, _flags = leased[job.id]["traceparent"].split("-")
    assert (version, tid) == ("00", trace_id)  # the remote worker's span continues it
    assert leased[untraced.id]["traceparent"] is None


def test_an_outcome_needs_the_token_and_the_worker_it_was_given_to(api, producer):
    job = producer.enqueue("held_by_a")
    [leased] = api.post("/v1/leases", json={"worker": "a", "tasks": ["held_by_a"]}).json()["jobs"]
    stolen = {"worker": "b", "token": leased["token"]}
    for path, extra in [
        ("complete", {"result": 1}),
        ("fail", {"error": "x", "permanent": True}),
        ("next-stage", {"stage": "two"}),
        ("snooze", {"delay_s": 0}),
        ("release", {}),
        ("heartbeat", {}),
    ]:
        r = api.post(f"/v1/leases/{job.id}/{path}", json={**stolen, **extra})
        assert r.status_code == 409, (path, r.text)
        if path != "heartbeat":  # (its sentence says the lease is not held: by b, it is not)
            assert "held by worker 'a', not 'b'" in r.json()["detail"], (path, r.text)
    outcome = {"job_id": job.id, "token": leased["token"], "kind": "complete"}
    [result] = api.post("/v1/leases/outcomes", json={"worker": "b", "outcomes": [outcome]}).json()[
        "results"
    ]
    assert (result["accepted"], result["reason"]) == (False, "wrong_worker")
    now = producer.get_job(job.id)
    assert (now.state, now.attempts, now.lease_owner) == ("running", 1, "a")
    assert producer.job_attempts(job.id) == []
    done = api.post(f"/v1/leases/{job.id}/complete", json={**stolen, "worker": "a", "result": 2})
    assert done.status_code == 200 and producer.get_job(job.id).result == 2


def test_outcomes_of_a_job_whose_cancel_was_requested_while_it_ran(api, producer):
    # what docs/guides/server.md says: the outcome is taken (200) and the job ends
    # cancelled, unless the worker reports it failed for good; 409 `cancelled` is for
    # an outcome that comes after the job already ended cancelled
    jobs = {kind: producer.enqueue("held_then_cancelled").id for kind in ("c", "f", "p", "s")}
    leased = api.post(
        "/v1/leases", json={"worker": "w", "tasks": ["held_then_cancelled"], "limit": 4}
    ).json()["jobs"]
    held = {j["id"]: {"worker": "w", "token": j["token"]} for j in leased}
    assert set(held) == set(jobs.values())
    for job_id in held:
        assert producer.cancel_job(job_id) == "requested"
        beat = api.post(f"/v1/leases/{job_id}/heartbeat", json=held[job_id]).json()
        assert beat["cancel_requested"] is True

    calls = {
        "c": ("complete", {"result": 1}),
        "f": ("fail", {"error": "stopped early"}),  # attempts left: it would retry
        "p": ("fail", {"error": "broken", "permanent": True}),
        "s": ("snooze", {"delay_s": 5}),
    }
    states = {}
    for kind, (call, extra) in calls.items():
        job_id = jobs[kind]
        r = api.post(f"/v1/leases/{job_id}/{call}", json={**held[job_id], **extra})
        assert r.status_code == 200, r.text
        states[kind] = (r.json()["state"], producer.get_job(job_id).state)
    assert states == {
        "c": ("cancelled", JobState.CANCELLED),
        "f": ("cancelled", JobState.CANCELLED),
        "p": ("failed", JobState.FAILED),
        "s": ("cancelled", JobState.CANCELLED),
    }
    again = api.post(f"/v1/leases/{jobs['c']}/complete", json={**held[jobs["c"]], "result": 2})
    assert again.status_code == 409 and again.json()["reason"] == "cancelled"
