"""The typed API (issue 39): a type checker reads a task's parameters and result
from its handler. mypy checks a user's file with good and bad calls: each bad
call is reported (and nothing else is), and the types it reveals are the
handler's."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import conveyor
from conveyor.task import SEND_OPTIONS, SendOptions

#: a user's module; ``# E: code`` marks a line mypy must report (with that
#: error code), ``# T: type`` a line whose ``reveal_type`` must say that type
USER_CODE = """
import asyncio
from datetime import UTC, datetime

from conveyor import Conveyor, Job

app = Conveyor("sqlite:///typing.db")


@app.task
def add(a: int, b: int) -> int:
    return a + b


@app.task(queue="fetch", max_attempts=3)
async def fetch(url: str, *, retries: int = 1) -> bytes:
    return b""


job: Job[int] = add.send(1, 2)
reveal_type(job)  # T: conveyor.job.Job[int]
reveal_type(job.result)  # T: int | None
reveal_type(job.wait(timeout=5).result_or_raise())  # T: int
reveal_type(fetch.send("https://example.org", retries=2))  # T: conveyor.job.Job[bytes]
add(1, 2)
add.send("x", 2)  # E: arg-type
add.send(1)  # E: call-arg
add.send(1, 2, 3)  # E: call-arg
fetch.send("u", retry=2)  # E: call-arg
add.send(1, 2, priority=5)  # E: call-arg
add.options(priority=5, delay=1.5, run_at=datetime.now(UTC), conn=None).send(1, 2)
add.options(priority="high")  # E: arg-type
add.options(prio=5)  # E: call-arg
add.options(queue="q").send(1, "2")  # E: arg-type
add.send_many([(1, 2), (3, 4)], priority=3)
add.send_many([(1, 2)], prio=3)  # E: call-arg
chain_step = add.s(1, 2)
add.s(1, b="2")  # E: arg-type


async def main() -> None:
    sent = await fetch.asend("u")
    reveal_type(await sent.await_result())  # T: bytes
    reveal_type(await add.asend_many([(1, 2)]))  # T: list[conveyor.job.Job[int]]
    await add.abatch([(1, 2)], name="pairs")
    await add.options(priority=1).asend(1, 2)
    await add.asend(1, "2")  # E: arg-type


asyncio.run(main())
"""


def _expected(marker: str) -> set[tuple[int, str]]:
    found = set()
    for n, line in enumerate(USER_CODE.splitlines(), 1):
        if f"# {marker}: " in line:
            found.add((n, line.split(f"# {marker}: ")[1].strip()))
    return found


def test_mypy_reads_the_handlers_types(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    user = tmp_path / "user.py"
    user.write_text(USER_CODE)
    src = Path(conveyor.__file__).parent.parent
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
         "--show-error-codes", "--no-error-summary", "--hide-error-context",
         "--cache-dir", str(tmp_path / "cache"), "--python-version", "3.11", str(user)],
        capture_output=True, text=True, cwd=tmp_path, timeout=170,
        env={**os.environ, "MYPYPATH": str(src)},
    )  # fmt: skip
    errors, revealed, other = set(), set(), []
    for line in run.stdout.splitlines():
        if m := re.match(r".*user\.py:(\d+): error: .*\[([\w-]+)\]$", line):
            errors.add((int(m[1]), m[2]))
        elif m := re.match(r'.*user\.py:(\d+): note: Revealed type is "(.*)"$', line):
            revealed.add((int(m[1]), m[2]))
        elif ": note: " not in line:
            other.append(line)
    assert not other, run.stdout + run.stderr
    assert errors == _expected("E"), run.stdout
    assert revealed == _expected("T"), run.stdout


def test_pyright_reads_them_alike(tmp_path: Path) -> None:
    """pyright (not a dependency: it needs Node.js) reports the same lines and
    reveals the same types, in its own words."""
    pyright = shutil.which("pyright")
    if pyright is None:
        pytest.skip("pyright is not installed (pip install pyright; it needs Node.js)")
    user = tmp_path / "user.py"
    user.write_text(USER_CODE)
    (tmp_path / "pyrightconfig.json").write_text(
        json.dumps({"extraPaths": [str(Path(conveyor.__file__).parent.parent)]})
    )
    run = subprocess.run(
        [pyright, "--pythonpath", sys.executable, "--outputjson", str(user)],
        capture_output=True, text=True, cwd=tmp_path, timeout=170,
    )  # fmt: skip
    found = json.loads(run.stdout)["generalDiagnostics"]
    errors = {d["range"]["start"]["line"] + 1 for d in found if d["severity"] == "error"}
    revealed = {
        (d["range"]["start"]["line"] + 1, re.sub(r"^.*\" is \"|\"$", "", d["message"]))
        for d in found
        if d["severity"] == "information"
    }
    assert errors == {n for n, _ in _expected("E")}, run.stdout
    assert revealed == {(n, t.replace("conveyor.job.", "")) for n, t in _expected("T")}


def test_send_options_typed_as_send_takes_them() -> None:
    """``SendOptions`` (what ``task.options`` and ``send_many`` type) names every
    option ``send`` splits from the handler's keywords, and no other but
    ``tenant`` (``options(tenant=)`` only: a handler may have such a parameter)."""
    assert set(SendOptions.__annotations__) == SEND_OPTIONS | {"tenant"}
