"""The reference trainer: one process per rank under torchrun.

`run(cfg, out)` never returns normally: it ends the process with `os._exit` (0 on success, 1 on
any error, 3 when stopped by `stop_after`, `PREEMPTED_EXIT_CODE` (75) when a notice signal
(`preemption`: SIGTERM, SIGUSR1) stopped it after a checkpoint), after `destroy_process_group` on success (gloo worker
threads can otherwise abort the interpreter at exit). A rank that raises writes its error into
`out/report.json` (the first failing rank wins) and exits at once; its peers then fail on their
next collective within `timeout_s` (or are stopped by torchrun), and a watchdog ends any rank
that makes no progress for `2 * timeout_s`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from service.failures import oom_line
from service.jobenv import PREEMPTED_EXIT_CODE, MeasurementKind
from service.planner.timing import FLOP_CONVENTION, model_flops_per_step
from workers.runtime import checkpoint, memory_budget
from workers.runtime.config import RunConfig
from workers.runtime.data import local_batch
from workers.runtime.measure import PeakTracker, StateBytes, state_bytes
from workers.runtime.mesh import Mesh, build_mesh, init_distributed, pick_device
from workers.runtime.model import Decoder
from workers.runtime.parallelize import apply_plan
from workers.runtime.preemption import Notice
from workers.runtime.profiling import ProfileWindow
from workers.runtime.report import (
    ApiReporter,
    RankMemory,
    RankReport,
    Report,
    RunError,
    compare,
    predicted_of,
    write_report,
)

log = logging.getLogger("workers.runtime")


class Watchdog:
    """Ends the process (exit code 124) when `touch()` has not been called for `limit_s` seconds."""

    def __init__(self, limit_s: float, on_expire: Any) -> None:
        self.limit_s = limit_s
        self.last = time.monotonic()
        self._on_expire = on_expire
        self._thread = threading.Thread(target=self._loop, daemon=True, name="shardctl-watchdog")
        self._thread.start()

    def touch(self) -> None:
        self.last = time.monotonic()

    def _loop(self) -> None:
        while True:
            time.sleep(min(1.0, self.limit_s / 4))
            if time.monotonic() - self.last > self.limit_s:
                self._on_expire()


def _global_losses(losses: list[float | None], device: torch.device) -> list[float]:
    """Per step, the mean over the ranks that computed a loss (last pipeline stage; every dp/tp rank).

    One all-reduce for all the given steps: the trainer calls it at heartbeats and once at the
    end, not after every step. Collective: every rank must call it with as many steps.
    """
    if not losses:
        return []
    t = torch.tensor([[x or 0.0, 1.0 if x is not None else 0.0] for x in losses], dtype=torch.float64,
                     device=device)
    dist.all_reduce(t)
    return [float(s / n) if n > 0 else float("nan") for s, n in t.tolist()]


def _coords(mesh: Mesh) -> dict[str, int]:
    return {name: mesh.coord(name) for name in mesh.sizes}


def run(cfg: RunConfig, out: Path) -> NoReturn:
    """Train per `cfg` on this rank and exit the process (see the module docstring)."""
    rank = int(os.environ.get("RANK", "0"))
    notice = Notice().install()  # from now on SIGTERM means "checkpoint after this step and stop"
    opts = cfg.options
    reporter = ApiReporter.from_env() if rank == 0 else ApiReporter(None, None, None)
    base = Report(status="failed", plan=cfg.plan.name, layout=cfg.layout.to_dict(), world_size=cfg.layout.world_size,
                  device="?", steps=0, predicted=predicted_of(cfg.plan), flop_convention=FLOP_CONVENTION)

    def fail(exc: BaseException, code: int = 1) -> NoReturn:
        err = RunError.of(rank, exc)
        log.error("rank %d failed: %s", rank, err.traceback)
        oom = memory_budget.measured_of(exc, rank, device, opts.memory_budget)
        report = base.model_copy(update={"status": "failed", "error": err, "oom": oom})
        if oom is not None:  # last on stderr, so that the backend's log tail carries it (docs/failures.md)
            print(oom_line(oom), file=sys.stderr, flush=True)
        if write_report(out, report, exclusive=True):
            # Whichever rank fails first reports it, not only rank 0.
            failing = reporter if reporter.enabled else ApiReporter.from_env()
            failing.post(MeasurementKind.REPORT, report.model_dump(mode="json"))
        (out / "errors").mkdir(parents=True, exist_ok=True)
        (out / "errors" / f"rank{rank}.json").write_text(err.model_dump_json(indent=2), encoding="utf-8")
        os._exit(code)

    watchdog = Watchdog(2 * opts.timeout_s, lambda: fail(TimeoutError(
        f"rank {rank} made no progress for {2 * opts.timeout_s:.0f} s (2 x timeout_s); a peer is dead or hung"), 124))
    device: torch.device | None = None
    try:
        device = pick_device(opts.device)
        base.device = str(device)
        if device.type == "cuda" and opts.memory_budget is not None:
            memory_budget.apply_cuda_budget(device, opts.memory_budget)
        if device.type == "cpu":
            torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        init_distributed(device, opts.timeout_s)
        watchdog.touch()
        report = _train(cfg, out, device, rank, reporter, watchdog, base, notice)
    except BaseException as exc:
        fail(exc)
    if rank == 0:
        write_report(out, report)
        reporter.post(MeasurementKind.REPORT, report.model_dump(mode="json"))
        if report.profile is not None:
            reporter.post(MeasurementKind.PROFILE, report.profile)
    reporter.close()
    dist.barrier()
    dist.destroy_process_group()
    os._exit({"stopped": 3, "preempted": PREEMPTED_EXIT_CODE}.get(report.status, 0))


def _train(cfg: RunConfig, out: Path, device: torch.device, rank: int, reporter: ApiReporter, watchdog: Watchdog,
           base: Report, notice: Notice) -> Report:
    opts, layout, shape = cfg.options, cfg.layout, cfg.shape
    mesh = build_mesh(layout, device)
    torch.manual_seed(opts.seed)
    model = Decoder(shape)
    applied = apply_plan(model, cfg.plan, mesh, device=device, optimizer_name=cfg.training.optimizer, lr=opts.lr)
    ckpt_root = checkpoint.root_for(out)
    start = checkpoint.load(ckpt_root, applied)
    watchdog.touch()
    steps = cfg.steps
    gb = cfg.training.global_batch
    tokens_per_step = gb * shape.seq_len
    track_k = 1 if steps - start > 1 else 0
    cpu_trackable = layout.pp == 1 and layout.grad_accum_steps == 1
    tracker = PeakTracker(device, applied.parts, applied.optimizer,
                          enabled=opts.track_memory and (device.type == "cuda" or cpu_trackable))
    if device.type == "cpu" and not cpu_trackable:
        tracker.source = "unavailable: MemTracker supports neither pipelining nor gradient accumulation"
    window = ProfileWindow(out, rank, device, enabled=opts.profile, wait=opts.profile_wait,
                           warmup=opts.profile_warmup, active=opts.profile_active)
    local_losses: list[float | None] = []
    times: list[tuple[int, float]] = []
    states: StateBytes | None = None
    status = "succeeded"
    budget: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if device.type == "cpu" and opts.memory_budget is not None:
        counter = memory_budget.MemoryBudget(opts.memory_budget)
        counter.register([*applied.parameters(), *(b for part in applied.parts for b in part.buffers())])
        budget = counter
    with window.context(), budget:
        for k, step in enumerate(range(start, steps)):
            x, y = local_batch(opts.seed, step, gb, shape.seq_len, shape.vocab, layout.dp, mesh.dp_rank)
            x, y = x.to(device), y.to(device)
            if opts.fail_rank == rank and opts.fail_step == step:
                raise RuntimeError(f"injected failure on rank {rank} at step {step}")
            t0 = time.perf_counter()
            if k == track_k:
                with tracker.track():
                    loss = applied.train_step(x, y)
            else:
                loss = applied.train_step(x, y)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append((k, time.perf_counter() - t0))
            window.step()
            watchdog.touch()
            local_losses.append(loss)
            if step == steps - 1 or (opts.stop_after is not None and step + 1 == opts.stop_after):
                states = state_bytes(applied.parameters(), applied.optimizer)
            if opts.heartbeat_every and (step + 1) % opts.heartbeat_every == 0:
                # Every rank joins this step's loss all-reduce; rank 0 posts.
                beat_loss = _global_losses([loss], device)[0]
                if rank == 0:
                    reporter.post(MeasurementKind.HEARTBEAT, {"step": step + 1, "loss": beat_loss,
                                                "tokens_per_s": tokens_per_step / times[-1][1]})
            done = step + 1
            if opts.checkpoint_every and done % opts.checkpoint_every == 0 and done < steps:
                checkpoint.save(ckpt_root, done, applied)
                watchdog.touch()
            if opts.stop_after is not None and done == opts.stop_after and done < steps:
                checkpoint.save(ckpt_root, done, applied)
                status = "stopped"
                break
            if notice.agree(device) and done < steps:  # every rank stops after this same step
                log.warning("rank %d: notice (signal %s) after step %d of %d: checkpointing and stopping", rank,
                            notice.signum, done, steps)
                if checkpoint.latest_step(ckpt_root) != done:
                    checkpoint.save(ckpt_root, done, applied)
                status = "preempted"
                break
    tracker.finish()
    losses = _global_losses(local_losses, device)
    if states is None:
        states = state_bytes(applied.parameters(), applied.optimizer)
    clean = [t for k, t in times if k != 0 and k != track_k and not window.in_window(k)]
    if not clean:
        clean = [t for k, t in times if k != 0] or [t for _, t in times]
    step_s = sorted(clean)[len(clean) // 2] if clean else None
    mine = RankReport(
        rank=rank, coords=_coords(mesh), param_count_local=states.param_count_local,
        memory=RankMemory(params=states.params, grads=states.grads, optimizer=states.optimizer,
                          optimizer_scalars=states.optimizer_scalars, peak=tracker.peak, reserved=tracker.reserved,
                          peak_source=tracker.source),
        step_s=step_s, tokens_per_s=tokens_per_step / step_s if step_s else None)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine.model_dump())
    watchdog.touch()
    ranks = [RankReport.model_validate(r) for r in gathered]
    report = base.model_copy(update={"status": status, "steps": len(times), "start_step": start,
                                     "losses": losses, "ranks": ranks})
    assert report.predicted is not None
    report.measured, report.ratios = compare(ranks, report.predicted)
    slowest = report.measured.get("step_s")
    if slowest:
        peak = cfg.plan.time.peak_flops_per_gpu
        report.mfu = model_flops_per_step(shape, gb) / (slowest * layout.world_size * peak) if peak else None
    if window.enabled:
        dist.barrier()
        watchdog.touch()
        traces = sorted((out / "traces").glob("rank*.json"))
        report.traces = [str(p) for p in traces]
        if rank == 0 and window.written:
            report.profile, report.profile_error = _analyze(traces, cfg.plan.time.exposed_comm_fraction)
    return report


def _analyze(traces: list[Path], predicted_comm: float | None) -> tuple[dict[str, Any] | None, str | None]:
    """The profile summary of the ranks' traces (its verdict set against the plan's predicted exposed
    communication share), or the reason it could not be made."""
    try:
        from service.profiles import analyze_traces

        return analyze_traces(traces, predicted_comm_fraction=predicted_comm).model_dump(mode="json"), None
    except Exception as exc:
        log.warning("profile analysis failed: %s", exc)
        return None, f"{type(exc).__name__}: {exc}"
