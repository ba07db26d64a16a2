"""A primary and a streaming replica of the test's own, from the installed
PostgreSQL binaries: ``initdb`` for the primary, ``pg_basebackup -R`` for the
replica, synchronous replication (``synchronous_standby_names = '*'``) so a commit
the primary acknowledged is on both. ``url`` names both hosts with libpq's
multi-host syntax and ``target_session_attrs=read-write``, as a client of a
Patroni or RDS Multi-AZ pair does; ``crash_primary()`` and ``promote()`` are the
failover. Each server runs as the ``postgres`` user when the tests run as root
(PostgreSQL refuses root), in a directory outside pytest's (which that user
cannot enter)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.ports import free_port


def pg_bindir() -> Path | None:
    found = shutil.which("initdb")
    candidates = [Path(found).parent] if found else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for d in candidates:
        if all((d / exe).exists() for exe in ("initdb", "pg_ctl", "pg_basebackup")):
            return d
    return None


class Server:
    """One PostgreSQL server of the pair: its data directory, port and log."""

    def __init__(self, bindir: Path, root: Path, name: str) -> None:
        self.bin = bindir
        self.dir = root / name
        self.data = self.dir / "data"
        self.port = free_port()
        self.dir.mkdir(parents=True)
        _give_to_postgres(self.dir)
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self, *settings: str) -> None:
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.dir}"
        opts += "".join(f" -c {s}" for s in settings)
        self.ctl("-l", str(self.dir / "log"), "-o", opts, "start")

    def ctl(self, *args: str) -> None:
        run_as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", *args)

    def crash(self) -> None:
        """Every server process quits at once: no checkpoint, no goodbye to clients."""
        self.ctl("-m", "immediate", "stop")

    def stop(self) -> None:
        try:
            self.ctl("-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass  # not running

    def query(self, sql: str) -> list[tuple]:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []


class ReplicatedPair:
    """A primary and its synchronous streaming replica; ``url`` reaches
    whichever of the two is writable."""

    def __init__(self, root: Path) -> None:
        bindir = pg_bindir()
        if bindir is None:
            pytest.skip("no initdb/pg_ctl/pg_basebackup on this machine: install PostgreSQL")
        self.primary = Server(bindir, root, "primary")
        self.replica = Server(bindir, root, "replica")
        run_as_postgres(
            str(bindir / "initdb"), "-D", str(self.primary.data), "-U", "postgres",
            "-E", "UTF8", "--auth=trust",
        )  # fmt: skip
        # Given on the command line, not in postgresql.conf: pg_basebackup copies
        # the files, and a promoted replica that waited for a standby of its own
        # would hang every commit.
        self.primary.start(
            "wal_level=replica",
            "max_wal_senders=5",
            "synchronous_standby_names='*'",
            "shared_preload_libraries=pg_stat_statements",  # what ran where
        )
        run_as_postgres(
            str(bindir / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.primary.port),
            "-U", "postgres", "-D", str(self.replica.data), "-R", "-X", "stream",
        )  # fmt: skip
        self.replica.start("hot_standby=on")
        self._wait_for_sync()
        self.url = (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.replica.port}"
            "/postgres?target_session_attrs=read-write&connect_timeout=2"
        )

    def _wait_for_sync(self) -> None:
        deadline = time.monotonic() + 30
        while self.primary.query("SELECT sync_state FROM pg_stat_replication") != [("sync",)]:
            if time.monotonic() > deadline:
                raise AssertionError("the replica never became a synchronous standby")
            time.sleep(0.1)

    def crash_primary(self) -> None:
        self.primary.crash()

    def promote(self) -> None:
        """The replica becomes the primary (as Patroni or RDS would make it)."""
        self.replica.ctl("promote")

    def stop(self) -> None:
        self.replica.stop()
        self.primary.stop()


def run_as_postgres(*argv: str) -> None:
    cmd = list(argv)
    if os.getuid() == 0:
        quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
        cmd = ["su", "postgres", "-s", "/bin/sh", "-c", quoted]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)


def _give_to_postgres(path: Path) -> None:
    if os.getuid() == 0:
        shutil.chown(path, "postgres")


@pytest.fixture
def pair() -> Iterator[ReplicatedPair]:
    root = Path(tempfile.mkdtemp(prefix="conveyor-pair-"))
    root.chmod(0o755)
    made = None
    try:
        made = ReplicatedPair(root)
        yield made
    finally:
        if made is not None:
            made.stop()
        else:
            for name in ("replica", "primary"):
                data = root / name / "data"
                if (data / "postmaster.pid").exists():
                    subprocess.run(
                        ["su", "postgres", "-s", "/bin/sh", "-c",
                         f"{pg_bindir()}/pg_ctl -D {data} -m immediate stop"],
                        capture_output=True, check=False,
                    )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)
