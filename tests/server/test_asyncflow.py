"""asyncflow compatibility (seed 001): the calls sent exactly as the seed
documents them, its field names, envelope and numeric statuses."""

from __future__ import annotations

import json

from .conftest import wait_for

CONTEXT = '{"ReqBody":{"Msg":"nice to meet u","FromAddr":"fish","ToAddr":"cat"},"UserId":""}'
CREATE = {
    "taskData": {
        "userId": "noob",
        "taskType": "Lark",
        "taskStage": "sendmsg",
        "scheduleLog": "{}",
        "taskContext": CONTEXT,
    }
}
TASK_FIELDS = {
    "userId",
    "taskId",
    "taskType",
    "taskStage",
    "status",
    "crtRetryNum",
    "maxRetryNum",
    "maxRetryInterval",
    "scheduleLog",
    "taskContext",
    "createTime",
    "modifyTime",
}


def ok(r):
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["code"], body["msg"]) == (0, "ok"), body
    return body["result"]


# -- seed 001's calls, as the seed writes them (its casing, its numbers) -----------------
#: (CONTEXT above is the seed's taskContext, the same JSON text)
#: the seed's t_schedule_cfg row, inserted in SQL there:
#: insert into t_schedule_cfg(task_type, schedule_limit, schedule_interval,
#:     max_processing_time,max_retry_num, retry_interval) values ('Lark', 100, 10, 30, 3, 10);
SEED_CFG_ROW = {
    "task_type": "Lark",
    "schedule_limit": 100,
    "schedule_interval": 10,
    "max_processing_time": 30,
    "max_retry_num": 3,
    "retry_interval": 10,
}
SEED_CREATE = {
    "taskData": {
        "userId": "noob",
        "taskType": "Lark",
        "taskStage": "sendmsg",
        "scheduleLog": "{}",
        "taskContext": CONTEXT,
    }
}
#: getTask's answer in the seed (its ids and times are its own)
SEED_TASK = {
    "userId": "noob",
    "taskId": "211896101907726336_lark_task_1",
    "taskType": "lark",
    "taskStage": "sendmsg",
    "status": 2,
    "crtRetryNum": 0,
    "maxRetryNum": 3,
    "maxRetryInterval": 10,
    "scheduleLog": "",
    "taskContext": CONTEXT,
    "createTime": 1723022367534,
    "modifyTime": 1723023186312,
}
SEED_LIST_PARAMS = {"taskType": "lark", "status": 1, "limit": 10}
SEED_HOLD_PARAMS = {"taskType": "lark", "status": 1, "limit": 10}
SEED_SET = {
    "taskId": "211896101907726336_lark_task_1",
    "taskStage": "sendmsg",
    "status": 2,
    "scheduleLog": CONTEXT,
    "taskContext": CONTEXT,
    "orderTime": 612579324307,
    "priority": 34,
    "crtRetryNum": 24,
    "maxRetryNum": 50,
    "maxRetryInterval": 88,
}
SEED_USER_PARAMS = {"userId": "noob", "statusList": "1"}


def like_the_seed(task: dict, status: int) -> None:
    """A task as the seed's answers show one: every field, each of the type the
    seed shows (integers as integers), the values it can share with the seed's."""
    for field, value in SEED_TASK.items():
        assert type(task[field]) is type(value), (field, task[field])
    same = ("userId", "taskType", "taskStage", "maxRetryNum", "maxRetryInterval")
    assert {f: task[f] for f in same} == {f: SEED_TASK[f] for f in same}
    # the same JSON (PostgreSQL's jsonb keeps its own order of keys)
    assert json.loads(task["taskContext"]) == json.loads(SEED_TASK["taskContext"])
    assert task["status"] == status and task["createTime"] > 1_600_000_000_000


def test_the_seed_replayed_as_written(api):
    """Seed 001's calls with its own bodies and parameters: a task created as
    "Lark" is the "lark" its lists and its worker's hold_task ask for (flowsvr
    folds a task type to lower case), and its numbers are integers."""
    # The seed's row; its tasks show maxRetryInterval 10, the cap of their backoff
    # in Conveyor's terms: a cap of 10 s too.
    api.patch(
        "/v1/tasks/Lark/settings",
        json={
            "batch_size": 100,
            "poll_interval_s": 10,
            "max_processing_s": 30,
            "max_attempts": 3,
            "retry_interval_s": 10,
            "retry_cap_s": 10,
        },
    )
    [cfg] = ok(api.post("/api/task_schedule_cfg/list"))["scheduleCfgList"]
    assert {k: cfg[k] for k in SEED_CFG_ROW} == SEED_CFG_ROW
    assert all(type(cfg[k]) is type(v) for k, v in SEED_CFG_ROW.items()), cfg

    task_id = ok(api.post("/api/task/createTask", json=SEED_CREATE))["taskId"]
    assert isinstance(task_id, str)
    like_the_seed(ok(api.get("/api/task/getTask", params={"taskId": task_id}))["taskData"], 1)
    [waiting] = ok(api.get("/api/task/getTaskList", params=SEED_LIST_PARAMS))["taskList"]
    assert waiting["taskId"] == task_id and waiting["crtRetryNum"] == 0
    like_the_seed(waiting, 1)

    [held] = ok(api.post("/api/task/hold_task", params=SEED_HOLD_PARAMS))["taskList"]
    assert held["taskId"] == task_id
    like_the_seed(held, 2)
    assert ok(api.post("/api/task/hold_task", params=SEED_HOLD_PARAMS))["taskList"] == []

    assert ok(api.post("/api/task/setTask", json={**SEED_SET, "taskId": task_id})) is None
    like_the_seed(ok(api.get("/api/task/getTask", params={"taskId": task_id}))["taskData"], 2)
    assert ok(api.get("/api/task/getUserTaskList", params=SEED_USER_PARAMS)) == {"taskList": []}


def test_a_task_type_is_the_same_whatever_its_case(api, producer):
    """As in flowsvr, whose tables and task ids fold a type to lower case: a type
    names the same tasks in any case, those created before the type had settings
    (of another case) too; a type with settings creates its jobs under its name."""
    email = {"taskData": {"taskType": "Email", "userId": "u"}}
    first = ok(api.post("/api/task/createTask", json=email))["taskId"]
    assert producer.get_job(int(first)).task == "email"
    api.patch("/v1/tasks/EMAIL/settings", json={"max_attempts": 5})
    email["taskData"]["taskType"] = "email"
    second = ok(api.post("/api/task/createTask", json=email))["taskId"]
    job = producer.get_job(int(second))
    assert (job.task, job.max_attempts) == ("EMAIL", 5)
    listed = ok(api.get("/api/task/getTaskList", params={"taskType": "EMAIL", "status": 1}))
    assert sorted(t["taskId"] for t in listed["taskList"]) == sorted([first, second])
    assert {t["taskType"] for t in listed["taskList"]} == {"email"}
    held = ok(api.post("/api/task/hold_task", params={"taskType": "eMaIl", "limit": 10}))
    assert sorted(t["taskId"] for t in held["taskList"]) == sorted([first, second])


def test_the_seed_flow(api, producer):
    # the seed's config row: 100 per hold, every 10 s, 30 s max, 3 retries, 10 s interval
    api.patch(
        "/v1/tasks/Lark/settings",
        json={
            "batch_size": 100,
            "poll_interval_s": 10,
            "max_processing_s": 30,
            "max_attempts": 3,
            "retry_interval_s": 10,
        },
    )
    [cfg] = ok(api.post("/api/task_schedule_cfg/list"))["scheduleCfgList"]
    assert {
        k: cfg[k]
        for k in (
            "task_type",
            "schedule_limit",
            "schedule_interval",
            "max_processing_time",
            "max_retry_num",
            "retry_interval",
        )
    } == {
        "task_type": "Lark",
        "schedule_limit": 100,
        "schedule_interval": 10,
        "max_processing_time": 30,
        "max_retry_num": 3,
        "retry_interval": 10,
    }
    assert {"create_time", "modify_time"} <= set(cfg)

    task_id = ok(api.post("/api/task/createTask", json=CREATE))["taskId"]
    assert isinstance(task_id, str)
    task = ok(api.get("/api/task/getTask", params={"taskId": task_id}))["taskData"]
    assert set(task) >= TASK_FIELDS
    assert (task["userId"], task["taskId"], task["taskType"], task["taskStage"]) == (
        "noob",
        task_id,
        "lark",
        "sendmsg",
    )
    assert (task["status"], task["crtRetryNum"], task["maxRetryNum"]) == (1, 0, 3)
    assert json.loads(task["taskContext"]) == json.loads(CONTEXT)
    assert task["createTime"] > 1_600_000_000_000  # milliseconds
    waiting = ok(
        api.get("/api/task/getTaskList", params={"taskType": "Lark", "status": 1, "limit": 10})
    )
    assert [t["taskId"] for t in waiting["taskList"]] == [task_id]

    # hold_task: query parameters; the tasks as they are after the claim; never twice
    held = ok(
        api.post("/api/task/hold_task", params={"taskType": "Lark", "status": 1, "limit": 10})
    )
    [h] = held["taskList"]
    assert (h["taskId"], h["status"], h["crtRetryNum"]) == (task_id, 2, 1)
    assert (
        ok(api.post("/api/task/hold_task", params={"taskType": "Lark", "status": 1, "limit": 10}))[
            "taskList"
        ]
        == []
    )
    running = ok(
        api.get("/api/task/getTaskList", params={"taskType": "Lark", "status": 2, "limit": 10})
    )
    assert [t["taskId"] for t in running["taskList"]] == [task_id]

    # status 2: still holding it
    ok(api.post("/api/task/setTask", json={"taskId": task_id, "status": 2}))
    # status 1 with a new stage: to the next stage, back in the queue
    next_context = '{"ReqBody":{"Msg":"stage two"}}'
    ok(
        api.post(
            "/api/task/setTask",
            json={
                "taskId": task_id,
                "taskStage": "sendagain",
                "status": 1,
                "scheduleLog": "{}",
                "taskContext": next_context,
                "priority": 34,
            },
        )
    )
    t = ok(api.get("/api/task/getTask", params={"taskId": task_id}))["taskData"]
    assert (t["status"], t["taskStage"], t["priority"], t["crtRetryNum"]) == (1, "sendagain", 34, 0)
    assert json.loads(t["taskContext"]) == {"ReqBody": {"Msg": "stage two"}}
    # status 1, same stage: a retry, the error from the worker's scheduleLog
    ok(api.post("/api/task/hold_task", params={"taskType": "Lark", "status": 1, "limit": 10}))
    log = json.dumps({"LastData": {"TraceId": "x", "ErrMsg": "smtp down", "Cost": "3ms"}})
    ok(
        api.post(
            "/api/task/setTask",
            json={
                "taskId": task_id,
                "taskStage": "sendagain",
                "status": 1,
                "scheduleLog": log,
                "orderTime": 0,
            },
        )
    )
    t = ok(api.get("/api/task/getTask", params={"taskId": task_id}))["taskData"]
    assert (t["status"], t["crtRetryNum"]) == (1, 1)
    schedule = json.loads(t["scheduleLog"])
    assert "smtp down" in schedule["LastData"]["ErrMsg"]
    assert len(schedule["HistoryDatas"]) == 2  # stage one's run, then the failed try
    assert [h["TraceId"] for h in schedule["HistoryDatas"]] == [
        f"{task_id}-sendmsg-1",
        f"{task_id}-sendagain-1",
    ]
    assert schedule["LastData"]["Cost"].endswith("ms")
    # status 3: succeeded
    ok(api.post("/api/task/hold_task", params={"taskType": "Lark", "status": 1, "limit": 10}))
    ok(
        api.post(
            "/api/task/setTask",
            json={"taskId": task_id, "status": 3, "taskContext": '{"sent": true}'},
        )
    )
    done = ok(api.get("/api/task/getUserTaskList", params={"userId": "noob", "statusList": "3"}))
    [d] = done["taskList"]
    assert (d["taskId"], d["status"]) == (task_id, 3)
    assert producer.get_job(int(task_id)).result == {"sent": True}
    assert (
        ok(api.get("/api/task/getUserTaskList", params={"userId": "noob", "statusList": "1,2"}))[
            "taskList"
        ]
        == []
    )

    # errors: the envelope with a non-zero code
    r = api.post("/api/task/setTask", json={"taskId": task_id, "status": 3})
    assert r.status_code == 200 and r.json()["code"] == 409 and "not held" in r.json()["msg"]
    r = api.get("/api/task/getTask", params={"taskId": "424242"})
    assert r.json()["code"] == 404 and r.json()["result"] is None
    r = api.get("/api/task/getTask", params={"taskId": "211896101907726336_lark_task_1"})
    assert r.json()["code"] == 422 and "taskId" in r.json()["msg"]
    r = api.post("/api/task/createTask", json={"taskData": {"userId": "noob"}})
    assert r.json()["code"] == 422 and "taskType" in r.json()["msg"]
    r = api.post(
        "/api/task/createTask", json={"taskData": {"taskType": "Lark", "taskContext": "{not json"}}
    )
    assert r.json()["code"] == 422 and "taskContext" in r.json()["msg"]
    r = api.post("/api/task/setTask", json={"taskId": task_id, "status": 7})
    assert r.json()["code"] == 422 and "status" in r.json()["msg"]
    assert api.get("/api/task/nothing").json()["code"] == 404


def test_failed_cancelled_and_a_hold_past_its_deadline(api, producer):
    api.patch("/v1/tasks/Quick/settings", json={"max_processing_s": 0.5, "max_attempts": 2})
    ids = [
        ok(
            api.post(
                "/api/task/createTask", json={"taskData": {"taskType": "Quick", "userId": "u"}}
            )
        )["taskId"]
        for _ in range(3)
    ]
    held = ok(
        api.post("/api/task/hold_task", params={"taskType": "Quick", "status": 1, "limit": 1})
    )
    [first] = held["taskList"]
    # past max_processing_s the server takes it back; the old hold's setTask is refused
    wait_for(
        lambda: (
            ok(api.get("/api/task/getTask", params={"taskId": first["taskId"]}))["taskData"][
                "status"
            ]
            == 1
        ),
        what="the expired hold to be taken back",
    )
    r = api.post("/api/task/setTask", json={"taskId": first["taskId"], "status": 3})
    assert r.json()["code"] == 409
    # the rest holds for longer: a loaded machine took 0.5 s between two requests
    api.patch("/v1/tasks/Quick/settings", json={"max_processing_s": 60, "max_attempts": 2})
    # status 4: failed for good, with the worker's error
    held = ok(
        api.post("/api/task/hold_task", params={"taskType": "Quick", "status": 1, "limit": 3})
    )
    assert len(held["taskList"]) == 3
    log = json.dumps({"LastData": {"ErrMsg": "bad request"}})
    ok(api.post("/api/task/setTask", json={"taskId": ids[1], "status": 4, "scheduleLog": log}))
    t = ok(api.get("/api/task/getTask", params={"taskId": ids[1]}))["taskData"]
    assert t["status"] == 4 and "bad request" in json.loads(t["scheduleLog"])["LastData"]["ErrMsg"]
    # a cancelled task shows as failed (4), saying so in scheduleLog
    producer.cancel_jobs(ids=[int(ids[2])])
    ok(api.post("/api/task/setTask", json={"taskId": ids[2], "status": 3}))  # finished as cancelled
    t = ok(api.get("/api/task/getTask", params={"taskId": ids[2]}))["taskData"]
    assert t["status"] == 4 and "cancel" in json.loads(t["scheduleLog"])["LastData"]["ErrMsg"]
    failed = ok(api.get("/api/task/getUserTaskList", params={"userId": "u", "statusList": "4"}))
    assert sorted(x["taskId"] for x in failed["taskList"]) == sorted(ids[1:])


def test_a_hold_past_its_deadline_is_fenced_only_until_the_task_is_held_again(api):
    # the limit docs/guides/server.md states: setTask names no hold (no token), so
    # once the task is held again, the expired hold's setTask counts as the new one's
    api.patch("/v1/tasks/Relay/settings", json={"max_processing_s": 0.5, "max_attempts": 3})
    task_id = ok(api.post("/api/task/createTask", json={"taskData": {"taskType": "Relay"}}))[
        "taskId"
    ]

    def status() -> int:
        return ok(api.get("/api/task/getTask", params={"taskId": task_id}))["taskData"]["status"]

    ok(api.post("/api/task/hold_task", params={"taskType": "Relay", "status": 1}))  # the first
    wait_for(lambda: status() == 1, what="the expired hold to be taken back")
    expired = api.post("/api/task/setTask", json={"taskId": task_id, "status": 3})
    assert expired.json()["code"] == 409  # nobody holds it: refused
    api.patch("/v1/tasks/Relay/settings", json={"max_processing_s": 60})
    again = ok(api.post("/api/task/hold_task", params={"taskType": "Relay", "status": 1}))
    assert [t["taskId"] for t in again["taskList"]] == [task_id]  # the second hold
    late = api.post("/api/task/setTask", json={"taskId": task_id, "status": 3})
    assert late.json()["code"] == 0 and status() == 3  # the first holder's, taken
    second = api.post("/api/task/setTask", json={"taskId": task_id, "status": 4})
    assert second.json()["code"] == 409 and status() == 3
