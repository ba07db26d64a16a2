"""Faults made real: a throwaway PostgreSQL cluster with a password that a test
stops and restarts, and a TCP proxy between a worker and its database that a
test cuts. No fakes: real servers, real sockets, real worker processes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.ports import free_port

PASSWORD = "s3cret pw/with:odd@chars"


def _pg_bin() -> Path | None:
    found = shutil.which("initdb")
    candidates = [Path(found).parent] if found else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for d in candidates:
        if (d / "initdb").exists() and (d / "pg_ctl").exists():
            return d
    return None


class Cluster:
    """A PostgreSQL cluster of the test's own, with password authentication."""

    def __init__(self, root: Path) -> None:
        bindir = _pg_bin()
        if bindir is None:
            pytest.fail("no initdb/pg_ctl on this machine: install PostgreSQL (see make test)")
        self.bin = bindir
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        root.mkdir(parents=True, exist_ok=True)
        if os.getuid() == 0:
            shutil.chown(root, "postgres")
        pwfile = root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if os.getuid() == 0:
            shutil.chown(pwfile, "postgres")
        self._as_pg(
            f"{bindir}/initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--auth=scram-sha-256",
            f"--pwfile={pwfile}",
        )
        from urllib.parse import quote

        self.url = (
            f"postgresql://postgres:{quote(PASSWORD, safe='')}@127.0.0.1:{self.port}/postgres"
        )

    def _as_pg(self, *argv: str) -> None:
        cmd = list(argv)
        if os.getuid() == 0:
            cmd = ["su", "postgres", "-s", "/bin/sh", "-c", " ".join(f"'{a}'" for a in argv)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        opts = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root}"
        )
        self._as_pg(
            f"{self.bin}/pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "log"),
            "-w",
            "-o",
            opts,
            "start",
        )

    def stop(self) -> None:
        self._as_pg(f"{self.bin}/pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def crash(self) -> None:
        """Stop as a crash does: every server process quits at once, no checkpoint,
        WAL not yet written from its buffers is lost; the next start recovers."""
        self._as_pg(f"{self.bin}/pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def kill(self) -> None:
        """``kill -9`` of the postmaster and, in the same instant, of every server
        process it started (as a power cut of the database's machine does): no
        process writes another byte, so WAL still in the server's buffers (a claim
        committed without waiting for it) is lost; the next start recovers."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        pids = [postmaster]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                    pids.append(int(stat.parent.name))
            except (OSError, ValueError, IndexError):
                continue  # a process that ended meanwhile
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in pids:  # gone, shared memory released, before the next start
            while Path(f"/proc/{pid}").exists() and "Z" not in _state(pid):
                time.sleep(0.01)
        # Its lock files are stale, as after the machine's reboot; but a killed
        # postmaster nobody reaps (this machine's init does not) keeps its pid, and
        # the next postmaster would take that for a server still running.
        for stale in [self.data / "postmaster.pid", *self.root.glob(".s.PGSQL.*")]:
            stale.unlink(missing_ok=True)

    def answers(self) -> bool:
        try:
            psycopg.connect(self.url, connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    # Not under pytest's tmp dir: the postgres user must reach it.
    root = Path(tempfile.mkdtemp(prefix="conveyor-pg-"))
    c = Cluster(root)
    c.start()
    yield c
    try:
        c.stop()
    except subprocess.CalledProcessError:
        pass
    shutil.rmtree(root, ignore_errors=True)


class Proxy:
    """A TCP forwarder to ``target``: ``cut()`` resets every connection and refuses
    new ones (a network cut as the client sees it), ``restore()`` undoes it;
    ``hold()`` forwards nothing more until ``release()``."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._socks: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._cut = False
        self._held = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)
                continue
            # No timeout once connected: a statement the database takes more than
            # 5 s over (a migration's DDL on a loaded machine) is not a cut.
            upstream.settimeout(None)
            with self._lock:
                self._socks |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                while self._held.is_set() and not self._cut:
                    time.sleep(0.01)
                if self._cut:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            _reset(s)
            with self._lock:
                self._socks.discard(s)

    def cut(self) -> None:
        self._cut = True
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            _reset(s)

    def restore(self) -> None:
        self._cut = False

    def hold(self) -> None:
        """Keep every byte from now on, both ways, the connections open: a
        database that stopped answering (its host frozen, the process stopped)
        without a word to the client, whose TCP stack still acknowledges."""
        self._held.set()

    def release(self) -> None:
        self._held.clear()

    def close(self) -> None:
        self._stop = True
        self.cut()
        self._listener.close()


def _reset(s: socket.socket) -> None:
    """Reset ``s`` at once. The shutdown first: a close alone, while another thread
    is blocked reading the socket, leaves it open until that read returns, so the
    peer (the database, waiting for the client) would never hear of the cut, and
    would keep the session and its locks (test_idle_transaction.py covers that)."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass


@pytest.fixture
def proxy_to() -> Iterator:
    made: list[Proxy] = []

    def make(host: str, port: int) -> Proxy:
        p = Proxy((host, port))
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def _state(pid: int) -> str:
    """A process's state letter (Z: a zombie, ended but not yet reaped), "" if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def in_a_forked_child(child: Callable[[], Any]) -> tuple[int, Any]:
    """Forks; the child runs ``child`` and sends back what it returned (as JSON)
    and never returns into pytest. The child's exit code, and what it sent (None
    if it failed first)."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (3.12+: threads at fork)
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.write(write, json.dumps(child()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        got = pipe.read()
    return os.waitstatus_to_exitcode(status), json.loads(got) if got else None
