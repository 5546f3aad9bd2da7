"""The planner's public operations: `plan` (search) and `estimate` (one pinned layout)."""

from __future__ import annotations

import dataclasses

from service.planner.budget import Deadline
from service.planner.calibration import Calibration, calibrate_candidate, family, scale_time, search_contexts
from service.planner.calibration import apply as apply_calibration
from service.planner.errors import FieldProblem, InvalidSpec
from service.planner.explain import gib, memory_sentence, plural, rubric, simpler_words, why_slower
from service.planner.layout import Layout
from service.planner.result import (
    Alternative,
    CalibrationUse,
    CommVolumes,
    MemoryBreakdown,
    Plan,
    PrecisionPolicy,
    Rejected,
    StepEstimate,
)
from service.planner.runnable import layout_problems, runtime_gaps
from service.planner.search import (
    MAX_ALTERNATIVES,
    PRUNE_FACTOR,
    SIMPLER_WITHIN,
    Candidate,
    Context,
    SearchResult,
    evaluate_layout,
    resolve,
    runnable_pin_problems,
    search,
    smallest_fitting_world,
)
from service.planner.timing import FLOP_CONVENTION, model_flops_per_step, recompute_flops_per_step, step_time
from service.spec import LayoutPins, TrainingSpec


def plan(spec: TrainingSpec, *, deadline: Deadline | None = None,
         min_free_fraction: float | None = None, calibration: Calibration | None = None) -> Plan:
    """Search every runnable layout the spec's pins allow and return the best that fits (see
    `search`: runtime gaps last, then layouts leaving less than `min_free_fraction` of GPU memory
    free, then the simplest within `SIMPLER_WITHIN` of the fastest). `min_free_fraction` None takes
    the spec's `planner.min_free_fraction` (default 10%); a number overrides it (`shardctl plan --min-free`).

    When nothing fits, the plan describes the candidate closest to fitting, with `fits` false,
    the reasons, and the smallest GPU count of this kind that would fit.
    Raises `InvalidSpec` for a spec that cannot be planned at all, and `SearchBudgetExceeded` when
    the search (or the search for the smallest GPU count that fits) runs past `deadline`.

    With a `calibration` (`service.planner.calibration`), each layout's step time and per-GPU total
    are scaled by its GPU kind and family's factors where enough runs exist, fit and ranking are
    decided on the scaled figures, and `Plan.calibration` says what was applied. Without one the
    plan is the model's alone and `Plan.calibration` is None.
    """
    wanted = spec.planner.min_free_fraction if min_free_fraction is None else min_free_fraction
    ctx = dataclasses.replace(resolve(spec), min_free=wanted)
    if problems := runnable_pin_problems(spec.layout, spec.training.precision):
        raise InvalidSpec(problems)
    if calibration is None:
        result = search(ctx, deadline=deadline)
    else:
        result = apply_calibration(ctx, [search(c, deadline=deadline) for c in search_contexts(ctx, calibration)],
                                   calibration)
    if result.best is not None:
        return _assemble(ctx, result.best, result, calibration=calibration)
    reasons = _no_fit_reasons(ctx, result)
    target = result.closest
    if target is None:
        raise InvalidSpec([FieldProblem(loc=("layout",), message="no valid layout: " + "; ".join(reasons))])
    target = evaluate_layout(ctx, target.layout)
    min_gpus = smallest_fitting_world(ctx, deadline)
    if calibration is not None:
        target = calibrate_candidate(ctx, target, calibration)
        if min_gpus is not None and min_gpus <= ctx.cluster.world_size:
            # The model alone fits here; a count for the calibrated memory is not searched.
            min_gpus = None
    return _assemble(ctx, target, result, reasons=reasons, min_gpus=min_gpus, calibration=calibration)


def estimate(spec: TrainingSpec, layout: Layout) -> Plan:
    """Evaluate one complete layout for the spec, even one that does not fit (then `fits` is false)."""
    ctx = resolve(spec)
    fields = layout.to_dict()
    fields.pop("grad_accum_steps")
    if fields["sharding"] != "hsdp":
        fields.pop("dp_shard")
    if fields["tp"] == 1 and not fields["sequence_parallel"]:
        fields["sequence_parallel"] = None
    pins = LayoutPins.model_validate(fields)
    resolve(spec.model_copy(update={"layout": pins}))
    if layout.world_size != ctx.cluster.world_size:
        raise InvalidSpec([FieldProblem(loc=("layout", "dp"), message=(
            f"dp*tp*pp*cp = {layout.world_size} but the resources give {ctx.cluster.world_size} GPUs"))])
    expected = spec.training.global_batch // (layout.dp * layout.micro_batch)
    if expected * layout.dp * layout.micro_batch != spec.training.global_batch or (
            layout.grad_accum_steps != expected):
        raise InvalidSpec([FieldProblem(loc=("layout", "grad_accum_steps"), message=(
            f"global_batch ({spec.training.global_batch}) must equal dp*micro_batch*grad_accum_steps"
            f" ({layout.dp}*{layout.micro_batch}*{layout.grad_accum_steps})"))])
    cand = evaluate_layout(ctx, layout)
    reasons = [] if cand.fits else [_oom_reason(ctx, cand)]
    return _assemble(ctx, cand, None, reasons=reasons)


def _oom_reason(ctx: Context, cand: Candidate) -> str:
    limit, mem = ctx.cluster.memory_bytes_per_gpu, cand.mem
    host = ctx.cluster.cpu_memory_gib * 2**30
    parts = []
    if cand.total > limit:  # cand.total is mem.total, or calibrated (mem.total x the memory factor)
        calibrated = " calibrated" if cand.total > mem.total * 1.000001 else ""
        parts.append(f"needs {gib(cand.total)} per GPU{calibrated}, {gib(cand.total - limit)} more than the"
                     f" {gib(limit)} available")
    if mem.cpu_per_node > host:
        parts.append(f"offloads {gib(mem.cpu_per_node)} per node to host memory, more than the"
                     f" {gib(host)} available")
    return f"{cand.layout.short()} " + " and ".join(parts or ["fits"])


def _no_fit_reasons(ctx: Context, result: SearchResult) -> list[str]:
    reasons: list[str] = []
    if result.closest is not None:
        reasons.append("closest: " + _oom_reason(ctx, result.closest))
    if result.out_of_memory:
        reasons.append(f"{plural(result.out_of_memory, 'layout')} out of memory")
    for why, count in sorted(result.invalid_reasons.items(), key=lambda kv: -kv[1])[:3]:
        reasons.append(f"{plural(count, 'mesh', 'meshes')} invalid: {why}")
    if not result.out_of_memory and not result.invalid_reasons:
        reasons.append("the pins leave no valid layout (check micro_batch, pp and the batch size)")
    return reasons


def _warnings(ctx: Context, cand: Candidate) -> list[str]:
    out: list[str] = []
    lay, cl = cand.layout, ctx.cluster
    if lay.tp > cl.gpus_per_node:
        out.append(f"tensor parallelism (tp={lay.tp}) crosses nodes over a {cl.inter_node_gbps:g} GB/s"
                   " fabric; keep tp within a node")
    if ctx.precision == "fp16":
        out.append("fp16 needs a dynamic loss scaler (the runtime uses a sharded GradScaler); bf16 would not")
    if ctx.precision == "fp8":
        out.append("fp8: MFU is quoted against the fp8 peak; attention runs in bf16")
    tokens = lay.micro_batch * ctx.shape.seq_len // lay.cp
    if tokens < 1024:
        out.append(f"tiny micro-batches ({tokens} tokens per GPU) leave the GPU under-used")
    t = cand.time
    if t is not None and t.bubble_s > 0.2 * t.step_s:
        out.append(f"the pipeline bubble is {t.bubble_s / t.step_s:.0%} of the step; more micro-batches or"
                   " an interleaved schedule would shrink it")
    if cand.fits and cand.total > ctx.roomy:  # cand.total: calibrated when a calibration applied
        out.append(f"only {1 - cand.total / cl.memory_bytes_per_gpu:.0%} of GPU memory free, under the"
                   f" {ctx.min_free:.0%} minimum: variable shapes or fragmentation may still run out")
    for problem in layout_problems(lay, precision=ctx.precision, attention=ctx.attention, shape=ctx.shape):
        out.append(f"{problem}: shardctl's runtime refuses this layout (plan() never returns it)")
    for gap in runtime_gaps(lay, precision=ctx.precision):
        out.append(f"{gap}: shardctl's runtime refuses this plan until that is implemented")
    if lay.offload != "none":
        out.append(f"offload={lay.offload} moves state to host memory and adds PCIe traffic every step")
    if ctx.attention == "eager" and ctx.shape.seq_len >= 4096:
        out.append("eager attention materialises the s x s scores; flash attention would save that memory")
    if cl.gpu.name == "cpu":
        out.append("cpu: worker processes with gloo; step times are indicative only")
    return out


def why_not(ctx: Context, chosen: Candidate, other: Candidate) -> str:
    """Why `other` lost to `chosen`: its step time, and what decided when it is not slower."""
    assert chosen.time is not None and other.time is not None
    words = why_slower(chosen.time, other.time)
    limit = ctx.cluster.memory_bytes_per_gpu
    if other.tier > chosen.tier:
        gaps = runtime_gaps(other.layout, precision=ctx.precision)
        if gaps and not runtime_gaps(chosen.layout, precision=ctx.precision):
            return f"{words}; needs {', '.join(f'{g.field}' for g in gaps)} support the runtime does not have yet"
        return (f"{words}; uses {other.total / limit:.0%} of GPU memory, leaving less than the"
                f" {ctx.min_free:.0%} minimum free")
    simpler = chosen.layout.simplicity() < other.layout.simplicity()
    if other.step_s < chosen.step_s and simpler:
        return (f"{words}; within the {SIMPLER_WITHIN:.0%} near-tie tolerance, and the chosen layout is"
                f" simpler ({simpler_words(chosen.layout, other.layout)})")
    if abs(other.step_s - chosen.step_s) < 0.0005 * chosen.step_s:
        if simpler:
            return f"{words}; the chosen layout is simpler ({simpler_words(chosen.layout, other.layout)})"
        return f"{words}; the chosen layout uses less memory ({gib(chosen.total)} against {gib(other.total)})"
    return words


def _explanation(ctx: Context, cand: Candidate, result: SearchResult | None) -> list[str]:
    lay, t = cand.layout, cand.time
    assert t is not None
    limit = ctx.cluster.memory_bytes_per_gpu
    lines: list[str] = []
    if result is not None and result.fitting and cand.fits:
        lines.append(f"{lay.short()}: chosen from {plural(result.fitting, 'fitting layout')}"
                     f" ({t.step_s:.3g} s/step).")
    else:
        lines.append(f"{lay.short()}: {t.step_s:.3g} s/step.")
    if result is not None and cand.fits:
        lines += _decision(ctx, cand, result)
    lines.append(memory_sentence(cand.mem, limit))
    lines.append(f"Time per step: compute {t.compute_s:.3g} s, recompute {t.recompute_s:.3g} s, exposed"
                 f" communication {t.comm_exposed_s:.3g} s, bubble {t.bubble_s:.3g} s, optimizer"
                 f" {t.optimizer_s:.3g} s, offload {t.offload_s:.3g} s; FLOPs and MFU count causal"
                 " attention at half the full-attention FLOPs, as the step time does.")
    if result is None or not cand.fits:
        return lines
    for dim, value in (("tp", lay.tp), ("pp", lay.pp), ("cp", lay.cp), ("sharding", lay.sharding),
                       ("activation_checkpointing", lay.activation_checkpointing), ("offload", lay.offload)):
        rivals = [c for (d, v), c in result.by_dimension.items() if d == dim and v != value]
        slow = sorted(str(v) for d, v in result.pruned_dimensions if d == dim and v != value
                      and (d, v) not in result.by_dimension)
        if slow:
            lines.append(f"{dim}={value}: every fitting layout with {dim}={'/'.join(slow)} is at least"
                         f" {PRUNE_FACTOR - 1:.0%} slower.")
        untimed = sorted(str(v) for d, v in result.gap_dimensions if d == dim and v != value
                         and (d, v) not in result.by_dimension)
        if untimed:
            lines.append(f"{dim}={value}: layouts with {dim}={'/'.join(untimed)} need support the runtime does"
                         " not have yet, and a layout it runs fits; they were not timed.")
        if not rivals:
            if dim == "activation_checkpointing" and value == "none":
                lines.append("activation_checkpointing=none: activations fit without recompute.")
            elif dim == "offload" and value == "none":
                lines.append("offload=none: states fit on the GPU.")
            continue
        rival = min(rivals, key=lambda c: c.key())
        lines.append(f"{dim}={value}: the best with {dim}={getattr(rival.layout, dim)} is"
                     f" {why_not(ctx, cand, rival)}.")
    return lines


def _decision(ctx: Context, cand: Candidate, result: SearchResult) -> list[str]:
    """What decided the choice when it is not simply the fastest fitting layout."""
    limit = ctx.cluster.memory_bytes_per_gpu
    lines: list[str] = []
    if "gap" in result.decided_by:
        gaps = runtime_gaps(cand.layout, precision=ctx.precision)
        lines.append("No layout the runtime implements fits: this one needs "
                     + ", ".join(g.field for g in gaps) + ", which the runtime refuses for now.")
    if cand.tier % 2 == 1:
        lines.append(f"No fitting layout leaves {ctx.min_free:.0%} of GPU memory free; this one uses"
                     f" {cand.total / limit:.0%}.")
    if "headroom" in result.decided_by:
        tight = min((c for c in result.timed if c.tier == cand.tier + 1), key=lambda c: c.step_s)
        assert tight.time is not None and cand.time is not None
        lines.append(f"Headroom decided: the fastest fitting layout, {tight.layout.short()}, is"
                     f" {why_slower(cand.time, tight.time)}, but uses {tight.total / limit:.0%} of GPU memory,"
                     f" leaving less than the {ctx.min_free:.0%} minimum free.")
    if "simplicity" in result.decided_by and result.fastest is not None:
        fast = result.fastest
        assert fast.time is not None and cand.time is not None
        lines.append(f"Simplicity decided: {fast.layout.short()} is {why_slower(cand.time, fast.time)},"
                     f" within the {SIMPLER_WITHIN:.0%} near-tie tolerance, and this layout is simpler"
                     f" ({simpler_words(cand.layout, fast.layout)}).")
    return lines


def _calibration_use(ctx: Context, cand: Candidate, calibration: Calibration) -> CalibrationUse:
    gpu, fam = ctx.cluster.gpu.name, family(cand.layout)
    group = calibration.group(gpu, fam)
    step = calibration.step_factor(gpu, fam)
    assert cand.time is not None
    families = len(calibration.used_for(gpu))
    return CalibrationUse(
        used=families > 0, gpu=gpu, family=fam, runs=group.runs if group is not None else 0,
        min_runs=calibration.min_runs, step_factor=step, memory_factor=calibration.memory_factor(gpu, fam),
        model_step_s=cand.time.step_s / step, memory_total=int(cand.total), families=families)


def _calibration_sentence(use: CalibrationUse, model_total: float) -> str:
    if use.step_factor != 1.0 or use.memory_factor != 1.0:
        return (f"Calibrated from {plural(use.runs, 'measured run')} of {use.family} on {use.gpu}: step time"
                f" x{use.step_factor:.3g} (the model says {use.model_step_s:.3g} s), memory x{use.memory_factor:.3g}"
                f" ({gib(use.memory_total)} per GPU against the model's {gib(model_total)}); fit and ranking use"
                " the calibrated figures.")
    if use.used:
        return (f"Calibration: {use.family} on {use.gpu} has {plural(use.runs, 'measured run')}, fewer than the"
                f" {use.min_runs} a factor needs, so its figures are the model's; the factors of"
                f" {plural(use.families, 'other family', 'other families')} re-ranked their layouts.")
    return (f"Not calibrated: no layout family on {use.gpu} has {use.min_runs} measured runs yet"
            f" ({use.family}: {use.runs}); the figures are the model's.")


def _assemble(ctx: Context, cand: Candidate, result: SearchResult | None, *,
              reasons: list[str] | None = None, min_gpus: int | None = None,
              calibration: Calibration | None = None) -> Plan:
    spec, shape, cl = ctx.spec, ctx.shape, ctx.cluster
    lay, mem = cand.layout, cand.mem
    t = cand.time
    if t is None:
        t = step_time(shape, cl, lay, precision=ctx.precision, optimizer=ctx.optimizer, attention=ctx.attention)
        if calibration is not None:
            t = scale_time(t, calibration.step_factor(cl.gpu.name, family(lay)))
    cand.time = t
    use = _calibration_use(ctx, cand, calibration) if calibration is not None else None
    tokens = spec.training.global_batch * shape.seq_len
    flops = model_flops_per_step(shape, spec.training.global_batch)
    peak = cl.gpu.peak_tflops[ctx.precision] * 1e12
    alternatives: list[Alternative] = []
    rejected = Rejected()
    if result is not None:
        ranked = sorted(result.by_signature.values(), key=lambda c: c.key())
        for other in [c for c in ranked if c.layout != lay][:MAX_ALTERNATIVES]:
            assert other.time is not None
            alternatives.append(Alternative(
                layout=other.layout, fits=other.fits, memory_total=int(other.mem.total),
                step_s=other.time.step_s, tokens_per_s=tokens / other.time.step_s,
                mfu=flops / (other.time.step_s * cl.world_size * peak), why_not=why_not(ctx, cand, other)))
        rejected = Rejected(invalid=result.invalid, out_of_memory=result.out_of_memory,
                            dominated=result.dominated,
                            slower=max(0, result.fitting - (1 if cand.fits else 0)) + result.pruned)
    cpu_limit = int(cl.cpu_memory_gib * 2**30) if mem.cpu_per_node else None
    return Plan(
        name=spec.name, fits=cand.fits, model=shape.name, model_params=int(shape.total_params),
        gpu=cl.gpu.name, world_size=cl.world_size, nodes=cl.nodes, gpus_per_node=cl.gpus_per_node,
        layout=lay,
        memory=MemoryBreakdown(
            params=int(mem.params), grads=int(mem.grads), optimizer=int(mem.optimizer),
            activations=int(mem.activations), logits=int(mem.logits), comm_buffers=int(mem.comm_buffers),
            runtime_overhead=int(mem.runtime_overhead), allocator_margin=int(mem.allocator_margin),
            total=int(mem.total), gpu_memory=cl.memory_bytes_per_gpu,
            fits=mem.total <= cl.memory_bytes_per_gpu,
            cpu_memory=int(mem.cpu_per_node) if mem.cpu_per_node else None, cpu_memory_available=cpu_limit),
        time=StepEstimate(
            compute_s=t.compute_s, recompute_s=t.recompute_s, comm_exposed_s=t.comm_exposed_s,
            bubble_s=t.bubble_s, optimizer_s=t.optimizer_s, offload_s=t.offload_s, step_s=t.step_s,
            tokens_per_step=tokens, tokens_per_s=tokens / t.step_s,
            tokens_per_s_per_gpu=tokens / t.step_s / cl.world_size, model_flops_per_step=flops,
            hardware_flops_per_step=flops + recompute_flops_per_step(
                shape, spec.training.global_batch, lay.activation_checkpointing, ctx.attention),
            mfu=flops / (t.step_s * cl.world_size * peak), flop_convention=FLOP_CONVENTION,
            peak_flops_per_gpu=peak, job_s=t.step_s * spec.training.steps),
        comm=CommVolumes(dp=int(t.comm_dp), tp=int(t.comm_tp), pp=int(t.comm_pp), cp=int(t.comm_cp),
                         offload=int(t.comm_offload)),
        precision=PrecisionPolicy(
            compute=ctx.precision, params="fp32", grads="fp32", reduce="fp32",
            loss_scaler=ctx.precision == "fp16"),
        rubric=rubric(ctx),
        explanation=_explanation(ctx, cand, result) + (
            [_calibration_sentence(use, mem.total)] if use is not None else []),
        alternatives=alternatives, rejected=rejected,
        candidates_evaluated=result.evaluated if result is not None else 1,
        reasons=reasons or [], min_gpus_to_fit=min_gpus, warnings=_warnings(ctx, cand),
        shape=shape, training=spec.training, calibration=use,
    )


__all__ = ["estimate", "plan"]
