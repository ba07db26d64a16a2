"""Conveyor peer benchmark: the same three phases, through the shared harness.

Uses ``_common.py`` from the shared peer folder (``../shared/bench/peers`` next to
this repository, or ``$PEERBENCH_PEERS``), so Conveyor is measured by exactly the
code that measures PgQueuer and the others (see that module for the phases).

Settings: Conveyor's public API only. Bulk enqueue is ``task.send_many`` (one
statement, one transaction per chunk); one-by-one is ``task.send``; the worker is
``Worker(app, queues=["bench"], concurrency=C, fetch_batch=B, lease_s=30)`` run
with ``run_async`` in one process, or with ``--cli`` what a user runs: the process
becomes ``conveyor worker --app cli_app:app --queues bench --burst`` (the CLI's
defaults; ``bench/cli_app.py``) before it imports Conveyor, so the harness's wall
time is that process's. ``--backend postgres`` uses the database
``peer_conveyor`` (default durable settings); ``--backend sqlite`` uses a file in
the scratch folder with Conveyor's default ``synchronous=full``.

    PEERBENCH_PG=postgresql://postgres@127.0.0.1:5432 \\
        /tmp/peerbench/venv/bin/python bench/bench_conveyor.py --backend postgres --n 20000
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEERS = Path(os.environ.get("PEERBENCH_PEERS") or REPO.parent / "shared" / "bench" / "peers")
if not (PEERS / "_common.py").is_file():
    sys.exit(
        f"bench_conveyor: the shared peer harness is missing ({PEERS / '_common.py'}); "
        "set PEERBENCH_PEERS to the folder holding _common.py"
    )
sys.path.insert(0, str(PEERS))
import _common as C  # noqa: E402


def exec_cli_worker(argv: list[str]) -> None:
    """--cli: this worker process becomes `conveyor worker` (never returns)."""
    p = C.base_parser(__doc__)
    p.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    args, _ = p.parse_known_args(argv)
    url = C.dsn(PG_DB) if args.backend == "postgres" else f"sqlite:///{SQLITE_FILE}"
    env = {
        **os.environ,
        "CONVEYOR_DATABASE_URL": url,
        "PEERBENCH_ROLE": args.role,
        "PEERBENCH_RESULT": args.result_file,
        "PEERBENCH_N": str(args.n if args.role == "worker-drain" else args.lat_n),
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO / "bench"), str(PEERS), os.environ.get("PYTHONPATH")) if p
        ),
    }
    cmd = [sys.executable, "-m", "conveyor.cli.main", "worker", "--app", "cli_app:app"]
    cmd += ["--queues", "bench", *(["--burst"] if args.role == "worker-drain" else [])]
    os.execve(sys.executable, cmd, env)


QUEUE = "bench"
PG_DB = "peer_conveyor"
# The harness resets a PostgreSQL database named after the adapter before every
# run; the SQLite adapter gets its own (otherwise unused) name so it never
# clobbers the PostgreSQL one.
SQLITE_DB = "peer_conveyor_sqlite"
SQLITE_FILE = C.SCRATCH / "conveyor.db"
# before Conveyor is imported: the worker's start-up is the CLI's alone
ROLE = sys.argv[1] if len(sys.argv) > 1 else ""
if __name__ == "__main__" and ROLE.startswith("worker-") and "--cli" in sys.argv:
    exec_cli_worker(sys.argv[1:])

from _bench import commit  # noqa: E402

import conveyor  # noqa: E402
from conveyor import Conveyor  # noqa: E402
from conveyor.runtime.worker import Worker  # noqa: E402

FINISHED = {"succeeded", "failed", "cancelled"}


def database_url(backend: str) -> str:
    if backend == "postgres":
        return C.dsn(PG_DB)
    return f"sqlite:///{SQLITE_FILE}"


def make_app(backend: str, handler=None):
    """A Conveyor app with the benchmark's one task registered on it."""
    app = Conveyor(database_url(backend))

    async def noop(t: float, w: bool) -> None:
        if handler is not None:
            handler(t, w)

    task = app.task(name="noop", queue=QUEUE)(noop)
    return app, task


def remove_sqlite_files() -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        p = Path(str(SQLITE_FILE) + suffix)
        if p.exists():
            p.unlink()


class Adapter:
    name = "conveyor"
    version = conveyor.__version__

    def __init__(self, args):
        self.backend = args.backend
        self.db = PG_DB if args.backend == "postgres" else SQLITE_DB
        self.settings = {
            "backend": args.backend,
            "driver": "psycopg3" if args.backend == "postgres" else "sqlite3",
            "concurrency": args.concurrency,
            "fetch_batch": args.fetch_batch,
            "durability": "durable" if args.backend == "postgres" else "synchronous=full",
            "loop": args.loop,
            "worker": "conveyor worker (CLI defaults)" if args.cli else "in-process Worker",
            "commit": commit(),
        }
        self.app = None
        self.task = None

    def _fresh(self) -> None:
        """An empty schema: the database (or file) recreated, then migrated."""
        if self.app is not None:
            self.app.close()
            self.app = None
        if self.backend == "postgres":
            C.reset_database(PG_DB)
        else:
            C.SCRATCH.mkdir(parents=True, exist_ok=True)
            remove_sqlite_files()
        self.app, self.task = make_app(self.backend)
        self.app.migrate()

    async def install(self):
        # orchestrate() has just reset the PostgreSQL database; SQLite starts over here.
        if self.backend == "sqlite":
            C.SCRATCH.mkdir(parents=True, exist_ok=True)
            remove_sqlite_files()
        self.app, self.task = make_app(self.backend)
        self.app.migrate()

    async def enqueue_bulk(self, n, batch):
        for start in range(0, n, batch):
            k = min(batch, n - start)
            self.task.send_many([(0.0, False)] * k)

    async def enqueue_one(self, t, warm):
        self.task.send(t, warm)

    async def pending(self):
        return sum(c.count for c in self.app.counts() if c.state not in FINISHED)

    async def clear(self):
        # The backend seam has no "delete all jobs" verb (and SQL lives only in the
        # backend packages), so start from a new, migrated database. Called between
        # phases only, never inside a timed section.
        self._fresh()

    async def close(self):
        if self.app is not None:
            self.app.close()
            self.app = None


def new_worker(app, args) -> Worker:
    return Worker(
        app, queues=[QUEUE], concurrency=args.concurrency, fetch_batch=args.fetch_batch, lease_s=30
    )


async def worker_drain(args):
    rec = C.DrainRecorder(args.n)
    worker = None

    def handle(t, w):
        rec.start()
        if rec.end():
            rec.dump(args.result_file)
            worker.stop()

    app, _ = make_app(args.backend, handle)
    worker = new_worker(app, args)
    try:
        await worker.run_async()
    finally:
        app.close()


async def worker_latency(args):
    rec = C.LatencyRecorder(args.lat_n, args.result_file + ".ready")
    worker = None

    def handle(t, w):
        if rec.job(t, w):
            rec.dump(args.result_file)
            worker.stop()

    app, _ = make_app(args.backend, handle)
    worker = new_worker(app, args)
    try:
        await worker.run_async()
    finally:
        app.close()


def run(coro, loop: str):
    if loop == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def main():
    p = C.base_parser(__doc__)
    p.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    p.add_argument("--concurrency", type=int, default=100, help="worker concurrency")
    p.add_argument("--fetch-batch", type=int, default=100, help="jobs claimed per statement")
    p.add_argument(
        "--loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="event loop of the worker and the producer (Worker.run uses asyncio)",
    )
    p.add_argument(
        "--cli",
        action="store_true",
        help="drain and latency by `conveyor worker` with its defaults (its concurrency and "
        "fetch batch: --concurrency and --fetch-batch are then ignored), as users run it",
    )
    args = p.parse_args()
    extra = ["--cli"] if args.cli else []
    extra += [
        "--backend",
        args.backend,
        "--concurrency",
        str(args.concurrency),
        "--fetch-batch",
        str(args.fetch_batch),
        "--loop",
        args.loop,
    ]
    if args.role == "worker-drain":
        run(worker_drain(args), args.loop)
    elif args.role == "worker-latency":
        run(worker_latency(args), args.loop)
    else:
        run(C.orchestrate(Adapter(args), args, __file__, extra), args.loop)


if __name__ == "__main__":
    main()
