"""How long a full layout search takes, next to the time a user would otherwise spend.

Prints, for each case, the median wall and CPU time of `plan(spec)` over several runs, the least CPU
time (the steadiest figure on a shared machine: compare that one before and after a change), the
number of candidate layouts evaluated, the chosen layout, and the ratio to the goal (Llama-3.1-70B on
64 H100s under 100 ms; a 1T-parameter GPT on 3072 A100s under 1 s, on a 2-core machine).

    .venv/bin/python benchmarks/planner_search.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from service.planner import plan
from service.spec import TrainingSpec

CASES: list[tuple[str, float, dict[str, object]]] = [
    ("llama-3.1-70b on 64 x H100", 0.100, {
        "name": "bench-70b",
        "model": {"preset": "llama-3.1-70b"},
        "training": {"global_batch": 128, "precision": "bf16"},
        "resources": {"gpu": "H100-SXM-80GB", "gpus_per_node": 8, "nodes": 8},
    }),
    ("gpt-1t on 3072 x A100-80GB", 1.0, {
        "name": "bench-1t",
        "model": {"preset": "gpt-1t"},
        "training": {"global_batch": 3072, "precision": "bf16"},
        "resources": {"gpu": "A100-SXM-80GB", "gpus_per_node": 8, "nodes": 384},
    }),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"{'case':32} {'median s':>9} {'cpu s':>7} {'min cpu s':>9} {'goal s':>7} {'goal/median':>11}"
          f" {'evaluated':>9}  chosen")
    for label, goal, raw in CASES:
        spec = TrainingSpec.model_validate(raw)
        times, cpu_times = [], []
        result = None
        for _ in range(args.runs):
            start, cpu_start = time.perf_counter(), time.process_time()
            result = plan(spec)
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
        assert result is not None
        median = statistics.median(times)
        cpu = statistics.median(cpu_times)
        print(f"{label:32} {median:9.3f} {cpu:7.3f} {min(cpu_times):9.3f} {goal:7.3f} {goal / median:11.2f}"
              f" {result.candidates_evaluated:9d}"
              f"  {result.layout.short()} ({result.time.step_s:.3g} s/step, MFU {result.time.mfu:.0%})")


if __name__ == "__main__":
    main()
