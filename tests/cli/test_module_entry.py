"""``python -m conveyor`` runs the same CLI as the ``conveyor`` command."""

from __future__ import annotations

import subprocess
import sys


def test_python_dash_m_conveyor_is_the_cli():
    out = subprocess.run(
        [sys.executable, "-m", "conveyor", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "conveyor worker --app myapp:app" in out.stdout
