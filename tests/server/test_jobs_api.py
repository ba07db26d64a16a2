"""/v1/jobs over HTTP, on the real server: create (Idempotency-Key), create many,
read with attempts, list with filters and keyset pagination, cancel, retry,
delete, and the bulk actions by filter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from conveyor import JobState


def test_create_with_options_and_idempotency_key(api, producer):
    r = api.post("/v1/jobs", json={"task": "add", "args": [1, 2]})
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["task"], job["args"], job["state"], job["queue"]) == (
        "add",
        [1, 2],
        "available",
        "default",
    )
    assert "lease_token" not in job and "token" not in job
    # send options over HTTP
    run_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    r = api.post(
        "/v1/jobs",
        json={
            "task": "remote_only",  # no handler anywhere in the server: remote workers run it
            "kwargs": {"x": 1},
            "queue": "q2",
            "priority": 7,
            "run_at": run_at,
            "unique_key": "u-1",
            "max_attempts": 9,
            "timeout": 12.5,
            "tenant": "acme",
            "pinned_to": ["gpu"],
        },
    )
    assert r.status_code == 201, r.text
    got = producer.get_job(r.json()["id"])
    assert (got.queue, got.priority, got.max_attempts, got.timeout) == ("q2", 7, 9, 12.5)
    assert (got.tenant, got.pinned_to, got.unique_key, got.state) == (
        "acme",
        ["gpu"],
        "u-1",
        JobState.SCHEDULED,
    )
    # a unique key held by an unfinished job returns that job, 200
    again = api.post("/v1/jobs", json={"task": "remote_only", "unique_key": "u-1"})
    assert again.status_code == 200 and again.json()["id"] == got.id
    # Idempotency-Key: the retried POST returns the same job with 200
    first = api.post(
        "/v1/jobs", json={"task": "add", "args": [2, 3]}, headers={"Idempotency-Key": "k1"}
    )
    retry = api.post(
        "/v1/jobs", json={"task": "add", "args": [2, 3]}, headers={"Idempotency-Key": "k1"}
    )
    assert (first.status_code, retry.status_code) == (201, 200)
    assert first.json()["id"] == retry.json()["id"]
    clash = api.post(
        "/v1/jobs",
        json={"task": "add", "args": [1, 1], "idempotency_key": "other"},
        headers={"Idempotency-Key": "k1"},
    )
    assert clash.status_code == 422 and "idempotency_key" in clash.json()["detail"]
    # a registered task's arguments are checked against its handler
    bad = api.post("/v1/jobs", json={"task": "add", "args": [1]})
    assert bad.status_code == 422 and "add" in bad.json()["detail"]
    typo = api.post("/v1/jobs", json={"task": "add", "args": [1, 2], "prority": 1})
    assert typo.status_code == 422 and typo.json()["detail"][0]["loc"] == ["body", "prority"]


def test_create_many_in_one_call(api, producer):
    r = api.post(
        "/v1/jobs/bulk",
        json={
            "jobs": [{"task": "add", "args": [i, i]} for i in range(5)]
            + [{"task": "remote_only", "idempotency_key": "once"}]
        },
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["created"] == 6 and [j["args"] for j in body["jobs"][:2]] == [[0, 0], [1, 1]]
    again = api.post(
        "/v1/jobs/bulk", json={"jobs": [{"task": "remote_only", "idempotency_key": "once"}]}
    )
    assert again.status_code == 200 and again.json()["jobs"][0]["created"] is False
    # all or nothing: one bad job fails the call and writes none
    before = sum(producer.count_jobs().values())
    bad = api.post(
        "/v1/jobs/bulk", json={"jobs": [{"task": "add", "args": [1, 1]}, {"task": "add"}]}
    )
    assert bad.status_code == 422
    assert sum(producer.count_jobs().values()) == before


def test_create_many_keeps_a_fingerprint_per_keyed_job(api, producer):
    def bulk(*jobs):
        return api.post("/v1/jobs/bulk", json={"jobs": list(jobs)})

    keyed = {"task": "add", "args": [1, 2], "idempotency_key": "b1"}
    first = bulk(keyed, {"task": "add", "args": [0, 0]})
    assert first.status_code == 201, first.text
    b1 = first.json()["jobs"][0]["id"]
    again = bulk(keyed)
    assert again.status_code == 200
    assert (again.json()["jobs"][0]["id"], again.json()["jobs"][0]["created"]) == (b1, False)
    before = sum(producer.count_jobs().values())
    # a different request under a key used before: 422 naming the item, nothing written
    clash = bulk(
        {"task": "add", "args": [5, 5]},
        {"task": "add", "args": [1, 3], "idempotency_key": "b1"},
    )
    assert clash.status_code == 422, clash.text
    assert clash.json()["detail"].startswith("jobs[1].idempotency_key: 'b1' was already used")
    assert f"job {b1}," in clash.json()["detail"]
    # two items of one call under one key: the same request twice is one job...
    twice = bulk(*[{"task": "add", "args": [3, 3], "idempotency_key": "b2"}] * 2)
    assert twice.status_code == 201 and twice.json()["created"] == 1
    assert len({j["id"] for j in twice.json()["jobs"]}) == 1
    before += 1
    # ... two different ones are refused, and nothing is written
    mixed = bulk(
        {"task": "add", "args": [4, 4]},
        {"task": "add", "args": [4, 4], "idempotency_key": "b3"},
        {"task": "add", "args": [4, 5], "idempotency_key": "b3"},
    )
    assert mixed.status_code == 422 and mixed.json()["detail"].startswith(
        "jobs[2].idempotency_key: 'b3' was already used by a different request (jobs[1] of"
    )
    assert sum(producer.count_jobs().values()) == before
    # one fingerprint for both routes: a job made by the bulk call guards its key on
    # POST /v1/jobs too (other arguments are a different request), and back
    same = api.post(
        "/v1/jobs",
        json={"task": "add", "args": [1, 2], "priority": 9},  # options are not compared
        headers={"Idempotency-Key": "b1"},
    )
    assert same.status_code == 200 and same.json()["id"] == b1
    other = api.post(
        "/v1/jobs",
        json={"task": "add", "args": [2, 1]},
        headers={"Idempotency-Key": "b1"},
    )
    assert other.status_code == 422 and other.json()["detail"].startswith("Idempotency-Key: 'b1'")
    single = api.post(
        "/v1/jobs", json={"task": "add", "args": [7, 7], "idempotency_key": "s1"}
    ).json()
    back = bulk({"task": "add", "args": [7, 7], "idempotency_key": "s1"})
    assert back.status_code == 200 and back.json()["jobs"][0]["id"] == single["id"]
    assert bulk({"task": "add", "args": [7, 8], "idempotency_key": "s1"}).status_code == 422
    assert sum(producer.count_jobs().values()) == before + 1


def test_get_with_attempts_and_unknown_ids(api, producer):
    job = producer.enqueue("remote_only", [1])
    from conveyor.outcomes import OutcomeKind, RemoteOutcome
    from conveyor.records import WorkerInfo

    producer.serving.heartbeat_worker(WorkerInfo("w", "h", 1, ["default"], 1))
    [held] = producer.serving.claim("w", ["default"], limit=1)
    producer.serving.report(
        "w",
        [RemoteOutcome(held.id, held.lease_token, OutcomeKind.FAIL, error="nope", permanent=True)],
    )
    body = api.get(f"/v1/jobs/{job.id}").json()
    assert body["state"] == "failed" and body["attempts"] == 1
    [attempt] = body["attempt_log"]
    assert (attempt["worker_id"], attempt["outcome"]) == ("w", "failed")
    assert "nope" in attempt["error"]
    assert api.get("/v1/jobs/999999").status_code == 404
    assert api.get("/v1/jobs/0").status_code == 422
    assert api.get("/v1/jobs/99999999999999999999999").status_code == 422
    assert api.post("/v1/jobs/999999/cancel").status_code == 404
    assert api.post("/v1/jobs/999999/retry").status_code == 404
    assert api.delete("/v1/jobs/999999").status_code == 404


def test_list_filters_and_keyset_pagination(api, producer):
    ids = [
        producer.enqueue("remote_only", [i], tenant="t1" if i % 2 else "t2").id for i in range(25)
    ]
    producer.enqueue("other", ["needle-xyz"], queue="side")
    seen, cursor, pages = [], None, 0
    while True:
        params = {"task": "remote_only", "limit": 10}
        if cursor:
            params["cursor"] = cursor
        page = api.get("/v1/jobs", params=params).json()
        seen += [j["id"] for j in page["jobs"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids, reverse=True) and pages == 3  # newest first, each once
    t1 = api.get("/v1/jobs", params={"tenant": "t1", "limit": 100}).json()["jobs"]
    assert len(t1) == 12 and {j["tenant"] for j in t1} == {"t1"}
    found = api.get("/v1/jobs", params={"search": "NEEDLE"}).json()["jobs"]
    assert [j["task"] for j in found] == ["other"]
    both = api.get(
        "/v1/jobs", params=[("queue", "side"), ("queue", "default"), ("limit", 1000)]
    ).json()
    assert len(both["jobs"]) == 26 and both["next_cursor"] is None
    assert api.get("/v1/jobs", params={"state": "failed"}).json()["jobs"] == []
    assert api.get("/v1/jobs", params={"state": "bogus"}).status_code == 422
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert api.get("/v1/jobs", params={"created_after": future}).json()["jobs"] == []
    bad = api.get("/v1/jobs", params={"cursor": "not-a-cursor"})
    assert bad.status_code == 422 and "cursor" in bad.json()["detail"]


def test_cancel_retry_delete(api, producer):
    waiting = producer.enqueue("remote_only")
    r = api.post(f"/v1/jobs/{waiting.id}/cancel")
    assert r.status_code == 200 and r.json()["result"] == "cancelled"
    again = api.post(f"/v1/jobs/{waiting.id}/cancel")
    assert again.status_code == 409 and "already finished" in again.json()["detail"]
    retried = api.post(f"/v1/jobs/{waiting.id}/retry")
    assert retried.status_code == 200 and retried.json()["state"] == "available"
    conflict = api.post(f"/v1/jobs/{waiting.id}/retry")
    assert conflict.status_code == 409 and "only failed or cancelled" in conflict.json()["detail"]
    # a running job: cancel is requested (202), delete refused (409)
    from conveyor.records import WorkerInfo

    producer.serving.heartbeat_worker(WorkerInfo("w", "h", 1, ["default"], 1))
    producer.serving.claim("w", ["default"], limit=1)
    assert api.post(f"/v1/jobs/{waiting.id}/cancel").status_code == 202
    assert api.delete(f"/v1/jobs/{waiting.id}").status_code == 409
    done = producer.enqueue("remote_only")
    assert api.delete(f"/v1/jobs/{done.id}").status_code == 204
    assert api.get(f"/v1/jobs/{done.id}").status_code == 404


def test_bulk_actions_by_filter_with_dry_run(api, producer):
    for i in range(4):
        producer.enqueue("bulk_task", [i])
    producer.enqueue("keep_me")
    assert api.post("/v1/jobs/bulk-cancel", json={}).status_code == 422  # no filter
    dry = api.post("/v1/jobs/bulk-cancel", json={"task": ["bulk_task"], "dry_run": True}).json()
    assert (dry["matched"], dry["done"], dry["dry_run"]) == (4, 0, True)
    done = api.post("/v1/jobs/bulk-cancel", json={"task": ["bulk_task"]}).json()
    assert (done["matched"], done["done"]) == (4, 4)
    assert producer.count_jobs(task="bulk_task") == {"cancelled": 4}
    retried = api.post("/v1/jobs/bulk-retry", json={"task": ["bulk_task"], "state": ["cancelled"]})
    assert retried.json()["done"] == 4
    api.post("/v1/jobs/bulk-cancel", json={"task": ["bulk_task"]})
    deleted = api.post("/v1/jobs/bulk-delete", json={"task": ["bulk_task"]}).json()
    assert deleted["done"] == 4 and producer.count_jobs(task="bulk_task") == {}
    assert producer.count_jobs(task="keep_me") == {"available": 1}


def test_a_bulk_action_in_the_background_is_followed_and_kept_in_the_audit_log(server, producer):
    from tests.server.conftest import wait_for

    for i in range(1200):  # more than one transaction of 500
        producer.enqueue("bulk_bg", [i])
    _, token = producer.create_token("producer", name="night-shift")
    with server.client() as anonymous:  # the server sees the token within 2 s
        wait_for(lambda: anonymous.get("/v1/actions").status_code == 401, what="auth on")
    with server.client(token) as api:
        started = api.post("/v1/jobs/bulk-cancel", json={"task": ["bulk_bg"], "background": True})
        assert started.status_code == 202, started.text
        action = started.json()
        assert (action["action"], action["matched"], action["actor"]) == (
            "cancel",
            1200,
            "night-shift",
        )
        assert action["filter"] == {"tasks": ["bulk_bg"]}
        final = wait_for(
            lambda: (
                (a := api.get(f"/v1/actions/{action['id']}").json())["state"] != "running" and a
            ),
            timeout=60,
            what="the background action",
        )
        assert (final["state"], final["done"]) == ("done", 1200)
        assert final["finished_at"] is not None
        assert producer.count_jobs(task="bulk_bg") == {"cancelled": 1200}
        assert [a["id"] for a in api.get("/v1/actions").json()["actions"]] == [action["id"]]
        assert api.get("/v1/actions/nope").status_code == 404


def test_sensitive_arguments_are_hidden_in_every_answer(api, producer):
    sent = api.post("/v1/jobs", json={"task": "sign_up", "args": ["bob", "hunter2"]})
    assert sent.status_code == 201, sent.text
    job_id = sent.json()["id"]
    by_kw = api.post(
        "/v1/jobs", json={"task": "sign_up", "kwargs": {"user": "amy", "password": "pa55"}}
    ).json()["id"]
    answers = [
        api.get(f"/v1/jobs/{job_id}").text,
        api.get(f"/v1/jobs/{by_kw}").text,
        api.get("/v1/jobs", params={"task": "sign_up"}).text,
        sent.text,
    ]
    for text in answers:
        assert "hunter2" not in text and "pa55" not in text
    assert api.get(f"/v1/jobs/{job_id}").json()["args"] == ["bob", "***"]
    assert api.get(f"/v1/jobs/{by_kw}").json()["kwargs"] == {"user": "amy", "password": "***"}
    assert producer.get_job(job_id).args == ["bob", "hunter2"]  # stored as sent, for the handler


def test_a_read_token_cannot_find_a_secret_by_searching(start_server, producer):
    tokens = {s: producer.create_token(s)[1] for s in ("read", "producer", "worker")}
    server = start_server("--app", "tests.server.srvapp:app")
    with server.client(tokens["producer"]) as prod:
        by_position = prod.post("/v1/jobs", json={"task": "sign_up", "args": ["bob", "hunter2"]})
        by_name = prod.post(
            "/v1/jobs",
            json={"task": "sign_up", "kwargs": {"user": "amy", "password": "hunter2"}},
        )
        assert by_position.status_code == by_name.status_code == 201
        dry = prod.post("/v1/jobs/bulk-cancel", json={"search": "hunter2", "dry_run": True})
        assert dry.json()["matched"] == 0, dry.text
    signed_in = server.client(cookies={"conveyor_token": tokens["read"]})  # the dashboard's
    with server.client(tokens["read"]) as read, signed_in as browser:
        for guess in ("hunter2", "hunt", "2", '"h'):  # a guess, or its first characters
            found = read.get("/v1/jobs", params={"search": guess}).json()["jobs"]
            assert found == [], (guess, found)
            page = browser.get("/jobs", params={"search": guess})
            assert page.status_code == 200 and "/jobs/" not in page.text.split("<tbody", 1)[-1]
        assert [j["id"] for j in read.get("/v1/jobs", params={"search": "bob"}).json()["jobs"]] == [
            by_position.json()["id"]
        ]
        assert [j["args"] for j in read.get("/v1/jobs", params={"search": "amy"}).json()["jobs"]]
    # the worker that runs it gets it as sent
    with server.client(tokens["worker"]) as worker:
        leased = worker.post("/v1/leases", json={"worker": "w", "queues": ["accounts"], "limit": 2})
        assert sorted(
            str(j["args"] + list(j["kwargs"].values())) for j in leased.json()["jobs"]
        ) == [
            "['amy', 'hunter2']",
            "['bob', 'hunter2']",
        ]


def test_a_server_without_the_app_hides_what_the_app_declared(start_server, db_url):
    from conveyor import Conveyor

    server = start_server()  # no --app: it knows no task; it reads the declarations
    app = Conveyor(db_url)

    @app.task(sensitive=("password",))
    def sign_in(user: str, password: str) -> None: ...

    try:
        positional = sign_in.send("amy", "pa55").id  # the app opens the database here
        keyword = sign_in.send(user="bob", password="pa55").id
    finally:
        app.close()
    with server.client() as api:
        answers = {
            "one": api.get(f"/v1/jobs/{positional}"),
            "other": api.get(f"/v1/jobs/{keyword}"),
            "list": api.get("/v1/jobs", params={"task": "sign_in"}),
            "search": api.get("/v1/jobs", params={"search": "pa55"}),
            "page": api.get(f"/jobs/{positional}"),
            "pages": api.get("/jobs", params={"task": "sign_in"}),
        }
        for what, r in answers.items():
            assert r.status_code == 200 and "pa55" not in r.text, (what, r.text[:500])
        assert answers["one"].json()["args"] == ["amy", "***"]
        assert answers["other"].json()["kwargs"] == {"user": "bob", "password": "***"}
        assert answers["search"].json()["jobs"] == []


def test_conveyors_own_task_and_queue_are_not_for_clients(api, producer):
    """The bulk-action task and Conveyor's own queue (where the server's bulk
    actions wait) are refused over HTTP, naming the field: a client cannot fill
    that queue, send its task, or lease its jobs away from the server."""
    before = sum(producer.count_jobs().values())
    for path, body, loc in [
        ("/v1/jobs", {"task": "conveyor.bulk_action", "args": ["x"]}, ["body", "task"]),
        ("/v1/jobs", {"task": "add", "args": [1, 2], "queue": "conveyor"}, ["body", "queue"]),
        ("/v1/batches", {"task": "conveyor.bulk_action", "items": [["x"]]}, ["body", "task"]),
        ("/v1/leases", {"worker": "w", "queues": ["conveyor"]}, ["body", "queues", 0]),
    ]:
        r = api.post(path, json=body)
        assert r.status_code == 422, (path, r.text)
        assert r.json()["detail"][0]["loc"] == loc, r.text
        assert "Conveyor's own" in r.json()["detail"][0]["msg"]
    assert sum(producer.count_jobs().values()) == before
