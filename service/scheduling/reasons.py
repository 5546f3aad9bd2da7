"""Why a job waits: the placement's verdict as numbers (`Blocked`), and the `Reason` a user reads.

`Blocked` is what the ledger and the placement find (a code, the GPUs available, the limit, and a
detail the message reads: which pool, which part of the quota, whether GPUs are being released or
preempted for it). `reason_of` turns one into the sentence `explain`, the queue view and
`admit(s).waiting` show; equal inputs give equal (and, through its cache, the same) `Reason`s.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.scheduling.decisions import Reason, ReasonCode
from service.scheduling.state import WaitingJob

#: reasons that mean a job cannot start, as things stand (it takes no part in the forecast)
NEVER = frozenset({ReasonCode.NO_MATCHING_POOL, ReasonCode.EXCEEDS_TEAM_LIMIT})

ReasonCache = dict[tuple[object, ...], Reason]


@dataclass(slots=True)
class Blocked:
    """One reason a job waits, before it is worded: `detail` is appended to (";releasing",
    ";preempting") by the placement that found it."""

    code: ReasonCode
    available: int
    limit: int
    detail: str = ""


def reason_of(j: WaitingJob, b: Blocked, cache: ReasonCache) -> Reason:
    """The worded reason of `b` for `j`; `cache` holds the ones made so far (one per distinct message)."""
    key = (b.code, j.team, j.gpu, j.gpus, b.available, b.limit, b.detail, j.backend, j.pool)  # all the message names
    got = cache.get(key)
    if got is None:
        got = cache[key] = _word(j, b)
    return got


def _word(j: WaitingJob, b: Blocked) -> Reason:
    flavor = j.gpu
    code = b.code
    tail = ""
    if b.detail.endswith(";releasing"):
        tail = "; GPUs being released by preempted or cancelled jobs will make room"
    elif b.detail.endswith(";preempting"):
        tail = "; jobs are being preempted to make room for it"
    if code is ReasonCode.BACKOFF:
        msg = f"a retry waiting out its backoff: admitted no sooner than in {b.detail.split(';')[0]} s"
        return Reason.model_construct(code=code, message=msg, flavor=None, requested=None, available=None,
                                      limit=None)
    if code is ReasonCode.NO_MATCHING_POOL:
        if b.detail == "none":
            msg = (f"no pool has backend {j.backend} and GPU kind {j.gpu}"
                   + (f" named {j.pool}" if j.pool else ""))
        else:
            msg = f"needs {j.gpus} {j.gpu} GPUs in one pool; the largest matching pool has {b.limit}"
        return Reason.model_construct(code=code, message=msg, flavor=flavor, requested=j.gpus,
                                      available=b.available, limit=b.limit)
    if code is ReasonCode.EXCEEDS_TEAM_LIMIT:
        msg = (f"team {j.team} may never hold more than {b.limit} {flavor} GPUs (nominal plus what it may"
               f" borrow); the job needs {j.gpus}")
    elif code is ReasonCode.QUOTA_EXCEEDED:
        msg = (f"team {j.team}'s {flavor} quota is in use: {b.available} of the {j.gpus} GPUs it needs are"
               f" available to it now ({b.detail}; at most {b.limit})")
    elif code is ReasonCode.WAITING_FOR_CAPACITY:
        pool = b.detail.split(";")[0].removeprefix("pool:")
        msg = (f"pool {pool} has {b.available} of {b.limit} {flavor} GPUs free; it needs {j.gpus}"
               + ("" if ";quota" in b.detail else " (its team's quota allows it)"))
    else:
        held = "quota" if b.detail.startswith("quota held") else "GPUs"
        msg = (f"it would fit, but the {held} it needs are held for higher-priority or longer-waiting jobs"
               f" ahead of it ({b.available} {flavor} GPUs free to it, needs {j.gpus})")
    return Reason.model_construct(code=code, message=msg + tail, flavor=flavor, requested=j.gpus,
                                  available=b.available, limit=b.limit)


def with_priority_reason(target: WaitingJob, reasons: list[Reason], waiting_jobs: int,
                         waiting_gpus: int) -> list[Reason]:
    """`reasons`, plus `waiting_for_priority` when the job waits for capacity while `waiting_jobs`
    other waiting jobs (`waiting_gpus` GPUs) for the same pools are ahead of it and no reason says so yet."""
    codes = {r.code for r in reasons}
    if waiting_jobs and ReasonCode.WAITING_FOR_PRIORITY not in codes and ReasonCode.WAITING_FOR_CAPACITY in codes:
        reasons = [*reasons, Reason(
            code=ReasonCode.WAITING_FOR_PRIORITY, flavor=target.gpu, requested=target.gpus,
            message=f"{waiting_jobs} waiting jobs ({waiting_gpus} {target.gpu} GPUs) for the same pools are ahead"
            " of it in admission order")]
    return reasons


__all__ = ["NEVER", "Blocked", "ReasonCache", "reason_of", "with_priority_reason"]
