from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import Person
from service.planner import Plan, plan
from service.spec import TrainingSpec

router = APIRouter(prefix="/v1/plans", tags=["plans"])


@router.post("", response_model=Plan, summary="Dry run: plan a spec without creating a job")
def create_plan(spec: TrainingSpec, _: Person) -> Plan:
    """The planner's `Plan`, fitting or not (`fits` says which). No job is created."""
    return plan(spec)
