"""Why a job waits, as `GET /v1/jobs/{id}/explain` answers and the dashboard's job page shows it.

For a waiting job: the engine's explanation from the dispatcher's queue view while it is fresh
(`as_of` says when it was computed; `service.store.queue_view`), else computed now. For a job that
does not wait for admission: what it does instead; and for one its backend holds (PENDING or
SUBMITTING), the backend's own reason and start estimate. Jobs ahead from the caller's own team are
listed; other teams' are counted and summed, never named (an admin sees every one).
"""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from service.lifecycle import AT_BACKEND_WAITING, TERMINAL, UNSUBMITTED
from service.scheduling import engine
from service.scheduling.decisions import Eta, Explanation, Reason, ReasonCode
from service.scheduling.snapshot import SnapshotParams, build_snapshot
from service.store.backend_pending import last_backend_pending
from service.store.jobs import visible_job
from service.store.models import Job, utcnow
from service.store.pools import effective_pools, kueue_kinds, managed
from service.store.queue_view import read_explanation
from service.store.tokens import NotFound, Principal
from service.store.visibility import sees_every_team
from service.store.vocab import JobStatus

S = JobStatus

#: How explain names each backend, and whose start estimate it quotes.
BACKEND_WORDS = {"slurm": "Slurm", "kubernetes": "Kubernetes", "local": "the local backend"}
ESTIMATE_WORDS = {"slurm": "Slurm's own `squeue --start` estimate"}


def _not_waiting(job: Job, pools_managed: bool) -> Explanation | None:
    """The explanation of a job that does not wait for admission; None for one that does."""
    status = job.status.value
    if job.status in TERMINAL:
        return Explanation(status=status, admitted=job.admitted_at is not None, pool=job.pool,
                           note=f"job {job.id} has ended ({status}); it no longer waits")
    if not pools_managed:
        return Explanation(status=status, admitted=True, note=f"backend {job.backend.value!r} has no pool declared,"
                           " so shardctl does not hold its jobs back: the backend's own scheduler queues them")
    if job.status == S.QUEUED and job.pool is None:
        return None
    where = f" in pool {job.pool}" if job.pool else ""
    if job.status == S.RUNNING:
        return Explanation(status=status, admitted=True, pool=job.pool, note=f"job {job.id} is running{where}")
    if job.status == S.CANCELLING:
        return Explanation(status=status, admitted=True, pool=job.pool, note=f"job {job.id} is being cancelled")
    if job.status in UNSUBMITTED:
        return Explanation(status=status, admitted=True, pool=job.pool,
                           note=f"job {job.id} is admitted{where}; a dispatcher is submitting it to its backend")
    reason = Reason(code=ReasonCode.BACKEND_PENDING, message=f"admitted{where}; waiting for the {job.backend.value}"
                    " backend to start it", flavor=job.gpu, requested=job.gpus)
    return Explanation(status=status, admitted=True, pool=job.pool, reasons=[reason],
                       note=f"job {job.id} is admitted{where} and handed to its backend")


def _backend_pending(session: Session, job: Job, base: Explanation, pools_managed: bool) -> Explanation:
    """`base` (a PENDING or SUBMITTING job's explanation) with the backend's own reason for holding
    the current attempt, when the dispatcher recorded one (`job.backend_pending`): one
    `backend_pending` reason quoting the backend, and an `eta` that puts shardctl's own band (0: it
    is admitted, shardctl holds nothing back; none when shardctl does not queue this backend) next
    to the backend's estimate (`backend_start_s`, seconds from now). `base` unchanged otherwise."""
    if job.status not in AT_BACKEND_WAITING or not job.attempts:
        return base
    last = last_backend_pending(session, job.id, job.attempts[-1].number)
    if last is None or (last.reason is None and last.expected_start is None):
        return base
    backend = job.backend.value
    who = BACKEND_WORDS.get(backend, backend)
    where = f" to pool {job.pool}" if job.pool else ""
    reason = Reason(code=ReasonCode.BACKEND_PENDING, flavor=job.gpu, requested=job.gpus,
                    message=f"admitted{where}; {who} holds it: {last.reason or 'it gives no reason'}")
    now = utcnow().timestamp()
    start_s = None if last.expected_start is None else round(max(0.0, last.expected_start - now), 1)
    estimate = ESTIMATE_WORDS.get(backend, f"{who}'s own estimate")
    method = (f"{estimate}: {start_s:g} s from now" if start_s is not None
              else f"{who} gives no start estimate")
    if pools_managed:
        eta = Eta(earliest_s=0.0, latest_s=0.0, backend_start_s=start_s,
                  method=f"shardctl: already admitted{where}, nothing of its own holds it back; {method}")
    else:
        eta = Eta(earliest_s=None, latest_s=None, backend_start_s=start_s,
                  method=f"shardctl: no band, it does not queue {backend} jobs (no pool declared); {method}")
    return base.model_copy(update={"reasons": [reason], "eta": eta})


def explain_job(db: sessionmaker[Session], principal: Principal, job_id: int, params: SnapshotParams, *,
                max_age_s: float) -> Explanation:
    """Why job `job_id` waits, or what it does instead, with `GET /v1/jobs/{id}`'s visibility
    (`NotFound` otherwise). `params` are the settings a live snapshot is built with; the dispatcher's
    queue view answers while it is at most `max_age_s` old and was computed after the job last changed."""
    with db.begin() as session:
        job = visible_job(session, principal, job_id)
        pools = effective_pools(session, params.local_gpus)
        pools_managed = managed(pools, job.backend.value)
        done = _not_waiting(job, pools_managed)
        kueue_pool = kueue_kinds(pools).get((job.backend.value, job.gpu))
        if done is None and kueue_pool is not None:  # Kueue admits it, not shardctl's engine
            done = Explanation(status=job.status.value, admitted=False, pool=kueue_pool,
                               note=f"pool {kueue_pool} is managed by Kueue: the next dispatcher cycle hands job"
                               f" {job.id} to it, and Kueue admits it (see the workload's conditions)")
        if done is not None:
            return _backend_pending(session, job, done, pools_managed)
        viewer = None if sees_every_team(principal) else job.team.name
        done = read_explanation(session, job_id, viewer, now=utcnow(), max_age_s=max_age_s,
                                changed_at=job.updated_at) if job.status == S.QUEUED else None
        if done is None:  # no fresh view, or the job is not in it (submitted or requeued since): live
            try:
                done = engine.explain(build_snapshot(session, params), job_id, viewer)
            except engine.UnknownJob as exc:
                raise NotFound(f"no job {job_id}") from exc
        return done.model_copy(update={"status": job.status.value})
