"""SQLite: this process's writers take turns on a lock (see SQLiteBackend._tx). A
child forked while a parent's thread holds that turn must not inherit it held."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from conveyor import Conveyor

from .conftest import in_a_forked_child


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="needs fork")
def test_a_forked_child_writes_while_the_parent_holds_its_turn(tmp_path):
    url = f"sqlite:///{tmp_path / 'fork.db'}"
    parent = Conveyor(url)
    parent.enqueue("t", args=[0], queue="default")
    turn = parent.backend._writer()
    held, release = threading.Event(), threading.Event()

    def mid_transaction() -> None:  # another thread of the parent holds the turn
        with turn:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=mid_transaction)
    holder.start()
    assert held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the child: a write of its own, through a fresh app
            code = 1
            try:
                child = Conveyor(url)
                claimed = child.backend.job_claim(queues=["default"], worker_id="c", limit=1)
                child.close()
                code = 0 if len(claimed) == 1 else 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child waited on the parent's write turn")
    finally:
        release.set()
        holder.join()
    assert os.waitstatus_to_exitcode(status) == 0
    assert parent.count_jobs() == {"running": 1}  # the child's claim is there
    parent.close()


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="needs fork")
def test_a_forked_child_opens_sqlite_connections_of_its_own(tmp_path):
    """A process that used the app, then forked (a pre-forking web server): the
    child's threads must not use the parent's connections, neither the forking
    thread's nor one a parent's thread left (in the child every other thread of
    the parent looks ended, and an ended thread's connection passes on)."""
    parent = Conveyor(f"sqlite:///{tmp_path / 'fork.db'}")
    parent.enqueue("t", args=[0], queue="default")
    theirs = {id(parent.backend._conn())}
    other = threading.Thread(target=lambda: theirs.add(id(parent.backend._conn())))
    other.start()
    other.join()

    def child() -> list[int]:
        used = [id(parent.backend._conn())]
        parent.enqueue("t", args=[1], queue="default")

        def send() -> None:
            used.append(id(parent.backend._conn()))
            parent.enqueue("t", args=[2], queue="default")

        thread = threading.Thread(target=send)
        thread.start()
        thread.join()
        parent.close()  # closes the child's own, not the parent's
        return used

    code, used = in_a_forked_child(child)
    assert code == 0
    assert len(used) == 2 and not set(used) & theirs, (used, theirs)
    assert parent.count_jobs() == {"available": 3}  # the child's two jobs are there
    parent.enqueue("t", args=[3], queue="default")  # and the parent's connections still work
    parent.close()
