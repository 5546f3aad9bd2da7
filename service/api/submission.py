"""Submitting a job: team resolution, idempotency, planning, and the one transaction that queues it.

Planning runs on a few threads of its own (`PlanRunner`), never on the request threads, and under a
time budget: a search past `planner_budget_s` stops itself (a Python thread cannot be killed) and
the request is a 422 `plan_too_costly`; a request that finds every planning thread busy for
`planner_wait_s` is a 503 with Retry-After rather than queued work. Equal specs planned at the same
time share one search, and the last few hundred plans are remembered.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from service.api.errors import INVALID_SPEC, ApiError
from service.api.ops.access import acting_team
from service.api.schemas import ErrorField, JobOut, JobSummary
from service.api.views import encoded, job_out, job_summary, redacted_spec
from service.planner import Deadline, InvalidSpec, Plan, SearchBudgetExceeded, plan
from service.planner.calibration import Calibration
from service.planner.verdict import refusal
from service.scheduling.model import TeamQuota
from service.settings import Settings
from service.spec import TrainingSpec
from service.store.jobs import NewJob, body_hash, find_idempotent, idempotency_scope, visible_job
from service.store.known_tokens import LiveValues
from service.store.pools import SourcedPool, effective_pools, in_effect, managed, matching
from service.store.submissions import QueuedJob, SubmittingTeam, insert_jobs, submitting_team
from service.store.tokens import NotFound, Principal, no_such_team
from service.store.vocab import Role

DEFAULT_TEAM = "default"
MAX_KEY = 200
PLAN_CACHE = 512
#: the code of a spec whose search runs past the server's budget. Not `invalid_spec`: the spec keeps
#: the contract (`shardctl plan` plans it, given the time); it asks this server for more search than
#: it spends on one request, and the fix is to search less (pin more of the layout, fewer GPUs).
PLAN_TOO_COSTLY = "plan_too_costly"
PLANNER_BUSY = "planner_busy"
#: how long past the budget a request waits for a search to stop itself before answering anyway
GRACE_S = 1.0


# The fields a plan depends on; the name is copied in afterwards, the rest does not matter to it.
PLANNED = {"model", "training", "resources", "layout", "planner"}


class PlanRunner:
    """Plans specs on `workers` threads, each search under `budget_s`; a request waits at most
    `wait_s` for a free thread. At most `workers` searches run at once and none queue: the slots
    are taken before a search is handed to the pool and given back when it ends, even when the
    request that started it has stopped waiting."""

    def __init__(self, *, workers: int, budget_s: float, wait_s: float) -> None:
        self.workers, self.budget_s, self.wait_s = workers, budget_s, wait_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="shardctl-planner")
        self._slots = threading.BoundedSemaphore(workers)
        self._lock = threading.Lock()  # guards the cache and the running searches
        self._running: dict[str, Future[Plan]] = {}
        self._cache: OrderedDict[str, Plan] = OrderedDict()  # the last PLAN_CACHE plans by canonical spec JSON
        # Calibration from measurements: what a team's plans apply now and its version (the app sets
        # a `service.store.calibration.CalibrationSource`); None: plans are the model's alone.
        self.calibration: Callable[[str], tuple[Calibration, str]] | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> PlanRunner:
        return cls(workers=settings.planner_workers, budget_s=settings.planner_budget_s,
                   wait_s=settings.planner_wait_s)

    @property
    def retry_after_s(self) -> int:
        """Seconds by which a busy thread is free again: every search stops at its budget."""
        return max(1, math.ceil(self.budget_s))

    def plan(self, key: str, spec: TrainingSpec, calibration: Calibration | None = None) -> Plan:
        """The plan of `spec` (`key` is its canonical JSON): from the cache, from a search of the
        same key already running, or from a new search. Raises what `plan` raises (`InvalidSpec`),
        or `ApiError` 422 `plan_too_costly` past the budget and 503 `planner_busy` when no thread
        comes free in time."""
        found = self._find_or_start(key, spec, calibration)
        if isinstance(found, Plan):
            return found
        try:
            return found.result(timeout=self.budget_s + GRACE_S)
        except SearchBudgetExceeded as exc:
            raise self._too_costly(spec, exc.evaluated) from None
        except TimeoutError:
            raise self._too_costly(spec, None) from None

    def _find_or_start(self, key: str, spec: TrainingSpec, calibration: Calibration | None) -> Plan | Future[Plan]:
        waited = False
        while True:
            with self._lock:
                cached = self._cache.get(key)
                if cached is not None:
                    self._cache.move_to_end(key)
                    return cached
                running = self._running.get(key)
                if running is not None:
                    return running
                if self._slots.acquire(blocking=False):
                    future = self._pool.submit(self._search, key, spec, calibration)
                    self._running[key] = future
                    return future
            # Every thread is busy: wait (once, up to wait_s) for one to come free, then look again.
            if waited or not self._slots.acquire(timeout=self.wait_s):
                raise ApiError(
                    503, PLANNER_BUSY, f"all {self.workers} planning threads of this server are busy; retry"
                    f" in {self.retry_after_s} s", headers={"Retry-After": str(self.retry_after_s)},
                    details={"retry_after_s": self.retry_after_s, "planner_workers": self.workers})
            self._slots.release()
            waited = True

    def _search(self, key: str, spec: TrainingSpec, calibration: Calibration | None) -> Plan:
        try:
            result = plan(spec, deadline=Deadline.after(self.budget_s), calibration=calibration)
            with self._lock:
                self._cache[key] = result
                while len(self._cache) > PLAN_CACHE:
                    self._cache.popitem(last=False)
            return result
        finally:
            with self._lock:  # taken only after the starter has registered this search
                self._running.pop(key, None)
            self._slots.release()

    def _too_costly(self, spec: TrainingSpec, evaluated: int | None) -> ApiError:
        done = f" after evaluating {evaluated:,} layouts" if evaluated is not None else ""
        fix = ("pin more of the layout (layout.tp, layout.pp, layout.cp, layout.dp, layout.micro_batch,"
               " layout.sharding), ask for fewer GPUs or a smaller training.global_batch, or plan it"
               " offline with `shardctl plan`, which has no budget")
        return ApiError(
            422, PLAN_TOO_COSTLY, f"planning this spec ({spec.resources.world_size:,} GPUs) takes longer than"
            f" this server's {self.budget_s:g} s budget; the search stopped{done}. To search less: {fix}",
            fields=[ErrorField(loc="layout", message=f"too little is pinned to search within {self.budget_s:g} s:"
                               f" {fix}")],
            details={"budget_s": self.budget_s, "evaluated": evaluated, "world_size": spec.resources.world_size})


def plan_key(spec: TrainingSpec, *, calibration_version: str = "") -> str:
    """The cache key of `spec`'s plan: everything `plan()` reads. That is the spec's `PLANNED`
    sections, canonical JSON, and the version of any calibration planning applies: whoever passes a
    calibration to `plan()` must pass its version here too, or plans made without it would be served
    after it changed (and the other way round)."""
    return spec.model_dump_json(include=PLANNED) + "|calibration=" + calibration_version


def cached_plan(spec: TrainingSpec, planner: PlanRunner, team: str) -> Plan:
    """`plan(spec)` for a job of `team` (whose calibration it applies) on `planner`'s threads and under
    its budget, remembered for the last few hundred distinct `plan_key`s (planning is pure; teams
    resubmit the same run under new names). Callers must not mutate the result."""
    calibration, version = planner.calibration(team) if planner.calibration is not None else (None, "")
    result = planner.plan(plan_key(spec, calibration_version=version), spec, calibration)
    return result.model_copy(update={"name": spec.name})


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


def check_priority(principal: Principal, team: SubmittingTeam, priority: int) -> None:
    """403 naming the limit when a member sets a priority above the team's `max_priority` (the
    `TeamQuota` default when the team has no quota declared). Admins set any."""
    if principal.role != Role.MEMBER:
        return
    limit = team.max_priority if team.max_priority is not None else TeamQuota().max_priority
    if priority > limit:
        raise ApiError(403, "priority_over_limit", f"priority {priority} is above team"
                       f" {team.name!r}'s limit of {limit}; set priority to {limit} or"
                       " less, or ask an admin (PUT /v1/teams/{team}/quota max_priority)",
                       fields=[ErrorField(loc="priority", message=f"at most {limit} for this team")],
                       details={"priority": priority, "max_priority": limit})


def check_pools(session: Session, spec: TrainingSpec, planned: Plan, local_gpus: str | None,
                *, pools: list[SourcedPool] | None = None) -> None:
    """422 when the backend's pools cannot run the plan: no pool of its GPU kind (naming the pools that
    exist, field `resources.gpu`), or more GPUs than the largest such pool holds (with its size). A
    backend without any pool is not managed by admission and is not checked. `pools`: the
    `effective_pools` already read in this transaction."""
    pools = effective_pools(session, local_gpus) if pools is None else pools
    backend = spec.backend.kind
    if not managed(pools, backend):
        return
    found = matching(pools, backend, planned.gpu)
    if not found:
        theirs = [p.pool for p in pools if p.pool.backend == backend]
        names = ", ".join(f"{p.name} ({p.gpu} x {p.gpus})" for p in theirs)
        message = (f"no pool of backend {backend!r} has GPU kind {planned.gpu!r}; its pools: {names}. Set"
                   " resources.gpu to one of those kinds, or ask an admin to declare a pool (PUT /v1/pools/{name})")
        raise ApiError(422, INVALID_SPEC, message, fields=[ErrorField(loc="resources.gpu", message=message)],
                       details={"pools": [p.model_dump(mode="json") for p in theirs]})
    largest = found[0]
    if planned.world_size > largest.gpus:
        message = (f"the plan needs {planned.world_size} {planned.gpu} GPUs, more than the largest pool of that"
                   f" kind holds: {largest.name} has {largest.gpus}. Ask for {largest.gpus} or fewer")
        raise ApiError(422, INVALID_SPEC, message, fields=[ErrorField(loc="resources", message=message)],
                       details={"pool": largest.name, "pool_gpus": largest.gpus, "needs": planned.world_size})


@dataclass(frozen=True, slots=True)
class Submitted:
    """A submission's answer: the job's id, whether it is new (False: an idempotent replay) and the
    response body (`JobOut` as JSON), rendered inside the transaction that wrote the job."""

    job_id: int
    created: bool
    body: bytes
    team: str


def new_job_out(job: QueuedJob) -> JobOut:
    """The `JobOut` of a job inserted in this transaction, as `insert_jobs` wrote it: no attempts and no
    measurements yet, and nothing read back. Built without validation: every value was validated on
    the way in (the spec by the route, the plan by the planner, the columns copied from them)."""
    return JobOut.model_construct(
        id=job.id, name=job.name, team=job.team_name, status=job.status, backend=job.backend,
        priority=job.priority, created_at=job.created_at, updated_at=job.updated_at, finished_at=job.finished_at,
        layout=job.layout, predicted_step_s=job.predicted_step_s, spec=redacted_spec(job.spec), plan=job.plan,
        attempts=[], measurements={})


def team_of(principal: Principal, spec: TrainingSpec) -> str:
    """The team `spec` is submitted into: `acting_team`'s for the spec's team, else the default team."""
    return acting_team(principal, spec.team) or DEFAULT_TEAM


def fitting_plan(spec: TrainingSpec, planner: PlanRunner, team: str) -> Plan:
    """The (cached) plan of `spec` for a job of `team`, when it can run (`check_runnable`)."""
    result = cached_plan(spec, planner, team)
    check_runnable(spec, result)
    return result


def check_runnable(spec: TrainingSpec, result: Plan) -> None:
    """422 with the code and message of `service.planner.verdict.refusal` when the plan cannot become a
    job (`does_not_fit`, `needs_runtime_support`)."""
    refused = refusal(spec, result)
    if refused is not None:
        raise ApiError(422, refused.code, refused.message, details=refused.details,
                       fields=[ErrorField(loc=loc, message=message) for loc, message in refused.fields])


def resolve_team(session: Session, name: str, live: LiveValues | None = None) -> SubmittingTeam:
    """The team `name` and what a submission checks of it. Only the default team appears by itself;
    other teams are created on purpose (POST /v1/teams): `NotFound` naming the fix. With `live`, the
    read checks the submitter's token too (`submitting_team`: `Unproven`)."""
    team = submitting_team(session, name, create=name == DEFAULT_TEAM, live=live)
    if team is None:
        raise no_such_team(name)
    return team


def submit_job(db: sessionmaker[Session], principal: Principal, spec: TrainingSpec,
               idempotency_key: str | None, configured: Collection[str] | None, planner: PlanRunner,
               *, local_gpus: str | None = None, live: LiveValues | None = None) -> Submitted:
    """Plan and queue `spec`; the answer carries the response body. Everything the job needs is
    checked and written in one transaction (priority limit, pools, team, job, event, idempotency key),
    committed before this returns; planning comes first, outside it (cached, on `planner`'s threads).
    A request with an `Idempotency-Key` first looks the key up in a transaction of its own.

    `live` (`known_tokens.live_values`, without an `Idempotency-Key`): `principal` comes from
    `KnownTokens`, and the transaction's read of the team checks its token (`Unproven`: nothing stored).

    Raises `ApiError` 403 when a member names another team or sets a priority above the team's
    `max_priority`, 422 when the spec's backend is not configured or no layout fits (with the
    planner's reasons and the smallest GPU count that would fit) or its search runs past `planner`'s
    budget, or no pool of the backend has its GPU kind or the largest one is too small
    (`local_gpus`: SHARDCTL_LOCAL_GPUS, what the local machine has instead of detecting it),
    503 when every planning thread is busy, `Conflict` when the key was used with a different body.
    """
    check_backend(spec, configured)
    team_name = team_of(principal, spec)
    if live is not None and idempotency_key is not None:
        raise ValueError("with an Idempotency-Key the token is checked first: the replay is read before the team")
    if idempotency_key is not None and not 0 < len(idempotency_key) <= MAX_KEY:
        raise ApiError(400, "bad_request", f"Idempotency-Key must be 1 to {MAX_KEY} characters")
    idem = None
    if idempotency_key is not None:
        idem = (idempotency_scope(principal), idempotency_key,
                body_hash(spec.model_dump(mode="json", exclude_unset=True)))
        replay = _replay(db, principal, idem)
        if replay is not None:
            return replay

    result = fitting_plan(spec, planner, team_name)
    stored_spec = spec.model_copy(update={"team": team_name})
    try:
        with db.begin() as session:
            team = check_in_store(session, principal, spec, result, team_name, local_gpus, live)
            [job] = insert_jobs(session, [NewJob(team=team, spec=stored_spec, plan=result)], actor=principal.actor,
                                idempotency=idem)
            return Submitted(job.id, True, encoded(new_job_out(job)), job.team_name)
    except IntegrityError:
        if idem is None:
            raise
        # A concurrent request with the same key committed first: answer with its job.
        replay = _replay(db, principal, idem)
        if replay is None:
            raise
        return replay


def check_in_store(session: Session, principal: Principal, spec: TrainingSpec, result: Plan, team_name: str,
                   local_gpus: str | None, live: LiveValues | None = None) -> SubmittingTeam:
    """The checks of a submission that read the store, in `session`: the team exists (`NotFound`), the
    priority is within its limit (403), the backend's pools can run the plan (422). Returns the team."""
    team = resolve_team(session, team_name, live)
    check_priority(principal, team, spec.priority)
    check_pools(session, spec, result, local_gpus, pools=in_effect(team.pools, local_gpus))
    return team


@dataclass(frozen=True, slots=True)
class Preview:
    """What submitting the spec would do: its plan and team, and `refused`, the error `submit_job` would
    answer (None: it would queue the job)."""

    plan: Plan
    team: str
    refused: ApiError | None


def preview(db: sessionmaker[Session], principal: Principal, spec: TrainingSpec, configured: Collection[str] | None,
            planner: PlanRunner, *, local_gpus: str | None = None) -> Preview:
    """The dry run, for every entry point (`POST /v1/plans`, `shardctl submit --dry-run` and `plan
    --server` through it, the dashboard's Plan page): every check `submit_job` makes, in its order, on
    the same plan, storing nothing (the store's checks run in a transaction that is rolled back).

    What comes before a plan exists raises as `submit_job` raises it (a backend this server does not
    run, another team's name for a member, a search too costly, the planner busy); a refusal of the
    plan (no fit, a runtime gap, an unknown team, a priority over the limit, no pool that can run it)
    is `Preview.refused`, with the status and code `submit_job` would answer."""
    check_backend(spec, configured)
    team_name = team_of(principal, spec)
    result = cached_plan(spec, planner, team_name)
    try:
        check_runnable(spec, result)
        session = db()
        try:
            check_in_store(session, principal, spec, result, team_name, local_gpus)
        finally:
            session.rollback()
            session.close()
    except ApiError as exc:
        return Preview(result, team_name, exc)
    except NotFound as exc:
        return Preview(result, team_name, ApiError(404, "not_found", str(exc)))
    return Preview(result, team_name, None)


def _replay(db: sessionmaker[Session], principal: Principal, idem: tuple[str, str, str]) -> Submitted | None:
    """The answer for an idempotency key already used with this body (None: unused; `Conflict`: other body)."""
    with db.begin() as session:
        earlier = find_idempotent(session, *idem)
        if earlier is None:
            return None
        job = visible_job(session, principal, earlier.id, detail=True)
        return Submitted(job.id, False, encoded(job_out(session, job)), job.team.name)


def submit(db: sessionmaker[Session], principal: Principal, spec: TrainingSpec,
           idempotency_key: str | None, configured: Collection[str] | None, planner: PlanRunner,
           *, local_gpus: str | None = None) -> tuple[int, bool]:
    """`submit_job`, for callers that want only (job id, created); created is False for a replay."""
    submitted = submit_job(db, principal, spec, idempotency_key, configured, planner, local_gpus=local_gpus)
    return submitted.job_id, submitted.created


#: The most specs one batch submission takes (and the body must stay under the server's body limit).
MAX_BATCH = 500
#: The most seconds one batch may spend planning, all its items together (each item also has the
#: planner's own budget): 500 distinct costly specs would otherwise hold a server thread for an hour.
BATCH_PLANNING_S = 60.0


@dataclass(frozen=True, slots=True)
class Prepared:
    """One batch item past the checks that need no database: its team and its fitting plan."""

    spec: TrainingSpec
    team_name: str
    plan: Plan


def submit_batch(db: sessionmaker[Session], principal: Principal, specs: list[TrainingSpec],
                 configured: Collection[str] | None, planner: PlanRunner, *,
                 local_gpus: str | None = None) -> list[JobSummary]:
    """Plan and queue every spec of `specs`, all or nothing: the same checks as `submit_job` for each
    item, then every job, event and webhook delivery in one transaction. Returns the jobs' summaries
    (in the order of `specs`), built before the commit from the inserted rows.

    When any item is refused, nothing is stored: `ApiError` with the status and code of the first
    refused item, every refused item in `details.items` (index, status, code, message, fields) and
    each field prefixed with its item (`specs.3.resources.gpu`, as schema errors name it). A 503
    (planner busy) stops at once, and so does planning past `BATCH_PLANNING_S` (422 `plan_too_costly`).
    """
    refused: list[tuple[int, ApiError]] = []
    prepared: list[Prepared] = []
    deadline = time.monotonic() + BATCH_PLANNING_S
    for index, spec in enumerate(specs):
        if index and time.monotonic() > deadline:
            raise ApiError(422, PLAN_TOO_COSTLY, f"planning this batch took over {BATCH_PLANNING_S:g} s after"
                           f" {index} of its {len(specs)} specs; nothing was stored. Submit fewer distinct specs"
                           " per batch (specs that differ only by name are planned once)",
                           details={"budget_s": BATCH_PLANNING_S, "planned": index, "items": len(specs)})
        try:
            check_backend(spec, configured)
            team_name = team_of(principal, spec)
            prepared.append(Prepared(spec, team_name, fitting_plan(spec, planner, team_name)))
        except InvalidSpec as exc:
            refused.append((index, ApiError(422, INVALID_SPEC, str(exc), fields=[
                ErrorField(loc=p.path, message=p.message) for p in exc.problems])))
        except ApiError as exc:
            if exc.status == 503:
                raise
            refused.append((index, exc))
    _refuse(refused, len(specs))
    with db.begin() as session:
        teams: dict[str, SubmittingTeam] = {}
        for index, item in enumerate(prepared):
            try:
                if item.team_name not in teams:
                    teams[item.team_name] = resolve_team(session, item.team_name)
                check_priority(principal, teams[item.team_name], item.spec.priority)
            except NotFound as exc:
                message = f"{exc}; or submit into an existing team"
                refused.append((index, ApiError(404, "not_found", message, fields=[
                    ErrorField(loc="team", message=message)])))
            except ApiError as exc:
                refused.append((index, exc))
        pools_refused = _check_all_pools(session, prepared, local_gpus)
        _refuse(refused + pools_refused, len(specs))
        jobs = insert_jobs(session, [NewJob(team=teams[item.team_name], spec=item.spec.model_copy(
            update={"team": item.team_name}), plan=item.plan) for item in prepared], actor=principal.actor)
        return [job_summary(job, job.team_name) for job in jobs]


def _check_all_pools(session: Session, prepared: list[Prepared], local_gpus: str | None) -> list[tuple[int, ApiError]]:
    """`check_pools` of each item, the pools read once."""
    refused: list[tuple[int, ApiError]] = []
    pools = effective_pools(session, local_gpus)
    for index, item in enumerate(prepared):
        try:
            check_pools(session, item.spec, item.plan, local_gpus, pools=pools)
        except ApiError as exc:
            refused.append((index, exc))
    return refused


def _refuse(refused: list[tuple[int, ApiError]], total: int) -> None:
    if not refused:
        return
    refused.sort(key=lambda item: item[0])
    first_index, first = refused[0]
    items = [{"index": i, "status": e.status, "code": e.code, "message": e.message,
              "fields": [f.model_dump() for f in e.fields], "details": e.details} for i, e in refused]
    fields = [ErrorField(loc=f"specs.{i}" + (f".{f.loc}" if f.loc else ""), message=f.message)
              for i, e in refused for f in (e.fields or [ErrorField(loc="", message=e.message)])]
    raise ApiError(first.status, first.code, f"{len(refused)} of {total} specs refused, nothing was stored;"
                   f" the first, specs.{first_index}: {first.message}", fields=fields,
                   details={"items": items, "refused": len(refused), "total": total})
