"""The app ``bench_conveyor.py --cli`` runs under a real ``conveyor worker`` process
(``conveyor worker --app cli_app:app --queues bench [--burst]``), as a user runs
it: its one task records, through the shared harness's recorders, the first
handler start and the last end of the drain (written when the process exits) or
each job's delay from its send (the latency worker stops its own process with
SIGTERM once it has them all, a graceful stop).

Set by bench_conveyor.py: CONVEYOR_DATABASE_URL, PEERBENCH_ROLE (worker-drain or
worker-latency), PEERBENCH_RESULT (the harness's result file), PEERBENCH_N (jobs
expected), and PYTHONPATH holding this folder and the shared peer harness's.
"""

from __future__ import annotations

import atexit
import os
import signal

import _common as C

from conveyor import Conveyor

ROLE = os.environ["PEERBENCH_ROLE"]
RESULT = os.environ["PEERBENCH_RESULT"]
N = int(os.environ["PEERBENCH_N"])

app = Conveyor(os.environ["CONVEYOR_DATABASE_URL"])

if ROLE == "worker-drain":
    drained = C.DrainRecorder(N)
    atexit.register(lambda: drained.dump(RESULT))

    @app.task(name="noop", queue="bench")
    async def noop(t: float, w: bool) -> None:
        drained.start()
        drained.end()

else:
    timed = C.LatencyRecorder(N, RESULT + ".ready")

    @app.task(name="noop", queue="bench")
    async def noop(t: float, w: bool) -> None:
        if timed.job(t, w):
            timed.dump(RESULT)
            os.kill(os.getpid(), signal.SIGTERM)
