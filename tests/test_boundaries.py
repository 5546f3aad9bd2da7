"""Package boundaries the design promises: the control plane never imports torch; and the tests' own:
no module imports a test module, and no product test imports the benchmarks."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import EXAMPLES, ROOT


def test_service_never_imports_torch() -> None:
    code = (
        "import sys, service.spec, service.planner, service.cli.main, service.profiles\n"
        "from service.planner import plan\n"
        "from service.spec import parse_spec_text\n"
        f"plan(parse_spec_text(open({str(EXAMPLES / 'llama3-8b-8xh100.yaml')!r}).read()))\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_planner_imports_nothing_from_workers() -> None:
    code = ("import sys, service.planner, service.spec\n"
            "assert not [m for m in sys.modules if m.startswith('workers')]\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def _imports(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in `path` (or in `source`, as if it were that file), at
    any depth (a function's own imports too); `from a.b import c` gives both `a.b` and `a.b.c`, since
    `c` may be a module. Relative imports are resolved against the file's package."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    text = path.read_text(encoding="utf-8") if source is None else source
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*package[:len(package) - node.level + 1], node.module or ""] if node.level
                            else [node.module or ""]).strip(".")
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py") if ".venv" not in p.parts)


def test_no_module_imports_a_test_module() -> None:
    """Helpers live in tests/support (or a helper module beside the tests, or a conftest's fixtures):
    a test module is not a library, and importing one runs its module-level code and ties two test
    files together, so moving or deleting a test breaks another."""
    offenders = [f"{path.relative_to(ROOT)}:{line}: imports {module}"
                 for path in _python_files("tests", "benchmarks")
                 for line, module in _imports(path)
                 if module.split(".")[-1].startswith("test_") and module.split(".")[0] in {"tests", "benchmarks"}]
    assert not offenders, "\n".join(offenders)


def test_product_tests_never_import_the_benchmarks() -> None:
    """tests/ tests the product; what the benchmarks need from the tests comes from tests/support, and
    the benchmarks' own tests live in benchmarks/tests."""
    offenders = [f"{path.relative_to(ROOT)}:{line}: imports {module}"
                 for path in _python_files("tests") for line, module in _imports(path)
                 if module == "benchmarks" or module.startswith("benchmarks.")]
    assert not offenders, "\n".join(offenders)


def test_the_boundary_checks_see_every_kind_of_import() -> None:
    """The checks above find a test module however it is imported (a function's own import included)."""
    sample = ROOT / "tests" / "dispatch" / "test_sample_never_written.py"
    source = ("import tests.dispatch.test_a\n"
              "from tests.dispatch.test_b import drive\n"
              "from tests.dispatch import test_c\n"
              "from . import test_d\n"
              "from .test_e import x\n"
              "def f():\n    from benchmarks.admission import make_snapshot\n")
    parsed = {module for _, module in _imports(sample, source)}
    assert {"tests.dispatch.test_a", "tests.dispatch.test_b", "tests.dispatch.test_c", "tests.dispatch.test_d",
            "tests.dispatch.test_e", "benchmarks.admission"} <= parsed
