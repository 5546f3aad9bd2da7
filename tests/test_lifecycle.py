"""A job's life has one home, `service.lifecycle`: the drawings of its table agree with the table, the
named sets mean what their names say, and no other module lists job states as a set of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from service import lifecycle
from service.lifecycle import ALLOWED, HOLDING, TERMINAL, TRACKED, UNSUBMITTED, WAITING, allowed, diagram
from service.store.vocab import JobStatus

ROOT = Path(__file__).resolve().parents[1]


def test_the_drawings_of_the_table_are_the_table() -> None:
    drawn = diagram()
    assert f"```\n{drawn}\n```" in (lifecycle.__doc__ or "")
    assert f"```\n{drawn}\n```" in (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for status, targets in ALLOWED.items():
        line = next(line for line in drawn.splitlines() if line.split()[0] == status.value)
        assert set(line.partition("->")[2].replace(",", " ").split()) == {t.value for t in targets}


def test_the_named_sets_mean_what_they_say() -> None:
    assert set(ALLOWED) == set(JobStatus)
    assert all(not ALLOWED[s] for s in TERMINAL) and all(ALLOWED[s] for s in HOLDING)
    assert set(JobStatus) - TERMINAL == HOLDING
    assert UNSUBMITTED <= WAITING and not TRACKED & UNSUBMITTED
    # every non-terminal state can be cancelled, directly or through CANCELLING
    assert all(JobStatus.CANCELLED in ALLOWED[s] or JobStatus.CANCELLING in ALLOWED[s] for s in HOLDING
               if s != JobStatus.CANCELLING)
    assert allowed(JobStatus.RUNNING, JobStatus.QUEUED) and not allowed(JobStatus.FAILED, JobStatus.QUEUED)


def _status_names(tree: ast.AST) -> set[str]:
    """The names a module binds to JobStatus (`JobStatus` itself, and aliases such as `S = JobStatus`)."""
    names = {"JobStatus"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id == "JobStatus":
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _state_collections(path: Path) -> list[int]:
    """Lines where `path` writes a tuple, list or set of two or more job states."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = _status_names(tree)

    def is_state(node: ast.expr) -> bool:
        return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names \
            and node.attr.isupper()

    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Tuple | ast.List | ast.Set)
            and sum(is_state(e) for e in node.elts) >= 2]


@pytest.mark.parametrize("folder", ["service", "workers"])
def test_no_other_module_lists_job_states_as_a_set(folder: str) -> None:
    home = ROOT / "service" / "lifecycle.py"
    found = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / folder).rglob("*.py"))
             if p != home and (lines := _state_collections(p))}
    assert found == {}, f"name the set in service/lifecycle.py and use it: {found}"
