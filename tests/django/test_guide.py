"""docs/guides/django.md shows the test project's own code: each block whose
no-run note says test_guide.py checks it is, line for line (indentation aside),
in the file the note names."""

from __future__ import annotations

import re

from conftest import HERE

GUIDE = HERE.parent.parent / "docs" / "guides" / "django.md"
BLOCK = re.compile(
    r"<!-- no-run: [^>]*test_guide\.py checks this block against the test project's "
    r"(?P<file>settings|tasks) -->\n```python\n(?P<body>.*?)^```",
    re.S | re.M,
)
FILES = {"settings": HERE / "project" / "settings.py", "tasks": HERE / "shop" / "tasks.py"}


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def test_the_guide_s_blocks_are_the_project_s_code() -> None:
    blocks = list(BLOCK.finditer(GUIDE.read_text()))
    assert len(blocks) == 3
    for block in blocks:
        want = _lines(block["body"])
        have = _lines(FILES[block["file"]].read_text())
        found = any(have[i : i + len(want)] == want for i in range(len(have)))
        assert found, f"not in {FILES[block['file']].name}:\n{block['body']}"
