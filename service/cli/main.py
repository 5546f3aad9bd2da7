"""The `shardctl` command line."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from rich.console import Console
from typer.core import TyperGroup

from service.cli import calibrate as calibrate_cli
from service.cli import control, notify
from service.cli import logs as logs_cli
from service.cli.client import CliError, error_from_verdict
from service.cli.profile import profile_app
from service.cli.render import (
    EXIT_DOES_NOT_FIT,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_UNREADABLE,
    plan_line,
    plan_panel,
)
from service.cli.scheduling import register as register_scheduling
from service.cli.scheduling_cmds import register as register_scheduling_cmds
from service.planner import Plan, plan
from service.planner.hardware import CATALOG
from service.planner.models import PRESETS
from service.planner.search import DEFAULT_MIN_FREE_FRACTION, SIMPLER_WITHIN
from service.planner.verdict import refusal
from service.spec import LayoutPins, TrainingSpec, load_spec, spec_json_schema

# Click's UsageError, wherever this typer takes click from (recent versions vendor their own copy).
_USAGE_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


class _Group(TyperGroup):
    """Click exits 2 for a bad command line, the code `plan` keeps for "does not fit": make it 1."""

    def make_context(self, info_name: Any, args: Any, parent: Any = None, **extra: Any) -> Any:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except _USAGE_ERROR as exc:
            cast(Any, exc).exit_code = EXIT_ERROR
            raise

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except _USAGE_ERROR as exc:
            cast(Any, exc).exit_code = EXIT_ERROR
            raise


app = typer.Typer(
    name="shardctl",
    cls=_Group,
    help="Plan, launch and track distributed training jobs.\n\n"
    f"Exit codes: {EXIT_OK} done (every plan fits); {EXIT_ERROR} an invalid spec, a bad command line or"
    f" another error; {EXIT_DOES_NOT_FIT} no layout fits; {EXIT_UNREADABLE} a spec file that cannot be read.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(profile_app, name="profile", help="Analyse PyTorch profiler traces offline.")
app.add_typer(control.token_app, name="token")
app.add_typer(control.team_app, name="team")
app.add_typer(control.db_app, name="db")
register_scheduling(app)  # simulate, export kueue|slurm
register_scheduling_cmds(app)  # why, usage, pools list|set|rm, quota get|set
app.add_typer(notify.webhooks_app, name="webhooks")
for command in (control.serve, control.worker, control.submit, control.jobs, control.show, notify.events,
                control.cancel):
    app.command()(command)
app.command("logs")(logs_cli.logs)
app.command("calibrate")(calibrate_cli.calibrate)
app.command("artifacts")(logs_cli.artifacts)
console = Console()


def parse_layout_pins(text: str) -> dict[str, object]:
    """`dp=8,tp=2,sharding=fsdp` -> {"dp": "8", ...}; pydantic converts the values."""
    pins: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--layout: {item!r} is not KEY=VALUE (e.g. dp=8,tp=2,sharding=fsdp)")
        pins[key.strip()] = value.strip()
    return pins


def _load(path: Path, layout: str | None, min_free: float | None = None) -> TrainingSpec:
    spec = load_spec(path)
    if min_free is not None:  # validated as the spec's own field: the same range and message
        spec = TrainingSpec.model_validate({**spec.model_dump(), "planner": {"min_free_fraction": min_free}})
    if layout:
        merged = {**spec.layout.model_dump(exclude_none=True), **parse_layout_pins(layout)}
        pins = LayoutPins.model_validate(merged)
        spec = TrainingSpec.model_validate({**spec.model_dump(), "layout": pins.model_dump()})
    return spec


PLAN_HELP = f"""Plan the best layout that fits.

Model presets (model.preset in a spec; explicit model fields override a preset's):
{", ".join(PRESETS)}.

GPU kinds (resources.gpu; or describe one inline): {", ".join(CATALOG)}.

Ranking: a layout shardctl's runtime runs beats one that needs offload, context parallelism or fp8
(modelled, not yet run); then a layout leaving at least {DEFAULT_MIN_FREE_FRACTION:.0%} of GPU memory
free (the spec's planner.min_free_fraction, or --min-free) beats one that does not; among those, the
simplest layout within {SIMPLER_WITHIN:.0%} of the fastest wins (DDP before ZeRO before FSDP, no
pipeline before a pipeline). The explanation says when headroom or simplicity decided. Sizes are
GiB (2^30 bytes). FLOPs and MFU count causal attention at half the full-attention FLOPs, as the
step time does.

Offline (the default) the plans are the model's alone, not calibrated by measured runs. With
--server they are made by the server (SHARDCTL_URL) as `shardctl submit` would have them made:
calibrated for your team, and checked as a submission is (the server's backends and pools, your
team's limits); the exit code is then the one `shardctl submit` would give.

Exit codes:
  0  every plan fits and can be submitted
  1  an invalid spec (a `field.path: message` line per problem), a plan shardctl's built-in trainer
     cannot run (offload, context parallelism, fp8: the message says the fix), a refusal by the
     server (--server), or an error
  2  a plan does not fit (printed anyway: why, and the GPU count that fits)
  3  a spec file does not exist or cannot be read
The first invalid or unreadable file stops the command.
"""


def _plan_at(spec: TrainingSpec, _path: Path) -> Plan:
    return plan(spec)


@app.command("plan", help=PLAN_HELP)
def plan_command(
    specs: Annotated[list[Path], typer.Argument(help="Spec files (YAML or JSON).", show_default=False)],
    layout: Annotated[str | None, typer.Option(
        "--layout", help="Pins on top of the spec's own, e.g. dp=8,tp=2,sharding=fsdp.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the Plan JSON.")] = False,
    server: Annotated[bool, typer.Option(
        "--server", help="Plan on the server (SHARDCTL_URL): calibrated for your team, checked as a submission"
        " is, and exiting as `shardctl submit` would.")] = False,
    brief: Annotated[bool, typer.Option(
        "--brief", help="One line per spec: name, layout, step time, memory, whether it fits.")] = False,
    min_free: Annotated[float | None, typer.Option(
        "--min-free",
        help="The least share of GPU memory a preferred layout leaves free, over the spec's"
        " planner.min_free_fraction (default 0.1; 0 turns the rule off; below 0.5).")] = None,
) -> None:
    """Plan the best layout that fits (the help text is `PLAN_HELP`)."""
    loaded = [(path, control.read_spec(path, lambda p: _load(p, layout, min_free))) for path in specs]
    documents: list[dict[str, Any]] = []
    refusals: list[tuple[Path, CliError]] = []
    for path, spec in loaded:
        if server:
            document = control.api_call(path, "POST", "/v1/plans", json=spec.model_dump(mode="json",
                                                                                         exclude_unset=True))
            refused = error_from_verdict(document)
        else:
            planned = control.read_spec(path, functools.partial(_plan_at, spec))  # the planner checks pins too
            document = planned.model_dump(mode="json")
            offline = refusal(spec, planned)
            refused = None if offline is None else error_from_verdict(
                {**document, "verdict": {"submittable": False, "status": 422, "code": offline.code,
                                         "message": offline.message,
                                         "fields": [{"loc": loc, "message": m} for loc, m in offline.fields]}})
        documents.append(document)
        if refused is not None:
            refusals.append((path, refused))
    plans = [Plan.model_validate({k: v for k, v in d.items() if k not in ("launch", "verdict")}) for d in documents]
    if as_json:
        console.out(json.dumps(documents[0] if len(documents) == 1 else documents, indent=2))
    elif brief:
        for p in plans:
            console.out(plan_line(p), highlight=False)
    else:
        for p in plans:
            console.print(plan_panel(p, console.width))
        if not server:
            console.out("Not calibrated: planned offline from the model alone; --server plans with the server's"
                        " calibration and checks, as a submission would.", highlight=False)
    if refusals:
        path, refused = next(((p, r) for p, r in refusals if r.code != "does_not_fit"), refusals[0])
        if refused.code == "does_not_fit":
            raise typer.Exit(EXIT_DOES_NOT_FIT)  # each panel or line says why already
        raise control.refusal_exit(path, refused)


@app.command("spec-schema")
def spec_schema_command() -> None:
    """Print the JSON Schema of a training spec."""
    console.out(json.dumps(spec_json_schema(), indent=2))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
