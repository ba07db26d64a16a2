"""Every code block in README.md and docs/ works as a reader would use it.

Each page's ```python blocks run in order, in one namespace, in a folder of
their own with ``CONVEYOR_DATABASE_URL`` naming a SQLite file there (a page's
``Conveyor()`` uses it). A block may carry one directive, an HTML comment on the
line before its fence (invisible on the page):

- ``<!-- no-run: why -->``: not run (it installs, serves forever, needs a
  server of yours...); a Python one is still compiled. The reason is required.
- ``<!-- checked-by: PATH -->``: not run here; the test file PATH checks it (a
  block for another interpreter, such as Django's, compared with a real project
  word for word). PATH must exist and name the page.
- ``<!-- file: NAME -->``: the block is the file NAME, written to the page's
  folder (later blocks import it; a worker started by ``background`` loads it).
- ``<!-- worker -->``: before the block runs, a worker starts in this process
  for the namespace's ``app`` (what ``conveyor worker --app ...`` would be in
  the reader's other terminal) and runs until the page ends.
- ``<!-- needs: postgres -->``: runs only with ``CONVEYOR_TEST_POSTGRES_URL``,
  each ``postgresql://localhost/app`` in it pointing at a schema of its own.
- ``<!-- run -->`` (shell): each ``conveyor`` line runs and must exit 0.
- ``<!-- background: NAME -->`` (shell): each ``conveyor`` line starts as a
  process that runs until the page ends (a worker the next blocks rely on).

Every ``conveyor ...`` line of every shell block, run or not, must name real
commands and options (checked against the click group, no process started).
A Python block with top-level ``await`` runs as a notebook would run it.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
import shlex
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from conveyor import Conveyor
from conveyor.cli.main import cli
from conveyor.registry import user_tasks
from conveyor.runtime.worker import Worker

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PG_PLACEHOLDER = "postgresql://localhost/app"
SHELLS = {"bash", "sh", "console", "shell"}
DIRECTIVES = {"no-run", "checked-by", "file", "worker", "needs", "run", "background"}

FENCE = re.compile(
    r"^(?P<indent>[ ]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M
)
DIRECTIVE = re.compile(r"^\s*<!--\s*(?P<name>[a-z-]+)\s*(?::\s*(?P<arg>.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    directive: str | None = None
    arg: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        d = DIRECTIVE.match(before)
        indent = len(m["indent"])
        code = "\n".join(row[indent:] for row in m["body"].splitlines())
        found.append(Block(page, line, m["lang"], code, d and d["name"], d and (d["arg"] or None)))
    return found


def all_blocks() -> Iterator[Block]:
    for page in PAGES:
        yield from blocks(page)


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


# -- shell lines --------------------------------------------------------------------
def conveyor_lines(code: str) -> list[list[str]]:
    """The ``conveyor ...`` command lines of a shell block, split into words."""
    lines, pending = [], ""
    for raw in code.splitlines():
        row = raw.strip()
        if row.startswith("$ "):
            row = row[2:]
        if row.endswith("\\"):
            pending += row[:-1] + " "
            continue
        row, pending = pending + row, ""
        if row.startswith("conveyor ") or row == "conveyor":
            lines.append(shlex.split(row, comments=True))
    return lines


def check_command(words: list[str]) -> None:
    """Every subcommand and option in ``words`` exists (the click group is walked)."""
    command: click.Command = cli
    path = ["conveyor"]
    args = iter(words[1:])
    for word in args:
        if word.startswith("-"):
            name = word.split("=", 1)[0]
            option = next((p for p in command.params if name in p.opts + p.secondary_opts), None)
            if option is None and name not in ("-h", "--help"):
                raise AssertionError(f"`{' '.join(path)}` has no option {name}")
            if option is not None and not getattr(option, "is_flag", False) and "=" not in word:
                next(args, None)  # its value
            continue
        if isinstance(command, click.Group):
            sub = command.get_command(click.Context(command), word)
            if sub is None:
                raise AssertionError(f"`{' '.join(path)}` has no command {word!r}")
            command, path = sub, [*path, word]
        # else: an argument of the command


# -- running a page -----------------------------------------------------------------
class PageRun:
    """One page's namespace, folder, workers and processes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ns: dict[str, object] = {"__name__": "__docs__"}
        self.workers: list[tuple[Worker, threading.Thread]] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        self.schemas: list[str] = []

    def python(self, block: Block, code: str | None = None) -> None:
        source = code if code is not None else block.code
        compiled = compile(
            source, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
        )
        if compiled.co_flags & inspect.CO_COROUTINE:
            asyncio.run(eval(compiled, self.ns))
        else:
            exec(compiled, self.ns)

    def start_worker(self, block: Block) -> None:
        app = self.ns.get("app")
        assert isinstance(app, Conveyor), f"{block.where}: <!-- worker --> needs `app` defined"
        queues = sorted({t.defaults.queue for t in user_tasks(app.tasks)} | {app.default_queue})
        worker = Worker(app, queues=queues, poll_s=0.05)
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
        thread.start()
        self.workers.append((worker, thread))

    def shell(self, block: Block) -> None:
        for words in conveyor_lines(block.code):
            argv = [sys.executable, "-m", "conveyor", *words[1:]]
            if block.directive == "background":
                self.processes.append(subprocess.Popen(argv, cwd=self.folder))
                continue
            done = subprocess.run(argv, cwd=self.folder, capture_output=True, timeout=120)
            assert done.returncode == 0, (
                f"{block.where}: `{shlex.join(words)}` exited {done.returncode}\n"
                f"{done.stdout.decode()}{done.stderr.decode()}"
            )

    def postgres(self, block: Block) -> bool:
        base = os.environ.get("CONVEYOR_TEST_POSTGRES_URL")
        if not base:
            return False
        import psycopg

        from tests.conftest import pg_schema_url

        schema = f"docs_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        self.schemas.append(schema)
        self.python(block, block.code.replace(PG_PLACEHOLDER, pg_schema_url(base, schema)))
        return True

    def close(self) -> None:
        for worker, thread in self.workers:
            worker.stop(graceful=False)
            thread.join(30)
        for process in self.processes:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for value in list(self.ns.values()):
            if isinstance(value, Conveyor):
                value.close()
        base = os.environ.get("CONVEYOR_TEST_POSTGRES_URL")
        if self.schemas and base:
            import psycopg

            with psycopg.connect(base, autocommit=True) as conn:
                for schema in self.schemas:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(str(self.folder)):
                del sys.modules[name]


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_the_page_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CONVEYOR_DATABASE_URL", f"sqlite:///{tmp_path / 'conveyor.db'}")
    monkeypatch.syspath_prepend(str(tmp_path))
    run = PageRun(tmp_path)
    try:
        for block in blocks(page):
            if block.directive in ("no-run", "checked-by"):
                if block.lang == "python":  # still valid Python
                    compile(block.code, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
                continue
            if block.directive == "file":
                assert block.arg, f"{block.where}: <!-- file: NAME --> needs a name"
                (tmp_path / block.arg).write_text(block.code + "\n")
                continue
            if block.lang in SHELLS:
                if block.directive in ("run", "background"):
                    run.shell(block)
                continue
            if block.lang != "python":
                continue
            if block.directive == "needs":
                assert block.arg == "postgres", f"{block.where}: needs what? {block.arg!r}"
            if block.directive == "worker":
                run.start_worker(block)
            try:
                if block.directive == "needs":
                    run.postgres(block)  # skipped without CONVEYOR_TEST_POSTGRES_URL
                else:
                    run.python(block)
            except Exception as exc:
                raise AssertionError(
                    f"{block.where}: this block failed (fix it, or mark it "
                    f"<!-- no-run: why --> on purpose): {type(exc).__name__}: {exc}"
                ) from exc
    finally:
        run.close()


def test_every_directive_is_known_and_explained() -> None:
    for block in all_blocks():
        if block.directive is None:
            continue
        assert block.directive in DIRECTIVES, f"{block.where}: unknown <!-- {block.directive} -->"
        if block.directive == "no-run":
            assert block.arg, f"{block.where}: <!-- no-run: ... --> must say why"
        if block.directive == "checked-by":
            checker = ROOT / (block.arg or "")
            assert block.arg and checker.is_file(), f"{block.where}: no test file {block.arg!r}"
            assert block.page.name in checker.read_text(), (
                f"{block.where}: {block.arg} does not name {block.page.name}"
            )
        if block.directive in ("run", "background"):
            assert block.lang in SHELLS, f"{block.where}: {block.directive} is for shell blocks"


def test_shell_blocks_name_real_commands_and_options() -> None:
    checked = 0
    for block in all_blocks():
        if block.lang not in SHELLS:
            continue
        for words in conveyor_lines(block.code):
            try:
                check_command(words)
            except AssertionError as exc:
                raise AssertionError(f"{block.where}: {exc}") from None
            checked += 1
    assert checked > 0


def inventory() -> dict[str, int]:
    """How many blocks run, are written as files, or are marked not to run."""
    counts: dict[str, int] = {}
    for block in all_blocks():
        if block.lang == "python" and block.directive in (None, "worker"):
            kind = "python run"
        elif block.directive == "no-run":
            kind = "marked no-run"
        elif block.lang in SHELLS and block.directive is None:
            kind = "shell, commands checked"
        else:
            kind = f"{block.directive or block.lang or 'text'}"
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def test_python_examples_mostly_run() -> None:
    """A page whose examples are all marked no-run proves nothing: keep that rare."""
    python = [b for b in all_blocks() if b.lang == "python"]
    marked = [b.where for b in python if b.directive == "no-run"]
    print(inventory())
    assert len(marked) <= len(python) // 10, f"too many Python examples marked no-run: {marked}"
