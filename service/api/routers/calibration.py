"""`GET /v1/calibration`: the correction factors a team's later plans use, per GPU kind and layout family.

A member reads their own team's; an admin names the team (`?team=`, the default team when omitted).
Under the scope `all` (`SHARDCTL_CALIBRATION_SCOPE`) every team's plans use one fit and `team` is
null. Reading it first reads any new finished runs' reports (`service.store.calibration.refresh`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from service.api.deps import Db, Person
from service.api.ops.access import acting_team
from service.api.schemas import ErrorResponse
from service.api.submission import DEFAULT_TEAM
from service.names import Label
from service.planner.calibration import DEFAULT_WINDOW, MEMORY_FACTOR_RANGE, STEP_FACTOR_RANGE, Factor
from service.settings import Settings
from service.store import calibration as store_calibration

router = APIRouter(prefix="/v1/calibration", tags=["calibration"])


class FactorOut(Factor):
    """One factor and whether plans use it (`runs` at least the minimum)."""

    used: bool


class GroupOut(BaseModel):
    gpu: str
    family: str = Field(description="The layout family, e.g. `fsdp+tp` (docs/planner.md, \"Calibration\").")
    runs: int = Field(description="Succeeded runs measured (the newest `window` at most).")
    step: FactorOut | None = Field(description="measured step time / predicted; null: no run measured it.")
    memory: FactorOut | None = Field(description="measured peak memory / predicted; null: no run measured it.")


class CalibrationOut(BaseModel):
    team: str | None = Field(description="The team whose runs these factors come from and whose plans use them;"
                             " null under the scope `all`, where every team's runs calibrate every plan.")
    scope: str = Field(description="`team` or `all` (SHARDCTL_CALIBRATION_SCOPE).")
    min_runs: int = Field(description="Runs a factor needs before plans use it (SHARDCTL_CALIBRATION_MIN_RUNS).")
    window: int = Field(description="Each group is fitted from its newest runs, at most this many.")
    rule: str = Field(description="How a factor is fitted.")
    groups: list[GroupOut]


RULE = ("factor = exp(median(ln(measured / predicted))) over each GPU kind and family's newest runs, against"
        " the prediction of each job's stored plan, held within"
        f" {STEP_FACTOR_RANGE[0]:g}-{STEP_FACTOR_RANGE[1]:g} (step time) and"
        f" {MEMORY_FACTOR_RANGE[0]:g}-{MEMORY_FACTOR_RANGE[1]:g} (memory); errors are mean absolute percentage"
        " errors of those runs before and after the factor")


@router.get("", response_model=CalibrationOut, responses={403: {"model": ErrorResponse}})
def get_calibration(request: Request, principal: Person, db: Db,
                    team: Annotated[Label | None, Query(max_length=63, description="An admin's choice of team"
                                                        " (default: the default team); a member's own team"
                                                        " when omitted.")] = None) -> CalibrationOut:
    """Every GPU kind and family measured so far for `team`: factors, runs, error before and after.
    403 when a member names another team."""
    settings: Settings = request.app.state.settings
    team = acting_team(principal, team)
    source = request.app.state.planner.calibration
    fitted_for = source.fitted_for(team or DEFAULT_TEAM)
    with db.begin() as session:
        cal = store_calibration.current(session, team=fitted_for, min_runs=settings.calibration_min_runs)

    def out(f: Factor | None) -> FactorOut | None:
        return None if f is None else FactorOut(**f.model_dump(), used=f.runs >= cal.min_runs)

    return CalibrationOut(team=fitted_for, scope=settings.calibration_scope, min_runs=cal.min_runs,
                          window=DEFAULT_WINDOW, rule=RULE, groups=[
        GroupOut(gpu=g.gpu, family=g.family, runs=g.runs, step=out(g.step), memory=out(g.memory))
        for g in cal.groups])
