"""Submitting a job: team resolution, idempotency, planning, and the one transaction that queues it."""

from __future__ import annotations

from collections.abc import Collection
from functools import lru_cache

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from service.api.errors import INVALID_SPEC, ApiError
from service.api.schemas import ErrorField
from service.planner import Plan, plan
from service.spec import TrainingSpec
from service.store.jobs import NewJob, body_hash, create_job, find_idempotent, idempotency_scope
from service.store.tokens import Principal, ensure_team, team_by_name
from service.store.vocab import Role

DEFAULT_TEAM = "default"
MAX_KEY = 200
PLAN_CACHE = 512


# The fields a plan depends on; the name is copied in afterwards, the rest does not matter to it.
PLANNED = {"model", "training", "resources", "layout"}


@lru_cache(maxsize=PLAN_CACHE)
def _plan_json(spec_json: str) -> Plan:
    return plan(TrainingSpec.model_validate_json(spec_json))


def cached_plan(spec: TrainingSpec) -> Plan:
    """`plan(spec)`, remembered for the last few hundred distinct model/training/resources/layout
    combinations (planning is pure and costs milliseconds; teams resubmit the same run under new
    names). Callers must not mutate the result."""
    keyed = TrainingSpec.model_validate({"name": "cached", **spec.model_dump(include=PLANNED)})
    return _plan_json(keyed.model_dump_json()).model_copy(update={"name": spec.name})


def check_backend(spec: TrainingSpec, configured: Collection[str] | None) -> None:
    """422 naming the configured backends when the spec asks for one this server does not run
    (`configured` None: the server does not know, as when it runs no dispatcher configuration)."""
    if configured is None or spec.backend.kind in configured:
        return
    names = ", ".join(sorted(configured)) or "none"
    message = (f"backend {spec.backend.kind!r} is not configured on this server; configured: {names}."
               " Set backend.kind to one of those, or ask an admin to configure it")
    raise ApiError(422, INVALID_SPEC, message, fields=[ErrorField(loc="backend.kind", message=message)],
                   details={"configured_backends": sorted(configured)})


def submit(db: sessionmaker[Session], principal: Principal, spec: TrainingSpec,
           idempotency_key: str | None, configured: Collection[str] | None = None) -> tuple[int, bool]:
    """Plan and queue `spec`. Returns (job id, created); created is False for an idempotent replay.

    Raises `ApiError` 403 when a member names another team, 422 when the spec's backend is not
    configured or no layout fits (with the planner's reasons and the smallest GPU count that would
    fit), `Conflict` when the key was used with a different body.
    """
    check_backend(spec, configured)
    if principal.role == Role.MEMBER:
        if spec.team is not None and spec.team != principal.team_name:
            raise ApiError(403, "forbidden", f"your token belongs to team {principal.team_name!r}; submit"
                           f" without team or with team: {principal.team_name}")
        team_name = principal.team_name or DEFAULT_TEAM
    else:
        team_name = spec.team or DEFAULT_TEAM
    if idempotency_key is not None and not 0 < len(idempotency_key) <= MAX_KEY:
        raise ApiError(400, "bad_request", f"Idempotency-Key must be 1 to {MAX_KEY} characters")
    idem = None
    if idempotency_key is not None:
        idem = (idempotency_scope(principal), idempotency_key,
                body_hash(spec.model_dump(mode="json", exclude_unset=True)))
        with db.begin() as session:
            earlier = find_idempotent(session, *idem)
            if earlier is not None:
                return earlier.id, False

    result = cached_plan(spec)
    if not result.fits:
        raise ApiError(422, "does_not_fit", "no layout fits: " + "; ".join(result.reasons),
                       details={"reasons": result.reasons, "min_gpus_to_fit": result.min_gpus_to_fit,
                                "closest": result.model_dump(mode="json")})
    stored_spec = spec.model_copy(update={"team": team_name})
    try:
        with db.begin() as session:
            # Only the default team appears by itself; other teams are created on purpose (POST /v1/teams).
            team = ensure_team(session, team_name) if team_name == DEFAULT_TEAM else team_by_name(session, team_name)
            job = create_job(session, NewJob(team=team, spec=stored_spec, plan=result), actor=principal.actor,
                             idempotency=idem)
            return job.id, True
    except IntegrityError:
        if idem is None:
            raise
        # A concurrent request with the same key committed first: answer with its job.
        with db.begin() as session:
            earlier = find_idempotent(session, *idem)
            if earlier is None:
                raise
            return earlier.id, False
