"""`GET /v1/calibration`: the correction factors later plans use, per GPU kind and layout family.

Every person may read it: the factors say how far the planner's figures were off, not whose jobs
ran. Reading it first reads any new finished runs' reports (`service.store.calibration.refresh`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from service.api.deps import Db, Person
from service.planner.calibration import DEFAULT_WINDOW, Factor
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
    min_runs: int = Field(description="Runs a factor needs before plans use it (SHARDCTL_CALIBRATION_MIN_RUNS).")
    window: int = Field(description="Each group is fitted from its newest runs, at most this many.")
    rule: str = Field(description="How a factor is fitted.")
    groups: list[GroupOut]


RULE = ("factor = exp(median(ln(measured / predicted))) over each GPU kind and family's newest runs; errors are"
        " mean absolute percentage errors of those runs before and after the factor")


@router.get("", response_model=CalibrationOut)
def get_calibration(request: Request, principal: Person, db: Db) -> CalibrationOut:
    """Every GPU kind and family measured so far: factors, runs, error before and after."""
    settings: Settings = request.app.state.settings
    with db.begin() as session:
        cal = store_calibration.current(session, min_runs=settings.calibration_min_runs)

    def out(f: Factor | None) -> FactorOut | None:
        return None if f is None else FactorOut(**f.model_dump(), used=f.runs >= cal.min_runs)

    return CalibrationOut(min_runs=cal.min_runs, window=DEFAULT_WINDOW, rule=RULE, groups=[
        GroupOut(gpu=g.gpu, family=g.family, runs=g.runs, step=out(g.step), memory=out(g.memory))
        for g in cal.groups])
