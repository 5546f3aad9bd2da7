"""The benchmarks' own tests: of their scripts' helpers and data, not of the product (that is tests/).

They run in the main pytest session (pyproject's testpaths) or alone (`pytest benchmarks/tests`). The
repository root goes on sys.path, as tests/ has it, for `benchmarks.<script>` and `tests.support`; a
test that needs the scripts' bare names (they import each other so, run as `python benchmarks/x.py`)
puts this folder's parent on sys.path itself, for as long as it imports."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
