"""On a GPU machine: run the reference model under real plans and print predicted vs measured
peak memory and step time.

Layouts: one GPU (ddp, dp=1), and with N >= 2 visible GPUs: ddp, fsdp and (N >= 2, heads
divisible) tp over N GPUs. Each runs `python -m workers.runtime` under torchrun with the plan the
planner makes for the layout (`service.planner.estimate`), then reads `report.json`:

- peak: `torch.cuda.max_memory_allocated` (and reserved) vs the plan's total minus runtime
  overhead and allocator margin (and minus runtime overhead);
- step: measured median step time vs the plan's `time.step_s`;
- params/grads/optimizer: exact local bytes vs the plan.

    python benchmarks/gpu_check.py [--model llama-tiny|llama-2-7b|...] [--steps 8] [--gpu H100-SXM-80GB]

`--gpu` names the catalog entry for the planner (default: guessed from the device name).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GUESS = {"H200": "H200-SXM-141GB", "H100 PCIe": "H100-PCIe-80GB", "H100": "H100-SXM-80GB",
         "A100-SXM4-40GB": "A100-SXM-40GB", "A100": "A100-SXM-80GB", "B200": "B200-180GB", "L40S": "L40S-48GB",
         "MI300X": "MI300X-192GB", "V100": "V100-SXM-32GB"}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-tiny", help="a planner preset (default llama-tiny)")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--gpu", help="catalog GPU name for the planner")
    p.add_argument("--max-gpus", type=int, default=8)
    p.add_argument("--timeout", type=int, default=900, help="seconds per layout")
    return p.parse_args(argv)


def guess_gpu(name: str) -> str:
    for key, catalog in GUESS.items():
        if key in name:
            return catalog
    raise SystemExit(f"cannot map device {name!r} to the GPU catalog; pass --gpu")


def layouts(n: int, micro_batch: int) -> list[tuple[str, dict[str, Any]]]:
    base = {"tp": 1, "pp": 1, "cp": 1, "sequence_parallel": False, "micro_batch": micro_batch,
            "grad_accum_steps": 1, "activation_checkpointing": "none", "pipeline_schedule": None,
            "virtual_stages": 1, "offload": "none"}
    out = [("1 GPU ddp", {**base, "dp": 1, "sharding": "ddp", "dp_shard": 1})]
    if n >= 2:
        out.append((f"{n} GPU ddp", {**base, "dp": n, "sharding": "ddp", "dp_shard": 1}))
        out.append((f"{n} GPU fsdp", {**base, "dp": n, "sharding": "fsdp", "dp_shard": n}))
        out.append((f"{n} GPU tp+sp", {**base, "dp": 1, "tp": n, "sharding": "fsdp", "dp_shard": 1,
                                       "sequence_parallel": True, "micro_batch": micro_batch * n}))
    return out


def run_one(label: str, fields: dict[str, Any], args: argparse.Namespace, gpu: str, tmp: Path) -> None:
    from service.planner import Layout, estimate
    from service.spec import TrainingSpec

    lay = Layout(**fields)
    world = lay.world_size
    spec = TrainingSpec.model_validate({
        "name": "gpu-check", "model": {"preset": args.model, "seq_len": args.seq_len},
        "training": {"global_batch": lay.dp * lay.micro_batch, "precision": args.precision, "steps": args.steps},
        "resources": {"gpu": gpu, "gpus_per_node": world, "nodes": 1}})
    try:
        plan = estimate(spec, lay)
    except Exception as exc:
        print(f"{label:16} skipped: {exc}")
        return
    work = tmp / label.replace(" ", "_").replace("+", "")
    work.mkdir(parents=True)
    (work / "plan.json").write_text(plan.model_dump_json())
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", f"--nproc_per_node={world}", "-m", "workers.runtime",
           "--plan", str(work / "plan.json"), "--out", str(work / "out"),
           "--device", "cuda", "--timeout-s", "120"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHARDCTL_LOG": "WARNING"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout, check=False)
    report_path = work / "out" / "report.json"
    if not report_path.exists():
        print(f"{label:16} FAILED (exit {done.returncode}): {done.stderr[-2000:]}")
        return
    rep = json.loads(report_path.read_text())
    if rep["status"] != "succeeded":
        print(f"{label:16} FAILED: {rep['error']['type']}: {rep['error']['message'][:500]}")
        return
    pred, meas, ratio = rep["predicted"], rep["measured"], rep["ratios"]

    def gib(v: float | None) -> str:
        return "-" if v is None else f"{v / 2**30:.3f}"

    def r(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    print(f"{label:16} {gib(pred['peak_allocated']):>9} {gib(meas['peak']):>9} {r(ratio['peak']):>6}"
          f" {gib(pred['peak_reserved']):>9} {gib(meas['reserved']):>9} {r(ratio['reserved']):>6}"
          f" {pred['step_s'] * 1e3:9.1f} {(meas['step_s'] or 0) * 1e3:9.1f} {r(ratio['step_s']):>6}"
          f" {r(ratio['params'])}/{r(ratio['grads'])}/{r(ratio['optimizer'])}  mfu={r(rep['mfu'])}")


def main() -> None:
    args = parse()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this check needs a GPU machine (see --help)")
    n = min(torch.cuda.device_count(), args.max_gpus)
    gpu = args.gpu or guess_gpu(torch.cuda.get_device_name(0))
    print(f"{n} x {torch.cuda.get_device_name(0)} (planner: {gpu}), {args.model}, seq {args.seq_len},"
          f" micro-batch {args.micro_batch}, {args.precision}, torch {torch.__version__}")
    print(f"{'layout':16} {'pred GiB':>9} {'alloc':>9} {'ratio':>6} {'pred rsv':>9} {'reserved':>9} {'ratio':>6}"
          f" {'pred ms':>9} {'step ms':>9} {'ratio':>6} params/grads/optim")
    with tempfile.TemporaryDirectory() as tmp:
        for label, fields in layouts(n, args.micro_batch):
            run_one(label, fields, args, gpu, Path(tmp))


if __name__ == "__main__":
    main()
