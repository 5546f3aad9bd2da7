"""The `shardctl` command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import pydantic
import typer
from rich.console import Console

from service.cli import control
from service.cli.profile import profile_app
from service.cli.render import plan_panel, print_problems
from service.planner import FieldProblem, InvalidSpec, plan
from service.spec import LayoutPins, TrainingSpec, load_spec, spec_json_schema

app = typer.Typer(
    name="shardctl",
    help="Plan, launch and track distributed training jobs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(profile_app, name="profile", help="Analyse PyTorch profiler traces offline.")
app.add_typer(control.token_app, name="token")
app.add_typer(control.team_app, name="team")
app.add_typer(control.db_app, name="db")
for command in (control.serve, control.worker, control.submit, control.jobs, control.show, control.events,
                control.cancel):
    app.command()(command)
console = Console()
err = Console(stderr=True)

EXIT_FITS, EXIT_INVALID, EXIT_DOES_NOT_FIT = 0, 1, 2


def pydantic_problems(exc: pydantic.ValidationError, prefix: tuple[str, ...] = ()) -> list[FieldProblem]:
    """pydantic's errors as `FieldProblem`s: a dotted field path and a message."""
    return [
        FieldProblem(loc=prefix + tuple(str(part) for part in e["loc"]), message=e["msg"].removeprefix("Value error, "))
        for e in exc.errors()
    ]


def parse_layout_pins(text: str) -> dict[str, object]:
    """`dp=8,tp=2,sharding=fsdp` -> {"dp": "8", ...}; pydantic converts the values."""
    pins: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--layout: {item!r} is not KEY=VALUE (e.g. dp=8,tp=2,sharding=fsdp)")
        pins[key.strip()] = value.strip()
    return pins


def _load(path: Path, layout: str | None) -> TrainingSpec:
    spec = load_spec(path)
    if layout:
        merged = {**spec.layout.model_dump(exclude_none=True), **parse_layout_pins(layout)}
        pins = LayoutPins.model_validate(merged)
        spec = TrainingSpec.model_validate({**spec.model_dump(), "layout": pins.model_dump()})
    return spec


@app.command("plan")
def plan_command(
    specs: Annotated[list[Path], typer.Argument(help="Spec files (YAML or JSON).", exists=True, dir_okay=False)],
    layout: Annotated[str | None, typer.Option(
        "--layout", help="Pins on top of the spec's own, e.g. dp=8,tp=2,sharding=fsdp.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the Plan JSON.")] = False,
) -> None:
    """Plan the fastest layout that fits. Exit 0 when every plan fits, 2 when one does not, 1 for an
    invalid spec."""
    plans = []
    for path in specs:
        try:
            spec = _load(path, layout)
            plans.append(plan(spec))
        except pydantic.ValidationError as exc:
            prefix = ("layout",) if exc.title == "LayoutPins" else ()
            print_problems(err, str(path), pydantic_problems(exc, prefix))
            raise typer.Exit(EXIT_INVALID) from None
        except InvalidSpec as exc:
            print_problems(err, str(path), exc.problems)
            raise typer.Exit(EXIT_INVALID) from None
        except (ValueError, OSError) as exc:
            err.print(f"[bold red]{path}[/]: {exc}")
            raise typer.Exit(EXIT_INVALID) from None
    if as_json:
        payload = [p.model_dump(mode="json") for p in plans]
        console.out(json.dumps(payload[0] if len(payload) == 1 else payload, indent=2))
    else:
        for p in plans:
            console.print(plan_panel(p, console.width))
    if not all(p.fits for p in plans):
        raise typer.Exit(EXIT_DOES_NOT_FIT)


@app.command("spec-schema")
def spec_schema_command() -> None:
    """Print the JSON Schema of a training spec."""
    console.out(json.dumps(spec_json_schema(), indent=2))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
