"""What a wheel carries besides Python: every file the code loads at run time
(queries, migrations, templates) must be named in pyproject's package-data, or an
installed Conveyor lacks it (the MySQL backend's SQL was left out once)."""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


def _shipped(path: Path, package_data: dict[str, list[str]]) -> bool:
    rel = path.relative_to(SRC)
    for package, patterns in package_data.items():
        base = Path(*package.split("."))
        if base in rel.parents and any(fnmatch(str(rel.relative_to(base)), p) for p in patterns):
            return True
    return False


def test_every_sql_file_is_in_the_package_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_data = config["tool"]["setuptools"]["package-data"]
    sql = sorted(SRC.glob("conveyor/**/*.sql"))
    assert len(sql) > 50
    missing = [str(p.relative_to(SRC)) for p in sql if not _shipped(p, package_data)]
    assert missing == []
