"""The planner against published training runs: predicted vs published step time and peak memory.

Loads the rows of `benchmarks/published/*.yaml` (measured runs and stated out-of-memory layouts,
each with its source; README.md there lists them and the rows left out), builds a `TrainingSpec`
per row, evaluates the published layout with `service.planner.estimate` (the layout pinned
completely, as `shardctl plan --layout` pins it), and prints per row the published and predicted
figures, their ratio and the error, the time and memory terms behind the prediction, then the mean
and worst errors against the goals (step time: mean under 10%, worst under 20%; memory: mean under
10%) and whether the planner calls each published out-of-memory layout "does not fit" (goal: all).

Rows marked `in_goal: false` (torch.compile, Float8, async TP, a checkpointing mode the planner
lacks) are printed and summarised apart from the goal set: they are data the planner does not yet
model, not failures of the rows.

    .venv/bin/python benchmarks/prediction_error.py [--folder benchmarks/published] [--terms]

It exits 0 whatever the errors: it measures, it does not test.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from service.planner import InvalidSpec, Layout, Plan, estimate
from service.spec import Checkpointing, TrainingSpec

FOLDER = Path(__file__).resolve().parent / "published"
GIB = 1024**3
STEP_MEAN_GOAL = 0.10
STEP_WORST_GOAL = 0.20
MEMORY_MEAN_GOAL = 0.10

#: What the sources call their activation checkpointing. `selective` is Korthikanti et al.'s
#: (attention core recomputed); `selective-op` torchtitan's op-level policy (matmul outputs saved);
#: `selective-layer` torchtitan's every-second-layer full checkpointing.
PublishedCheckpointing = Literal["none", "full", "selective", "selective-op", "selective-layer"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    """Where a file's figures come from and how its figure becomes a step time."""

    id: str = Field(min_length=1)
    title: str = Field(min_length=1)
    urls: list[str] = Field(min_length=1)
    measured_on: str
    figure: Literal["tokens_per_s_per_gpu", "tflops_per_gpu"]
    conversion: str = Field(min_length=1)
    memory: Literal["reserved_peak_gib", "not published"]

    @model_validator(mode="after")
    def _urls_are_links(self) -> Source:
        bad = [u for u in self.urls if not u.startswith("https://")]
        if bad:
            raise ValueError(f"source.urls must be https links; fix {bad}")
        return self


class ModelRow(_Strict):
    """An architecture: every number the planner's spec needs. `family` sets the block style."""

    family: Literal["llama", "gpt"]
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    ffn_hidden: int = Field(gt=0)
    vocab: int = Field(gt=0)
    seq_len: int = Field(gt=0)


class GpuRow(_Strict):
    kind: str = Field(min_length=1, description="A catalog name (service/planner/hardware.py).")
    memory_gib: float | None = Field(None, gt=0, description="Override: the GPU the source ran on had this much.")


class LayoutRow(_Strict):
    """The published layout; every degree stated (defaults of the file filled in)."""

    dp: int = Field(gt=0)
    tp: int = Field(gt=0)
    pp: int = Field(gt=0)
    cp: int = Field(gt=0)
    sharding: Literal["ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp"]
    sequence_parallel: bool
    checkpointing: PublishedCheckpointing
    pipeline_schedule: Literal["1f1b", "interleaved", "gpipe"] | None = None
    virtual_stages: int = Field(1, gt=0)


class Measured(_Strict):
    tokens_per_s_per_gpu: float | None = Field(None, gt=0)
    tflops_per_gpu: float | None = Field(None, gt=0)
    peak_memory_gib: float | None = Field(None, gt=0)


class Row(_Strict):
    """One published run (`outcome: measured`) or one layout stated to run out of memory (`oom`)."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$", max_length=32)
    source: Source
    where: str = Field(min_length=1, description="Table and row in the source.")
    model_name: str
    model: ModelRow
    gpu: GpuRow
    gpus: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    global_batch: int = Field(gt=0)
    micro_batch: int = Field(gt=0)
    precision: Literal["bf16", "fp16", "fp8", "fp32"]
    optimizer: Literal["adamw", "adam", "sgd"]
    attention: Literal["flash", "eager"]
    layout: LayoutRow
    outcome: Literal["measured", "oom"] = "measured"
    measured: Measured | None = None
    in_goal: bool = True
    outside_goal_because: str | None = None
    assumptions: list[str] = Field(default_factory=list)
    notes: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Row:
        lay = self.layout
        if lay.dp * lay.tp * lay.pp * lay.cp != self.gpus:
            raise ValueError(f"layout dp*tp*pp*cp = {lay.dp * lay.tp * lay.pp * lay.cp} but gpus = {self.gpus}")
        if self.global_batch % (lay.dp * self.micro_batch):
            raise ValueError(f"global_batch ({self.global_batch}) must be a multiple of dp*micro_batch"
                             f" ({lay.dp}*{self.micro_batch})")
        if self.outcome == "measured":
            m = self.measured
            if m is None or (m.tokens_per_s_per_gpu is None) == (m.tflops_per_gpu is None):
                raise ValueError("a measured row needs exactly one of measured.tokens_per_s_per_gpu or"
                                 " measured.tflops_per_gpu")
            wanted = "tokens_per_s_per_gpu" if self.source.figure == "tokens_per_s_per_gpu" else "tflops_per_gpu"
            if getattr(m, wanted) is None:
                raise ValueError(f"the source publishes {self.source.figure}; give measured.{wanted}")
        elif self.measured is not None:
            raise ValueError("an oom row carries no measured figures")
        if not self.in_goal and not self.outside_goal_because:
            raise ValueError("in_goal: false needs outside_goal_because (what the planner does not model)")
        return self

    @property
    def grad_accum_steps(self) -> int:
        return self.global_batch // (self.layout.dp * self.micro_batch)

    def published_step_s(self) -> float | None:
        """The step time the source's figure implies (see each source's `conversion`)."""
        m = self.measured
        if m is None:
            return None
        if m.tokens_per_s_per_gpu is not None:
            return self.global_batch * self.model.seq_len / (m.tokens_per_s_per_gpu * self.gpus)
        assert m.tflops_per_gpu is not None
        return megatron_eq3_flops(self.model, self.global_batch) / (self.gpus * m.tflops_per_gpu * 1e12)


def megatron_eq3_flops(model: ModelRow, batch: int) -> float:
    """Narayanan et al. 2021 Eq. 3: FLOPs of one iteration with full recompute,
    96 B s l h^2 (1 + s/(6h) + V/(16 l h))."""
    s, layers, h, v = model.seq_len, model.layers, model.hidden, model.vocab
    return 96.0 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


_FAMILY: dict[str, dict[str, object]] = {
    "llama": {"mlp": "swiglu", "norm": "rmsnorm", "positional": "rope", "tied_embeddings": False, "bias": False,
              "dropout": 0.0},
    "gpt": {"mlp": "gelu", "norm": "layernorm", "positional": "learned", "tied_embeddings": True, "bias": True,
            "dropout": 0.1},
}


def planner_checkpointing(published: str) -> Checkpointing:
    """The planner's mode for a published one: torchtitan's op-level policy is `op` when the
    planner has it (else the nearest, `selective`); every-second-layer has no mode (`selective`)."""
    modes = typing.get_args(Checkpointing)
    if published == "selective-op":
        return "op" if "op" in modes else "selective"
    if published == "selective-layer":
        return "selective"
    assert published in modes, published
    return typing.cast(Checkpointing, published)


def spec_for(row: Row) -> TrainingSpec:
    """The row as a spec (the architecture given field by field, the published GPU and count)."""
    gpu: str | dict[str, object] = row.gpu.kind
    if row.gpu.memory_gib is not None:
        gpu = {"name": row.gpu.kind, "memory_gib": row.gpu.memory_gib}
    model = {**row.model.model_dump(exclude={"family"}), **_FAMILY[row.model.family]}
    resources: dict[str, object] = {"gpu": gpu, "gpus": row.gpus, "gpus_per_node": min(row.gpus_per_node, row.gpus)}
    return TrainingSpec.model_validate({
        "name": row.id,
        "model": model,
        "training": {"global_batch": row.global_batch, "precision": row.precision, "optimizer": row.optimizer,
                     "attention": row.attention},
        "resources": resources,
    })


def layout_for(row: Row) -> Layout:
    """The published layout as the planner's complete `Layout` (every field pinned)."""
    lay = row.layout
    dp_shard = 1 if lay.sharding == "ddp" else lay.dp
    return Layout(
        dp=lay.dp, tp=lay.tp, pp=lay.pp, cp=lay.cp, sharding=lay.sharding, dp_shard=dp_shard,
        sequence_parallel=lay.sequence_parallel, micro_batch=row.micro_batch,
        grad_accum_steps=row.grad_accum_steps,
        activation_checkpointing=planner_checkpointing(lay.checkpointing),
        pipeline_schedule=lay.pipeline_schedule if lay.pp > 1 else None,
        virtual_stages=lay.virtual_stages, offload="none",
    )


def _merge(defaults: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    out = {**defaults, **row}
    for key in ("layout", "gpu"):
        if isinstance(defaults.get(key), dict) and isinstance(row.get(key), dict):
            out[key] = {**defaults[key], **row[key]}
    return out


class DataError(ValueError):
    """A data file that does not parse: the message names the file, the row and the field."""


def load_rows(folder: Path = FOLDER) -> list[Row]:
    """Every row of every `*.yaml` in `folder`. Model names resolve within the file, then across
    files (shared architectures live in a file with `models:` only). Raises `DataError`."""
    files = sorted(folder.glob("*.yaml"))
    if not files:
        raise DataError(f"{folder}: no *.yaml data files")
    docs = {}
    for path in files:
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise DataError(f"{path.name}: not valid YAML: {exc}") from exc
        if not isinstance(doc, dict):
            raise DataError(f"{path.name}: a data file is a mapping (source, models, defaults, rows)")
        docs[path.name] = doc
    shared: dict[str, Any] = {}
    for doc in docs.values():
        shared.update(doc.get("models") or {})
    rows: list[Row] = []
    for name, doc in docs.items():
        if "rows" not in doc:
            continue
        if "source" not in doc:
            raise DataError(f"{name}: rows need a source (id, title, urls, measured_on, figure, conversion, memory)")
        models = {**shared, **(doc.get("models") or {})}
        defaults = dict(doc.get("defaults") or {})
        common = list(doc.get("common_assumptions") or [])
        for i, raw in enumerate(doc["rows"]):
            where = f"{name} rows[{i}] ({raw.get('id', '?') if isinstance(raw, dict) else '?'})"
            if not isinstance(raw, dict):
                raise DataError(f"{where}: a row is a mapping")
            fields = _merge(defaults, raw)
            model_name = fields.pop("model", None)
            if model_name not in models:
                raise DataError(f"{where}: model {model_name!r} is not defined; define it under models:"
                                f" (known: {', '.join(sorted(models))})")
            model = dict(models[model_name])
            if "seq_len" in fields:
                model["seq_len"] = fields.pop("seq_len")
            fields["assumptions"] = common + list(fields.get("assumptions") or [])
            try:
                rows.append(Row.model_validate({**fields, "source": doc["source"], "model_name": model_name,
                                                "model": model}))
            except ValidationError as exc:
                problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'row'}: {e['msg']}"
                                     for e in exc.errors())
                raise DataError(f"{where}: {problems}") from exc
    ids = [r.id for r in rows]
    if dupes := sorted({i for i in ids if ids.count(i) > 1}):
        raise DataError(f"row ids must be unique; repeated: {', '.join(dupes)}")
    return rows


@dataclass(frozen=True)
class Result:
    """One row evaluated: the plan, or why the planner refused the layout."""

    row: Row
    plan: Plan | None
    refused: str | None
    cpu_s: float

    @property
    def step_error(self) -> float | None:
        published = self.row.published_step_s()
        if self.plan is None or published is None:
            return None
        return self.plan.time.step_s / published - 1

    @property
    def memory_error(self) -> float | None:
        m = self.row.measured
        if self.plan is None or m is None or m.peak_memory_gib is None:
            return None
        return self.plan.memory.total / (m.peak_memory_gib * GIB) - 1


def evaluate(row: Row) -> Result:
    """Evaluate the row's published layout with the planner (`estimate`: one pinned layout)."""
    start = time.process_time()
    try:
        plan = estimate(spec_for(row), layout_for(row))
    except InvalidSpec as exc:
        reason = "; ".join(f"{'.'.join(str(p) for p in problem.loc)}: {problem.message}" for problem in exc.problems)
        return Result(row, None, reason, time.process_time() - start)
    return Result(row, plan, None, time.process_time() - start)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.0%}"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _errors_line(label: str, errors: Sequence[float], mean_goal: float, worst_goal: float | None) -> str:
    if not errors:
        return f"  {label}: no rows"
    absolute = [abs(e) for e in errors]
    mean, worst = statistics.fmean(absolute), max(absolute)
    signed = statistics.fmean(errors)
    text = (f"  {label}: {len(errors)} rows, mean |error| {mean:.1%} (goal {mean_goal:.0%}, goal/mean"
            f" {mean_goal / mean if mean else math.inf:.2f}), mean signed {signed:+.1%}, worst {worst:.1%}")
    if worst_goal is not None:
        text += f" (goal {worst_goal:.0%}, goal/worst {worst_goal / worst if worst else math.inf:.2f})"
    return text


def summary(results: Iterable[Result], label: str) -> list[str]:
    """The mean and worst errors of `results` against the goals."""
    chosen = list(results)
    steps = [e for r in chosen if (e := r.step_error) is not None]
    mems = [e for r in chosen if (e := r.memory_error) is not None]
    refused = [r for r in chosen if r.refused and r.row.outcome == "measured"]
    lines = [f"{label}:",
             _errors_line("step time", steps, STEP_MEAN_GOAL, STEP_WORST_GOAL),
             _errors_line("peak memory", mems, MEMORY_MEAN_GOAL, None)]
    if refused:
        lines.append(f"  refused by the planner (no prediction): {', '.join(r.row.id for r in refused)}")
    return lines


def table(results: Sequence[Result], *, terms: bool) -> list[str]:
    """One line per measured row: published and predicted step time and memory, ratios and errors."""
    head = (f"{'row':32} {'layout (planner)':44} {'pub s':>8} {'pred s':>8} {'pred/pub':>8} {'err':>6}"
            f" {'pub GiB':>7} {'pred GiB':>8} {'err':>6} {'MFU':>5}")
    lines = [head]
    for r in results:
        if r.row.outcome != "measured":
            continue
        published = r.row.published_step_s()
        mem = r.row.measured.peak_memory_gib if r.row.measured else None
        if r.plan is None:
            lines.append(f"{r.row.id:32} refused: {r.refused}")
            continue
        t = r.plan.time
        ratio = t.step_s / published if published else None
        lines.append(
            f"{r.row.id:32} {r.plan.layout.short()[:44]:44} {_num(published, '8.3f')} {t.step_s:8.3f}"
            f" {_num(ratio, '8.2f')} {_pct(r.step_error):>6} {_num(mem, '7.1f')}"
            f" {r.plan.memory.total / GIB:8.1f} {_pct(r.memory_error):>6} {t.mfu:5.0%}")
        if terms:
            m = r.plan.memory
            lines.append(
                f"{'':32}   time s: compute {t.compute_s:.3f} recompute {t.recompute_s:.3f} comm exposed"
                f" {t.comm_exposed_s:.3f} bubble {t.bubble_s:.3f} optimizer {t.optimizer_s:.3f}")
            lines.append(
                f"{'':32}   GiB: params {m.params / GIB:.1f} grads {m.grads / GIB:.1f} optimizer"
                f" {m.optimizer / GIB:.1f} activations {m.activations / GIB:.1f} logits {m.logits / GIB:.1f}"
                f" comm {m.comm_buffers / GIB:.1f} runtime {m.runtime_overhead / GIB:.1f}"
                f" allocator {m.allocator_margin / GIB:.1f}")
    return lines


def oom_lines(results: Sequence[Result]) -> list[str]:
    """Each published out-of-memory layout and whether the planner says it does not fit."""
    ooms = [r for r in results if r.row.outcome == "oom"]
    lines = [f"{'published OOM layout':40} {'planner':14} {'pred GiB':>8} {'GPU GiB':>7}  where"]
    called = 0
    for r in ooms:
        if r.plan is None:
            verdict, pred, limit = "refused", None, None
        else:
            verdict = "does not fit" if not r.plan.fits else "fits (wrong)"
            called += not r.plan.fits
            pred, limit = r.plan.memory.total / GIB, r.plan.memory.gpu_memory / GIB
        lines.append(f"{r.row.id:40} {verdict:14} {_num(pred, '8.1f')} {_num(limit, '7.1f')}  {r.row.where}")
    lines.append(f"  called 'does not fit': {called} of {len(ooms)} (goal: all)")
    return lines


def background_load() -> str:
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "background load: unknown"
    return f"background load: {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=FOLDER, help="the data files (default: %(default)s)")
    parser.add_argument("--terms", action="store_true", help="print each prediction's time and memory terms")
    args = parser.parse_args(argv)
    try:
        rows = load_rows(args.folder)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results = [evaluate(row) for row in rows]
    goal = [r for r in results if r.row.in_goal]
    other = [r for r in results if not r.row.in_goal]
    sources = sorted({r.row.source.id for r in results})
    print(f"{len(rows)} published rows from {len(sources)} sources ({', '.join(sources)});"
          f" {sum(r.row.outcome == 'oom' for r in results)} are out-of-memory layouts")
    print("Errors are predicted/published - 1; published step time is derived from each source's figure"
          " (benchmarks/published/*.yaml: conversion).")
    print()
    print("Goal set (layouts the planner models: no torch.compile, no Float8, a checkpointing mode it has):")
    print("\n".join(table(goal, terms=args.terms)))
    print()
    print("Outside the goal set (why: each row's outside_goal_because):")
    print("\n".join(table(other, terms=args.terms)))
    for r in other:
        if r.row.outcome == "measured":
            print(f"  {r.row.id}: {r.row.outside_goal_because}")
    print()
    print("\n".join(oom_lines(results)))
    print()
    print("\n".join(summary(goal, "Goal set")))
    print("\n".join(summary(other, "Outside the goal set")))
    print("\n".join(summary(results, "All rows")))
    print()
    print(f"planner CPU time: {sum(r.cpu_s for r in results):.2f} s for {len(results)} estimates; {background_load()}"
          " (the figures above do not depend on it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
