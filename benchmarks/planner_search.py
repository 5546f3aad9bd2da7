"""How long a full layout search takes, next to its goal and next to a reference measured in the same run.

For each case it prints the least CPU time of `plan(spec)` over several runs (the steadiest figure
on a shared machine), the median wall time, the goal (a 1T-parameter GPT on 3,072 A100s
under 100 ms, Llama-3.1-70B on 64 H100s under 20 ms) and the ratio goal / least CPU time (above 1
meets the goal), the number of layouts evaluated and the chosen layout.

With `--against REV` the same cases are also planned by the tree at git revision REV (checked out
into a temporary git worktree, run in child processes), the two trees taking turns round by round
so that both see the same background load; it prints reference / this ratios and whether both
trees chose the same layout. The machine's load average is printed before and after.

    .venv/bin/python benchmarks/planner_search.py [--runs N] [--rounds R] [--against REV]

A benchmark measures; it does not test: it exits 0 whatever the figures are.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES: list[tuple[str, float, dict[str, object]]] = [
    ("llama-3.1-70b on 64 x H100", 0.020, {
        "name": "bench-70b",
        "model": {"preset": "llama-3.1-70b"},
        "training": {"global_batch": 128, "precision": "bf16"},
        "resources": {"gpu": "H100-SXM-80GB", "gpus_per_node": 8, "nodes": 8},
    }),
    ("gpt-1t on 3072 x A100-80GB", 0.100, {
        "name": "bench-1t",
        "model": {"preset": "gpt-1t"},
        "training": {"global_batch": 3072, "precision": "bf16"},
        "resources": {"gpu": "A100-SXM-80GB", "gpus_per_node": 8, "nodes": 384},
    }),
]
ROOT = Path(__file__).resolve().parents[1]


def measure(runs: int) -> dict[str, dict[str, object]]:
    """Least CPU and median wall seconds of `runs` plans per case, after one warm-up plan."""
    from service.planner import plan
    from service.spec import TrainingSpec

    out: dict[str, dict[str, object]] = {}
    for label, _, raw in CASES:
        spec = TrainingSpec.model_validate(raw)
        result = plan(spec)
        walls, cpus = [], []
        for _ in range(runs):
            start, cpu_start = time.perf_counter(), time.process_time()
            result = plan(spec)
            walls.append(time.perf_counter() - start)
            cpus.append(time.process_time() - cpu_start)
        out[label] = {"cpu": cpus, "wall": walls, "evaluated": result.candidates_evaluated,
                      "chosen": result.layout.short(), "step_s": result.time.step_s, "mfu": result.time.mfu}
    return out


def _child(tree: Path, runs: int) -> dict[str, dict[str, object]]:
    """`measure` in a fresh interpreter that imports `service` from `tree`."""
    code = (f"import json, sys; sys.path.insert(0, {str(tree)!r}); sys.path.insert(0, {str(ROOT / 'benchmarks')!r});"
            f" import planner_search as b; print(json.dumps(b.measure({runs})))")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _merge(into: dict[str, dict[str, list[float]]], got: dict[str, dict[str, object]]) -> None:
    for label, row in got.items():
        slot = into.setdefault(label, {"cpu": [], "wall": []})
        slot["cpu"] += row["cpu"]  # type: ignore[arg-type]
        slot["wall"] += row["wall"]  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="plans per case per round")
    parser.add_argument("--rounds", type=int, default=3, help="turns each tree takes (with --against)")
    parser.add_argument("--against", metavar="REV", help="git revision to measure as the reference")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    this: dict[str, dict[str, list[float]]] = {}
    ref: dict[str, dict[str, list[float]]] = {}
    last: dict[str, dict[str, object]] = {}
    ref_last: dict[str, dict[str, object]] = {}
    if args.against is None:
        last = measure(args.runs)
        _merge(this, last)
    else:
        with tempfile.TemporaryDirectory(prefix="planner-ref-") as tmp:
            tree = Path(tmp) / "tree"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), args.against],
                           check=True)
            try:
                for _ in range(args.rounds):
                    ref_last = _child(tree, args.runs)
                    _merge(ref, ref_last)
                    last = _child(ROOT, args.runs)
                    _merge(this, last)
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    head = f"{'case':28} {'min cpu s':>9} {'median s':>9} {'goal s':>7} {'goal/cpu':>8}"
    if ref:
        head += f" {'ref cpu s':>9} {'ref/this':>8} {'same':>5}"
    print(head + f" {'evaluated':>9}  chosen")
    for label, goal, _ in CASES:
        cpu = min(this[label]["cpu"])
        line = (f"{label:28} {cpu:9.4f} {statistics.median(this[label]['wall']):9.4f} {goal:7.3f}"
                f" {goal / cpu:8.2f}")
        if ref:
            ref_cpu = min(ref[label]["cpu"])
            same = ref_last[label]["chosen"] == last[label]["chosen"]
            line += f" {ref_cpu:9.4f} {ref_cpu / cpu:8.2f} {'yes' if same else 'NO':>5}"
        row = last[label]
        print(line + f" {row['evaluated']:9d}  {row['chosen']} ({row['step_s']:.3g} s/step, MFU {row['mfu']:.0%})")


if __name__ == "__main__":
    main()
