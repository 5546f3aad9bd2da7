"""Step time of the runtime (`apply_plan(...).train_step`) next to hand-written DDP and FSDP2 loops.

Same model (the reference decoder), same data, same optimizer, same process group. The runtime
and its hand-written counterpart are timed interleaved: `--warmup` untimed rounds, then `--steps`
rounds of one step each, alternating which goes first, with a barrier before every step. A busy
or noisy machine then slows both alike, instead of whichever block of steps it happened to hit.
The table prints median step times and the ratio runtime / hand-written (goal: within 3%). A last
row times the runtime's profiler window (warm-up + recorded steps, with trace export) against
unprofiled steps.

    .venv/bin/python benchmarks/runtime_overhead.py [--nproc 2] [--steps 100] [--model tiny|llama-tiny]

The script launches itself under torchrun; `--worker` is the per-rank entry.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODELS: dict[str, dict[str, object]] = {
    "tiny": {"layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128, "vocab": 256, "seq_len": 32},
    "llama-tiny": {"preset": "llama-tiny", "seq_len": 128},
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=100, help="timed rounds per pair (2 cores, loaded: 100+)")
    p.add_argument("--profile-steps", type=int, default=10, help="steps of the profiled-window row")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--model", choices=sorted(MODELS), default="tiny")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from service.planner import Layout, estimate
    from service.planner.models import resolve_model
    from service.spec import TrainingSpec
    from workers.runtime import Decoder, apply_plan, build_mesh, init_distributed, pick_device
    from workers.runtime.data import local_batch
    from workers.runtime.model import Block
    from workers.runtime.parallelize import cross_entropy
    from workers.runtime.profiling import ProfileWindow

    device = pick_device(args.device)
    init_distributed(device, 300)
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.set_num_threads(1)
    gb = world * args.micro_batch
    spec = TrainingSpec.model_validate({
        "name": "overhead", "model": MODELS[args.model],
        "training": {"global_batch": gb, "precision": "fp32", "steps": args.steps},
        "resources": {"gpu": "cpu" if device.type == "cpu" else "H100-SXM-80GB", "gpus_per_node": world,
                      "nodes": 1}})
    shape = resolve_model(spec.model)
    x, y = local_batch(0, 0, gb, shape.seq_len, shape.vocab, world, rank)
    x, y = x.to(device), y.to(device)

    def fresh() -> Decoder:
        torch.manual_seed(0)
        return Decoder(shape).to(device)

    def timed(variants: dict[str, Callable[[], None]], n: int) -> dict[str, float]:
        """Median step time of each variant, the variants' steps interleaved (see the docstring)."""
        times: dict[str, list[float]] = {k: [] for k in variants}
        order = list(variants.items())
        for i in range(args.warmup + n):
            for name, step in (order if i % 2 == 0 else order[::-1]):
                dist.barrier()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                step()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - t0)
        return {k: statistics.median(v) for k, v in times.items()}

    def hand(model: torch.nn.Module) -> Callable[[], None]:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            torch.autograd.backward(cross_entropy(model(x), y))
            opt.step()
        return step

    results: dict[str, float] = {}
    for sharding in ("ddp", "fsdp"):
        lay = Layout(dp=world, tp=1, pp=1, cp=1, sharding=sharding, dp_shard=1 if sharding == "ddp" else world,
                     sequence_parallel=False, micro_batch=args.micro_batch, grad_accum_steps=1,
                     activation_checkpointing="none", pipeline_schedule=None, virtual_stages=1, offload="none")
        plan = estimate(spec, lay)
        applied = apply_plan(fresh(), plan, build_mesh(lay, device), device=device)
        def runtime_step(a: Any = applied) -> None:
            a.train_step(x, y)

        if sharding == "ddp":
            ids = [device.index] if device.type == "cuda" else None
            # Like for like: the runtime skips DDP's per-step buffer broadcast for the decoder (its
            # buffers are rotary tables, not state); a hand-written loop that keeps it pays one more
            # collective per step, which is not runtime overhead.
            hand_model: torch.nn.Module = DistributedDataParallel(fresh(), device_ids=ids,
                                                                  gradient_as_bucket_view=True,
                                                                  broadcast_buffers=False)
        else:
            hand_model = fresh()
            for block in hand_model.modules():
                if isinstance(block, Block):
                    fully_shard(block)
            fully_shard(hand_model)
        results.update(timed({f"runtime {sharding}": runtime_step, f"hand {sharding}": hand(hand_model)},
                             args.steps))
        if sharding == "ddp":
            with tempfile.TemporaryDirectory() as tmp:
                n = args.profile_steps
                window = ProfileWindow(Path(tmp), rank, device, enabled=True, wait=0, warmup=1, active=n - 1)
                t0 = time.perf_counter()
                with window.context():
                    for _ in range(n):
                        applied.train_step(x, y)
                        window.step()
                results["runtime ddp, profiled window (mean)"] = (time.perf_counter() - t0) / n
    gathered: list[dict[str, float] | None] = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        slowest = {k: max(r[k] for r in gathered if r) for k in results}
        print(f"{world} ranks, {args.model} ({shape.total_params / 1e6:.2f}M params), micro-batch"
              f" {args.micro_batch}, {args.steps} interleaved timed steps, slowest rank's median step")
        print(f"{'variant':40} {'step ms':>9} {'ratio':>8}")
        for k, v in slowest.items():
            base = {"runtime ddp": "hand ddp", "runtime fsdp": "hand fsdp",
                    "runtime ddp, profiled window (mean)": "runtime ddp"}.get(k)
            ratio = f"{v / slowest[base]:.3f}" if base else ""
            print(f"{k:40} {v * 1e3:9.1f} {ratio:>8}")
        print("ratio: runtime / hand-written (goal <= 1.03); profiled window / unprofiled runtime steps")
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def main() -> None:
    args = parse()
    if args.worker:
        worker(args)
        return
    torchrun = Path(sys.executable).with_name("torchrun")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONPATH": str(root)}
    cmd = [str(torchrun), "--standalone", f"--nproc_per_node={args.nproc}", str(Path(__file__).resolve()),
           "--worker", *sys.argv[1:]]
    sys.exit(subprocess.run(cmd, env=env, check=False).returncode)


if __name__ == "__main__":
    main()
