"""The Jobs page (`/ui/jobs`): a filtered, paginated list with status counts, rows updating live.

Thin over the store: `list_jobs` (keyset pages in the chosen sort, the same function and sorts as
`GET /v1/jobs`, so a page costs the same with 100,000 jobs stored), `count_jobs_by_status` (one
grouped count under the same filters and visibility, over at most the newest 5,000 matching jobs,
so a filter no index serves stays cheap) and, for the live rows, the event feed (`list_feed`,
scoped like jobs). A member sees their team's jobs only, as in the API.

Sortable by submission (the job id), status, team, GPUs, name and finish time, each both ways: the
column headers are links that keep the filters (`service.store.job_sort` has the orders). Live
updates: in the default order (newest first) new jobs are prepended to the first page; in every
order the rows shown are updated in place, and new jobs show up on reload.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field, ValidationError, field_validator
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from starlette.responses import Response

from service.api.deps import Db
from service.api.ui.live import Batch, live_response
from service.api.ui.render import fragment_text, page
from service.api.ui.session import Polled, Signed
from service.backend_options import BackendKind
from service.names import Label
from service.store.event_feed import FeedFilter, list_feed
from service.store.job_sort import DEFAULT_SORT, BadCursor, JobCursor, JobSort, SortField, SortText
from service.store.jobs import JobFilter, count_jobs_by_status, jobs_after, list_jobs, visible_job
from service.store.models import Event, Job
from service.store.tokens import NotFound, Principal
from service.store.vocab import JobStatus

router = APIRouter(tags=["ui"], include_in_schema=False)
PAGE_SIZE = 50
STATUSES = list(JobStatus)


def _day_or_time(value: object, *, end: bool) -> object:
    """A date (`2026-12-01`: the whole day, UTC) or an ISO time; empty is none."""
    if value in (None, ""):
        return None
    if isinstance(value, str) and len(value) == 10:
        day = date.fromisoformat(value)
        return datetime.combine(day + timedelta(days=1) if end else day, time(), UTC)
    return value


class JobsQuery(BaseModel):
    """The Jobs page's query string. Every field is optional; an empty one is ignored."""

    status: list[JobStatus] = Field(default_factory=list)
    team: Label | None = None
    backend: BackendKind | None = None
    gpu: str | None = Field(None, max_length=64)
    name: str | None = Field(None, max_length=200)
    since: datetime | None = None
    until: datetime | None = None
    sort: SortText = "-submitted"
    cursor: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,600}$")

    @field_validator("team", "backend", "gpu", "name", "cursor", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("sort", mode="before")
    @classmethod
    def _old_sort_names(cls, value: object) -> object:
        """`newest`/`oldest` were the page's sorts before the others came; old links keep working."""
        return {"": DEFAULT_SORT.text, "newest": "-submitted", "oldest": "submitted"}.get(str(value), value)

    def order(self) -> JobSort:
        return JobSort.parse(self.sort)

    def header(self, field: str) -> SortHeader:
        """The sort link of the column that sorts by `field`: this sort reversed if it is the
        current one, else the field in its first direction (numbers and times biggest first)."""
        current, wanted = self.order(), SortField(field)
        if current.field is wanted:
            target = current.reversed()
        else:
            target = JobSort(wanted, descending=wanted in FIRST_DESCENDING)
        aria = ("descending" if current.descending else "ascending") if current.field is wanted else None
        return SortHeader(href=self.url(sort=target.text, cursor=None), aria_sort=aria,
                          arrow={"descending": "▼", "ascending": "▲", None: ""}[aria],
                          action="sort descending" if target.descending else "sort ascending")

    def caption(self) -> str:
        order = self.order()
        what = SORT_WORDS[order.field][order.descending]
        if order == DEFAULT_SORT:
            return f"Jobs {what}; rows update live and new jobs appear at the top."
        return f"Jobs by {what}; rows update live in place, new jobs appear when the page is reloaded."

    @field_validator("since", mode="before")
    @classmethod
    def _since(cls, value: object) -> object:
        return _day_or_time(value, end=False)

    @field_validator("until", mode="before")
    @classmethod
    def _until(cls, value: object) -> object:
        return _day_or_time(value, end=True)

    @field_validator("since", "until")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value

    def filters(self) -> JobFilter:
        return JobFilter(status=self.status, team=self.team, backend=self.backend, name=self.name, gpu=self.gpu,
                         created_after=self.since, created_before=self.until)

    def since_input(self) -> str:
        """The `since` field as the date input shows it."""
        return self.since.date().isoformat() if self.since else ""

    def until_input(self) -> str:
        """The `until` field as the date input shows it: the last day included."""
        return (self.until - timedelta(microseconds=1)).date().isoformat() if self.until else ""

    def url(self, **changes: object) -> str:
        """This query with `changes` (None drops a field), as a `/ui/jobs?...` link."""
        values = {**self.model_dump(mode="json"), **changes}
        pairs: list[tuple[str, str]] = []
        for key, value in values.items():
            if (key == "sort" and value == DEFAULT_SORT.text) or value in (None, "", []):
                continue
            for item in value if isinstance(value, list) else [value]:
                pairs.append((key, str(item)))
        return "/ui/jobs" + (f"?{urlencode(pairs)}" if pairs else "")


@dataclass(frozen=True, slots=True)
class SortHeader:
    """A sortable column header: where its link goes, its `aria-sort` (None when the list is not
    sorted by it), the arrow shown and what the link does, in words, for screen readers."""

    href: str
    aria_sort: str | None
    arrow: str
    action: str


FIRST_DESCENDING = {SortField.SUBMITTED, SortField.GPUS, SortField.FINISHED}
#: field -> (ascending words, descending words), for the table's caption
SORT_WORDS: dict[SortField, tuple[str, str]] = {
    SortField.SUBMITTED: ("oldest first", "newest first"),
    SortField.STATUS: ("status, A to Z", "status, Z to A"),
    SortField.TEAM: ("team, A to Z", "team, Z to A"),
    SortField.GPUS: ("GPUs, fewest first", "GPUs, most first"),
    SortField.NAME: ("name, A to Z", "name, Z to A"),
    SortField.FINISHED: ("finish time, earliest first, unfinished last",
                         "finish time, latest first, unfinished first"),
}


def parse_query(request: Request) -> tuple[JobsQuery, list[str]]:
    """The page's query, and the problems with it in words (field: what is wrong); a bad field is dropped."""
    raw: dict[str, object] = {key: request.query_params.get(key) for key in JobsQuery.model_fields
                              if key != "status" and key in request.query_params}
    raw["status"] = [s for s in request.query_params.getlist("status") if s]
    try:
        query = JobsQuery.model_validate(raw)
    except ValidationError as exc:
        problems, bad = [], set()
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else "query"
            bad.add(field)
            problems.append(f"{field}: {error['msg'].removeprefix('Value error, ')}")
        kept = {key: value for key, value in raw.items() if key not in bad}
        return _checked_cursor(JobsQuery.model_validate(kept), problems)
    return _checked_cursor(query, [])


def _checked_cursor(query: JobsQuery, problems: list[str]) -> tuple[JobsQuery, list[str]]:
    """`query` without its cursor if the cursor is not one of its sort's (the first page shows then)."""
    if query.cursor is not None:
        try:
            JobCursor.decode(query.cursor, query.order())
        except BadCursor as exc:
            return query.model_copy(update={"cursor": None}), [*problems, f"cursor: {exc}"]
    return query, problems


def latest_event_id(session: Session) -> int:
    return int(session.scalar(select(func.max(Event.id))) or 0)


def _row(job: Job) -> str:
    return fragment_text("_job_row.html", job=job)


def _counts(query: JobsQuery, counts: tuple[dict[JobStatus, int], bool]) -> str:
    return fragment_text("_job_counts.html", query=query, counts=counts[0], capped=counts[1], statuses=STATUSES)


@router.get("/ui/jobs")
def jobs_page(request: Request, session: Signed, db: Db) -> Response:
    query, problems = parse_query(request)
    with db.begin() as tx:
        order = query.order()
        start = JobCursor.decode(query.cursor, order) if query.cursor else None
        rows, next_cursor = list_jobs(tx, session.principal, query.filters(), limit=PAGE_SIZE, cursor=start,
                                      sort=order)
        counts, capped = count_jobs_by_status(tx, session.principal, query.filters())
        after = latest_event_id(tx)
        html = page(request, session, "jobs.html", title="Jobs", query=query, rows=rows, counts=counts, capped=capped,
                    statuses=STATUSES, backends=list(BackendKind), problems=problems,
                    next_cursor=next_cursor.encode() if next_cursor is not None else None,
                    live_url=_live_url(query, rows, after))
    return html


def _live_url(query: JobsQuery, rows: list[Job], after: int) -> str:
    params = [(k, v) for k, v in [("team", query.team), ("backend", query.backend), ("gpu", query.gpu),
                                  ("name", query.name)] if v]
    params += [("status", s.value) for s in query.status]
    if query.since:
        params.append(("since", query.since.isoformat()))
    if query.until:
        params.append(("until", query.until.isoformat()))
    params.append(("ids", ",".join(str(j.id) for j in rows)))
    # New jobs appear at the top of the first page of the newest-first list only.
    newest = query.order() == DEFAULT_SORT and query.cursor is None
    params.append(("top", str(rows[0].id if rows else 0) if newest else ""))
    params.append(("after", str(after)))
    return "/ui/jobs/live?" + urlencode(params)


def _ids(text: str | None) -> set[int]:
    return {int(part) for part in (text or "").split(",")[:200] if part.isdigit() and len(part) <= 18}


@router.get("/ui/jobs/live")
def jobs_live(request: Request, session: Polled,
              after: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0) -> Response:
    """The page's rows and counts, live: an `html` message per changed row (and per new job on the
    first page), and the counts again whenever something changed."""
    query, _ = parse_query(request)
    shown = _ids(request.query_params.get("ids"))
    top_text = request.query_params.get("top", "")
    top = int(top_text) if top_text.isdigit() and len(top_text) <= 18 else None

    def step(tx: Session, principal: Principal, cursor: int) -> Batch:
        nonlocal top
        batch = Batch(cursor=cursor)
        events = list_feed(tx, principal, FeedFilter(team=query.team), since=cursor, limit=500)
        if not events:
            return batch
        batch.cursor = events[-1].event.id
        for job_id in sorted({e.event.job_id for e in events} & shown):
            try:
                batch.add(f"job-row-{job_id}", _row(visible_job(tx, principal, job_id)))
            except NotFound:
                continue
        if top is not None:
            new = jobs_after(tx, principal, query.filters(), top, limit=PAGE_SIZE)
            for job in new:
                batch.add("job-rows", _row(job), swap="prepend")
                shown.add(job.id)
                top = job.id
            if new:
                batch.add("jobs-empty", "")  # the "no jobs" note, if the page had none
        batch.add("job-counts", _counts(query, count_jobs_by_status(tx, principal, query.filters())))
        return batch

    return live_response(request, session, step, after)
