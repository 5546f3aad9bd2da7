"""`python -m workers.runtime [--plan plan.json] [--out DIR]`, one process per rank.

Started by a backend, it takes everything from the job contract (`service.jobenv`): the stored plan
from $SHARDCTL_PLAN_JSON and the output folder from $SHARDCTL_OUT_DIR. By hand, `--plan` takes a
plan as `shardctl plan SPEC --json` prints it; the plan alone is enough to run.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from service.jobenv import LOG_LEVEL, OUT_DIR, PLAN, JobEnv, JobEnvError
from service.planner import Plan
from workers.runtime.config import PlanNotRunnable, RunOptions, load_plan
from workers.runtime.memory_budget import BUDGET_ENV, parse_bytes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m workers.runtime", description=(
        "Train the reference decoder under a shardctl plan (run under torchrun, one process per rank)."))
    p.add_argument("--plan", type=Path, help="plan JSON, as `shardctl plan SPEC --json` prints it"
                   f" (default: the plan in ${PLAN}, as backends ship it)")
    p.add_argument("--out", type=Path, help=f"directory for report.json, traces and checkpoints (default: ${OUT_DIR})")
    p.add_argument("--steps", type=int, help="override training.steps")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--timeout-s", type=float, default=300.0, help="rendezvous and collective timeout")
    p.add_argument("--checkpoint-every", type=int, default=0, help="save a DCP checkpoint every N steps")
    p.add_argument("--stop-after", type=int, help="checkpoint and stop after N steps (exit 3), as a preemption")
    p.add_argument("--heartbeat-every", type=int, default=10)
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--profile-wait", type=int, default=1)
    p.add_argument("--profile-warmup", type=int, default=1)
    p.add_argument("--profile-active", type=int, default=2)
    p.add_argument("--no-track-memory", action="store_true", help="skip the CPU MemTracker step")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--memory-budget", help="per-process memory budget, bytes or with a unit (64MiB, 2GiB);"
                   " past it the rank fails as out of memory, as a GPU that is full would"
                   f" (default: ${BUDGET_ENV}, else none)")
    p.add_argument("--fail-rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--fail-step", type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)




def _plan(path: Path | None) -> Plan:
    """The plan: the file given, else the job contract's."""
    if path is not None:
        return load_plan(path)
    return JobEnv.from_environ(os.environ).plan


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.out is None:
        if not os.environ.get(OUT_DIR):
            print(f"error: give --out or set ${OUT_DIR}", file=sys.stderr)
            sys.exit(2)
        args.out = Path(os.environ[OUT_DIR])
    args.out.mkdir(parents=True, exist_ok=True)
    # Under shardctl's launchers torchrun labels every line with its rank already (the log readers
    # split that label off): naming it again would print "[rank 0] [rank 0] ..." in `shardctl logs`.
    labelled = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE" in os.environ
    logging.basicConfig(level=os.environ.get(LOG_LEVEL, "INFO"),
                        format=("" if labelled else f"[rank {os.environ.get('RANK', '0')}] ")
                        + "%(levelname)s %(name)s: %(message)s")
    budget_text = args.memory_budget or os.environ.get(BUDGET_ENV) or None
    try:
        budget = parse_bytes(budget_text) if budget_text else None
    except ValueError as exc:
        print(f"error: --memory-budget: {exc}", file=sys.stderr)
        sys.exit(2)
    opts = RunOptions(seed=args.seed, lr=args.lr, steps=args.steps, timeout_s=args.timeout_s,
                      checkpoint_every=args.checkpoint_every, stop_after=args.stop_after,
                      heartbeat_every=args.heartbeat_every, profile=not args.no_profile,
                      profile_wait=args.profile_wait, profile_warmup=args.profile_warmup,
                      profile_active=args.profile_active, track_memory=not args.no_track_memory,
                      device=args.device, fail_rank=args.fail_rank, fail_step=args.fail_step,
                      memory_budget=budget)
    from workers.runtime.config import resolve_run
    from workers.runtime.train import run

    try:
        cfg = resolve_run(_plan(args.plan), opts)
    except (OSError, JobEnvError, PlanNotRunnable) as exc:  # no usable plan: say so on stderr, exit 2
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    run(cfg, args.out)


if __name__ == "__main__":
    main()
