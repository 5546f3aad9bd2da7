"""Package boundaries the design promises: the control plane never imports torch."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import EXAMPLES


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
