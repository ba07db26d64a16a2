"""A remote worker in plain Python with only httpx: no Conveyor import, nothing
but the HTTP protocol a worker in any language would speak.

    python remote_worker.py --url URL --worker ID [--token T] --task square ...
        [--jobs N] [--hold]

Handlers: ``square`` returns n*n; ``stages`` runs two stages (the first passes
its context on); ``flaky`` fails its first attempt (retried at once), then
succeeds. ``--hold``: lease one job, print ``holding <id> <token>``, keep
heartbeating and never finish it (the test kills this process). Each finished
job prints ``done <id>``; the worker exits after ``--jobs`` jobs.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import httpx


def handle(job: dict) -> dict:
    """The outcome to report for one leased job."""
    base = {"job_id": job["id"], "token": job["token"]}
    args = job["args"]
    if job["task"] == "square":
        n = args[0] if args else job["kwargs"]["n"]
        return {**base, "kind": "complete", "result": n * n}
    if job["task"] == "stages":
        if job["stage"] is None:
            return {**base, "kind": "next_stage", "stage": "second", "context": {"n": args[0]}}
        return {**base, "kind": "complete", "result": job["context"]["n"] * 10}
    if job["task"] == "flaky":
        if job["attempts"] == 1:
            return {**base, "kind": "fail", "error": "first try fails", "retry_in_s": 0}
        return {**base, "kind": "complete", "result": "second try"}
    return {**base, "kind": "fail", "error": f"no handler for {job['task']}", "permanent": True}


def heartbeat(client: httpx.Client, worker: str, stop: threading.Event) -> None:
    while not stop.wait(0.5):
        try:
            client.post(f"/v1/workers/{worker}/heartbeat")
        except httpx.HTTPError:
            pass


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--token")
    p.add_argument("--task", action="append", required=True)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--hold", action="store_true")
    a = p.parse_args()
    headers = {"Authorization": f"Bearer {a.token}"} if a.token else {}
    client = httpx.Client(base_url=a.url, headers=headers, timeout=60)
    stop = threading.Event()
    threading.Thread(target=heartbeat, args=(client, a.worker, stop), daemon=True).start()
    done = 0
    while done < a.jobs:
        r = client.post(
            "/v1/leases",
            json={"worker": a.worker, "tasks": a.task, "limit": 1 if a.hold else 10, "wait_s": 2},
        )
        r.raise_for_status()
        lease = r.json()
        if lease["stop"]:
            break
        if a.hold and lease["jobs"]:
            job = lease["jobs"][0]
            print(f"holding {job['id']} {job['token']}", flush=True)
            while True:
                time.sleep(1)
        if not lease["jobs"]:
            continue
        outcomes = [handle(job) for job in lease["jobs"]]
        r = client.post("/v1/leases/outcomes", json={"worker": a.worker, "outcomes": outcomes})
        r.raise_for_status()
        for o, res in zip(outcomes, r.json()["results"], strict=True):
            if not res["accepted"]:
                print(f"refused {o['job_id']} {res['reason']}", flush=True)
            elif res["state"] in ("succeeded", "failed", "cancelled"):
                done += 1
                print(f"done {o['job_id']}", flush=True)
    stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
