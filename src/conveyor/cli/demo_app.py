"""The tasks `conveyor demo` runs. A real module, so worker processes can load it with
``--app conveyor.cli.demo_app:app`` like any user's app.

Each task shows one behaviour; which inputs fail is decided by the input number,
so every run of the demo tells the same story.
"""

from __future__ import annotations

import asyncio

from conveyor import Backoff, Conveyor, Permanent, current_job

#: URL from CONVEYOR_DATABASE_URL: `conveyor demo` sets it for itself and its workers.
app = Conveyor()

#: retries come back after ~0.2s, 0.4s, 0.8s: the demo shows retries without waiting long
QUICK_RETRY = Backoff(base=0.2, factor=2.0, cap=2.0, jitter=0.25)

#: what each task does, for the demo's summary table
BEHAVIOUR = {
    "fast": "returns at once",
    "slow": "sleeps 0.2-1s (async)",
    "flaky": "fails n%4 times, then succeeds (3 attempts)",
    "picky": "rejects every 5th input (Permanent)",
    "batch_done": "the batch's on_complete: summarises its final counts",
}


@app.task(queue="default")
def fast(n: int) -> int:
    return n * n


@app.task(queue="reports", timeout=10)
async def slow(n: int) -> dict[str, int]:
    await asyncio.sleep(0.2 + (n * 37 % 81) / 100)  # 0.2 .. 1.0 s, spread over inputs
    return {"report": n, "pages": n % 7 + 1}


@app.task(queue="default", max_attempts=3, backoff=QUICK_RETRY, retry_on=(ConnectionError,))
def flaky(n: int) -> str:
    # Inputs with n % 4 == 3 fail three times: they run out of attempts and fail.
    attempt = current_job().attempts
    if attempt <= n % 4:
        raise ConnectionError(f"simulated upstream timeout for item {n}")
    return f"item {n} synced on attempt {attempt}"


@app.task(queue="emails")
def picky(n: int) -> str:
    if n % 5 == 0:
        raise Permanent(f"address user{n}@example.invalid does not exist")
    return f"sent to user{n}@example.com"


@app.task(queue="default")
def batch_done(batch_id: int, counts: dict[str, int]) -> str:
    """The demo batch's on_complete: called once, with the final counts, when it closes."""
    parts = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    return f"batch {batch_id} closed with {parts or 'no jobs'}"
