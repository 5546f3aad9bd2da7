"""`python -m workers.runtime --plan plan.json --out DIR [--spec spec.yaml]`, one process per rank."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from workers.backends.base import OUT_ENV, PLAN_ENV, SPEC_ENV
from workers.runtime.config import RunOptions


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m workers.runtime", description=(
        "Train the reference decoder under a shardctl plan (run under torchrun, one process per rank)."))
    p.add_argument("--plan", type=Path, help="plan JSON, as `shardctl plan --json` prints it"
                   f" (default: the JSON in ${PLAN_ENV}, as backends ship it)")
    p.add_argument("--spec", type=Path, help="the spec the plan was made for (model shape, batch, steps);"
                   f" default: the JSON in ${SPEC_ENV}; without either the spec is rebuilt from the plan's preset")
    p.add_argument("--out", type=Path, help=f"directory for report.json, traces and checkpoints (default: ${OUT_ENV})")
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
    p.add_argument("--fail-rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--fail-step", type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)




def _from_env(path: Path | None, var: str, out: Path, filename: str) -> Path | None:
    """`path`, or the JSON in $var written to `out/filename` (every rank writes the same bytes)."""
    if path is not None or not os.environ.get(var):
        return path
    target = out / filename
    tmp = out / f".{filename}.{os.getpid()}"
    tmp.write_text(os.environ[var])
    tmp.replace(target)
    return target


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.out is None:
        if not os.environ.get(OUT_ENV):
            print(f"error: give --out or set ${OUT_ENV}", file=sys.stderr)
            sys.exit(2)
        args.out = Path(os.environ[OUT_ENV])
    args.out.mkdir(parents=True, exist_ok=True)
    args.plan = _from_env(args.plan, PLAN_ENV, args.out, "plan.json")
    args.spec = _from_env(args.spec, SPEC_ENV, args.out, "spec.json")
    if args.plan is None:
        print(f"error: give --plan or set ${PLAN_ENV}", file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(level=os.environ.get("SHARDCTL_LOG", "INFO"),
                        format=f"[rank {os.environ.get('RANK', '0')}] %(levelname)s %(name)s: %(message)s")
    opts = RunOptions(seed=args.seed, lr=args.lr, steps=args.steps, timeout_s=args.timeout_s,
                      checkpoint_every=args.checkpoint_every, stop_after=args.stop_after,
                      heartbeat_every=args.heartbeat_every, profile=not args.no_profile,
                      profile_wait=args.profile_wait, profile_warmup=args.profile_warmup,
                      profile_active=args.profile_active, track_memory=not args.no_track_memory,
                      device=args.device, fail_rank=args.fail_rank, fail_step=args.fail_step)
    from workers.runtime.config import load_run
    from workers.runtime.train import run

    try:
        cfg = load_run(args.plan, args.spec, opts)
    except Exception as exc:  # a bad plan or spec: say so on stderr, exit 2
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    run(cfg, args.out)


if __name__ == "__main__":
    main()
