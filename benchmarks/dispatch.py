"""Dispatch on the local Slurm cluster (deploy/slurm.sh): measured side by side, not pass/fail.

1. Submit-to-RUNNING latency of a 2-node job: shardctl's SlurmBackend (submit, then `poll` until RUNNING)
   vs submitit used directly (`SlurmExecutor.submit`, then a forced `sacct` state read until RUNNING),
   alternating, same poll interval; median, min and max, and the ratio of medians.
2. Slurm CLI calls per reconcile cycle as tracked jobs grow 10 -> 1000: real jobs (`sbatch --wrap true`),
   one `SlurmBackend.poll(handles)` per cycle (the dispatcher makes exactly one per backend per cycle),
   every subprocess counted by a wrapper around `subprocess.run`. Must stay flat (1 sacct).

    .venv/bin/python benchmarks/dispatch.py [--partition debug] [--runs 5] [--sizes 10,100,1000]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import submitit

from service.planner import Plan, plan
from service.spec import TrainingSpec
from workers.backends.base import Handle, RunState
from workers.backends.slurm import SlurmBackend
from workers.dispatch.request import build_request

#: A one-process CPU spec; the benchmark replaces its command and world (it measures Slurm, not training).
TINY: dict[str, Any] = {"name": "bench", "model": {"preset": "llama-tiny"},
                        "training": {"global_batch": 2, "precision": "fp32", "steps": 1},
                        "resources": {"gpu": "cpu", "gpus_per_node": 1, "nodes": 1}}


def _plan() -> Plan:
    return plan(TrainingSpec.model_validate(TINY))

POLL_S = 0.05


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def shardctl_latency(backend: SlurmBackend, job_id: int, partition: str) -> float:
    spec = TrainingSpec.model_validate({**TINY, "backend": {"kind": "slurm", "partition": partition,
                                                            "time_limit": "00:05:00"}})
    req = build_request(job_id, 1, plan=_plan(), spec=spec, team="bench", token=None, api_url=None)
    req = req.model_copy(update={"nodes": 2, "procs_per_node": 1,
                                 "command": ["python", "-c", "import time; time.sleep(30)"]})
    start = time.perf_counter()
    handle = backend.submit(req)
    while backend.poll([handle])[handle.name].state != RunState.RUNNING:
        time.sleep(POLL_S)
    elapsed = time.perf_counter() - start
    backend.cancel(handle)
    return elapsed


def submitit_latency(folder: Path, partition: str) -> float:
    executor = submitit.SlurmExecutor(folder=folder)
    executor.update_parameters(nodes=2, ntasks_per_node=1, cpus_per_task=1, time=5, partition=partition,
                               job_name="submitit-bench")
    start = time.perf_counter()
    job = executor.submit(_sleep, 30)
    while job.watcher.get_state(job.job_id, mode="force") != "RUNNING":
        time.sleep(POLL_S)
    elapsed = time.perf_counter() - start
    job.cancel()
    return elapsed


def wait_idle(timeout: float = 60) -> None:
    """No job of ours pending or running (the cancelled ones release their nodes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-t", "PD,R,CG", "-o", "%i"], capture_output=True, text=True).stdout
        if not out.strip():
            return
        time.sleep(0.2)


def latency(partition: str, runs: int, folder: Path) -> dict[str, list[float]]:
    backend = SlurmBackend(folder=folder / "shardctl", partition=partition)
    base = int(time.time()) * 1000
    results: dict[str, list[float]] = {"shardctl": [], "submitit": []}
    for i in range(runs):
        wait_idle()
        results["shardctl"].append(shardctl_latency(backend, base + i, partition))
        wait_idle()
        results["submitit"].append(submitit_latency(folder / "submitit", partition))
    wait_idle()
    return results


def calls_per_cycle(partition: str, sizes: list[int], folder: Path) -> list[dict[str, Any]]:
    calls: Counter[str] = Counter()

    def counting(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls[args[0]] += 1
        return subprocess.run(args, **kw)

    backend = SlurmBackend(folder=folder, partition=partition, runner=counting)
    handles: list[Handle] = []
    rows = []
    tag = time.time_ns()
    for size in sizes:
        while len(handles) < size:
            name = f"shardctl-bench-{tag}-{len(handles)}"
            out = subprocess.run(["sbatch", "--parsable", "-p", partition, "-J", name, "-t", "1", "-o", "/dev/null",
                                  "--wrap", "true"], capture_output=True, text=True, check=True).stdout
            handles.append(Handle(name=name, backend_id=out.strip().split(";")[0]))
        for _ in range(3):  # three reconcile cycles at this size
            calls.clear()
            start = time.perf_counter()
            observed = backend.poll(handles)
            seconds = time.perf_counter() - start
            states = Counter(o.state.value for o in observed.values())
            rows.append({"tracked": size, "sacct": calls["sacct"], "squeue": calls["squeue"],
                         "other": sum(calls.values()) - calls["sacct"] - calls["squeue"], "poll_s": seconds,
                         "states": dict(states)})
    subprocess.run(["scancel", *(h.backend_id for h in handles if h.backend_id)], capture_output=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--partition", default="debug")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--sizes", default="10,100,1000")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="shardctl-bench-") as tmp:
        folder = Path(tmp)
        print(f"== submit -> RUNNING, 2-node job, partition {args.partition}, {args.runs} runs each, "
              f"poll every {POLL_S * 1000:.0f} ms")
        lat = latency(args.partition, args.runs, folder)
        print(f"{'path':<10} {'median s':>9} {'min s':>7} {'max s':>7}  runs")
        for path, values in lat.items():
            print(f"{path:<10} {statistics.median(values):>9.3f} {min(values):>7.3f} {max(values):>7.3f}  "
                  + " ".join(f"{v:.3f}" for v in values))
        ratio = statistics.median(lat["shardctl"]) / statistics.median(lat["submitit"])
        print(f"ratio shardctl/submitit (medians): {ratio:.2f}")
        print("\n== Slurm CLI calls per reconcile cycle (one SlurmBackend.poll for all tracked jobs)")
        print(f"{'tracked':>7} {'sacct':>5} {'squeue':>6} {'other':>5} {'poll s':>7}  states")
        for row in calls_per_cycle(args.partition, sizes, folder / "poll"):
            print(f"{row['tracked']:>7} {row['sacct']:>5} {row['squeue']:>6} {row['other']:>5} {row['poll_s']:>7.3f}"
                  f"  {row['states']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
