"""What the benchmarks that compare two checkouts share (`api_load.py`, `heartbeats.py`,
`request_cpu.py`, `profile_analyze.py`, `trace_stages.py`): the `--against DIR` option, its check, the
trees it gives, a tree's bytecode, the PostgreSQL server they make their scratch database on, and a
reference of the machine's speed.

Benchmarks run as scripts (`.venv/bin/python benchmarks/NAME.py`), so they import this module by its
bare name: `from side_by_side import add_against, trees`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def add_against(parser: argparse.ArgumentParser, what: str) -> None:
    """`--against DIR`: another checkout of shardctl (`git worktree add DIR REV`); `what` says how its
    measurements take turns with this tree's."""
    parser.add_argument("--against", type=Path, default=None, metavar="DIR",
                        help=f"another checkout of shardctl (git worktree add DIR REV): {what}")


def trees(parser: argparse.ArgumentParser, against: Path | None) -> list[Path | None]:
    """The trees to measure: this one (None), then `against` resolved. A DIR that is not a shardctl
    checkout is a usage error that says how to make one."""
    if against is None:
        return [None]
    if not (against / "service" / "api" / "app.py").is_file():
        parser.error(f"--against {against}: not a shardctl checkout (no service/api/app.py there); make one"
                     " with: git worktree add DIR REV")
    return [None, against.resolve()]


def compiled(tree: Path) -> None:
    """Bytecode for `tree`'s `service` package, as an installed package has. Compiling source at import
    leaves the heap a few hundred KB of freed memory that a measured run then reuses without growing
    RSS, which made a tree without `__pycache__` read lower (`profile_analyze.py`'s docstring)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "service")], check=True)


def postgres_server(url: str | None) -> str:
    """`url`, or the URL `deploy/postgres.sh` starts (or finds) the local PostgreSQL server at."""
    if url:
        return url
    return subprocess.run(["bash", str(ROOT / "deploy" / "postgres.sh")], capture_output=True, text=True,
                          check=True).stdout.strip()


# A fixed piece of pure-Python work of the kind a request does (dicts, strings, JSON): the same
# instructions every run, so its time says how fast this machine runs Python at the moment.
_REFERENCE_DOC = {"items": [{"id": i, "name": f"job-{i}", "status": "RUNNING", "priority": i % 7,
                             "layout": "dp=8 tp=1 pp=1 zero=1", "predicted_step_s": i / 3} for i in range(50)]}


def machine_speed(repeats: int = 5) -> float:
    """Milliseconds of CPU time the reference work takes here now, the fastest of `repeats` tries
    (lower is faster). On a shared machine the same code's figures move with the machine: runs from
    different hours compare by their figures divided by this, not by their figures alone."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(200):
            doc = json.loads(json.dumps(_REFERENCE_DOC))
            sorted((item["name"], item["priority"]) for item in doc["items"])
        best = min(best, time.process_time() - start)
    return best * 1000
