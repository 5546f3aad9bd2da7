"""What the benchmarks that compare two checkouts share (`api_load.py`, `heartbeats.py`,
`request_cpu.py`): the `--against DIR` option, its check, the trees it gives, and the PostgreSQL
server they make their scratch database on.

Benchmarks run as scripts (`.venv/bin/python benchmarks/NAME.py`), so they import this module by its
bare name: `from side_by_side import add_against, trees`.
"""

from __future__ import annotations

import argparse
import subprocess
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


def postgres_server(url: str | None) -> str:
    """`url`, or the URL `deploy/postgres.sh` starts (or finds) the local PostgreSQL server at."""
    if url:
        return url
    return subprocess.run(["bash", str(ROOT / "deploy" / "postgres.sh")], capture_output=True, text=True,
                          check=True).stdout.strip()
