"""Real worker processes: killed with SIGKILL, racing, stopped with SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter

import pytest

from .helpers import finished, wait_for

pytestmark = pytest.mark.slow


def test_killed_worker_job_is_finished_by_another_exactly_once(procs, producer):
    job = producer.enqueue("sleepy", [1.0])
    first = procs.worker(lease_s=2, heartbeat_s=0.5)
    wait_for(lambda: procs.lines("start"), what="job started in the first worker")
    first.send_signal(signal.SIGKILL)
    first.wait()
    second = procs.worker(lease_s=2, heartbeat_s=0.5, maintenance_s=0.3)
    wait_for(finished(producer, job.id), timeout=30, what="job finished by the second worker")
    second.send_signal(signal.SIGTERM)
    assert second.wait(15) == 0
    got = producer.get_job(job.id)
    assert (got.state, got.attempts) == ("succeeded", 2)
    assert [a.outcome for a in got.attempt_log()] == ["lost", "succeeded"]
    assert [pid for _, pid in procs.lines("start")] == [first.pid, second.pid]
    assert [pid for _, pid in procs.lines("end")] == [second.pid]  # ran to the end once


def test_two_processes_racing_over_1000_jobs_lose_none_and_run_each_once(procs, producer):
    # "raced": each process's first job waits for the other's, so both take part
    # however fast one of them drains alone
    jobs = producer.tasks["raced"].send_many([(i,) for i in range(1000)])
    workers = [procs.worker(concurrency=10, lease_s=30) for _ in range(2)]
    procs.drain_and_stop(producer, workers)
    ran = procs.lines("ran")
    per_job = Counter(job for job, _ in ran)
    assert set(per_job) == {j.id for j in jobs}
    assert set(per_job.values()) == {1}, "a job ran twice"
    assert {pid for _, pid in ran} == {w.pid for w in workers}, "both workers took part"
    counts = {c.state: c.count for c in producer.counts()}
    assert counts == {"succeeded": 1000}


def test_sigterm_lets_the_running_job_finish(procs, producer):
    job = producer.enqueue("sleepy", [1.0])
    worker = procs.worker(grace_s=20)
    wait_for(lambda: procs.lines("start"), what="job started")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(20) == 0
    assert producer.get_job(job.id).state == "succeeded"
    assert "stopping" in worker.log.read_text()


def test_sigterm_past_grace_releases_the_job_without_using_an_attempt(procs, producer):
    job = producer.enqueue("sleepy", [60])
    worker = procs.worker(grace_s=0.5)
    wait_for(lambda: procs.lines("start"), what="job started")
    t0 = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    assert time.monotonic() - t0 < 10
    got = producer.get_job(job.id)
    assert (got.state, got.attempts, got.lease_owner) == ("available", 0, None)


def test_job_that_kills_its_worker_every_time_ends_failed(procs, producer):
    job = producer.enqueue("crash", max_attempts=2)
    for _ in range(6):
        if producer.get_job(job.id).state.finished:
            break
        w = procs.worker(lease_s=1, heartbeat_s=0.3, maintenance_s=0.2)
        try:
            w.wait(8)  # dies when it runs the job, or lives on once the job has failed
        except subprocess.TimeoutExpired:
            pass
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
            w.wait(15)
    got = producer.get_job(job.id)
    assert got.state == "failed"
    assert "lease lost on attempt 2 of 2" in got.error and "no attempts left" in got.error
    assert [a.outcome for a in got.attempt_log()] == ["lost", "lost"]
    assert len(procs.lines("crash")) == 2
