"""Loading an app named ``module:attribute``: what ``--app`` means to the CLI, and
how the child processes of ``--processes`` find the app their parent runs.

A module of its own, below both: the runtime must not import the CLI to load an
app. Every failure is a ``ConfigError`` of one clear line (the CLI prints it as
its ``error:`` line).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from .app import Conveyor
from .errors import ConfigError, ConveyorError


def load_app(spec: str) -> Conveyor:
    """Import ``module:attr`` and check it is a Conveyor. Every failure is one clear line."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        guess = module_name.strip().removesuffix(".py").replace("/", ".") or "myapp"
        raise ConfigError(f"--app must look like module:attribute (e.g. {guess}:app), got {spec!r}")
    if module_name.strip().endswith(".py") or "/" in module_name:
        module = module_name.strip().removesuffix(".py").replace("/", ".")
        raise ConfigError(
            f"--app names a module, not a file: {module}:{attr.strip()}, not {spec!r}"
            " (run from the directory the module is in, or set PYTHONPATH)"
        )
    module = _import(module_name.strip())
    obj: Any = module
    for part in attr.strip().split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(
                f"--app {spec}: module {module_name!r} has no attribute {attr!r}"
            ) from None
    if not isinstance(obj, Conveyor):
        raise ConfigError(
            f"--app {spec}: {attr!r} is a {type(obj).__name__}, not a conveyor.Conveyor "
            "(point --app at the object created with Conveyor(...))"
        )
    return obj


def _import(module_name: str) -> Any:
    # Like `python -m`: modules in the current directory are importable.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ConfigError(
                f"--app: no module named {module_name!r} (looked in {cwd} and on sys.path; "
                "run from your project's directory or set PYTHONPATH)"
            ) from None
        raise ConfigError(_import_failure(module_name, exc)) from None
    except ConveyorError:
        raise  # e.g. a task registered twice: its own message is the clearest
    except Exception as exc:
        raise ConfigError(_import_failure(module_name, exc)) from None


def _import_failure(module_name: str, exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return (
        f"--app: importing {module_name!r} failed with {type(exc).__name__}: {first} "
        f"(run `python -c 'import {module_name}'` to see the traceback)"
    )
