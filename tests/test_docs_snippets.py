"""Every Python snippet in the README and the manual is valid Python: a
reader pastes them (the README's first one had `...` after a keyword
argument, a SyntaxError)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def snippets() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for i, m in enumerate(BLOCK.finditer(page.read_text(encoding="utf-8"))):
            out.append((f"{page.relative_to(REPO)}#{i + 1}", m.group(1)))
    return out


@pytest.mark.parametrize(("where", "code"), snippets(), ids=[w for w, _ in snippets()])
def test_the_snippet_is_valid_python(where: str, code: str) -> None:
    try:
        ast.parse(code)
    except SyntaxError as e:
        pytest.fail(f"{where}: {e}")


def test_there_are_snippets_to_check() -> None:
    assert len(snippets()) > 10
