"""Rows to records, and back: the same for every dialect, given how the dialect
hands back timestamps (``ts``) and JSON columns (``loads``)."""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from ...encoding import Unreadable, read_json
from ...records import (
    ActionRecord,
    ApiToken,
    Attempt,
    BatchRecord,
    BatchState,
    ChainLink,
    JobRecord,
    JobState,
    NodeState,
    QueueInfo,
    StepRecord,
    TaskSettings,
    TokenScope,
    WorkerInfo,
    WorkflowNode,
    WorkflowRecord,
    WorkflowState,
    frozen_record,
)

Ts = Callable[[Any], datetime | None]
Loads = Callable[[Any], Any]


def loads(value: Any) -> Any:
    """JSON columns arrive as text from every dialect (PostgreSQL is told to hand
    jsonb back as text), so one decoder serves all."""
    return None if value is None else json.loads(value)


def _list(value: Any) -> list[Any]:
    """Arrays: PostgreSQL text[] arrives as a list, the others store JSON text."""
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else list(json.loads(value))


#: JobState by its text, without the Enum call (a claim decodes hundreds of rows)
_STATES = {s.value: s for s in JobState}


#: The columns a job record is made from, in the order ``_job`` takes them: those
#: every job query returns, then those some leave out (read as NULL then).
_JOB_REQUIRED = (
    "id",
    "queue",
    "task",
    "args",
    "state",
    "priority",
    "attempt",
    "max_attempts",
    "created_at",
    "scheduled_at",
    "started_at",
    "finished_at",
    "stage",
    "timeout_s",
    "backoff",
    "unique_key",
    "idempotency_key",
    "lease_owner",
    "lease_token",
    "lease_expires_at",
)
_JOB_OPTIONAL = (
    "result",
    "error",
    "batch_id",
    "context",
    "chain_root",
    "chain_next",
    "chain",
    "tenant",
    "base_priority",
    "concurrency_key",
    "rate_key",
    "pinned_to",
    "cancel_requested",
)
_pick_required = operator.itemgetter(*_JOB_REQUIRED)


def _job(values: Sequence[Any], ts: Ts) -> JobRecord:
    (
        id_,
        queue,
        task,
        args_json,
        state,
        priority,
        attempt,
        max_attempts,
        created_at,
        scheduled_at,
        started_at,
        finished_at,
        stage,
        timeout_s,
        backoff,
        unique_key,
        idempotency_key,
        lease_owner,
        lease_token,
        lease_expires_at,
        result,
        error,
        batch_id,
        context,
        chain_root,
        chain_next,
        chain,
        tenant,
        base_priority,
        concurrency_key,
        rate_key,
        pins,
        cancel_requested,
    ) = values
    problems: list[str] = []
    if not isinstance(args := _read("args", args_json, problems) or {}, dict):
        args = _not_arguments(problems)
    return frozen_record(
        JobRecord,
        {
            "id": id_,
            "queue": queue,
            "task": task,
            "args": list(args.get("args", [])),
            "kwargs": dict(args.get("kwargs", {})),
            "state": _STATES.get(state) or JobState(state),
            "priority": priority,
            "attempts": attempt,
            "max_attempts": max_attempts,
            "created_at": ts(created_at) or datetime.now(UTC),
            "scheduled_at": ts(scheduled_at) or datetime.now(UTC),
            "started_at": ts(started_at),
            "finished_at": ts(finished_at),
            "result": _read("result", result, problems),
            "error": error,
            "stage": stage,
            "timeout": timeout_s,
            "backoff": loads(backoff),
            "unique_key": unique_key,
            "idempotency_key": idempotency_key,
            "lease_owner": lease_owner,
            "lease_token": lease_token,
            "lease_expires_at": ts(lease_expires_at),
            "batch_id": batch_id,
            "context": _read("context", context, problems),
            "chain_root": chain_root,
            "chain_next": chain_next,
            "chain": _read("chain", chain, problems),
            "tenant": tenant,
            "base_priority": base_priority,
            "concurrency_key": concurrency_key,
            "rate_key": rate_key,
            "pinned_to": None if pins is None else _list(pins),
            "cancel_requested": bool(cancel_requested),
            "headers": dict(args.get("headers") or {}),
            "unreadable": "; ".join(problems) if problems else None,
        },
    )


def _not_arguments(problems: list[str]) -> dict[str, Any]:
    """What a job whose ``args`` column holds JSON but no arguments document is
    read with: no arguments, and why (the rare path, out of ``_job``'s way)."""
    problems.append("args: not an arguments document")
    return {}


def _read(name: str, text: str | None, problems: list[str]) -> Any:
    """A job's JSON column, or ``None`` with what is wrong with it added to
    ``problems``: one unreadable job is shown as such (``JobRecord.unreadable``),
    and never breaks a list, a page or a claim of others."""
    if text is None:
        return None
    try:
        return read_json(text)
    except Unreadable as exc:
        problems.append(f"{name}: {exc}")
        return None


def job_from_row(row: Mapping[str, Any], ts: Ts) -> JobRecord:
    """A job from a row read as a dict (a missing required column: KeyError)."""
    return _job((*_pick_required(row), *map(row.get, _JOB_OPTIONAL)), ts)


def job_reader(names: Sequence[str], ts: Ts) -> Callable[[tuple[Any, ...]], JobRecord]:
    """Jobs from the plain tuple rows of a result whose columns are ``names``: one C
    call picks a row's columns in the order ``_job`` takes them, instead of a dict
    made per row and read by name (a claim decodes hundreds of rows; the dict was a
    third of the decoding). A column named twice is read at its last, as a dict
    keeps it."""
    pick = _picker(tuple(names))
    return lambda row: _job(pick(row), ts)


@functools.lru_cache(maxsize=64)
def _picker(names: tuple[str, ...]) -> Callable[[tuple[Any, ...]], Sequence[Any]]:
    """The columns ``_job`` takes, picked from a row of ``names`` (made once per
    result shape: every claim of one statement returns the same columns)."""
    index = {name: i for i, name in enumerate(names)}
    missing = [c for c in _JOB_REQUIRED if c not in index]
    if missing:
        raise KeyError(f"the result has no column {', '.join(missing)} of a job")
    width = len(names)  # where a padded row has its NULL
    pick = operator.itemgetter(*(index.get(c, width) for c in _JOB_REQUIRED + _JOB_OPTIONAL))
    if all(c in index for c in _JOB_OPTIONAL):
        return pick
    return lambda row: pick((*row, None))


def attempt_from_row(row: dict[str, Any], ts: Ts) -> Attempt:
    return Attempt(
        job_id=row["job_id"],
        attempt=row["attempt"],
        worker_id=row["worker_id"],
        started_at=ts(row["started_at"]),
        finished_at=ts(row["finished_at"]) or datetime.now(UTC),
        outcome=row["outcome"],
        stage=row.get("stage"),
        error=row["error"],
        traceback=row["traceback"],
    )


def batch_from_row(row: dict[str, Any], ts: Ts) -> BatchRecord:
    callback_state = row.get("callback_state")
    state = BatchState(row["state"])
    if state != BatchState.RUNNING and callback_state == JobState.FAILED:
        state = BatchState.CALLBACK_FAILED
    return BatchRecord(
        id=row["id"],
        name=row["name"],
        task=row["task"],
        total=row["total"],
        state=state,
        idempotency_key=row["idempotency_key"],
        on_complete=loads(row["on_complete"]),
        closings=row["closings"],
        counts=loads(row["counts"]),
        created_at=ts(row["created_at"]) or datetime.now(UTC),
        finished_at=ts(row["finished_at"]),
        cancelled_at=ts(row["cancelled_at"]),
        callback_job_id=row.get("callback_job_id"),
        callback_state=None if callback_state is None else JobState(callback_state),
        fingerprint=row.get("fingerprint"),
    )


def worker_from_row(row: dict[str, Any], ts: Ts) -> WorkerInfo:
    tasks = row.get("tasks")
    return WorkerInfo(
        id=row["id"],
        hostname=row["hostname"],
        pid=row["pid"],
        queues=_list(row["queues"]),
        concurrency=row["concurrency"],
        tags=_list(row.get("tags")),
        started_at=ts(row["started_at"]),
        last_seen_at=ts(row["last_seen_at"]),
        tasks=None if tasks is None else _list(tasks),
        running=int(row.get("held_jobs") or 0),
        stop_requested=bool(row.get("stop_requested")),
    )


def queue_from_row(row: dict[str, Any]) -> QueueInfo:
    return QueueInfo(
        name=row["name"],
        paused=bool(row["paused"]),
        counts={k: int(v) for k, v in (loads(row["counts"]) or {}).items()},
        max_running=row["max_running"],
        rate_per_s=row.get("rate_per_s"),
        rate_burst=row.get("rate_burst"),
    )


def chain_link_from_row(row: dict[str, Any]) -> ChainLink:
    return ChainLink(
        id=row["id"],
        state=row["state"],
        result_json=row["result"],
        error=row["error"],
        chain=json.loads(row["chain"]),
        chain_root=row["chain_root"],
    )


def action_from_row(row: dict[str, Any], ts: Ts) -> ActionRecord:
    return ActionRecord(
        id=row["id"],
        action=row["action"],
        filter=json.loads(row["filter"]),
        actor=row["actor"],
        matched=int(row["matched"]),
        done=int(row["done"]),
        requested=int(row["requested"]),
        state=row["state"],
        error=row["error"],
        created_at=ts(row["created_at"]) or datetime.now(UTC),
        finished_at=ts(row["finished_at"]),
    )


def token_from_row(row: dict[str, Any], ts: Ts) -> ApiToken:
    return ApiToken(
        id=row["id"],
        name=row["name"],
        scope=TokenScope(row["scope"]),
        created_at=ts(row["created_at"]) or datetime.now(UTC),
        revoked_at=ts(row["revoked_at"]),
    )


def task_settings_from_row(row: dict[str, Any], ts: Ts) -> TaskSettings:
    return TaskSettings(
        task=row["task"],
        batch_size=row["batch_size"],
        poll_interval_s=row["poll_interval_s"],
        max_processing_s=row["max_processing_s"],
        max_attempts=row["max_attempts"],
        retry_interval_s=row["retry_interval_s"],
        retry_cap_s=row["retry_cap_s"],
        updated_at=ts(row["updated_at"]),
    )


def workflow_from_row(row: Mapping[str, Any], ts: Ts) -> WorkflowRecord:
    return WorkflowRecord(
        id=int(row["id"]),
        name=row["name"],
        state=WorkflowState(row["state"]),
        idempotency_key=row["idempotency_key"],
        total=int(row["total"]),
        open_nodes=int(row["open_nodes"]),
        failures=int(row["failures"]),
        round=int(row["round"]),
        error=row["error"],
        created_at=ts(row["created_at"]) or datetime.now(UTC),
        updated_at=ts(row["updated_at"]) or datetime.now(UTC),
        finished_at=ts(row["finished_at"]),
        cancelled_at=ts(row["cancelled_at"]),
        fingerprint=row["fingerprint"],
    )


def workflow_node_from_row(row: Mapping[str, Any], ts: Ts) -> WorkflowNode:
    step = loads(row["step"])
    return WorkflowNode(
        workflow_id=int(row["workflow_id"]),
        node=int(row["node"]),
        item=int(row["item"]),
        name=row["name"],
        kind=row["kind"],
        task=step.get("task") if isinstance(step, dict) else None,
        parents=[int(p) for p in loads(row["parents"])],
        children=[int(c) for c in loads(row["children"])],
        over_node=row["over_node"],
        on_parent_failure=row["on_parent_failure"],
        state=NodeState(row["state"]),
        job_id=row["job_id"],
        items=row["items"],
        result_json=row["result"],
        error=row["error"],
        round=int(row["round"]),
        updated_at=ts(row["updated_at"]) or datetime.now(UTC),
        finished_at=ts(row["finished_at"]),
    )


def step_from_row(row: dict[str, Any]) -> StepRecord:
    due = row.get("due_in_s")
    return StepRecord(
        name=row["name"],
        kind=row["kind"],
        result_json=row["result"],
        done=bool(row["done"]),
        timed_out=bool(row["timed_out"]),
        event_key=row["event_key"],
        due_in_s=None if due is None else float(due),
    )
