"""docs/guides/django.md shows the test project's own code: each block marked
``<!-- checked-by: tests/django/test_guide.py -->`` is, line for line
(indentation aside), in the project's settings or its tasks module."""

from __future__ import annotations

import re

from conftest import HERE

GUIDE = HERE.parent.parent / "docs" / "guides" / "django.md"
BLOCK = re.compile(
    r"<!-- checked-by: tests/django/test_guide\.py -->\n```python\n(?P<body>.*?)^```",
    re.S | re.M,
)
FILES = (HERE / "project" / "settings.py", HERE / "shop" / "tasks.py")


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def test_the_guide_s_blocks_are_the_project_s_code() -> None:
    blocks = list(BLOCK.finditer(GUIDE.read_text()))
    assert len(blocks) == 3
    for block in blocks:
        want = _lines(block["body"])
        found = False
        for path in FILES:
            have = _lines(path.read_text())
            found = found or any(have[i : i + len(want)] == want for i in range(len(have)))
        assert found, f"not in {[p.name for p in FILES]}:\n{block['body']}"
