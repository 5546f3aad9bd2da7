"""Reading sacct and squeue, and merging the two into one current record per job.

sacct (slurmdbd) keeps the history: requeued runs, exit codes, jobs long gone from the controller.
squeue (slurmctld) is the present, but forgets a job MinJobAge after it ends. Accounting lags the
controller by up to seconds, in three ways, none of which may give a verdict early or lose a node:

- a job that ended before sacct recorded it reads RUNNING until sacct has its exit code (only a
  cancellation is taken from squeue alone);
- sacct first records a just-finished multi-node job on its batch host alone while `NNodes` already
  says how many nodes it had: such a record also asks squeue, whose list is complete then;
- while a job completes, squeue drops each node that has finished its epilog: the longer list wins;
- a cancelled (or preempted: `SlurmBackend.preempt`) job reads CANCELLED in sacct at once, while its
  processes still run out KillWait: squeue's COMPLETING wins, so it reads RUNNING until they are gone.

Everything here is pure: the CLI arguments to run, and functions of their output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from workers.backends.slurm.nodelist import fuller, nodes_complete
from workers.backends.slurm.states import CANCELLED, LIVE, state_word

#: One job's record, keyed by these sacct field names (squeue's records are given the same keys).
Record = Mapping[str, str]
SACCT_FIELDS = ("JobIDRaw", "JobName", "State", "ExitCode", "NodeList", "Reason", "WorkDir", "NNodes")
#: squeue's columns, in the order of SACCT_FIELDS minus ExitCode (squeue has none): id, name, state,
#: nodes, reason, working directory, node count; then the start time (`StartTime`): for a pending job
#: the controller's expected start, the same value `squeue --start` shows ("N/A" while it has none)
SQUEUE_FORMAT = "%i|%j|%T|%N|%r|%Z|%D|%S"
#: start times that are no time: none computed yet, or none that applies
NO_START = frozenset({"", "N/A", "NONE", "UNKNOWN", "(NULL)"})


def sacct_args(*, ids: Sequence[str] = (), names: Sequence[str] = (), window: str = "now-30days") -> list[str]:
    """One `sacct` for every record (requeued runs included, `--duplicates`) of these job ids, or when
    `names` is given of every job with one of these names since `window` (sacct without `-j` only
    searches since midnight unless told)."""
    args = ["sacct", "-n", "-P", "-X", "--duplicates", "-o", ",".join(SACCT_FIELDS)]
    if names:
        return [*args, "-S", window, "-E", "now", "--name", ",".join(names)]
    return [*args, "-j", ",".join(ids)]


def squeue_args(names: Sequence[str]) -> list[str]:
    """One `squeue` for the jobs with these names, in any state the controller still holds."""
    return ["squeue", "-h", "-t", "all", "-n", ",".join(names), "-o", SQUEUE_FORMAT]


def find_args(name: str, *, accounted: bool, window: str = "now-30days") -> list[str]:
    """`id|workdir` lines of the jobs named `name`: from squeue, or (`accounted`) from sacct."""
    if accounted:
        return ["sacct", "-n", "-P", "-X", "-S", window, "-E", "now", "--name", name, "-o", "JobIDRaw,WorkDir"]
    return ["squeue", "-h", "-t", "all", "-n", name, "-o", "%i|%Z"]


def parse_sacct(output: str) -> dict[str, list[dict[str, str]]]:
    """`sacct_args` output -> job id -> its records, oldest first. Malformed lines are skipped."""
    records: dict[str, list[dict[str, str]]] = {}
    for line in output.splitlines():
        fields = line.split("|")
        if len(fields) == len(SACCT_FIELDS):
            rec = dict(zip(SACCT_FIELDS, fields, strict=True))
            records.setdefault(rec["JobIDRaw"], []).append(rec)
    return records


def _squeue_record(line: str) -> dict[str, str] | None:
    """One `squeue_args` line as a sacct-shaped record (`ExitCode` "0:0": squeue does not know it) plus
    squeue's `StartTime`; None when it names no job id."""
    job_id, name, state, nodelist, reason, workdir, count, start = (line.split("|") + [""] * 8)[:8]
    if not job_id.isdigit():
        return None
    return {"JobIDRaw": job_id, "JobName": name, "State": state, "ExitCode": "0:0", "NodeList": nodelist,
            "Reason": reason, "WorkDir": workdir, "NNodes": count, "StartTime": start}


def parse_squeue(output: str) -> dict[str, dict[str, str]]:
    """`squeue_args` output -> job name -> the newest job of that name (`_squeue_record`)."""
    live: dict[str, dict[str, str]] = {}
    for line in output.splitlines():
        rec = _squeue_record(line)
        if rec is not None and (rec["JobName"] not in live
                                or int(rec["JobIDRaw"]) > int(live[rec["JobName"]]["JobIDRaw"])):
            live[rec["JobName"]] = rec
    return live


def parse_squeue_by_id(output: str) -> dict[str, dict[str, str]]:
    """`squeue_args` output -> job id -> its record (every job of each name, not only the newest)."""
    by_id: dict[str, dict[str, str]] = {}
    for line in output.splitlines():
        rec = _squeue_record(line)
        if rec is not None:
            by_id[rec["JobIDRaw"]] = rec
    return by_id


def start_time(value: str) -> float | None:
    """squeue's `%S` (ISO 8601 in the local time zone, as the Slurm CLI prints it without
    `SLURM_TIME_FORMAT`) -> epoch seconds; None for "N/A", "Unknown", empty or anything unreadable."""
    if value.strip().upper() in NO_START:
        return None
    try:
        return datetime.fromisoformat(value.strip()).timestamp()  # a naive time is local, as squeue printed it
    except ValueError:
        return None


def pending_details(current: Record | None, accounted: Sequence[Record] | None) -> tuple[str | None, float | None]:
    """Why Slurm holds a pending job and when it expects to start it: squeue's reason (`Resources`,
    `Priority`, `BeginTime`, `QOSMaxGRESPerUser`, ...) and start estimate when squeue has the job,
    else sacct's latest reason and no estimate. "None" or empty -> None."""
    record = current if current is not None else (accounted[-1] if accounted else None)
    if record is None:
        return None, None
    reason = record.get("Reason", "").strip()
    return (reason if reason and reason.upper() not in NO_START else None), start_time(record.get("StartTime", ""))


def ids_in(output: str, workdir: str) -> list[int]:
    """Job ids from `find_args` output whose working directory is `workdir`."""
    ids = []
    for line in output.splitlines():
        job_id, _, wd = line.partition("|")
        if job_id.strip().isdigit() and wd.strip() == workdir:
            ids.append(int(job_id))
    return ids


def newest_named(records: Mapping[str, Sequence[Record]], name: str, workdir: str) -> str | None:
    """The newest job id among `records` named `name` that ran in `workdir`; None if there is none."""
    ids = [int(job_id) for job_id, recs in records.items()
           if recs[-1]["JobName"] == name and recs[-1]["WorkDir"] == workdir]
    return str(max(ids)) if ids else None


#: Ends after which Slurm may queue the same job again (`PreemptMode=REQUEUE`, `scontrol requeue`).
REQUEUABLE = frozenset({"PREEMPTED", "REQUEUED"})


def lags(accounted: Sequence[Record] | None) -> bool:
    """Whether squeue may know better: sacct has no record yet, shows the job not finished, shows it
    cancelled (sacct writes CANCELLED at the scancel, while squeue says COMPLETING until its processes,
    which got SIGTERM and may be writing a checkpoint, are gone), or lists fewer nodes than the job had."""
    return (not accounted or state_word(accounted[-1]["State"]) in LIVE | REQUEUABLE | CANCELLED
            or not nodes_complete(accounted[-1]))


def belongs(current: Record, job_id: str | None, workdir: str | None) -> bool:
    """squeue's record is the job asked about: the same id, or, the id unknown, run in `workdir`
    (read only when `job_id` is None; None there matches no record)."""
    return current["JobIDRaw"] == job_id if job_id is not None else current["WorkDir"] == workdir


def merge(accounted: Sequence[Record] | None, current: Record | None) -> list[Record] | None:
    """sacct's records of one job (oldest first) with squeue's current record of it -> the records to
    observe (`states.observe`), or None when neither knows the job. sacct keeps the history and the
    exit code; squeue's state wins while the job is live, and the fuller node list wins."""
    if accounted:
        *history, last = accounted
        if current is None:
            return [*history, last]
        if current["State"] in LIVE and state_word(last["State"]) in REQUEUABLE:
            # preempted or requeued, and already queued again: sacct has not written the new run's record
            # yet. Without it the job would read as ended (and be submitted a second time).
            return [*history, last, {**last, "State": current["State"], "NodeList": current["NodeList"]}]
        if current["State"] == "CANCELLED" and state_word(last["State"]) in REQUEUABLE:
            # cancelled while queued again after a requeue: sacct may never write a record for that
            # (seen on slurm 22.05), so without squeue's word the job would read as pending for ever
            return [*history, last, {**last, "State": "CANCELLED", "NodeList": current["NodeList"]}]
        if current["State"] in LIVE:  # fresher than sacct
            return [*history, {**last, "State": current["State"],
                               "NodeList": fuller(last["NodeList"], current["NodeList"])}]
        if not nodes_complete(last):
            return [*history, {**last, "NodeList": fuller(last["NodeList"], current["NodeList"])}]
        if last["State"] == "PENDING" and current["State"] != "CANCELLED":
            # it ran and ended; sacct has not caught up: RUNNING until sacct has its exit code
            return [*history, {**last, "State": "RUNNING", "NodeList": current["NodeList"]}]
        return [*history, last]
    if current is None:
        return None
    if current["State"] not in LIVE and current["State"] != "CANCELLED":
        # ended before sacct ever saw it: its exit code and node list are sacct's to give
        return [{**current, "State": "RUNNING"}]
    return [current]

