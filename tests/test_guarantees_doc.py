"""Every test that docs/guarantees.md cites exists, so the list of guarantees cannot drift from the proofs."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cited() -> list[tuple[str, str | None]]:
    """`(file, test name or None)` for every `tests/...py` path and `::name` that follows it on the same line."""
    found = []
    for line in (ROOT / "docs" / "guarantees.md").read_text().splitlines():
        current = None
        for match in re.finditer(r"`(tests/[\w/]+\.py)?(::\w+)?`", line):
            path, name = match.group(1), match.group(2)
            current = path or current
            if current is not None and (path or name):
                found.append((current, name[2:] if name else None))
    return found


def test_every_cited_test_exists():
    citations = cited()
    assert len(citations) > 30
    missing = []
    for path, name in citations:
        file = ROOT / path
        if not file.is_file():
            missing.append(path)
            continue
        if name is not None:
            tree = ast.parse(file.read_text())
            names = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
            if name not in names:
                missing.append(f"{path}::{name}")
    assert not missing, missing
