"""Roles are compared as `Role` members, never as strings: a typo in a string ("admn") would compare
unequal for ever without any checker noticing, and team visibility would quietly widen or narrow."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _string_role_comparisons(path: Path) -> list[int]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        names_role = any(isinstance(s, ast.Attribute) and s.attr == "role" for s in sides)
        if names_role and any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides):
            found.append(node.lineno)
    return found


def test_no_role_is_compared_with_a_string() -> None:
    found = {str(p.relative_to(ROOT)): lines for folder in ("service", "workers")
             for p in sorted((ROOT / folder).rglob("*.py")) if (lines := _string_role_comparisons(p))}
    assert found == {}, f"compare with service.store.vocab.Role: {found}"
