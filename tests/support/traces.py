"""Real profiler traces the tests analyse: two ranks of a gloo DDP run (tests/profiles/fixtures)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "profiles" / "fixtures"
#: the per-rank traces of the captured 2-rank gloo DDP run (`capture_gloo_traces.py`), rank order
GLOO = sorted((FIXTURES / "gloo_ddp").glob("rank-*.json.gz"))
